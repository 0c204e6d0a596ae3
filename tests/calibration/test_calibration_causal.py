"""The κ calibration plants Jacobians whose E[JᵀJ] is known and runs the production κ stage;
the sweep-gate calibration plants SAEs whose held-out FVU is known and runs the gate."""

from __future__ import annotations

import numpy as np
import pytest

from structlens.calibration.causal import (
    GATE_FVU,
    GATE_WIDTHS,
    SPECTRUM,
    calibrate_gate,
    calibrate_kappa,
    planted_gate_sweep,
    planted_grams,
    planted_sae,
    true_kappa,
)


def test_true_kappa_is_the_entropy_effective_rank():
    assert true_kappa(np.ones(7)) == pytest.approx(7.0)
    assert true_kappa(np.array([1.0, 0.0, 0.0])) == pytest.approx(1.0)
    assert 1 < true_kappa(SPECTRUM) < len(SPECTRUM)


def test_planted_grams_average_to_the_planted_spectrum():
    """Law of large numbers: the mean Gram is rank·diag(m), whatever ρ."""
    for rho in (0.0, 0.9):
        _, g = planted_grams(rho, seed=1, n_chunks=400, windows_per_chunk=10)
        mean = g.mean(0)
        np.testing.assert_allclose(np.diag(mean), 2 * SPECTRUM, rtol=0.12)
        assert np.abs(mean - np.diag(np.diag(mean))).max() < 0.05


def test_windows_follow_the_protocols_chunk_major_order():
    prompts, g = planted_grams(0.5, seed=0, n_chunks=3, windows_per_chunk=2)
    assert prompts.kappa_chunks == [0, 1, 2, 0, 1, 2]
    assert g.shape == (6, 16, 16) and len(prompts.kappa_windows) == 6
    with pytest.raises(ValueError, match="rho"):
        planted_grams(1.0, seed=0)


def test_the_chunk_unit_widens_the_interval_when_windows_of_a_chunk_are_correlated():
    chunk = calibrate_kappa(0.9, "chunk", 12, first_seed=3)
    vector = calibrate_kappa(0.9, "vector", 12, first_seed=3)
    assert chunk.mean_vectors == vector.mean_vectors  # one doubling rule, one data set
    assert chunk.mean_plugin == pytest.approx(vector.mean_plugin)
    assert chunk.mean_width > 1.2 * vector.mean_width
    assert abs(chunk.mean_estimate - chunk.truth) < abs(chunk.mean_plugin - chunk.truth)


def test_the_interval_width_is_the_bias_corrected_estimates_own_jackknife():
    """Independent computation: the stage's standard error is the delete-a-chunk jackknife of
    the bias-corrected κ that :func:`kappa_from_grams` gives on the remaining chunks (32 chunks:
    one block each), and it exceeds the plain jackknife's, which measures the plug-in."""
    import functools

    from structlens.calibration.causal import PROTOCOL, _windows
    from structlens.causal_dim.kappa import kappa_from_grams
    from structlens.causal_dim.stages import kappa
    from structlens.stats.intervals import group_jackknife

    prompts, grams = planted_grams(0.9, seed=50_000)
    fit = kappa(PROTOCOL, None, 0, prompts, grams=functools.partial(_windows, grams))
    g, chunks = grams[: fit.n_vectors], np.array(prompts.kappa_chunks[: fit.n_vectors])
    labels = sorted(set(chunks.tolist()))
    reps = [kappa_from_grams(g[chunks != c], groups=chunks[chunks != c]).erank for c in labels]
    want = group_jackknife(fit.erank, np.array(reps)).se
    assert fit.erank_se == pytest.approx(float(want), rel=1e-8)
    # the plain jackknife of the plug-in, centred on the same bias-corrected estimate
    plug = [kappa_from_grams(g[chunks != c]).erank_plugin for c in labels]
    plain = group_jackknife(fit.erank_plugin, np.array(plug))
    assert fit.erank == pytest.approx(float(plain.bias_corrected))
    assert fit.erank_se > float(plain.se)


def test_the_identification_rule_and_the_papers_are_scored_against_the_planted_kappa():
    from structlens.calibration.causal import PROTOCOL, STOPPING_SPECTRA, calibrate_stopping

    # a cap at the first size leaves the rule no doubling to stop on: it never says identified
    capped = PROTOCOL.replace(kappa_start=16, kappa_max_vectors=16)
    never = calibrate_stopping("d=16, j^-1", 5, first_seed=1, protocol=capped)
    assert never.rate == never.false_stop_rate == 0 and never.mean_vectors == 16
    # 16 rank-2 windows cannot show a 64-d flat spectrum: the plug-in is far below κ = 64
    assert never.truth == true_kappa(STOPPING_SPECTRA["d=16, j^-1"])
    flat = calibrate_stopping("d=64, flat", 3, first_seed=1, protocol=capped)
    assert (
        flat.truth == pytest.approx(64.0)
        and flat.mean_plugin < 0.5 * flat.truth
        and flat.plugin_close == 0
    )
    # a loose tolerance stops at the first size (κ(16)/κ(8)), whatever the plug-in has reached
    loose = PROTOCOL.replace(kappa_tolerance=10.0)
    early = calibrate_stopping("d=64, flat", 3, first_seed=1, protocol=loose)
    assert early.rate == 1 and early.mean_vectors == 16 and early.false_stop_rate == 1
    assert early.paper_rate == 1 and early.paper_false_stop_rate == 1
    # at the paper's tolerance the plug-in ratio stops falsely on a spectrum that 128 windows
    # resolve, where the identification rule waits for its interval (independent windows)
    scored = calibrate_stopping("d=16, j^-1", 40, first_seed=1)
    assert scored.paper_false_stop_rate >= 0.2 and scored.false_stop_rate <= 0.05


def test_a_spectrum_is_found_for_any_kappa_between_one_and_d():
    from structlens.calibration.causal import spectrum_with_kappa

    for target in (64.0, 29.1, 9.7, 1.5):
        m = spectrum_with_kappa(target, 64)
        assert true_kappa(m) == pytest.approx(target, rel=1e-9) and np.all(np.diff(m) <= 0)
    for bad in (1.0, 65.0):
        with pytest.raises(ValueError, match="kappa"):
            spectrum_with_kappa(bad, 64)


def test_the_scale_rule_is_scored_against_the_planted_ratio():
    """Pairs of one spectrum are never called different, pairs three-fold apart never the
    same (a cap of 32 vectors: wide intervals, so "unidentified" is allowed either way)."""
    from structlens.calibration.causal import PROTOCOL, calibrate_scale

    short = PROTOCOL.replace(kappa_max_vectors=32)
    same, apart = calibrate_scale((1.0, 3.0), 4, first_seed=1, protocol=short)
    assert not same.expected and same.rate == 0 and same.kappa[0] == same.kappa[1]
    assert apart.expected and apart.same_rate == 0
    assert apart.kappa[0] == pytest.approx(3 * apart.kappa[1])


def test_a_planted_sae_reconstructs_with_its_residual_map():
    import torch

    rng = np.random.default_rng(0)
    r = 0.1 * rng.standard_normal((6, 6))
    x = torch.as_tensor(rng.standard_normal((50, 6)))
    sae = planted_sae(r)
    assert sae.d_sae == 12
    torch.testing.assert_close(sae(x), x + x @ torch.as_tensor(r).T)


def test_planted_gate_sweeps_have_their_true_fvu():
    """Over many prompts each width's held-out FVU (the production ``sae_quality``) is its
    planted population FVU, the last width's the third's times 1 + rise."""
    import torch

    from structlens.sae.sweep import sae_quality

    saes, acts, ids, truth = planted_gate_sweep(0.1, 400, 32, seed=3)
    assert list(truth) == list(GATE_WIDTHS)
    assert truth[GATE_WIDTHS[-1]] == pytest.approx(GATE_FVU[-1] * 1.1)
    x = torch.cat(acts)
    for m, sae in saes.items():
        assert sae_quality(sae, x)["fvu"] == pytest.approx(truth[m], rel=0.03)
    assert [int(i[0]) for i in ids] == list(range(400)) and all(len(i) == 32 for i in ids)


def test_the_gate_passes_a_falling_sweep_and_fails_a_large_rise():
    falls = calibrate_gate(-0.15, 10, first_seed=5)
    rises = calibrate_gate(0.1, 10, first_seed=5)
    assert not falls.expected and falls.rate == 0.0 and falls.mean_rise < -0.1
    assert rises.expected and rises.rate == 1.0 and rises.raw_rate == 1.0
    assert 0.05 < rises.mean_rise < 0.15 and 0 < rises.mean_rise_se < 0.05

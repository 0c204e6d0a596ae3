"""Every figure takes the method's Result: each test computes one on tiny synthetic data,
draws it and checks that the PNG is written and not blank."""

from __future__ import annotations

import matplotlib.image
import numpy as np
import pytest
import torch

from structlens.causal_dim.kappa import KappaCurve, KappaResult, kappa_curve, kappa_from_grams
from structlens.causal_dim.sweep import (
    FeatureStats,
    WidthSweepConfig,
    WidthSweepResult,
    analyze_width_sweep,
)
from structlens.equivalence.compare import CompareConfig, Comparison
from structlens.errors import InputError
from structlens.koopman import EDMDc, EDMDcConfig, IdentityDictionary, split_half_convergence
from structlens.ndm.evaluate import PatchRun
from structlens.ndm.ndm import NDM, NDMConfig, NDMResult
from structlens.report.causal import plot_kappa_curve, plot_spectra, plot_spectrum, plot_width_sweep
from structlens.report.equivalence import plot_layer_matching
from structlens.report.koopman import plot_fit_spectra, plot_split_half_results
from structlens.report.ndm import plot_effect_heatmap, plot_merge_history
from structlens.results import to_jsonable
from structlens.sae.models import TopKSAE


def assert_drawn(path, expected):
    """``path`` is the file the figure function returned, and the image is not blank."""
    assert path == expected and path.stat().st_size > 0
    pixels = matplotlib.image.imread(path)
    colours = np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)
    assert len(colours) > 1


def _grams(rng, n=8, d=6, rank=3):
    """Per-vector Grams JᵀJ of random [rank, d] Jacobians."""
    jac = rng.standard_normal((n, rank, d))
    return np.einsum("nrd,nre->nde", jac, jac)


def test_width_sweep_takes_the_sweep_result(tmp_path):
    torch.manual_seed(0)
    d = 16
    acts = torch.randn(300, d, dtype=torch.float64)
    grads = torch.randn(300, d, dtype=torch.float64)
    stats = {}
    for m in (64, 128, 256):
        stats[m] = FeatureStats(m, 8)
        stats[m].update(
            TopKSAE(d, m, k=4, seed=m, dtype=torch.float64), acts, grads, torch.arange(300)
        )
    sweep = analyze_width_sweep(stats, WidthSweepConfig(n_bootstrap=5))
    assert_drawn(plot_width_sweep(sweep, tmp_path / "w.png"), tmp_path / "w.png")
    # the JSON form a command or a stage record holds rebuilds the same result
    again = WidthSweepResult.from_dict(to_jsonable(sweep) | {"layer": 0})
    for name in ("widths", "n_repr", "n_causal", "n_repr_ci", "n_causal_growth_ci"):
        np.testing.assert_array_equal(getattr(again, name), getattr(sweep, name))
    np.testing.assert_equal(again.fits, sweep.fits)  # NaN equals NaN here
    np.testing.assert_equal(again.kappa_hat, sweep.kappa_hat)
    assert again.kappa_hat_status == sweep.kappa_hat_status
    assert_drawn(plot_width_sweep(again, tmp_path / "w2.png"), tmp_path / "w2.png")
    with pytest.raises(InputError, match="just the shape"):
        WidthSweepResult.from_dict(sweep.to_json())
    with pytest.raises(InputError, match="needs the fields"):
        WidthSweepResult.from_dict({"widths": [64, 128]})


def test_spectrum_and_kappa_curve_take_kappa_results(tmp_path, rng):
    grams = {layer: _grams(rng) for layer in (0, 3)}
    kappa = {layer: kappa_from_grams(g) for layer, g in grams.items()}
    curves = {layer: kappa_curve(g, [1, 2, 4, 8], n_draws=3) for layer, g in grams.items()}
    assert all(isinstance(c, KappaCurve) for c in curves.values())
    assert_drawn(plot_spectrum(kappa, tmp_path / "s.png"), tmp_path / "s.png")
    assert_drawn(plot_kappa_curve(curves, tmp_path / "k.png"), tmp_path / "k.png")
    spectra = {layer: r.eigenvalues for layer, r in kappa.items()}
    assert_drawn(plot_spectra(spectra, tmp_path / "a.png"), tmp_path / "a.png")
    # the replication's stage record (to_jsonable) rebuilds the same results
    back = KappaResult.from_dict(to_jsonable(kappa[0]) | {"layer": 0})
    np.testing.assert_array_equal(back.eigenvalues, kappa[0].eigenvalues)
    assert back.erank == kappa[0].erank and back.erank_ci == kappa[0].erank_ci
    assert KappaCurve.from_dict(to_jsonable(curves[3])) == curves[3]


def test_merge_history_takes_ndm_results(tmp_path, rng):
    h = rng.standard_normal((1000, 4)).astype(np.float32)
    cfg = NDMConfig(
        unit_size=1, batch_size=32, lr=3e-2, max_steps=30, bank_size=300, refresh_interval=10,
        reproject_interval=3, merge_start=10, merge_interval=10, mi_samples=300,
        log_interval=5, init="random",
    )  # fmt: skip
    res = NDM(cfg).fit(h)
    assert isinstance(res, NDMResult) and res.loss_history
    out = plot_merge_history({"L0": res}, tmp_path / "m.png")
    assert_drawn(out, tmp_path / "m.png")


def test_effect_heatmap_takes_patch_runs(tmp_path, rng):
    # Patching with a linear metric w·h: the subspaces of a rotation split the whole-space
    # effect exactly, so each method's normalised effects sum to 1.
    n, d, partition = 20, 6, [3, 2, 1]
    w = rng.standard_normal(d)
    clean, corrupt = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    runs = {}
    for method in ("ndm", "pca"):
        rotation = np.linalg.qr(rng.standard_normal((d, d)))[0]
        bases = np.split(rotation, np.cumsum(partition)[:-1], axis=1)
        patched = [clean + (corrupt - clean) @ b @ b.T for b in bases]
        effects = np.stack([(clean - p) @ w for p in patched], axis=1)
        runs[method] = PatchRun(
            clean_metric=clean @ w,
            corrupt_metric=corrupt @ w,
            effects=effects,
            full_effect=(clean - corrupt) @ w,
            top1=np.zeros((n, len(partition)), dtype=np.int64),
            top1_clean=np.zeros(n, dtype=np.int64),
            top1_full=np.zeros(n, dtype=np.int64),
        )
        assert runs[method].normalized_effects().sum() == pytest.approx(1.0)
    effects = {m: r.normalized_effects() for m, r in runs.items()}
    out = plot_effect_heatmap(effects, partition, "synthetic", tmp_path / "e.png")
    assert_drawn(out, tmp_path / "e.png")


def test_layer_matching_takes_matched_components(tmp_path, rng):
    resid = [rng.normal(size=(40, 6)) for _ in range(3)]
    heads = [rng.normal(size=(40, 2, 3)) for _ in range(3)]
    matched = Comparison(CompareConfig(metric="linear_cka")).fit((resid, heads), (resid, heads))
    out = plot_layer_matching(matched, tmp_path / "l.png", title="linear_cka")
    assert_drawn(out, tmp_path / "l.png")


def _linear_system(rng, n=3200, d=4):
    a = np.diag([0.9, 0.6, -0.4, 0.2])
    x, u = rng.standard_normal((n, d)), rng.standard_normal((n, 1))
    y = x @ a.T + u @ rng.standard_normal((1, d)) + 0.3 * rng.standard_normal((n, d))
    return x, u, y, np.arange(n) // 4


def test_koopman_figures_take_fits_and_split_half_results(tmp_path, rng):
    x, u, y, ids = _linear_system(rng)
    est = EDMDc(IdentityDictionary().fit(x), EDMDcConfig(alpha=0.0))
    fit = est.fit(x, u, y)
    assert_drawn(plot_fit_spectra({"identity": fit}, tmp_path / "ev.png"), tmp_path / "ev.png")
    blocks = est.statistics(x, u, y, ids, n_blocks=16, seed=0)
    sh = split_half_convergence(blocks, est.config, n_repeats=4, seed=0)
    out = plot_split_half_results({"identity": sh}, tmp_path / "sh.png")
    assert_drawn(out, tmp_path / "sh.png")

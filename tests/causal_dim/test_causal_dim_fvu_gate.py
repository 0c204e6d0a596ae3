"""The width sweep's held-out FVU gate: a rise within its relative tolerance, or above it by
less than its one-sided 95% sampling error over prompt blocks, passes and a real rise fails;
a failure is diagnosed from the training FVU (a planted growing train–held-out gap is
data-limited, a flat one under-trained) and the typed cause reaches the sweep result, the κ̂
claims and analyze's caveats."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_causal_dim_identification import _sweep_stats

from structlens.causal_dim import verdicts as V
from structlens.causal_dim.stages import CausalAnalysis, SweepFit
from structlens.causal_dim.sweep import (
    FVU_RISE_Z,
    WidthSweepConfig,
    analyze_width_sweep,
    fvu_gate,
    heldout_fvu_rise_se,
)
from structlens.sae import TopKSAE, evaluate_sae

WIDTHS = [2304, 4608, 9216, 18432]
# the held-out FVU of the committed cpu run: a 1.2% rise at the widest SAE
HELD = [0.1797, 0.1646, 0.1604, 0.1624]


def test_a_rise_within_the_tolerance_passes_and_a_real_rise_fails():
    within = [0.30, 0.20, 0.15, 0.1514]  # +0.9% at the widest, under the 1% tolerance
    assert fvu_gate(WIDTHS, within).passed
    assert not fvu_gate(WIDTHS, within, tolerance=0.005).passed  # a tighter one fails it
    real = fvu_gate(WIDTHS, [0.30, 0.20, 0.15, 0.18])  # +20%
    assert not real.passed and real.failing == [18432]
    assert real.allowance == pytest.approx([0.003, 0.002, 0.0015])
    # a fall never fails, however small the tolerance
    assert fvu_gate(WIDTHS, [0.30, 0.20, 0.15, 0.10], tolerance=0.0).passed


def test_a_rise_within_its_sampling_error_passes():
    """The allowance is the tolerance plus 1.645 SE: a rise 0.0004 over the tolerance passes
    with an SE of 0.0003 (lower bound 0.0020 − 0.0005 below 0.0016) and fails with 0.0002."""
    rise = HELD[3] - HELD[2]  # 0.0020, above 1% of 0.1604
    assert not fvu_gate(WIDTHS, HELD).passed
    noisy = {18432: 0.0003}
    gate = fvu_gate(WIDTHS, HELD, rise_se=noisy)
    assert gate.passed
    assert gate.allowance[-1] == pytest.approx(0.01 * HELD[2] + FVU_RISE_Z * 0.0003)
    assert rise > gate.allowance[-1] - FVU_RISE_Z * 0.0003  # the tolerance alone fails it
    assert not fvu_gate(WIDTHS, HELD, rise_se={18432: 0.0002}).passed


def test_a_growing_gap_is_data_limited_and_a_flat_gap_under_trained():
    # the committed run: train FVU keeps falling, the gap grows 0.017 -> 0.046
    grown = fvu_gate(WIDTHS, HELD, train_fvu=[0.163, 0.138, 0.124, 0.116])
    assert not grown.passed and grown.cause == "data_limited"
    assert grown.gap == pytest.approx([0.0167, 0.0266, 0.0364, 0.0464])
    assert "data-limited" in grown.reason and "more tokens" in grown.reason
    assert "0.0464" in grown.reason  # the gaps are in the words
    # the same held-out FVU with a flat gap: the widest SAE fits its training tokens worse too
    flat = fvu_gate(WIDTHS, HELD, train_fvu=[f - 0.02 for f in HELD])
    assert flat.cause == "under_trained" and "under-trained" in flat.reason
    assert flat.gap == pytest.approx([0.02] * 4)
    assert fvu_gate(WIDTHS, HELD).cause == "undiagnosed"
    # a passing gate has no cause, with or without the training FVU
    ok = fvu_gate(WIDTHS, [0.3, 0.2, 0.15, 0.1], train_fvu=[0.2, 0.1, 0.05, 0.01])
    assert ok.passed and ok.cause is None and ok.reason == ""


def test_unsorted_widths_are_ordered_with_their_fvu():
    order = [3, 0, 2, 1]
    gate = fvu_gate(
        [WIDTHS[i] for i in order], [HELD[i] for i in order],
        train_fvu=[[0.163, 0.138, 0.124, 0.116][i] for i in order],
    )  # fmt: skip
    assert gate.failing == [18432] and gate.cause == "data_limited"
    with pytest.raises(ValueError, match="one train FVU per width"):
        fvu_gate(WIDTHS, HELD, train_fvu=[0.1, 0.2])


def test_the_cause_reaches_the_sweep_the_claims_and_the_caveats():
    stats = _sweep_stats()
    held, train = {64: 0.30, 128: 0.20, 256: 0.25}, {64: 0.28, 128: 0.17, 256: 0.12}
    res = analyze_width_sweep(
        stats, WidthSweepConfig(n_bootstrap=0), heldout_fvu=held, train_fvu=train,
        fvu_rise_se={128: 0.001, 256: 0.002},
    )  # fmt: skip
    assert res.sweep_status == "not interpretable" and res.sweep_cause == "data_limited"
    assert res.fvu_monotone is False and res.fits == {} and math.isnan(res.kappa_hat)
    assert res.train_fvu == [0.28, 0.17, 0.12] and res.fvu_gap == pytest.approx([0.02, 0.03, 0.13])
    assert res.fvu_rise_se == {"128": 0.001, "256": 0.002}
    assert "data-limited" in res.kappa_hat_reason
    fit = _sweep_fit(res)
    claim = V.kappa_hat(fit, d=16)
    assert claim.verdict == "unidentified" and "data-limited" in claim.note
    assert claim.settings["sweep_cause"] == "data_limited"
    exact = SimpleNamespace(layer=1, n_vectors=8)  # what the claim reads of an exact κ
    assert "data-limited" in V.kappa_hat_vs_exact(fit, [exact]).note
    analysis = CausalAnalysis(
        protocol={}, d_model=16, kappa_fits=[], sweep_layer=1, sweep_fit=fit, sweep_not_run="",
        n_sae_train=1, n_sae_eval=1, kappa_windows_from_sae_training=0,
    )  # fmt: skip
    assert [c.kind for c in V.caveats(analysis)] == ["data_limited"]
    assert V.sweep_view(fit)["sweep_cause"] == "data_limited"
    # the same sweep whose train FVU rises with the held-out one is under-trained
    flat = analyze_width_sweep(
        stats, WidthSweepConfig(n_bootstrap=0), heldout_fvu=held,
        train_fvu={m: f - 0.02 for m, f in held.items()},
    )  # fmt: skip
    assert flat.sweep_cause == "under_trained"


def _sweep_fit(res):
    return SweepFit(**{f.name: getattr(res, f.name) for f in dataclasses.fields(res)}, layer=1)


def test_rise_standard_error_equals_the_jackknife_of_the_evaluated_fvu():
    """The per-block sums give the same delete-one-block jackknife as evaluating the SAEs
    on the kept prompts from scratch (an independent computation)."""
    torch.manual_seed(1)
    d, n_prompts, n_blocks = 8, 12, 5
    lengths = torch.randint(3, 9, (n_prompts,))
    ids = torch.repeat_interleave(torch.arange(n_prompts), lengths)
    x = torch.randn(int(lengths.sum()), d) + torch.randn(n_prompts, d)[ids]
    saes = {m: TopKSAE(d, m, k=3, seed=m) for m in (16, 32, 64)}
    batches = list(x.split(20))
    got = heldout_fvu_rise_se(saes, batches, list(ids.split(20)), n_blocks)
    block = ids % n_blocks
    for lo, hi in ((16, 32), (32, 64)):
        reps = []
        for b in range(n_blocks):
            kept = x[block != b]
            reps.append(evaluate_sae(saes[hi], kept).fvu - evaluate_sae(saes[lo], kept).fvu)
        reps = np.asarray(reps)
        se = math.sqrt((n_blocks - 1) / n_blocks * np.sum((reps - reps.mean()) ** 2))
        assert got[hi] == pytest.approx(se, rel=1e-4)
    assert set(got) == {32, 64}
    assert heldout_fvu_rise_se(saes, batches, [torch.zeros(len(b)) for b in batches], 4) == {}

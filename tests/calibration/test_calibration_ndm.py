"""The NDM calibrations plant subspace pairs of known mutual information (scoring the
estimator and threshold NDM's merge rounds use) and layer sweeps of known shares (scoring the
share sweep's layer rule)."""

from __future__ import annotations

import numpy as np
import pytest

from structlens.calibration.ndm import (
    PROTOCOL,
    calibrate_layer_rule,
    calibrate_merge,
    normalized_mi,
    planted_pair,
    planted_sweep_runs,
)


def test_the_planted_mutual_information_is_the_gaussian_closed_form():
    assert normalized_mi(0.0) == 0.0
    # threshold crossing: -¼ log(1 - ρ²) = 0.04 at ρ ≈ 0.385
    assert normalized_mi(0.385) == pytest.approx(0.0401, abs=2e-4)
    z = planted_pair(0.6, 3, 200_000, seed=0)
    c = np.corrcoef(z.T)
    np.testing.assert_allclose(np.diag(c[:3, 3:]), 0.6, atol=0.01)
    assert np.abs(c[:3, :3] - np.eye(3)).max() < 0.01
    with pytest.raises(ValueError, match="rho"):
        planted_pair(1.0, 2, 10, seed=0)


def test_independent_subspaces_are_not_merged_and_strong_dependence_is():
    null = calibrate_merge(0.0, 2, 15, first_seed=5)
    assert not null.expected and null.rate == 0.0 and abs(null.mean_estimate) < 0.01
    strong = calibrate_merge(0.7, 2, 15, first_seed=5)
    assert strong.expected and strong.rate == 1.0
    assert strong.mean_estimate == pytest.approx(strong.truth, rel=0.15)
    assert strong.seeds == (5, 19) and PROTOCOL.merge_threshold == 0.04


def test_the_estimate_falls_with_the_dimension_at_a_fixed_true_value():
    small = calibrate_merge(0.5, 2, 5, first_seed=5)
    large = calibrate_merge(0.5, 48, 5, first_seed=5)
    assert small.truth == large.truth
    assert large.mean_estimate < 0.5 * small.mean_estimate


def test_planted_patch_runs_share_the_prompt_factor_and_concentrate_ndm_only():
    from structlens.calibration.ndm import GINI_SUBSPACES, planted_patch_runs

    runs = planted_patch_runs(0.5, ("ndm", "pca"), 400, seed=0)
    ndm, pca = runs["ndm"].effects, runs["pca"].effects
    assert ndm.shape == pca.shape == (400, GINI_SUBSPACES)
    # the prompt factor is common: per-prompt totals of the two methods correlate
    assert np.corrcoef(ndm.sum(1), pca.sum(1))[0, 1] > 0.5
    share = ndm.mean(0)[0] / ndm.mean(0).sum()
    assert share == pytest.approx(0.5 + 0.5 * pca.mean(0)[0] / pca.mean(0).sum(), abs=0.05)


def test_the_gini_rule_finds_a_concentrated_ndm_and_holm_only_removes_rejections():
    """Known answer: with a fifth of the effect moved onto one subspace NDM beats every
    baseline in most instances; with none moved the adjusted rule never says "above"
    where the unadjusted one does not."""
    from structlens.calibration.ndm import calibrate_gini

    strong = calibrate_gini(0.2, 6, first_seed=0)
    assert strong.expected and strong.truth > 0.05 and strong.all_rate >= 0.5
    assert strong.rate >= strong.all_rate
    null = calibrate_gini(0.0, 6, first_seed=0)
    assert not null.expected and null.truth == 0.0 and null.rate <= null.raw_rate


def test_planted_sweeps_carry_the_planted_shares_and_share_the_prompt_noise():
    """Over many prompts each layer's measured share is its planted one; at ρ = 1 the
    layers' effects differ by exactly the planted gain per unit of clean metric."""
    from structlens.ndm.evaluate import whole_space_share

    runs = planted_sweep_runs([0.5, 0.5, 0.9], 0.5, 20_000, seed=1)
    assert [whole_space_share(r) for r in runs] == pytest.approx([0.5, 0.5, 0.9], abs=0.01)
    assert all(np.array_equal(r.clean_metric, runs[0].clean_metric) for r in runs)
    same = planted_sweep_runs([0.5, 0.7], 1.0, 24, seed=2)
    np.testing.assert_allclose(same[1].full_effect - same[0].full_effect,
                               0.2 * same[0].clean_metric)  # fmt: skip
    with pytest.raises(ValueError, match="rho"):
        planted_sweep_runs([0.5], 1.5, 4, seed=0)


def test_the_layer_rule_stays_without_a_better_layer_and_moves_for_a_clear_one():
    """The paired, Holm-adjusted rule leaves a flat sweep far less often than the
    one-standard-error rule alone, and moves for a gain of 0.4 every time."""
    flat = calibrate_layer_rule(0.0, 0.0, 60, first_seed=7)
    assert not flat.expected and flat.rate + flat.best_rate == pytest.approx(1.0)
    assert flat.rate <= 0.1 < 0.3 <= flat.raw_rate
    clear = calibrate_layer_rule(0.4, 0.5, 20, first_seed=7)
    assert clear.expected and clear.rate == clear.best_rate == 1.0

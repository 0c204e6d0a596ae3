"""The NDM merge-rule calibration plants subspace pairs of known mutual information and scores
the estimator and threshold NDM's merge rounds use."""

from __future__ import annotations

import numpy as np
import pytest

from structlens.calibration.ndm import PROTOCOL, calibrate_merge, normalized_mi, planted_pair


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

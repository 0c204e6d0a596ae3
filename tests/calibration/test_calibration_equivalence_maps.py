"""The layer-map calibration runs the production map choice, fit and criterion on planted
layer pairs whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import log_softmax, softmax

from structlens.calibration.equivalence_maps import (
    LAYER_WIDTH,
    PROTOCOL,
    calibrate_layer_map,
    planted_layers,
    planted_truth,
    validate_layer,
)


@pytest.mark.parametrize("relation", ["independent", "copy"])
def test_planted_layers_have_the_stated_covariance_and_noise_share(relation):
    """A's variances fall as 1/j (mean 1); B's layer has unit mean variance and the same
    covariance whether it depends on A's (η = 0) or not (η = 1); at η it differs from the
    planted map E[Y | X] by a share η of its variance, independent of A's layer."""
    rows = 20_000
    var = 1 / np.arange(1, LAYER_WIDTH + 1)
    var *= LAYER_WIDTH / var.sum()
    dependent = planted_layers(relation, 0.0, rows, 2)
    independent = planted_layers(relation, 1.0, rows, 2)
    eig = np.sort(np.linalg.eigvalsh(np.cov(dependent.x_fit.T)))[::-1]
    np.testing.assert_allclose(eig, var, rtol=0.1, atol=0.01)
    cov0, cov1 = np.cov(dependent.y_fit.T), np.cov(independent.y_fit.T)
    assert abs(np.trace(cov0) / LAYER_WIDTH - 1) < 0.05
    assert np.linalg.norm(cov0 - cov1) < 0.05 * np.linalg.norm(cov0)
    np.testing.assert_array_equal(dependent.y_held, dependent.planted)
    layers = planted_layers(relation, 0.1, rows, 2)
    rest = layers.y_held - layers.planted
    assert abs(rest.var(0).sum() / layers.y_held.var(0).sum() - 0.1) < 0.01
    assert np.abs(rest.T @ layers.x_held / rows).max() < 0.03


@pytest.mark.parametrize("relation", ["independent", "copy"])
def test_a_noiseless_map_always_passes_and_an_independent_layer_never(relation):
    """Known answers at the fewest fit rows the protocol accepts: a layer that is a linear
    map of A's passes (Procrustes recovers a copy's exactly; ridge's smallest penalty shrinks
    a little, which may flip a near-tied top-1 of a row); a layer independent of A's moves B's
    predictions by nats and fails."""
    rows = int(PROTOCOL.layer_map_rows_per_dim * LAYER_WIDTH)
    for seed in range(8):
        exact = validate_layer(planted_layers(relation, 0.0, rows, seed))
        assert exact.passed and exact.kl < 1e-4 and exact.top1 >= 0.99
        if relation == "copy":
            assert exact.kl < 1e-12 and exact.top1 == 1.0
        unrelated = validate_layer(planted_layers(relation, 1.0, rows, seed))
        assert not unrelated.passed and unrelated.kl > 1.0


def test_the_map_is_the_one_a_comparison_would_fit():
    """The protocol's choice: ridge for independent models on at least 10 fit rows per
    dimension and no map (the layer not validated) below; Procrustes for a copy. A
    calibration that would score unvalidated layers refuses."""
    rows = int(PROTOCOL.layer_map_rows_per_dim * LAYER_WIDTH)
    assert validate_layer(planted_layers("independent", 0.0, rows, 0)).method == "ridge"
    assert validate_layer(planted_layers("copy", 0.0, rows, 0)).method == "procrustes"
    short = validate_layer(planted_layers("independent", 0.0, rows - 1, 0))
    assert short.method is None and not short.passed and "not validated" in short.reason
    with pytest.raises(ValueError, match="do not give one layer map"):
        calibrate_layer_map("independent", 0.0, 9.0, 2)


def test_the_measured_kl_and_top1_agree_with_an_independent_computation():
    layers = planted_layers("independent", 0.03, 320, 4)
    check = validate_layer(layers)
    from structlens.equivalence.layer_map import fit_layer_map

    mapped = fit_layer_map(layers.x_fit, layers.y_fit, "ridge").apply(layers.x_held)
    ref, new = layers.y_held @ layers.readout, mapped @ layers.readout
    kl = np.mean(np.sum(softmax(ref, 1) * (log_softmax(ref, 1) - log_softmax(new, 1)), 1))
    assert check.kl == pytest.approx(kl, rel=1e-9)
    assert check.top1 == np.mean(ref.argmax(1) == new.argmax(1))
    assert check.passed == (kl <= PROTOCOL.max_kl and check.top1 >= PROTOCOL.min_top1)


def test_the_truth_is_exact_without_noise_and_degrades_with_it():
    """The planted map keeps B's predictions exactly at η = 0; its top-1 agreement falls as
    B's share of independent variance grows, and at η = 1 it fails the criterion."""
    assert planted_truth("independent", 0.0) == (pytest.approx(0.0, abs=1e-12), 1.0)
    top1 = [planted_truth("independent", eta)[1] for eta in (0.001, 0.01, 0.03, 1.0)]
    assert top1 == sorted(top1, reverse=True)
    kl, agree = planted_truth("independent", 1.0)
    assert kl > 1.0 and agree < PROTOCOL.min_top1

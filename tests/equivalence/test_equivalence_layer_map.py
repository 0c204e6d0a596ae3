"""Layer maps with more rows than dimensions, and decisions calibrated against a null."""

import numpy as np
import pytest

from structlens.equivalence import (
    decide_with_null,
    fit_layer_map,
    fit_linear_map,
    informative_heads,
)


def _r2(pred, y):
    """Variance-weighted R² of predictions ``pred`` of ``y``."""
    return 1.0 - np.sum((y - pred) ** 2) / np.sum((y - y.mean(0)) ** 2)


def _layer(rng, n, d):
    # anisotropic, like a residual stream
    return rng.standard_normal((n, d)) * np.exp(-np.arange(d) / 20.0) + 3.0


def test_identical_and_rotated_layers_map_exactly():
    rng = np.random.default_rng(0)
    d = 48
    fit, held = _layer(rng, 3 * d, d), _layer(rng, 200, d)
    q = np.linalg.qr(rng.standard_normal((d, d)))[0]
    for method in ("auto", "procrustes", "ridge"):
        same = fit_layer_map(fit, fit, method)
        rot = fit_layer_map(fit, fit @ q, method)
        assert _r2(held @ same.weight + same.bias, held) > 0.999
        assert _r2(held @ rot.weight + rot.bias, held @ q) > 0.999
    exact = fit_layer_map(fit, fit @ q)
    assert exact.method == "procrustes"
    np.testing.assert_allclose(exact.weight, q, atol=1e-8)
    np.testing.assert_allclose(held @ exact.weight + exact.bias, held @ q, atol=1e-8)


def test_too_few_rows_is_rejected_where_ridge_used_to_fail_silently():
    rng = np.random.default_rng(1)
    d = 96
    few, held = rng.standard_normal((40, d)), rng.standard_normal((200, d))
    # the old layer map: ridge on fewer rows than dimensions loses most held-out directions
    old = fit_linear_map(few, few, "ridge", alpha=1e-3)
    assert _r2(held @ old.weight + old.bias, held) < 0.5
    with pytest.raises(ValueError, match="more than 96 fit rows"):
        fit_layer_map(few, few)


def test_decisions_need_the_score_interval_above_the_null():
    assert decide_with_null(0.95, [0.85, 1.0], [0.0, 0.2])[0] == "equivalent"
    verdict, reason = decide_with_null(0.9, [0.7, 1.0], [0.6, 0.95])
    assert verdict == "unidentified" and "null" in reason
    assert decide_with_null(0.9, [0.7, 1.0], None)[0] == "not tested"
    assert decide_with_null(0.9, [0.7, 1.0], [float("nan")] * 2)[0] == "not tested"
    verdict, reason = decide_with_null(0.4, [0.3, 0.5], [0.0, 0.1], min_score=0.5)
    assert verdict == "unidentified" and "below" in reason


def test_informative_heads_are_the_top_kl_heads_whose_null_fails():
    kl = np.array([[0.01, 2.0, 0.5], [0.05, 0.3, 1.0]])
    pairs = [((0, h), (l, h)) for l in range(2) for h in range(3)]
    # KL by pair: 0.01, 2.0, 0.5, 0.05, 0.3, 1.0 -> above 0.1: 2.0, 1.0, 0.5, 0.3
    assert informative_heads(kl, pairs, 2) == [1, 5]
    assert informative_heads(kl, pairs, 10) == [1, 2, 4, 5]
    assert informative_heads(np.zeros((2, 3)), pairs, 3) == []

"""Layer maps with more rows than dimensions, chosen by how the models relate (Procrustes
for copies, an affine ridge map for independently trained models), and decisions calibrated
against a null."""

import numpy as np
import pytest

from structlens.equivalence import (
    choose_layer_map,
    decide_with_null,
    fit_layer_map,
    fit_linear_map,
    informative_heads,
)
from structlens.errors import InputError


def _r2(pred, y):
    """Variance-weighted R² of predictions ``pred`` of ``y``."""
    return 1.0 - np.sum((y - pred) ** 2) / np.sum((y - y.mean(0)) ** 2)


def _layer(rng, n, d):
    # anisotropic, like a residual stream
    return rng.standard_normal((n, d)) * np.exp(-np.arange(d) / 20.0) + 3.0


def test_identical_and_rotated_copies_map_exactly():
    rng = np.random.default_rng(0)
    d = 48
    fit, held = _layer(rng, 3 * d, d), _layer(rng, 200, d)
    q = np.linalg.qr(rng.standard_normal((d, d)))[0]
    for method in ("auto", "procrustes", "ridge"):
        same = fit_layer_map(fit, fit, method, relation="copy")
        rot = fit_layer_map(fit, fit @ q, method, relation="copy")
        assert _r2(held @ same.weight + same.bias, held) > 0.999
        assert _r2(held @ rot.weight + rot.bias, held @ q) > 0.999
    # a copy keeps Procrustes: the planted rotation exactly, from 3 rows per dimension
    exact = fit_layer_map(fit, fit @ q, relation="copy")
    assert exact.method == "procrustes"
    np.testing.assert_allclose(exact.weight, q, atol=1e-8)
    np.testing.assert_allclose(held @ exact.weight + exact.bias, held @ q, atol=1e-8)
    assert choose_layer_map(3 * d, d, d, relation="copy").method == "procrustes"


def _affine_pair(rng, n, d_a, d_b, noise=0.01):
    """Two layers related by a planted affine map ``y = x W + b`` (W neither orthogonal nor
    square) plus a little noise: what independently trained models may share."""
    w = rng.standard_normal((d_a, d_b)) * rng.uniform(0.2, 3.0, d_b)
    b = rng.standard_normal(d_b) * 5.0
    x = _layer(rng, n, d_a)
    return x, x @ w + b + noise * rng.standard_normal((n, d_b)), w, b


def test_ridge_recovers_a_planted_affine_map_between_independent_layers():
    rng = np.random.default_rng(2)
    d_a, d_b = 32, 24
    n = 12 * d_a  # enough rows per dimension for an affine map
    x, y, w, b = _affine_pair(rng, n, d_a, d_b)
    choice = choose_layer_map(n, d_a, d_b)  # relation "independent" by default
    assert (choice.method, choice.min_rows) == ("ridge", 10 * d_a)
    lmap = fit_layer_map(x, y)
    assert lmap.method == "ridge"
    # the planted slope and intercept (the penalty is negligible at this many rows)
    np.testing.assert_allclose(lmap.weight, w, atol=0.01 * np.abs(w).max())
    np.testing.assert_allclose(lmap.bias, b, atol=0.03 * np.abs(b).max())
    held, y_held, _, _ = _affine_pair(np.random.default_rng(2), 200, d_a, d_b)
    assert _r2(held @ lmap.weight + lmap.bias, y_held) > 0.999
    # a scaled orthogonal map cannot represent it: why independent models get ridge
    xs, ys, _, _ = _affine_pair(rng, n, d_a, d_a)
    ortho = fit_layer_map(xs, ys, "procrustes")
    ridge = fit_layer_map(xs, ys, "ridge")
    assert _r2(xs @ ortho.weight + ortho.bias, ys) < 0.9 < _r2(xs @ ridge.weight + ridge.bias, ys)


def test_layer_map_refusals_say_why():
    # independent models with fewer than 10 rows per dimension: no map, and the reason
    few = choose_layer_map(200, 32, 32)
    assert few.method is None and few.min_rows == 320 and "rows per dimension" in few.reason
    assert choose_layer_map(200, 32, 32, rows_per_dim=5).method == "ridge"
    # a copy needs only more rows than dimensions, and equal widths
    assert choose_layer_map(33, 32, 32, relation="copy").method == "procrustes"
    assert choose_layer_map(32, 32, 32, relation="copy").method is None
    with pytest.raises(InputError, match="equal width"):
        choose_layer_map(100, 32, 24, relation="copy")
    # an explicit map is used as asked
    assert choose_layer_map(40, 32, 32, "ridge").method == "ridge"
    with pytest.raises(InputError, match="relation must be one of"):
        choose_layer_map(100, 8, 8, relation="cousin")
    with pytest.raises(InputError, match="no layer map: independently trained"):
        fit_layer_map(*_affine_pair(np.random.default_rng(3), 100, 32, 32)[:2])


def test_too_few_rows_is_rejected_where_ridge_used_to_fail_silently():
    rng = np.random.default_rng(1)
    d = 96
    few, held = rng.standard_normal((40, d)), rng.standard_normal((200, d))
    # the old layer map: ridge on fewer rows than dimensions loses most held-out directions
    old = fit_linear_map(few, few, "ridge", alpha=1e-3)
    assert _r2(held @ old.weight + old.bias, held) < 0.5
    with pytest.raises(ValueError, match="more than 96 fit rows"):
        fit_layer_map(few, few, relation="copy")


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

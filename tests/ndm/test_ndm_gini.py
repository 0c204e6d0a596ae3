import numpy as np
import pytest

from structlens.stats.gini import (
    gini,
    gini_all,
    gini_dimension_normalized,
    gini_variance_normalized,
)


def _double_sum(x):
    x = np.abs(np.asarray(x, dtype=float))
    return np.abs(x[:, None] - x[None, :]).sum() / (2 * len(x) * x.sum())


def test_extremes():
    assert gini([3.0, 3.0, 3.0, 3.0]) == pytest.approx(0.0, abs=1e-15)
    assert gini([0.0, 0.0, -5.0, 0.0]) == pytest.approx(3 / 4)


def test_matches_definition(rng):
    for _ in range(5):
        x = rng.standard_normal(7)
        assert gini(x) == pytest.approx(_double_sum(x), abs=1e-12)
    assert gini([1, 2, 3, 4]) == pytest.approx(0.25)


def test_normalized_variants():
    dims = [64, 32, 32]
    # Effects proportional to dimension are not concentrated once normalised by dimension.
    assert gini_dimension_normalized([2.0, 1.0, 1.0], dims) == pytest.approx(0.0, abs=1e-15)
    assert gini([2.0, 1.0, 1.0]) > 0
    effects = np.array([5.0, 1.0, 0.5])
    shares = effects / effects.sum()
    assert gini_dimension_normalized(effects, dims) == pytest.approx(
        _double_sum(shares / (np.array(dims) / 128))
    )
    variances = [1.0, 3.0, 6.0]
    assert gini_variance_normalized(effects, variances) == pytest.approx(
        _double_sum(shares / (np.array(variances) / 10))
    )
    out = gini_all(effects, dims, variances)
    assert set(out) == {"unnormalized", "dimension", "variance"}


def test_bad_input():
    with pytest.raises(ValueError, match="all zero"):
        gini([0, 0])
    with pytest.raises(ValueError, match="NaN"):
        gini([1, np.nan])
    with pytest.raises(ValueError, match="one entry per value"):
        gini_dimension_normalized([1, 2], [1, 2, 3])


def test_gini_rows_equal_the_one_row_functions_and_mark_a_zero_row():
    from structlens.stats.gini import gini_rows

    rng = np.random.default_rng(5)
    x = rng.standard_normal((30, 6))
    x[3] = 0.0
    dims, var = [1, 2, 3, 1, 4, 5], rng.uniform(0.5, 2.0, 6)
    for weights, one in ((None, gini), (dims, lambda r: gini_dimension_normalized(r, dims)),
                         (var, lambda r: gini_variance_normalized(r, var))):  # fmt: skip
        got = gini_rows(x, weights)
        assert np.isnan(got[3])
        np.testing.assert_allclose(np.delete(got, 3), [one(r) for r in np.delete(x, 3, 0)])
    with pytest.raises(ValueError, match="n_rows"):
        gini_rows(x[0])

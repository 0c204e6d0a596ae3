"""Holm and Benjamini–Hochberg: the rejections equal the sequential procedures that define
them, BH's adjusted p-values equal SciPy's, the order of the tests does not matter, and on
planted families Holm holds the family-wise error and BH the false-discovery rate where
testing each at α does not."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from structlens.stats.multiplicity import adjust, benjamini_hochberg, holm


def holm_sequential(p, alpha):
    """Holm (1979) as stated: reject the smallest while p_(i) <= alpha / (m - i + 1)."""
    order = np.argsort(p, kind="stable")
    rejected = np.zeros(len(p), bool)
    for i, k in enumerate(order):
        if p[k] > alpha / (len(p) - i):
            break
        rejected[k] = True
    return rejected


def bh_step_up(p, alpha):
    """Benjamini–Hochberg (1995) as stated: reject the k smallest, k the largest index with
    p_(k) <= k alpha / m."""
    order = np.argsort(p, kind="stable")
    below = np.nonzero(p[order] <= alpha * np.arange(1, len(p) + 1) / len(p))[0]
    rejected = np.zeros(len(p), bool)
    if below.size:
        rejected[order[: below[-1] + 1]] = True
    return rejected


@pytest.mark.parametrize("m", [1, 2, 3, 7, 40])
def test_rejections_equal_the_defining_procedures(m):
    rng = np.random.default_rng(m)
    for _ in range(200):
        p = rng.beta(0.3, 1.0, size=m)  # many small p-values, some ties at rounding
        p = np.round(p, 3)
        for alpha in (0.01, 0.05, 0.2):
            assert holm(p, alpha).rejected == tuple(holm_sequential(p, alpha))
            assert benjamini_hochberg(p, alpha).rejected == tuple(bh_step_up(p, alpha))


def test_bh_adjusted_p_values_equal_scipy():
    rng = np.random.default_rng(1)
    p = rng.uniform(size=50) ** 2
    np.testing.assert_allclose(
        benjamini_hochberg(p).adjusted, stats.false_discovery_control(p, method="bh"), rtol=1e-12
    )


def test_adjusted_values_follow_the_tests_when_reordered():
    rng = np.random.default_rng(2)
    p = rng.uniform(size=12)
    perm = rng.permutation(12)
    for method in ("holm", "bh"):
        a, b = adjust(p, method), adjust(p[perm], method)
        np.testing.assert_array_equal(np.asarray(a.adjusted)[perm], b.adjusted)
        assert all(x >= y * (1 - 1e-12) for x, y in zip(a.adjusted, a.p_values, strict=True))


def equicorrelated_p_values(rng, m, rho, effects):
    """One-sided p-values of m z-tests sharing a common factor of correlation rho; test i
    has mean effects[i] (0: a true null)."""
    z = np.sqrt(rho) * rng.standard_normal() + np.sqrt(1 - rho) * rng.standard_normal(m)
    return stats.norm.sf(z + effects)


def test_holm_holds_the_family_wise_error_where_raw_tests_do_not():
    rng = np.random.default_rng(3)
    n, m, alpha = 4000, 10, 0.05
    any_holm = any_raw = 0
    for _ in range(n):
        p = equicorrelated_p_values(rng, m, 0.3, np.zeros(m))
        any_holm += holm(p, alpha).any_rejected
        any_raw += bool((p <= alpha).any())
    # Monte-Carlo standard error of a rate near 0.05 at n = 4000 is 0.0034
    assert any_holm / n <= alpha + 0.012
    assert any_raw / n > 2 * alpha


def test_bh_holds_the_false_discovery_rate_with_some_true_effects():
    rng = np.random.default_rng(4)
    n, m, alpha = 3000, 20, 0.1
    effects = np.r_[np.full(5, 3.0), np.zeros(15)]
    fdp, power = [], []
    for _ in range(n):
        p = equicorrelated_p_values(rng, m, 0.0, effects)
        r = np.asarray(benjamini_hochberg(p, alpha).rejected)
        fdp.append(r[5:].sum() / max(r.sum(), 1))
        power.append(r[:5].mean())
    # BH's FDR is m0/m * alpha = 0.075 for independent tests
    assert np.mean(fdp) <= 0.075 + 0.01
    assert np.mean(power) > 0.7


def test_bad_input_says_what_to_do():
    with pytest.raises(ValueError, match="drop the tests"):
        holm([0.1, float("nan")])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        benjamini_hochberg([1.2])
    with pytest.raises(ValueError, match="alpha"):
        holm([0.1], alpha=0)
    with pytest.raises(ValueError, match="holm, bh"):
        adjust([0.1], "bonferroni")
    assert holm([]).rejected == () and not holm([]).any_rejected

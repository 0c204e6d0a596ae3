"""Confidence intervals against closed forms and independent computations."""

import math
from statistics import NormalDist

import numpy as np
import pytest
import torch

from structlens.errors import InputError
from structlens.stats.intervals import (
    bootstrap_distribution,
    bootstrap_interval,
    group_jackknife,
    jackknife,
    leave_one_group_out_means,
    paired_bootstrap_interval,
    percentile_interval,
    t_interval,
    wilson_interval,
)


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (10, 10), (517, 1000)])
def test_wilson_solves_its_defining_quadratic(k, n):
    # the Wilson bounds are the p with |p̂ − p| = z sqrt(p(1 − p)/n)
    z = NormalDist().inv_cdf(0.975)
    lo, hi = wilson_interval(k, n)
    for p in (lo, hi):
        assert (k / n - p) ** 2 == pytest.approx(z * z * p * (1 - p) / n, abs=1e-14)
    assert 0.0 <= lo <= k / n <= hi <= 1.0
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(11, 10)
    with pytest.raises(ValueError, match="confidence"):
        wilson_interval(1, 10, confidence=1.0)


def test_t_interval_is_the_classical_one(rng):
    x = rng.normal(size=12)
    lo, hi = t_interval(x, 0.95)
    # t_{0.975, 11} = 2.20098516 (tables, 9 digits)
    half = 2.20098516 * x.std(ddof=1) / math.sqrt(12)
    assert lo == pytest.approx(x.mean() - half, rel=1e-8)
    assert hi == pytest.approx(x.mean() + half, rel=1e-8)


def test_percentile_bootstrap_of_the_mean_uses_the_documented_resamples(rng):
    x = rng.exponential(size=40)
    lo, hi = bootstrap_interval(x, 0.9, 500, seed=3)
    idx = np.random.default_rng(3).integers(0, 40, size=(500, 40))
    means = x[idx].mean(axis=1)
    assert (lo, hi) == (np.quantile(means, 0.05), np.quantile(means, 1 - 0.05))
    # the loop path gives the same numbers as the vectorised one
    loop = bootstrap_distribution(
        x, lambda s: float(np.mean(s)), n_boot=500, seed=3, vectorized=False
    )
    np.testing.assert_allclose(loop, means, rtol=1e-14)


def test_percentile_interval_drops_non_finite_samples():
    s = np.r_[np.arange(101.0), np.nan, np.inf]
    assert percentile_interval(s, 0.9) == pytest.approx((5.0, 95.0))
    lo, hi = percentile_interval(np.c_[np.arange(101.0), 2 * np.arange(101.0)], 0.9)
    np.testing.assert_allclose(lo, [5.0, 10.0])
    np.testing.assert_allclose(hi, [95.0, 190.0])


def test_bca_equals_percentile_for_a_symmetric_unbiased_case():
    # data symmetric about its mean: no bias (z0 ≈ 0) and no skew (acceleration 0)
    x = np.r_[-np.arange(1.0, 31.0), np.arange(1.0, 31.0)]
    j = jackknife(x)
    assert float(j.bias) == pytest.approx(0.0, abs=1e-12)
    bca = bootstrap_interval(x, n_boot=4000, seed=1, method="bca")
    pct = bootstrap_interval(x, n_boot=4000, seed=1)
    assert bca == pytest.approx(pct, abs=0.15)


def test_bca_shifts_towards_the_skew(rng):
    # for a right-skewed sample BCa moves both ends up relative to the percentile interval
    x = rng.lognormal(sigma=1.2, size=60)
    lo_p, hi_p = bootstrap_interval(x, n_boot=4000, seed=0)
    lo_b, hi_b = bootstrap_interval(x, n_boot=4000, seed=0, method="bca")
    assert lo_b > lo_p and hi_b > hi_p


def test_paired_bootstrap_resamples_rows_together(rng):
    a = rng.normal(size=50)
    b = a + 0.1 + 0.01 * rng.normal(size=50)  # strongly paired
    lo, hi = paired_bootstrap_interval(b, a, n_boot=1000, seed=0)
    assert lo < 0.1 + 0.01 < hi or lo < 0.1 < hi
    assert hi - lo < 0.02  # unpaired resampling would give a width ~ 2·1.96·sqrt(2/50) ≈ 0.8
    diff = bootstrap_interval(b - a, n_boot=1000, seed=0)
    assert (lo, hi) == pytest.approx(diff, abs=1e-12)


def test_jackknife_of_the_mean_is_the_t_interval_standard_error(rng):
    x = rng.normal(size=25) * 3 + 1
    j = jackknife(x)
    assert float(j.estimate) == pytest.approx(x.mean(), rel=1e-14)
    assert float(j.se) == pytest.approx(x.std(ddof=1) / math.sqrt(25), rel=1e-12)
    assert float(j.bias) == pytest.approx(0.0, abs=1e-12)
    lo, hi = j.interval(0.95)
    z = NormalDist().inv_cdf(0.975)
    assert (float(lo), float(hi)) == pytest.approx((x.mean() - z * j.se, x.mean() + z * j.se))


def test_jackknife_removes_the_bias_of_the_plugin_variance(rng):
    # the biased variance (ddof 0) has bias −σ²/n; the jackknife-corrected one is exactly ddof 1
    x = rng.normal(size=30)
    j = jackknife(x, np.var)
    assert float(j.bias_corrected) == pytest.approx(x.var(ddof=1), rel=1e-12)


def test_group_jackknife_of_the_mean_is_the_classical_t_interval(rng):
    # delete-one: the SE of the mean is exactly s / sqrt(n), its bias 0, and the
    # bias-corrected t interval with n − 1 degrees of freedom is the textbook t interval
    x = rng.normal(size=20) * 2 + 5
    loo = (x.sum() - x) / (x.size - 1)
    j = group_jackknife(x.mean(), loo)
    assert j.n == 20
    assert float(j.se) == pytest.approx(x.std(ddof=1) / math.sqrt(20), rel=1e-12)
    assert float(j.bias_corrected) == pytest.approx(x.mean(), rel=1e-14)
    lo, hi = j.interval(0.9, distribution="t")
    assert (float(lo), float(hi)) == pytest.approx(t_interval(x, 0.9), rel=1e-12)
    lo, hi = j.interval(0.9, distribution="t", centre="estimate")
    assert (float(lo) + float(hi)) / 2 == pytest.approx(x.mean(), rel=1e-15)
    # jackknife() is the delete-one case
    assert float(jackknife(x).se) == pytest.approx(float(j.se), rel=1e-14)


def test_delete_a_group_jackknife_of_the_mean_is_the_se_of_the_group_means(rng):
    x = rng.normal(size=24)
    groups = x.reshape(6, 4)
    reps = leave_one_group_out_means(groups.sum(1), np.full(6, 4.0))
    g = group_jackknife(x.mean(), np.array(reps))
    assert g.n == 6
    assert float(g.se) == pytest.approx(groups.mean(1).std(ddof=1) / math.sqrt(6), rel=1e-12)
    # deviations about the estimate are never smaller than about the replicates' mean
    uneven = leave_one_group_out_means(
        np.array([x[:3].sum(), x[3:10].sum(), x[10:].sum()]), np.array([3.0, 7.0, 14.0])
    )
    about_mean = group_jackknife(x.mean(), uneven)
    about_estimate = group_jackknife(x.mean(), uneven, about="estimate")
    assert float(about_estimate.se) >= float(about_mean.se) > 0
    np.testing.assert_array_equal(about_estimate.bias_corrected, about_mean.bias_corrected)


def test_leave_one_group_out_means_skip_empty_groups_for_numpy_and_torch():
    sums = np.array([[3.0, 1.0], [0.0, 0.0], [7.0, 5.0]])
    counts = np.array([1.0, 0.0, 2.0])
    expected = [[3.5, 2.5], [3.0, 1.0]]  # (10 − 3)/2, (6 − 1)/2; (10 − 7)/1, (6 − 5)/1
    np.testing.assert_array_equal(leave_one_group_out_means(sums, counts), expected)
    as_torch = leave_one_group_out_means(torch.from_numpy(sums), torch.from_numpy(counts))
    assert all(isinstance(m, torch.Tensor) for m in as_torch)
    np.testing.assert_array_equal(torch.stack(as_torch).numpy(), expected)
    assert leave_one_group_out_means(sums[:2], counts[:2]) == []  # one filled group


def test_group_jackknife_bad_input():
    with pytest.raises(InputError, match="at least 2 groups"):
        group_jackknife(1.0, [2.0])
    with pytest.raises(InputError, match="per group"):
        group_jackknife(1.0, np.ones((3, 2)))
    with pytest.raises(InputError, match="about"):
        group_jackknife(1.0, [1.0, 2.0], about="median")  # type: ignore[arg-type]
    j = group_jackknife(1.0, [1.0, 2.0])
    with pytest.raises(InputError, match="distribution"):
        j.interval(distribution="laplace")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="confidence"):
        j.interval(1.5, distribution="t")

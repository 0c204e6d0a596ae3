"""The jackknife of a bias-corrected jackknife estimate: known answers and a brute force."""

from __future__ import annotations

import numpy as np
import pytest

from structlens.errors import InputError
from structlens.stats.intervals import bias_corrected_jackknife, group_jackknife


def _rows(x: np.ndarray):
    """Every row its own group: the sums and counts the jackknife takes."""
    return x, np.ones(len(x))


def _corrected(x: np.ndarray, stat) -> float:
    """The delete-one bias-corrected estimate, written out."""
    n = len(x)
    loo = [stat(np.delete(x, i).mean()) for i in range(n)]
    return n * stat(x.mean()) - (n - 1) * float(np.mean(loo))


def test_the_square_of_the_mean_is_corrected_to_its_unbiased_estimate():
    """Known answer: the jackknife removes the bias of x̄² exactly, leaving x̄² − s²/n."""
    x = np.random.default_rng(0).normal(1.0, 2.0, 15)
    r = bias_corrected_jackknife(*_rows(x), lambda m: m**2)
    want = x.mean() ** 2 - x.var(ddof=1) / len(x)
    assert float(r.bias_corrected) == pytest.approx(want, rel=1e-10)
    assert float(r.estimate) == pytest.approx(x.mean() ** 2)


def test_se_is_the_jackknife_of_the_corrected_estimate_by_brute_force():
    x = np.random.default_rng(1).exponential(1.0, 12)

    def stat(m):
        return np.log(m)

    r = bias_corrected_jackknife(*_rows(x), stat)
    reps = np.array([_corrected(np.delete(x, i), stat) for i in range(len(x))])
    want = group_jackknife(_corrected(x, stat), reps).se
    assert float(r.se) == pytest.approx(float(want), rel=1e-10) and r.n == len(x)
    # the corrected estimate varies more than the plain one whose spread the plain jackknife gives
    plain = group_jackknife(stat(x.mean()), [stat(np.delete(x, i).mean()) for i in range(12)])
    assert float(r.se) > float(plain.se)


def test_groups_and_blocks():
    x = np.arange(40, dtype=float).reshape(20, 2)
    groups = np.array([i % 10 for i in range(20)])
    sums = np.stack([x[groups == g].sum(0) for g in range(10)])
    r = bias_corrected_jackknife(sums, np.full(10, 2.0), lambda m: m, max_blocks=4)
    assert r.n == 4 and r.se.shape == (2,)
    np.testing.assert_allclose(r.bias_corrected, x.mean(0))
    with pytest.raises(InputError, match="3 groups"):
        bias_corrected_jackknife(sums[:2], np.full(2, 2.0), lambda m: m)
    with pytest.raises(InputError, match="one count per group"):
        bias_corrected_jackknife(sums, np.ones(3), lambda m: m)
    with pytest.raises(InputError, match="empty"):
        bias_corrected_jackknife(sums, np.r_[0.0, np.ones(9)], lambda m: m)


def test_unequal_groups_weight_the_pooled_mean_by_their_rows():
    """The statistic sees the pooled mean of the rows, not the mean of the group means."""
    rng = np.random.default_rng(3)
    sizes = [1, 4, 2, 7, 3]
    x = [rng.normal(size=k) for k in sizes]
    sums, counts = np.array([v.sum() for v in x]), np.array(sizes, dtype=float)
    r = bias_corrected_jackknife(sums, counts, lambda m: m**2)
    pooled = np.concatenate(x)
    assert float(r.estimate) == pytest.approx(pooled.mean() ** 2)
    loo = [np.concatenate(x[:g] + x[g + 1 :]).mean() ** 2 for g in range(5)]
    assert float(r.bias_corrected) == pytest.approx(5 * pooled.mean() ** 2 - 4 * np.mean(loo))


def test_the_result_does_not_depend_on_the_lanes(monkeypatch):
    """The block replicates run in lanes; any number of them gives the same numbers."""
    import structlens.stats.intervals as iv

    rng = np.random.default_rng(4)
    sums, counts = rng.normal(size=(9, 3)), rng.integers(1, 4, 9).astype(float)
    got = []
    for lanes in (1, 2, 5):
        monkeypatch.setattr(iv, "lane_budget", lambda lanes=lanes: lanes)
        got.append(bias_corrected_jackknife(sums, counts, lambda m: m**2, max_blocks=7))
    for r in got[1:]:
        np.testing.assert_array_equal(r.se, got[0].se)
        np.testing.assert_array_equal(r.bias_corrected, got[0].bias_corrected)

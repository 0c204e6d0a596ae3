"""McNemar's exact test against SciPy and its size on planted paired data; the cluster
bootstrap of a pooled rate against the pooled Wilson interval on clustered data."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from structlens.errors import InputError
from structlens.stats.intervals import (
    cluster_bootstrap_ratio_interval,
    mcnemar_exact,
    wilson_interval,
)


@pytest.mark.parametrize(("b", "c"), [(0, 0), (1, 0), (0, 5), (9, 1), (7, 7), (3, 12), (40, 25)])
def test_mcnemar_exact_is_the_binomial_test_on_the_discordant_pairs(b, c):
    n = b + c
    if n == 0:
        assert mcnemar_exact(b, c) == 1.0
        return
    ref = scipy.stats.binomtest(b, n, 0.5)
    assert mcnemar_exact(b, c) == pytest.approx(ref.pvalue, rel=1e-12)
    greater = scipy.stats.binomtest(b, n, 0.5, alternative="greater").pvalue
    less = scipy.stats.binomtest(b, n, 0.5, alternative="less").pvalue
    assert mcnemar_exact(b, c, "greater") == pytest.approx(greater, rel=1e-12)
    assert mcnemar_exact(b, c, "less") == pytest.approx(less, rel=1e-12)
    assert mcnemar_exact(b, c) == mcnemar_exact(c, b)  # symmetric


def test_mcnemar_exact_bad_input():
    with pytest.raises(InputError, match="non-negative"):
        mcnemar_exact(-1, 3)
    with pytest.raises(InputError, match="alternative"):
        mcnemar_exact(1, 3, "both")  # type: ignore[arg-type]


def _paired(rng, n, shift):
    """Per-unit pass/fail under two conditions sharing a unit effect (a paired design)."""
    z = rng.normal(0.0, 1.5, n)
    return rng.random(n) < 1 / (1 + np.exp(-(z + shift))), rng.random(n) < 1 / (1 + np.exp(-z))


def test_mcnemar_size_is_at_most_alpha_and_it_has_power():
    rng = np.random.default_rng(0)
    n_sims, alpha = 2000, 0.05
    rejects = {0.0: 0, 1.5: 0}
    for shift in rejects:
        for _ in range(n_sims):
            a, b = _paired(rng, 60, shift)
            rejects[shift] += mcnemar_exact(int(np.sum(a & ~b)), int(np.sum(~a & b))) < alpha
    size, power = rejects[0.0] / n_sims, rejects[1.5] / n_sims
    # exact: the size never exceeds alpha (up to Monte Carlo error, sd ≈ 0.005)
    assert size <= alpha + 0.01, size
    assert power >= 0.8, power


def test_cluster_bootstrap_covers_a_pooled_rate_where_pooled_wilson_does_not():
    """Pass rates vary between clusters (model pairs); pooling their units as independent
    gives a Wilson interval far too narrow, resampling clusters covers at about nominal."""
    rng = np.random.default_rng(1)
    n_clusters, size, truth = 10, 30, 0.5
    covered = {"cluster": 0, "wilson": 0}
    n_sets = 300
    for i in range(n_sets):
        rate = 1 / (1 + np.exp(-rng.normal(0.0, 1.0, n_clusters)))  # E[rate] = 0.5
        k = rng.binomial(size, rate)
        lo, hi = cluster_bootstrap_ratio_interval(k, np.full(n_clusters, size), n_boot=400, seed=i)
        covered["cluster"] += lo <= truth <= hi
        wlo, whi = wilson_interval(int(k.sum()), n_clusters * size)
        covered["wilson"] += wlo <= truth <= whi
    rates = {k: v / n_sets for k, v in covered.items()}
    assert rates["cluster"] >= 0.85, rates  # 10 clusters: a little under nominal
    assert rates["wilson"] <= 0.6, rates


def test_cluster_bootstrap_examples_and_bad_input():
    lo, hi = cluster_bootstrap_ratio_interval([2, 8], [10, 10], n_boot=2000)
    assert 0.2 <= lo <= 0.5 <= hi <= 0.8  # resampled rates: 4/20, 10/20 or 16/20
    assert cluster_bootstrap_ratio_interval([3, 3, 3], [6, 6, 6]) == (0.5, 0.5)
    with pytest.raises(InputError, match="at least 2 clusters"):
        cluster_bootstrap_ratio_interval([3], [6])
    with pytest.raises(InputError, match="align"):
        cluster_bootstrap_ratio_interval([3, 4], [6])
    with pytest.raises(InputError, match="totals > 0"):
        cluster_bootstrap_ratio_interval([3, 0], [6, 0])
    with pytest.raises(InputError, match="totals > 0"):
        cluster_bootstrap_ratio_interval([7, 1], [6, 2])


def test_sign_flip_exact_agrees_with_enumerating_every_sign_pattern():
    import itertools

    from structlens.stats.intervals import sign_flip_exact

    rng = np.random.default_rng(0)
    for _ in range(20):
        d = rng.integers(-3, 4, size=int(rng.integers(1, 9)))
        patterns = list(itertools.product((-1, 1), repeat=len(d)))
        want = sum(abs(np.dot(s, d)) >= abs(d.sum()) for s in patterns) / len(patterns)
        assert sign_flip_exact(d) == pytest.approx(want)
    with pytest.raises(InputError, match="integers"):
        sign_flip_exact([0.5, 1.0])

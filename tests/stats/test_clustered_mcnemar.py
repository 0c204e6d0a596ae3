"""McNemar's test for clustered matched pairs: known identities, a hand-computed table, and
its level on planted clustered nulls."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from structlens.errors import InputError
from structlens.stats.intervals import clustered_mcnemar, sign_flip_exact


@pytest.mark.parametrize(("b", "c"), [(9, 1), (4, 6), (12, 0), (1, 0), (7, 7)])
def test_one_unit_per_cluster_gives_mcnemars_statistic(b, c):
    partner = np.array([1] * b + [0] * c)
    null = 1 - partner
    stat, _ = clustered_mcnemar(partner, null)
    assert stat == pytest.approx((b - c) ** 2 / (b + c), rel=1e-12)


def test_a_small_table_by_hand():
    """d = b − c = (2, 0, −1, 3): X² = 4² / 14, and the p-value is the one-sample t test of
    the four d's against 0 (t² = (K − 1) X² / (K − X²) = 1.2), computed by SciPy."""
    b, c = [2, 1, 0, 3], [0, 1, 1, 0]
    stat, p = clustered_mcnemar(b, c)
    assert stat == pytest.approx(16 / 14)
    d = np.subtract(b, c)
    ref = stats.ttest_1samp(d, 0.0)
    assert ref.statistic**2 == pytest.approx(1.2)
    assert p == pytest.approx(ref.pvalue, rel=1e-10)


def test_clusters_without_spread_fall_back_to_the_exact_sign_flip_test():
    stat, p = clustered_mcnemar([3, 3, 3, 3], [0, 0, 0, 0])
    assert stat == pytest.approx(4.0) and p == sign_flip_exact([3, 3, 3, 3]) == 2 / 16
    assert clustered_mcnemar([0, 0], [0, 0]) == (0.0, 1.0)
    assert clustered_mcnemar([2], [0])[1] == 1.0  # one cluster decides nothing
    with pytest.raises(InputError):
        clustered_mcnemar([1, 2], [1])
    with pytest.raises(InputError):
        clustered_mcnemar([-1, 2], [1, 0])


def _planted(rng, k, m, share):
    """Per-layer discordant counts of ``k`` layers of ``m`` heads; partner and null pass with
    0.3, each head following its layer's draw with probability ``share``."""
    layer_p, layer_n = rng.random(k) < 0.3, rng.random(k) < 0.3
    own_p, own_n = rng.random((k, m)) < 0.3, rng.random((k, m)) < 0.3
    follow_p, follow_n = rng.random((k, m)) < share, rng.random((k, m)) < share
    partner = np.where(follow_p, layer_p[:, None], own_p)
    null = np.where(follow_n, layer_n[:, None], own_n)
    return (partner & ~null).sum(1), (~partner & null).sum(1)


@pytest.mark.parametrize("k", [4, 10])
@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_level_on_planted_clustered_nulls(k, share):
    """Heads independent, half-shared or sharing their layer's fate: the two-sided test at
    0.05 rejects in no more than 5% of 1000 nulls (a one-sided binomial test at 0.01).
    McNemar's exact test over heads, for contrast, does not hold its level once the heads
    share their layer's fate."""
    rng = np.random.default_rng(20_000 + k)
    clustered = heads = 0
    n = 1000
    for _ in range(n):
        b, c = _planted(rng, k, 3, share)
        clustered += clustered_mcnemar(b, c)[1] < 0.05
        discordant = int(b.sum() + c.sum())
        heads += discordant > 0 and stats.binomtest(int(b.sum()), discordant).pvalue < 0.05
    assert stats.binomtest(clustered, n, 0.05, alternative="greater").pvalue > 0.01
    if share == 1.0:
        assert heads / n > 0.1

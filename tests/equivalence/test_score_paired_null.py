"""The matched verdict is a paired test of partner against null on the same heads.

Planted heads share an "easiness" that makes both the partner and the null pass more often
(the outcomes are paired and dependent).  With equal pass rates McNemar's exact test calls
"equivalent" at most at its level; with a planted difference it has power where comparing the
two Wilson intervals as if independent (the old rule) rarely decides.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from structlens.equivalence import decide_paired_null, decide_with_null
from structlens.equivalence.score import wilson_interval
from structlens.stats.intervals import mcnemar_exact


def _heads(rng, n, shift):
    z = rng.normal(0.0, 1.5, n)  # per-head easiness, shared by partner and null
    partner = rng.random(n) < 1 / (1 + np.exp(-(z + shift)))
    null = rng.random(n) < 1 / (1 + np.exp(-z))
    return partner, null


def test_false_positive_rate_is_at_most_alpha_on_equal_pass_rates():
    rng = np.random.default_rng(0)
    n_sims, alpha = 2000, 0.05
    calls = 0
    for _ in range(n_sims):
        partner, null = _heads(rng, 40, 0.0)
        calls += decide_paired_null(partner, null, alpha=alpha).verdict == "equivalent"
    assert calls / n_sims <= alpha, calls / n_sims  # exact, two-sided, one direction


def test_paired_test_has_power_where_the_interval_overlap_rule_does_not():
    rng = np.random.default_rng(1)
    n_sims, paired, overlap = 500, 0, 0
    for _ in range(n_sims):
        partner, null = _heads(rng, 60, 1.5)
        paired += decide_paired_null(partner, null).verdict == "equivalent"
        k, kn = int(partner.sum()), int(null.sum())
        verdict, _ = decide_with_null(k / 60, wilson_interval(k, 60), wilson_interval(kn, 60))
        overlap += verdict == "equivalent"
    assert paired / n_sims >= 0.75, paired / n_sims
    # the interval rule ignores the pairing and loses a third of the detections or more
    assert overlap / n_sims <= paired / n_sims - 0.2, (overlap / n_sims, paired / n_sims)


def test_decision_counts_reasons_and_gates():
    partner = [True] * 8 + [False, True]
    null = [False] * 8 + [True, True]
    d = decide_paired_null(partner, null)
    assert (d.partner_only, d.null_only, d.both, d.neither) == (8, 1, 1, 0)
    assert d.n_heads == 10 and d.score == 0.9 and d.null_score == 0.2
    assert d.p_value == mcnemar_exact(8, 1) and d.verdict == "equivalent"
    assert "8 of 10" in d.reason and "McNemar" in d.reason
    # below the required score: unidentified although the test passes
    low = decide_paired_null(partner, null, min_score=0.95)
    assert low.verdict == "unidentified" and "below the required" in low.reason
    # more null-only than partner-only heads never decides, however small p is
    rev = decide_paired_null(null, partner)
    assert rev.verdict == "unidentified" and rev.partner_only == 1 and rev.null_only == 8
    # concordant heads carry no information: all pass under both
    same = decide_paired_null([True] * 20, [True] * 20)
    assert same.verdict == "unidentified" and same.p_value == 1.0
    none = decide_paired_null(partner, None)
    assert none.verdict == "not tested" and "no null" in none.reason
    assert np.isnan(none.p_value)
    assert decide_paired_null(np.array([1, 0, 1]), np.array([0, 0, 0])).partner_only == 2


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="same order"):
        decide_paired_null([True, False], [True])
    with pytest.raises(ValueError, match="non-empty 1-D"):
        decide_paired_null([], [])
    with pytest.raises(ValueError, match="booleans"):
        decide_paired_null([0.5, 1.0], [True, False])
    with pytest.raises(ValueError, match="alpha"):
        decide_paired_null([True], [False], alpha=0.0)


def test_pooled_scores_resample_model_pairs():
    from structlens.equivalence.verdicts import pooled_interval

    (lo, hi), how = pooled_interval([5], [10])
    assert how == "Wilson, one pair" and (lo, hi) == wilson_interval(5, 10)
    # two pairs (a third without validated heads drops out): the pairs are the units, so
    # the interval spans their disagreement instead of shrinking with the head count
    (lo, hi), how = pooled_interval([20, 80, 0], [100, 100, 0])
    assert how == "cluster bootstrap over 2 pairs"
    wlo, whi = wilson_interval(100, 200)
    assert lo < wlo and hi > whi and 0.2 <= lo <= 0.5 <= hi <= 0.8


def test_clusters_make_the_layer_the_unit():
    """One cluster per head is McNemar's exact test; with layers as clusters the variance of
    b − c is estimated over the four layers (d = 3, 3, 3, 0: t = 3 on 3 degrees of freedom)."""
    partner = [True] * 9 + [False] * 3
    null = [False] * 12
    heads = decide_paired_null(partner, null)
    singletons = decide_paired_null(partner, null, clusters=range(12))
    assert singletons.p_value == pytest.approx(heads.p_value) and singletons.n_clusters == 12
    assert singletons.test == heads.test and "McNemar exact" in heads.test
    layers = decide_paired_null(partner, null, clusters=[i // 3 for i in range(12)])
    assert layers.n_clusters == 4 and "clustered McNemar over 4 clusters" in layers.test
    assert layers.p_value == pytest.approx(2 * stats.t.sf(3.0, 3))
    assert heads.verdict == "equivalent" and layers.verdict == "unidentified"
    with pytest.raises(ValueError, match="one per component"):
        decide_paired_null(partner, null, clusters=[0, 1])


def test_component_clusters_read_model_bs_layer():
    from structlens.equivalence.score import component_clusters

    pairs = [[[0, 1], [2, 3]], [[1, 0], [2, 1]], (1, 4), 5]
    assert component_clusters(pairs, "layer") == [2, 2, 4, 5]
    assert component_clusters(pairs, "head") is None
    with pytest.raises(ValueError, match="unit"):
        component_clusters(pairs, "token")

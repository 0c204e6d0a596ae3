from statistics import NormalDist

import numpy as np
import pytest

from structlens.equivalence import (
    EquivalenceScore,
    ValidationCriterion,
    bootstrap_interval,
    equivalence_score,
    wilson_interval,
)


def test_wilson_closed_forms():
    z = NormalDist().inv_cdf(0.975)
    lo, hi = wilson_interval(0, 10)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(z * z / (10 + z * z))
    lo, hi = wilson_interval(10, 10)
    assert hi == pytest.approx(1.0) and lo == pytest.approx(10 / (10 + z * z))
    lo, hi = wilson_interval(5, 10)
    assert (lo + hi) / 2 == pytest.approx(0.5)
    # coverage-free sanity: interval shrinks like 1/sqrt(n)
    w1 = np.diff(wilson_interval(50, 100))[0]
    w2 = np.diff(wilson_interval(200, 400))[0]
    assert w1 / w2 == pytest.approx(2.0, rel=0.02)


def test_score_from_validation_outcomes(tmp_path):
    pairs = [[0, 0], [1, 2], [2, 1], [3, 3]]
    kl = [0.01, 0.5, 0.05, 0.02]
    top1 = [0.95, 0.99, 0.85, 0.97]
    res = equivalence_score(pairs, kl=kl, top1=top1, similarity=[0.9, 0.8, 0.7, 0.6])
    assert [r["passed"] for r in res.validation] == [True, False, False, True]
    assert res.score == 0.5 and res.n_passed == 2 and res.n_matched == 4
    assert res.score_ci == list(wilson_interval(2, 4))
    assert res.validation[1]["kl"] == 0.5
    back = EquivalenceScore.load(res.save(tmp_path / "s"))
    assert back.score == res.score and back.validation == res.validation
    strict = ValidationCriterion(max_kl=None, min_top1=None, min_similarity=0.75)
    assert equivalence_score(pairs, strict, similarity=[0.9, 0.8, 0.7, 0.6]).score == 0.5


def test_bootstrap_interval_brackets_the_rate():
    passed = np.array([True] * 30 + [False] * 10)
    lo, hi = bootstrap_interval(passed, seed=1)
    assert lo < 0.75 < hi
    wl, wh = wilson_interval(30, 40)
    assert abs(lo - wl) < 0.06 and abs(hi - wh) < 0.06
    res = equivalence_score(
        [[i, i] for i in range(40)],
        kl=np.where(passed, 0.0, 1.0),
        top1=np.ones(40),
        ci="bootstrap",
        seed=1,
    )
    assert res.score_ci == [lo, hi]


def test_criterion_errors():
    with pytest.raises(ValueError, match="at least one threshold"):
        ValidationCriterion(None, None, None, None)
    with pytest.raises(ValueError, match="no top1 values"):
        equivalence_score([[0, 0]], kl=[0.0])
    with pytest.raises(ValueError, match="validation outcomes"):
        equivalence_score([[0, 0], [1, 1]], kl=[0.0], top1=[1.0])
    with pytest.raises(ValueError, match="NaN"):
        equivalence_score([[0, 0]], kl=[np.nan], top1=[1.0])


def test_representational_score_passes_aligned_pairs_only():
    from scipy.stats import ortho_group

    from structlens.equivalence import linear_cka, representational_score

    rng = np.random.default_rng(0)
    heads = [rng.standard_normal((400, 8)) for _ in range(6)]
    q = ortho_group.rvs(8, random_state=1)
    # pairs 0-2: a rotated, rescaled, shifted copy (aligned); 3-5: independent activations
    partners = [2.5 * h @ q + 1.0 for h in heads[:3]] + [
        rng.standard_normal((400, 8)) for _ in heads[3:]
    ]
    sims = [float(linear_cka(a, b, debiased=True)) for a, b in zip(heads, partners)]
    assert min(sims[:3]) > 0.999 and max(sims[3:]) < 0.1
    pairs = [[i, i] for i in range(6)]
    s = representational_score(pairs, sims, min_similarity=0.9)
    assert (s.n_passed, s.n_matched, s.score) == (3, 6, 0.5)
    assert [v["passed"] for v in s.validation] == [True] * 3 + [False] * 3
    assert s.score_ci == pytest.approx(list(wilson_interval(3, 6)))
    assert s.criterion["min_similarity"] == 0.9 and s.criterion["max_kl"] is None

"""The causal-dimension verdicts on planted Results: every branch of every claim, read off the
Claim's fields (verdict, ours, ci, the reason in ``note``), never off rendered text."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from structlens.causal_dim import verdicts as V
from structlens.causal_dim.experiment import (
    ArchitectureCounts,
    ArchitectureGrowth,
    DepthEpsilon,
    FourCell,
    IOIRecovery,
    SyntheticRecall,
)
from structlens.causal_dim.kappa import KappaResult, kappa_from_grams
from structlens.causal_dim.stages import CausalAnalysis, KappaFit, SweepFit
from structlens.verdicts import VERDICTS

D = 64


def kfit(layer: int = 1, **changes) -> KappaFit:
    """A real exact-κ fit of planted Grams (spectrum 1, 1/2, …, 1/16 over 16 of 64
    directions, one vector per direction), with ``changes`` planted on top."""
    g = np.zeros((16, D, D))
    for i in range(16):
        g[i, i, i] = 16.0 / (i + 1)
    res = kappa_from_grams(g)
    fields = {f.name: getattr(res, f.name) for f in dataclasses.fields(KappaResult)}
    base = fields | {"layer": layer, "identified": True, "ratio_last_doubling": 1.01}
    return KappaFit(**(base | changes))


def sweep(**changes) -> SweepFit:
    """A planted width sweep over 256 → 1024 at layer 1 whose κ̂ is identified."""
    n = 3
    base = dict(
        widths=np.array([256, 512, 1024]), n_repr=np.array([100.0, 300.0, 900.0]),
        n_causal=np.array([6.0, 12.0, 20.0]), n_repr_growth=np.array([1.0, 3.0, 9.0]),
        n_causal_growth=np.array([1.0, 2.0, 3.33]), wedge=2.7, epsilon=0.01,
        epsilon_ci=[0.008, 0.012], n_causal_ci=np.ones((2, n)), n_repr_ci=np.ones((2, n)),
        n_repr_growth_ci=np.array([[1.0, 2.5, 8.0], [1.0, 3.5, 10.0]]),
        n_causal_growth_ci=np.array([[1.0, 1.6, 2.0], [1.0, 2.4, 4.5]]), wedge_ci=[1.8, 3.6],
        fits={"michaelis_menten": {"K": 40.0}}, fit_model="michaelis_menten", kappa_hat=40.0,
        kappa_hat_ci=[30.0, 60.0], n_tokens=1000, n_bootstrap=50, exact_erank=None,
        kappa_hat_over_erank=None, definitions={}, kappa_hat_status="identified",
        base_width=256, d_model=D, layer=1,
    )  # fmt: skip
    return SweepFit(**(base | changes))


# ---------------------------------------------------------------- wedge
def test_wedge_reproduced_when_ratio_and_causal_growth_clear_the_gap():
    c = V.wedge(sweep())
    assert (c.verdict, c.ours, c.ci) == ("reproduced", 2.7, (1.8, 3.6))
    assert c.note.startswith("qualitatively")
    assert c.per_setting["n_causal_growth_ci"] == [2.0, 4.5]


def test_wedge_partly_when_n_causal_does_not_grow_enough():
    c = V.wedge(sweep(n_causal_growth_ci=np.array([[1.0, 1.0, 1.2], [1.0, 2.0, 3.0]])))
    assert c.verdict == "partly" and "N_causal growth not reproduced" in c.note


def test_wedge_gap_without_causal_growth_comes_from_n_repr_growth():
    # N_causal growth 0 makes the ratio infinite: the gap is read off N_repr growth's CI
    zero, zero_ci = np.array([1.0, 0.5, 0.0]), np.array([[1.0, 0.3, 0.0], [1.0, 0.8, 0.5]])
    planted = {"n_causal_growth": zero, "n_causal_growth_ci": zero_ci}
    c = V.wedge(sweep(**planted, wedge=float("inf"), wedge_ci=[0.0, 1.0]))
    assert c.verdict == "partly" and c.ours is None and c.ci == (0.0, 1.0)


def test_wedge_not_reproduced_and_not_tested():
    c = V.wedge(sweep(wedge_ci=[0.9, 3.0]))
    assert c.verdict == "not reproduced" and c.note == "the ratio's CI does not clear 1.5"
    c = V.wedge(None)
    assert (c.verdict, c.ours, c.ci) == ("not tested", None, None)
    assert c.note == c.ci_reason == "no width sweep in this run"


# ---------------------------------------------------------------- κ̂
def test_kappa_hat_reproduced_when_its_ci_reaches_half_of_d():
    c = V.kappa_hat(sweep(), D)
    assert (c.verdict, c.ours, c.ci) == ("reproduced", 40.0, (30.0, 60.0))
    assert c.settings["kappa_hat_status"] == "identified" and c.settings["raw_fit_K"] == 40.0


def test_kappa_hat_not_reproduced_when_small_against_d():
    c = V.kappa_hat(sweep(kappa_hat_ci=[10.0, 20.0], kappa_hat=15.0), D)
    assert (c.verdict, c.ours, c.ci) == ("not reproduced", 15.0, (10.0, 20.0))


@pytest.mark.parametrize(
    "status, field, reason",
    [("unidentified", "kappa_hat_reason", "K sits on its bound"),
     ("not interpretable", "sweep_reason", "held-out FVU does not fall")],
)  # fmt: skip
def test_kappa_hat_unidentified_has_no_number_and_says_why(status, field, reason):
    c = V.kappa_hat(sweep(kappa_hat_status=status, **{field: reason}), D)
    assert (c.verdict, c.ours, c.ci) == ("unidentified", None, None)
    assert c.note == reason and reason in c.ci_reason
    assert V.kappa_hat(None, D).verdict == "not tested"


# ---------------------------------------------------------------- κ̂ vs exact κ
def test_kappa_hat_vs_exact_interval_from_both_intervals():
    ex = kfit(erank=40.0, erank_ci=[35.0, 45.0])
    c = V.kappa_hat_vs_exact(sweep(), [ex])
    assert c.verdict == "reproduced" and c.ours == 1.0
    assert c.ci == pytest.approx((30.0 / 45.0, 60.0 / 35.0))


def test_kappa_hat_vs_exact_excludes_one():
    ex = kfit(erank=400.0, erank_ci=[380.0, 420.0])
    assert V.kappa_hat_vs_exact(sweep(), [ex]).verdict == "not reproduced"
    # the same ratio with exact κ not identified is not evidence either way
    c = V.kappa_hat_vs_exact(sweep(), [dataclasses.replace(ex, identified=False)])
    assert c.verdict == "unidentified" and "not identified" in c.note


def test_kappa_hat_vs_exact_unidentified_or_not_tested():
    ex = kfit()
    c = V.kappa_hat_vs_exact(sweep(kappa_hat_status="unidentified"), [ex])
    assert (c.verdict, c.ours, c.ci) == ("unidentified", None, None)
    c = V.kappa_hat_vs_exact(sweep(), [kfit(layer=2)])  # no exact κ at the sweep layer
    assert c.verdict == "not tested" and "exact κ at its layer" in c.note


# ---------------------------------------------------------------- exact κ
def test_exact_kappa_headline_is_the_middle_layer_fixed_in_advance():
    """The largest κ/d elsewhere never becomes the headline: the middle κ layer is."""
    lo, mid = kfit(1, kappa_over_d=0.3), kfit(2, kappa_over_d=0.7, erank=44.8)
    top = kfit(3, kappa_over_d=0.9, erank=57.6)
    c = V.exact_kappa([top, lo, mid], D)  # any order
    assert (c.verdict, c.ours, c.ci) == ("reproduced", 44.8, tuple(mid.erank_ci))
    assert c.settings["layer"] == 2 and set(c.per_setting) == {"1", "2", "3"}
    c = V.exact_kappa([lo, kfit(2, kappa_over_d=0.3), top], D)
    assert (c.verdict, c.settings["layer"]) == ("not reproduced", 2)
    c = V.exact_kappa([lo, dataclasses.replace(mid, identified=False, ratio_last_doubling=1.2)], D)
    assert c.settings["layer"] == 2 and c.verdict == "unidentified" and "1.20" in c.note
    assert V.exact_kappa([], D).verdict == "not tested"


def test_kappa_pr_is_a_check_with_its_positive_control():
    c = V.kappa_pr_lower_bound([kfit(1), kfit(2)])
    assert c.kind == "check" and c.verdict == "reproduced"
    assert c.positive_control["passed"] is True  # the library's closed-form control
    assert c.ci is None and c.ci_reason
    broken = kfit(1, participation_ratio_plugin=kfit().erank_plugin + 1)
    assert V.kappa_pr_lower_bound([broken]).verdict == "not reproduced"
    failed = V.kappa_pr_lower_bound([kfit()], control={"passed": False})
    assert failed.positive_control == {"passed": False}


# ---------------------------------------------------------------- replication sections
def four(**inflation) -> FourCell:
    cells = {
        a: {"inflation": {"random_enc/learned_dec": x}, "l0": {}, "n_tokens": 10}
        for a, x in inflation.items()
    }
    return FourCell(width=256, layer=1, architectures=cells)


def test_random_encoder_inflation_is_the_papers_architecture_not_the_largest():
    c = V.random_encoder_inflation(four(topk=1.0, relu=3.0, jumprelu=2.0))
    assert (c.verdict, c.ours, c.settings["architecture"]) == ("reproduced", 2.0, "jumprelu")
    c = V.random_encoder_inflation(four(topk=9.0, relu=48.7, jumprelu=1.0))
    assert (c.verdict, c.ours) == ("not reproduced", 1.0) and c.settings["inflation"][
        "relu"
    ] == 48.7
    c = V.random_encoder_inflation(four(topk=2.0, relu=3.0))
    assert c.verdict == "not tested" and "jumprelu" in c.note
    assert V.random_encoder_inflation(None).verdict == "not tested"


def syn(rotated: float, atoms: float) -> SyntheticRecall:
    def at(x):
        return {"8": {"recall": x}, "26": {"recall": x / 2}}

    return SyntheticRecall(rotated=at(rotated), atoms=at(atoms), steps=1, model={}, sae={})


def test_synthetic_recall_is_a_check_whose_control_must_find_atoms():
    c = V.synthetic_atp_recall(syn(0.0, 0.75))
    assert (c.kind, c.verdict, c.ours) == ("check", "reproduced", 0.0)
    assert c.positive_control["passed"] is True and c.positive_control["recall"]["8"] == 0.75
    c = V.synthetic_atp_recall(syn(0.25, 0.75))
    assert (c.verdict, c.ours) == ("not reproduced", 0.25)
    c = V.synthetic_atp_recall(syn(0.0, 0.0))  # the control fails: recall 0 says nothing
    assert c.verdict == "unidentified" and c.positive_control["passed"] is False
    assert V.synthetic_atp_recall(None).verdict == "not tested"


def ioi(recall: float) -> IOIRecovery:
    return IOIRecovery(
        width=256, n_prompts=8, n_fired_at_end=40, n_ground_truth=10, top_fraction=0.05,
        recall_top_of_all=recall, k_all=13, recall_top_of_fired=0.5, k_fired=2,
        spearman_fired=0.4, ground_truth=[],
    )  # fmt: skip


def test_ioi_recall_verdicts_and_the_reason_it_was_not_run():
    assert (V.ioi_atp_recall(ioi(0.9)).verdict, V.ioi_atp_recall(ioi(0.9)).ours) == (
        "reproduced", 0.9)  # fmt: skip
    assert V.ioi_atp_recall(ioi(0.5)).verdict == "partly"
    c = V.ioi_atp_recall(None, "no IOI prompts in this profile")
    assert (c.verdict, c.note) == ("not tested", "no IOI prompts in this profile")


def depth(eps0: float, eps1: float, fvu1: float = 0.1) -> DepthEpsilon:
    rows = [{"layer": 0, "epsilon": eps0, "quality": {"fvu": 0.1}},
            {"layer": 9, "epsilon": eps1, "quality": {"fvu": fvu1}}]  # fmt: skip
    return DepthEpsilon(width=256, rows=rows)


@pytest.mark.parametrize(
    "planted, verdict",
    [(depth(2.0, 0.1), "reproduced"), (depth(0.5, 0.1), "partly"),
     (depth(0.1, 0.1), "not reproduced"), (depth(2.0, 0.1, fvu1=0.3), "unidentified")],
)  # fmt: skip
def test_epsilon_falls_with_depth(planted, verdict):
    c = V.epsilon_falls_with_depth(planted)
    assert c.verdict == verdict
    assert c.ours == pytest.approx(planted.rows[0]["epsilon"] / planted.rows[1]["epsilon"])
    assert V.epsilon_falls_with_depth(DepthEpsilon(256, planted.rows[:1])).verdict == "not tested"


def arch(**counts) -> ArchitectureCounts:
    rows = {a: {"n_causal_at_topk_epsilon": n, "quality": {"fvu": f}}
            for a, (n, f) in counts.items()}  # fmt: skip
    return ArchitectureCounts(width=256, layer=1, rows=rows)


def test_architecture_invariance_within_two_fold():
    c = V.architecture_invariance(arch(topk=(10, 0.2), relu=(15, 0.2)))
    assert (c.verdict, c.ours) == ("reproduced", "topk: 10, relu: 15")
    c = V.architecture_invariance(arch(topk=(10, 0.2), relu=(2, 0.9)))
    assert c.verdict == "not reproduced" and "confound" in c.note
    assert "confound" not in V.architecture_invariance(arch(topk=(10, 0.2), relu=(2, 0.2))).note
    assert V.architecture_invariance(arch(relu=(2, 0.2))).verdict == "not tested"


def growth(**rows) -> ArchitectureGrowth:
    out = {a: {"n_causal_growth": g, "l0": [4.0, 4.0], "fvu": [0.2, f]}
           for a, (g, f) in rows.items()}  # fmt: skip
    return ArchitectureGrowth(widths=[256, 512], layer=1, k=4, rows=out)


def test_growth_invariance_needs_matched_saes():
    c = V.architecture_invariance_of_growth(growth(topk=(2.0, 0.2), relu=(2.5, 0.2)))
    assert (c.verdict, c.ours) == ("reproduced", 1.25) and c.settings["matched"] is True
    c = V.architecture_invariance_of_growth(growth(topk=(2.0, 0.2), relu=(4.0, 0.2)))
    assert (c.verdict, c.ours) == ("not reproduced", 2.0)
    c = V.architecture_invariance_of_growth(growth(topk=(2.0, 0.2), relu=(2.0, 0.5)))
    assert c.verdict == "unidentified" and c.settings["matched"] is False
    c = V.architecture_invariance_of_growth(growth(topk=(2.0, 0.2), relu=(0.0, 0.2)))
    assert (c.verdict, c.ours) == ("unidentified", None)
    assert c.note == "no N_causal at a base width"


# ---------------------------------------------------------------- scale invariance
def _kappa_at(layer: int, kappa: float, lo: float, hi: float) -> KappaFit:
    return kfit(layer, erank=kappa, erank_ci=(lo, hi), kappa_over_d=kappa / D)


def test_kappa_ratio_bounds_are_the_quotients_of_the_intervals():
    ratio, low, high = V.kappa_ratio(_kappa_at(1, 40.0, 30.0, 50.0), _kappa_at(1, 20.0, 10.0, 25.0))
    assert (ratio, low, high) == (2.0, 30.0 / 25.0, 50.0 / 10.0)


@pytest.mark.parametrize(
    "theirs, verdict",
    [
        ((40.0, 36.0, 44.0), "reproduced"),  # bounds 38/44 = 0.86 .. 42/36 = 1.17
        ((20.0, 18.0, 22.0), "not reproduced"),  # bounds 1.73 .. 2.33, beyond 1.25
        ((80.0, 72.0, 88.0), "not reproduced"),  # bounds 0.43 .. 0.58, below 1/1.25
        ((34.0, 25.0, 45.0), "unidentified"),  # bounds 0.84 .. 1.68 straddle 1.25
    ],
)
def test_scale_invariance_reads_the_middle_layer_by_the_ratio_bounds(theirs, verdict):
    """The headline is the middle κ layer's match, fixed in advance: an outer layer whose
    κ agree (or disagree) never decides it; N_causal's construction is named in the note."""
    ours = [_kappa_at(1, 10.0, 9.0, 11.0), _kappa_at(2, 40.0, 38.0, 42.0),
            _kappa_at(3, 90.0, 80.0, 99.0)]  # fmt: skip
    cross = {1: _kappa_at(0, 10.0, 9.0, 11.0), 2: _kappa_at(1, *theirs),
             3: _kappa_at(2, 20.0, 18.0, 22.0)}  # fmt: skip
    c = V.scale_invariance(ours[::-1], cross, models=("a", "b"), d_models=(D, 32))
    assert c.verdict == verdict
    assert c.settings["layers"] == [2, 1] and c.settings["ratio"] == 40.0 / theirs[0]
    assert set(c.per_setting) == {"1", "2", "3"} and c.ci is None and c.ci_reason
    assert "328 at the paper's 16384" in c.note and "stand-in" in c.note


def test_scale_invariance_not_tested_without_the_cross_family_model():
    assert V.scale_invariance([kfit(1)], None).verdict == "not tested"
    assert V.scale_invariance([kfit(1)], {}).verdict == "not tested"
    c = V.scale_invariance([kfit(1), kfit(2), kfit(3)], {1: kfit(0)})
    assert c.verdict == "not tested" and "layer 2" in c.note


def test_claims_cover_the_paper_table_and_say_why_when_not_tested():
    found = V.claims(D)
    assert [c.id for c in found] == list(V.PAPER)
    assert all(c.verdict == "not tested" and c.note and c.ci_reason for c in found)
    assert all(c.paper == V.PAPER[c.id][1] for c in found)
    found = V.claims(D, [kfit(1)], sweep())
    assert {c.verdict for c in found} <= set(VERDICTS)
    assert {c.id for c in found if c.verdict != "not tested"} == {
        "wedge", "kappa_hat", "kappa_hat_vs_exact_kappa", "exact_kappa", "kappa_pr_lower_bound"
    }  # fmt: skip


# ---------------------------------------------------------------- analyze's section
def analysis(fits, fit, not_run="") -> CausalAnalysis:
    return CausalAnalysis(
        protocol={}, d_model=D, kappa_fits=fits, sweep_layer=1, sweep_fit=fit,
        sweep_not_run=not_run, n_sae_train=4, n_sae_eval=4, kappa_windows_from_sae_training=0,
    )  # fmt: skip


def test_section_caveats_and_headlines():
    few = kfit(1, n_vectors=8, identified=False, ratio_last_doubling=1.2, max_vectors=8)
    enough = kfit(2, n_vectors=V.MIN_KAPPA_VECTORS)
    s = V.section(analysis([few, enough], sweep(kappa_hat_status="unidentified")))
    assert [c.kind for c in s.caveats] == ["too_few_vectors", "not_converged", "unidentified"]
    assert list(s.headline) == ["kappa_L1", "kappa_L2", "wedge", "kappa_hat"]
    assert s.headline["kappa_hat"].value is None and s.headline["wedge"].ci == (1.8, 3.6)
    s = V.section(analysis([enough], None, "widths below 4·d"))
    assert [(c.kind, c.message) for c in s.caveats] == [
        ("base_width", "width sweep (layer 1) not run: widths below 4·d")
    ]
    assert s.details["sweep"] == {} and s.details["sweep_fit"] is None
    s = V.section(analysis([enough], sweep()))
    assert s.caveats == () and s.headline["kappa_hat"].value == 40.0

"""The equivalence verdicts on planted stage results: every branch of a row's verdict
(reproduced above, below and inside the paper's range, unidentified, not tested), the group
claim pooled over model pairs (one pair's Wilson interval, a cluster bootstrap over several,
partly when rows differ), the sanity check with its positive control passing and failing,
the caveats reaching the rows, and the ``analyze`` section, all read off the typed Claim,
Caveat and Section fields."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from structlens.equivalence import verdicts as v
from structlens.equivalence.protocol import PROFILES
from structlens.equivalence.scenarios import SCENARIOS
from structlens.equivalence.score import PairedNullDecision, decide_paired_null
from structlens.equivalence.stages import (
    Caveat,
    ComponentScores,
    CongruityEstimate,
    CongruityScores,
    ModelAnalysis,
    ModelComparison,
    RateScore,
    SanityCheck,
)
from structlens.stats.intervals import mcnemar_exact, wilson_interval

NAN = float("nan")
PROTOCOL = PROFILES["smoke"]


def _rate(k: int, n: int) -> RateScore:
    return RateScore(n, k, k / n if n else NAN, wilson_interval(k, n) if n else (NAN, NAN))


def components(passed, null=None, *, kind="heads", method="patching", similarity=None, kl=()):
    """Planted validation of ``len(passed)`` components, decided as the stages decide."""
    passed = tuple(bool(p) for p in passed)
    n, k = len(passed), sum(passed)
    null = None if null is None else tuple(bool(x) for x in null)
    if n:
        decision = decide_paired_null(
            list(passed), None if null is None else list(null),
            alpha=PROTOCOL.null_alpha, min_score=PROTOCOL.equivalent_at,
        )  # fmt: skip
    else:  # nothing validated: no test was run
        decision = PairedNullDecision("not tested", "nothing validated", 0, 0, 0, 0, 0, NAN,
                                      PROTOCOL.null_alpha, NAN, NAN)  # fmt: skip
    informative = None
    if null is not None:
        fails = [p for p, x in zip(passed, null, strict=True) if not x]
        informative = _rate(sum(fails), len(fails))
    return ComponentScores(
        kind=kind, method=method, pairs=[((0, i), (0, i)) for i in range(n)], passed=passed,
        kl=tuple(kl), top1=tuple(1.0 for _ in kl),
        similarity=tuple(similarity) if similarity is not None else (1.0,) * n,
        score=k / n if n else NAN, score_ci=wilson_interval(k, n) if n else (NAN, NAN),
        null_passed=null, null_score=None if null is None else sum(null) / n,
        null_score_ci=None if null is None else wilson_interval(sum(null), n),
        informative=informative, decision=decision,
    )  # fmt: skip


def comparison(passed, null=None, *, method="patching", layers=None, caveats=(), model_b="b"):
    heads = components(passed, null, method=method)
    n = len(heads.passed)
    return ModelComparison(
        model_a="a", model_b=model_b, probe="corpus", n_fit=12, n_heldout=12,
        representation="tokens", heads=heads, layers=layers, head_groups=None,
        representational=_rate(n, n), congruity=None, decision=heads.decision.verdict,
        decision_reason=heads.decision.reason, agree=None, layer_similarity=np.eye(2),
        matched_layer_similarity=(1.0, 1.0), matched_head_similarity=(1.0,) * n,
        caveats=tuple(caveats), protocol=PROTOCOL.key(),
    )  # fmt: skip


def sanity_check(r: ModelComparison, *, passed=True, logit_diff=1e-6, recovered=1.0, copy="a+rot3"):
    return SanityCheck(
        comparison=dataclasses.replace(r, model_b=copy), rotation_seed=3,
        max_abs_logit_diff=logit_diff, heads_recovered=recovered, passed=passed, reason="planted",
    )  # fmt: skip


def claimed_row(k: int, n: int) -> ModelComparison:
    """``k`` of ``n`` heads pass with their partner, none under the null: claimed when
    McNemar's exact test on the ``k`` discordant heads gives p < 0.05 (k >= 6)."""
    return comparison([True] * k + [False] * (n - k), [False] * n)


def test_every_paper_value_names_a_scenario_group():
    groups = {sc.group for sc in SCENARIOS}
    assert set(v.PAPER) == {v.claim_id(g) for g in groups}
    # a range, or none at all (a row the paper has no value for)
    assert all(p.low <= p.high or np.isnan([p.low, p.high]).all() for p in v.PAPER.values())


def test_a_row_without_a_paper_value_is_measured_not_judged():
    row = comparison([True] * 5, method="similarity")  # the cross-family row: no patching
    assert v.vs_paper("cross-family", row.heads.score_ci) == "no paper value"
    verdict, reason = v.row_verdict("cross-family", row)
    assert verdict == "not tested" and "no value to compare with" in reason
    claim = v.group_claim("cross-family", {"cross-family": row})
    assert claim.verdict == "not tested" and claim.ours == 1.0


def test_claimed_is_the_paired_test_and_none_without_a_null():
    r = claimed_row(17, 20)
    assert mcnemar_exact(17, 0) < 0.05 and v.claimed(r) is True
    assert v.claimed(comparison([True] * 10, [True] * 10)) is False  # no discordant head
    assert v.claimed(comparison([True] * 5, method="similarity")) is None


def test_reproduced_when_the_paper_lies_in_the_interval():
    row = claimed_row(17, 20)
    verdict, reason = v.row_verdict("seeds", row)
    assert verdict == "reproduced" and "≈ 0.85" in reason
    claim = v.group_claim("seeds", {"seeds-s0-s1": row})
    assert claim.id == "seeds_score" and claim.paper == v.PAPER["seeds_score"].text
    assert claim.verdict == "reproduced" and claim.kind == "replication"
    assert claim.ours == 17 / 20
    assert claim.ci == pytest.approx(wilson_interval(17, 20))  # one pair: its Wilson interval
    assert claim.settings["interval"] == "Wilson, one pair"
    assert claim.per_setting["seeds-s0-s1"]["verdict"] == "reproduced"
    assert claim.per_setting["seeds-s0-s1"]["reason"] == reason


@pytest.mark.parametrize(("k", "n", "where"), [(60, 60, "higher"), (10, 40, "lower")])
def test_not_reproduced_above_or_below_the_paper(k, n, where):
    row = claimed_row(k, n)
    lo, hi = wilson_interval(k, n)
    assert (lo > 0.85) if where == "higher" else (hi < 0.85)  # the planted side
    assert v.vs_paper("seeds", row.heads.score_ci) == where
    verdict, reason = v.row_verdict("seeds", row)
    assert verdict == "not reproduced" and f"lies {where} than" in reason
    claim = v.group_claim("seeds", {"x": row})
    assert claim.verdict == "not reproduced" and claim.ours == k / n


def test_a_wilson_bound_of_one_is_consistent_with_a_paper_value_of_one():
    row = claimed_row(12, 12)
    assert row.heads.score_ci[1] == pytest.approx(1.0)
    assert v.vs_paper("sanity", row.heads.score_ci) == "consistent"


def test_unidentified_when_the_null_passes_as_often():
    row = comparison([True] * 10, [True] * 10)
    verdict, reason = v.row_verdict("seeds", row)
    assert verdict == "unidentified" and row.heads.decision.reason in reason
    claim = v.group_claim("seeds", {"x": row})
    assert claim.verdict == "unidentified" and claim.ours == 1.0  # a score, but no claim


def test_partly_when_rows_differ_and_pairs_are_resampled():
    rows = {"a": claimed_row(17, 20), "b": comparison([True] * 20, [True] * 20)}
    claim = v.group_claim("seeds", rows, n_boot=500)
    assert claim.verdict == "partly"
    assert claim.ours == 37 / 40
    assert claim.settings["interval"] == "cluster bootstrap over 2 pairs"
    # resampling two pairs gives pooled rates between the two pairs' rates
    lo, hi = claim.ci
    assert 17 / 20 - 1e-12 <= lo <= claim.ours <= hi <= 1.0
    assert [claim.per_setting[x]["verdict"] for x in rows] == ["reproduced", "unidentified"]


def test_not_tested_without_a_validated_head():
    row = comparison([])
    assert v.row_verdict("seeds", row) == ("not tested", "no head was validated")
    claim = v.group_claim("seeds", {"x": row})
    assert claim.verdict == "not tested" and claim.ours is None
    assert claim.ci is None and claim.ci_reason == "no head was validated"


def test_similarity_rows_are_compared_with_the_paper_without_a_null():
    no_patch = Caveat("no_patching", "no patching was possible")
    row = comparison([True] * 3 + [False] * 7, method="similarity", caveats=(no_patch,))
    assert v.row_verdict("encoder-other-data", row)[0] == "reproduced"  # 0.3 in [0.11, 0.60]
    claim = v.group_claim("encoder-other-data", {"enc-dec": row})
    assert claim.settings["validation"] == "similarity"
    assert claim.per_setting["enc-dec"]["caveats"] == [
        {"kind": "no_patching", "message": no_patch.message}
    ]


def test_the_encoding_caveat_reaches_the_rows():
    reduced = Caveat("encoding_reduced", "CONGRUITY encodings: reduced to 8 components")
    row = comparison([True] * 17 + [False] * 3, [False] * 20, caveats=(reduced,))
    (sc,) = [s for s in SCENARIOS if s.name == "seeds-s0-s1"]
    want = [{"kind": "encoding_reduced", "message": reduced.message}]
    assert [c.to_json() for c in v.row_caveats(row)] == want
    assert v.row_block(sc, row, PROTOCOL, v.row_verdict("seeds", row))["caveats"] == want
    assert v.group_claim("seeds", {sc.name: row}).per_setting[sc.name]["caveats"] == want


def test_rows_state_their_relation_layers_and_layer_map_in_the_claims_json():
    from structlens.equivalence import choose_layer_map
    from structlens.equivalence.scenarios import FT_TRAINED_LAYERS

    # copies (sanity copies, fine-tunes: one residual basis) keep Procrustes; every other row
    # compares independently trained models; fine-tunes are scored on their trained layers
    copies = {sc.name for sc in SCENARIOS if sc.relation == "copy"}
    assert copies == {sc.name for sc in SCENARIOS if sc.group in ("sanity", "finetune")}
    for sc in SCENARIOS:
        protocol = sc.protocol_for(PROFILES[sc.protocol] if sc.protocol else PROFILES["paper"])
        assert (protocol.relation, protocol.first_layer) == (sc.relation, sc.first_layer)
        want = FT_TRAINED_LAYERS.start if sc.group == "finetune" else 0
        assert sc.first_layer == want
    (sc,) = [s for s in SCENARIOS if s.name == "ft-ioi"]
    choice = choose_layer_map(700, 576, 576, relation="copy")
    row = dataclasses.replace(
        comparison([True] * 8, [False] * 8), layer_map=choice,
        compared_layers={"a": list(range(15, 30)), "b": list(range(15, 30))},
    )  # fmt: skip
    protocol = sc.protocol_for(PROFILES["paper-subset"])
    block = v.row_block(sc, row, protocol, v.row_verdict("finetune", row))
    assert block["protocol"]["relation"] == "copy" and block["protocol"]["first_layer"] == 15
    assert block["layer_map"]["method"] == "procrustes" and block["layer_map"]["reason"]
    assert block["compared_layers"]["b"] == list(range(15, 30))
    settings = v.group_claim("finetune", {"ft-ioi": row}).settings["layer_map"]
    assert settings == {"ft-ioi": {"relation": "copy", "method": "procrustes",
                                   "reason": choice.reason}}  # fmt: skip


def test_a_layer_map_that_fails_identical_layers_is_a_caveat():
    def with_layers(similarity):
        layers = components([False, True], kind="layers", similarity=similarity, kl=(2.0, 0.0))
        return comparison([True] * 8, [False] * 8, layers=layers)

    (caveat,) = v.row_caveats(with_layers((0.9995, 0.9995)))
    assert caveat.kind == "layer_map_fails" and "KL 2.00 nats" in caveat.message
    assert v.row_caveats(with_layers((0.99, 0.9995))) == ()  # a different layer may fail


def test_sanity_is_a_check_whose_positive_control_can_fail():
    good = sanity_check(claimed_row(12, 12))
    claim = v.sanity_claim({"sanity-tiny": good})
    assert claim.kind == "check" and claim.verdict == "reproduced"
    assert claim.positive_control["passed"] is True
    assert claim.ours == 1.0 and claim.ci == pytest.approx(wilson_interval(12, 12))
    # the control fails when matching misses a planted partner, or the copy's logits move
    for bad in (
        sanity_check(claimed_row(12, 12), recovered=11 / 12),
        sanity_check(claimed_row(12, 12), logit_diff=0.5),
    ):
        assert v.sanity_claim({"x": bad}).positive_control["passed"] is False
    failed = v.sanity_claim({"x": sanity_check(claimed_row(12, 12), passed=False)})
    assert failed.verdict == "not reproduced"
    none = v.sanity_claim({})
    assert none.verdict == "not tested" and none.ci is None and none.ci_reason
    assert none.note == "the sanity stage did not run"
    assert none.positive_control["passed"] is False


def test_claims_follow_the_scenario_groups_that_ran():
    results = {"seeds-s1-s2": claimed_row(17, 20), "sanity-tiny": claimed_row(12, 12)}
    checks = {"sanity-tiny": sanity_check(results["sanity-tiny"])}
    got = v.claims(results, checks, {})
    assert [c.id for c in got] == ["sanity_score", "seeds_score"]
    blocks = v.blocks(results, checks, dict.fromkeys(results, PROTOCOL))
    assert blocks["sanity"] == {"row": "sanity-tiny", "head_score": 1.0, "layer_score": None,
                                "passed": True, "congruity": []}  # fmt: skip
    assert [r["name"] for r in blocks["rows"]] == ["sanity-tiny", "seeds-s1-s2"]


def test_analyze_section_names_its_rows_and_their_caveats():
    reduced = Caveat("encoding_reduced", "reduced")
    copy = comparison([True] * 12, [False] * 12, caveats=(reduced,))
    other = comparison([True] * 5 + [False] * 5, [False] * 10, model_b="other")
    res = ModelAnalysis(PROTOCOL, sanity_check(copy, passed=False), None, other)
    section = v.section(res)
    assert list(section.headline) == [
        "sanity_score",
        "sanity_null",
        "compare_score",
        "compare_null",
    ]
    assert section.headline["sanity_score"].value == 1.0
    assert section.headline["sanity_score"].ci == pytest.approx(wilson_interval(12, 12))
    assert section.headline["compare_null"].value == 0.0
    kinds = [c.kind for c in section.caveats]
    assert kinds == ["encoding_reduced", "failed_sanity"]
    assert section.caveats[0].message.startswith("rotated + head-permuted copy")
    rows = section.details["rows"]
    assert [r["pair"] for r in rows][1] == "vs other" and rows[0]["sanity"]["passed"] is False
    assert section.details["protocol"] == PROTOCOL.to_json()
    # a model the sanity fold does not support: the row is missing and a caveat says why
    missing = v.section(ModelAnalysis(PROTOCOL, None, "LayerNorm", None))
    assert missing.headline == {} and missing.details["rows"] == []
    assert [(c.kind, c.message) for c in missing.caveats] == [("not_run", "sanity row: LayerNorm")]


def congruity(uniform_rates, weighted_rates):
    """Planted CONGRUITY scores: decision rates (A→B, B→A) under uniform and
    variance-weighted R², each decided as the stages decide (either rate above 0.5)."""

    def decide(rates):
        return "different" if max(rates) > 0.5 else "unidentified"

    weighted = CongruityEstimate(
        "variance_weighted", *weighted_rates, 0.5, 0.5, 1.0, 1.0, 0.9, 0.9, decide(weighted_rates)
    )
    return CongruityScores(
        representation="accumulated", intervention="mean ablation",
        decision_rate_ab=uniform_rates[0], decision_rate_ba=uniform_rates[1],
        mean_p_ab=0.5, mean_p_ba=0.5, selectivity_ab=1.0, selectivity_ba=1.0,
        top_heads_a=[[0, 0]], top_heads_b=[[0, 1]], top_kl_a=[0.1], top_kl_b=[0.1],
        decision=decide(uniform_rates), reason="planted", reduced_to=None, caveat=None,
        base_r2_ab=0.2, base_r2_ba=-0.5, variance_weighted=weighted,
    )  # fmt: skip


def test_congruity_on_both_sanity_copies_is_reported_beside_with_its_caveats():
    """The rotated copy called different by uniform R² only, the unrotated copy by neither:
    the analyze section reports both copies under both estimators, the decision stays the
    uniform one's, and the caveats name the false difference and the basis dependence."""
    rotated = dataclasses.replace(
        comparison([True] * 12, [False] * 12), congruity=congruity((0.0, 1.0), (0.0, 0.0))
    )
    check = dataclasses.replace(
        sanity_check(rotated), unrotated=congruity((0.0, 0.0), (0.0, 0.0)),
        unrotated_max_abs_logit_diff=2e-6,
    )  # fmt: skip
    section = v.section(ModelAnalysis(PROTOCOL, check, None, None))
    rows = section.details["congruity"]
    assert [r["pair"] for r in rows] == [
        "rotated + head-permuted copy (known: equivalent)",
        v.UNROTATED_COPY,
    ]
    assert [r["known"] for r in rows] == ["equivalent", "equivalent"]
    assert [r["decision"] for r in rows] == ["different", "unidentified"]
    assert rows[0]["decided_by"] == "uniform_average"
    assert rows[0]["uniform_average"]["decision_rate_ba"] == 1.0
    assert rows[0]["variance_weighted"]["decision"] == "unidentified"
    assert rows[0]["uniform_average"]["base_r2_ba"] == -0.5
    assert rows[1]["max_abs_logit_diff"] == 2e-6
    assert any("rotated copy" in c.message for c in section.caveats)
    assert section.details["rows"][0]["sanity"]["unrotated"]["decision"] == "unidentified"
    kinds = [c.kind for c in section.caveats]
    assert kinds == ["congruity_false_difference", "congruity_basis_dependent"]
    assert "uniform R²" in section.caveats[0].message
    assert "variance-weighted" not in section.caveats[0].message
    assert "uniform R²" in section.caveats[1].message
    # the claims document's sanity block carries both copies too
    blocks = v.blocks({"sanity-tiny": rotated}, {"sanity-tiny": check}, {"sanity-tiny": PROTOCOL})
    assert blocks["sanity"]["congruity"] == rows
    assert blocks["rows"][0]["congruity"]["variance_weighted"]["decision"] == "unidentified"
    # both estimators calling both copies alike: no basis caveat
    calm = dataclasses.replace(check, unrotated=rotated.congruity)
    kinds = [c.kind for c in v.section(ModelAnalysis(PROTOCOL, calm, None, None)).caveats]
    assert kinds == ["congruity_false_difference"] * 2


def test_the_fold_check_stage_finds_the_copy_is_the_same_function():
    """The rotated, head-permuted copy of the tiny model computes the same logits, moves each
    head's hook_z to its planted partner and rotates the residual stream (float32 round-off)."""
    from structlens.equivalence.stages import fold_check
    from structlens.models import load_model

    model = load_model("tiny-llama")
    got = fold_check(model, "When Mary and John went to the store", seed=3, layer=1)
    assert got.layer == 1 and got.top1_unchanged
    assert got.max_abs_logit_diff < 1e-4 * got.max_abs_logit
    assert got.max_abs_z_diff < 1e-4 and got.max_abs_resid_rotation_error < 1e-4 * got.max_abs_resid
    assert got.max_abs_resid > 0.1  # the residual is not trivially zero


def test_a_group_adjusts_its_rows_p_values_by_holm():
    """Six heads that pass only with their partner give p = 2 / 2^6 = 0.031: one such row is
    claimed; three of them in one group are not after Holm's adjustment (0.094 each), and a
    strong row beside two weak ones still is."""
    weak = comparison([True] * 6 + [False] * 14, [False] * 20)
    strong = claimed_row(17, 20)
    assert weak.heads.decision.p_value == pytest.approx(mcnemar_exact(6, 0))
    assert v.claimed(weak) is True
    assert v.claimed_in_group({"x": weak}) == {"x": True}
    found = v.claimed_in_group({"x": weak, "y": weak, "z": weak})
    assert found == {"x": False, "y": False, "z": False}
    found = v.claimed_in_group({"x": strong, "y": weak, "z": weak, "s": comparison([True] * 3)})
    assert found == {"x": True, "y": False, "z": False, "s": None}  # s has no null
    claim = v.group_claim("seeds", {"x": weak, "y": weak, "z": weak})
    assert claim.verdict == "unidentified"
    assert all("Holm" in claim.per_setting[x]["reason"] for x in "xyz")


def test_a_small_lm_plateaued_only_when_its_rule_stopped_it_early(tmp_path):
    """The stopping rule firing before the step budget is a plateau; a stall at the budget's
    last evaluation (the cosine schedule at 0) or a run without held-out evaluations is not."""
    from structlens.equivalence.stages import SmallLMTraining

    rec = SmallLMTraining({"steps": 2000}, [[800, 1.9]], [[800, 2.0]], 800, True, 3.0)
    assert rec.plateaued
    assert not dataclasses.replace(rec, steps_run=2000).plateaued
    assert not dataclasses.replace(rec, converged=None, held_out_loss=[]).plateaued
    assert SmallLMTraining.load(rec.save(tmp_path)) == rec


def test_the_sanity_row_names_how_the_copy_changed_the_basis():
    """Gemma's copy is signed-permuted (its sandwich norms admit no rotation): its rows and
    caveats say so, and a name that is no copy of ``rotate_and_permute`` is refused."""
    rotated = dataclasses.replace(
        comparison([True] * 12, [False] * 12), congruity=congruity((0.0, 1.0), (0.0, 0.0))
    )
    check = dataclasses.replace(
        sanity_check(rotated, copy="gemma3-270m+sperm0"),
        unrotated=congruity((0.0, 0.0), (0.0, 0.0)), unrotated_max_abs_logit_diff=2e-6,
    )  # fmt: skip
    section = v.section(ModelAnalysis(PROTOCOL, check, None, None))
    pairs = [r["pair"] for r in section.details["congruity"]]
    assert pairs[0] == "signed-permuted + head-permuted copy (known: equivalent)"
    assert section.details["rows"][0]["pair"] == pairs[0]
    basis = [c.message for c in section.caveats if "depends on the basis" in c.message]
    assert basis and "signed-permuted copy" in basis[0] and "rotated" not in basis[0]
    with pytest.raises(ValueError, match="not a copy made by rotate_and_permute"):
        v.sanity_copy(sanity_check(rotated, copy="b"))

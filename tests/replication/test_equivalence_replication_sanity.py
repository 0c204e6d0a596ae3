"""The equivalence replication's smoke profile: the sanity pair (tiny-llama against its rotated,
head-permuted copy) scores 1 at the head and the layer level and is a check with a passing
positive control, and every row's claims carry the null, the score's interval, the paired
decision, a verdict from the one vocabulary and the representational score."""

from __future__ import annotations

import pytest
import torch

from structlens.replication.claims import ClaimsDocument
from structlens.replication.equivalence import run as eq_run
from structlens.stats.intervals import mcnemar_exact
from structlens.verdicts import VERDICTS


@pytest.fixture(scope="module")
def document(tmp_path_factory):
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the shared CI machine is oversubscribed
    root = tmp_path_factory.mktemp("equivalence-smoke")
    try:
        eq_run.run("smoke", out=root / "cache", doc_dir=root / "docs")
    finally:
        torch.set_num_threads(before)
    return ClaimsDocument.load(root / "docs" / "equivalence.json")


@pytest.fixture(scope="module")
def claims(document):
    return document.blocks


def test_sanity_pair_scores_one_at_every_level(claims):
    sanity = claims["sanity"]
    assert sanity["row"] == "sanity-tiny"
    assert sanity["head_score"] >= 0.99 and sanity["layer_score"] >= 0.99


def test_rows_carry_null_interval_and_null_calibrated_decision(claims):
    rows = {r["name"]: r for r in claims["rows"]}
    assert list(rows) == eq_run.SMOKE["scenarios"]
    for r in rows.values():
        lo, hi = r["score_ci"]
        assert 0.0 <= lo <= r["score"] <= hi <= 1.0
        assert 0.0 <= r["null_score"] <= 1.0
        # the decision is the paired test's: McNemar exact on the discordant heads
        t = r["paired_test"]
        assert t["p_value"] == mcnemar_exact(t["partner_only"], t["null_only"])
        assert t["partner_only"] + t["null_only"] + t["both"] + t["neither"] == t["n_heads"]
        passed = t["partner_only"] > t["null_only"] and t["p_value"] < t["alpha"]
        assert (r["decision"] == "equivalent") == (passed and r["score"] >= 0.5)
        assert (r["decision"], r["decision_reason"]) == (t["verdict"], t["reason"])
        # the verdict against the paper is from the one vocabulary, with its reason
        assert r["verdict"] in VERDICTS and r["verdict_reason"]
        assert r["verdict"] != "unidentified" or not passed
        rlo, rhi = r["representational_score_ci"]
        assert rlo <= r["representational_score"] <= rhi
    sanity = rows["sanity-tiny"]
    # identical heads up to a rotation/permutation: aligned representations, and the
    # partner passes where mean ablation fails, so the decision is made
    assert sanity["representational_score"] == 1.0
    assert sanity["decision"] == "equivalent" and sanity["paired_test"]["p_value"] < 0.05


def test_sanity_is_a_check_with_a_passing_positive_control(document):
    (claim,) = [c for c in document.claims if c.id == "sanity_score"]
    assert claim.kind == "check" and claim.positive_control["passed"] is True
    assert claim.verdict == "reproduced"
    assert all(c.verdict in VERDICTS for c in document.claims)
    assert document.blocks["paper_targets"]["in_paper_code"] is False

"""The equivalence replication's smoke profile: the sanity pair (tiny-llama-deep against its
rotated, head-permuted copy) scores 1 at the head and the layer level and is a check with a passing
positive control; every row's claims carry the null, the score's interval, the paired
decision, a verdict from the one vocabulary and the representational score; the claims are
the verdicts of the run's typed results, and every caveat of a row (the reduced CONGRUITY
encodings among them) reaches that row of the document."""

from __future__ import annotations

import pytest
import torch

from structlens.equivalence import verdicts
from structlens.replication.claims import ClaimsDocument
from structlens.replication.equivalence import run as eq_run
from structlens.stats.intervals import mcnemar_exact
from structlens.verdicts import VERDICTS


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the shared CI machine is oversubscribed
    root = tmp_path_factory.mktemp("equivalence-smoke")
    try:
        results, _ = eq_run.run("smoke", out=root / "cache", doc_dir=root / "docs")
    finally:
        torch.set_num_threads(before)
    return results, ClaimsDocument.load(root / "docs" / "equivalence.json")


@pytest.fixture(scope="module")
def document(run):
    return run[1]


@pytest.fixture(scope="module")
def claims(document):
    return document.blocks


def test_sanity_pair_scores_one_at_every_level(claims):
    sanity = claims["sanity"]
    assert sanity["row"] == "sanity-tiny"
    assert sanity["head_score"] >= 0.99 and sanity["layer_score"] >= 0.99


def test_rows_carry_null_interval_and_null_calibrated_decision(claims):
    rows = {r["name"]: r for r in claims["rows"]}
    assert list(rows) == list(eq_run.PROFILES["smoke"].scenarios)
    for r in rows.values():
        lo, hi = r["score_ci"]
        assert 0.0 <= lo <= r["score"] <= hi <= 1.0
        assert 0.0 <= r["null_score"] <= 1.0
        # the decision is the paired test's, over B's layers (McNemar when each head is its
        # own layer), on the discordant heads
        t = r["paired_test"]
        assert 0 < t["p_value"] <= 1 and 1 <= t["n_clusters"] <= t["n_heads"]
        if t["n_clusters"] == t["n_heads"]:
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
    assert claim.verdict == "reproduced" and claim.ours == 1.0
    assert claim.positive_control["heads_recovered"] == {"sanity-tiny": 1.0}
    assert all(c.verdict in VERDICTS for c in document.claims)
    assert document.blocks["paper_targets"]["in_paper_code"] is False


def test_claims_are_the_verdicts_of_the_typed_results(run):
    results, document = run
    by_id = {c.id: c for c in document.claims}
    assert list(by_id) == ["sanity_score", "seeds_score"]
    (row,) = [r for r in document.blocks["rows"] if r["name"] == "seeds-s0-s1"]
    r = results["seeds-s0-s1"]
    verdict, reason = verdicts.row_verdict("seeds", r)
    assert (row["verdict"], row["verdict_reason"]) == (verdict, reason)
    claim = by_id["seeds_score"]
    assert claim.verdict == verdict  # one pair: the group's verdict is the row's
    assert claim.ours == sum(r.heads.passed) / len(r.heads.passed)
    assert claim.ci == pytest.approx(r.heads.score_ci)  # one pair: its Wilson interval
    assert claim.per_setting["seeds-s0-s1"]["reason"] == reason


def test_every_caveat_of_a_row_reaches_its_row(run):
    results, document = run
    rows = {r["name"]: r for r in document.blocks["rows"]}
    kinds = set()
    for name, r in results.items():
        want = [{"kind": c.kind, "message": c.message} for c in verdicts.row_caveats(r)]
        assert rows[name]["caveats"] == want
        kinds |= {c["kind"] for c in want}
    # the smoke probe's 12 fit prompts are too few rows for CONGRUITY's encodings
    assert "encoding_reduced" in kinds
    seeds = {c.id: c for c in document.claims}["seeds_score"].per_setting["seeds-s0-s1"]
    assert seeds["caveats"] == rows["seeds-s0-s1"]["caveats"]


def test_rows_are_refused_when_their_stated_layers_or_context_do_not_fit(tmp_path):
    """A fine-tune row must compare exactly the layers its fine-tune trained, and an
    encoder–decoder must read no more context than it was trained on (checked before any
    model runs)."""
    import dataclasses
    from types import SimpleNamespace

    from structlens.equivalence.protocol import PROFILES as PROTOCOLS
    from structlens.equivalence.scenarios import FT_SETTINGS, SCENARIOS
    from structlens.errors import InputError

    rows = {sc.name: sc for sc in SCENARIOS}
    rep = eq_run.EquivalenceReplication(eq_run.PROFILES["cpu"], tmp_path)
    rep.ft_info["smollm2-ft-ioi"] = SimpleNamespace(train_layers=FT_SETTINGS["train_layers"])
    smollm2 = SimpleNamespace(n_layers=30)
    rep._check_trained_layers(rows["ft-ioi"], smollm2)  # layers 15-29, as trained
    with pytest.raises(InputError, match="trained layers"):
        rep._check_trained_layers(dataclasses.replace(rows["ft-ioi"], first_layer=0), smollm2)
    enc_dec = rows["enc-dec-same-data"]
    rep._check_context(enc_dec, enc_dec.protocol_for(PROTOCOLS["paper"]))  # 32 of 32 bytes
    smoke = eq_run.EquivalenceReplication(eq_run.PROFILES["smoke"], tmp_path)  # seq_len 32
    with pytest.raises(InputError, match="trained on at most 16"):
        smoke._check_context(enc_dec, enc_dec.protocol_for(PROTOCOLS["paper"]))

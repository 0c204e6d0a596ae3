"""The equivalence replication's smoke profile: the sanity pair (tiny-llama against its rotated,
head-permuted copy) scores 1 at the head and the layer level, and every row's claims carry the
null, the score's interval, the null-calibrated verdict and the representational score."""

from __future__ import annotations

import pytest
import torch

from structlens.replication.claims import ClaimsDocument
from structlens.replication.equivalence import run as eq_run
from structlens.stats.intervals import mcnemar_exact


@pytest.fixture(scope="module")
def claims(tmp_path_factory):
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the shared CI machine is oversubscribed
    root = tmp_path_factory.mktemp("equivalence-smoke")
    try:
        eq_run.run("smoke", out=root / "cache", doc_dir=root / "docs")
    finally:
        torch.set_num_threads(before)
    return ClaimsDocument.load(root / "docs" / "equivalence.json").blocks


def test_sanity_pair_scores_one_at_every_level(claims):
    sanity = claims["sanity"]
    assert sanity["row"] == "sanity-tiny"
    assert sanity["head_score"] >= 0.99 and sanity["layer_score"] >= 0.99


def test_rows_carry_null_interval_and_null_calibrated_verdict(claims):
    rows = {r["name"]: r for r in claims["rows"]}
    assert list(rows) == eq_run.SMOKE["scenarios"]
    for r in rows.values():
        lo, hi = r["score_ci"]
        assert 0.0 <= lo <= r["score"] <= hi <= 1.0
        assert 0.0 <= r["null_score"] <= 1.0
        # the verdict is the paired test's: McNemar exact on the discordant heads
        t = r["paired_test"]
        assert t["p_value"] == mcnemar_exact(t["partner_only"], t["null_only"])
        assert t["partner_only"] + t["null_only"] + t["both"] + t["neither"] == t["n_heads"]
        passed = t["partner_only"] > t["null_only"] and t["p_value"] < t["alpha"]
        assert (r["verdict"] == "equivalent") == (passed and r["score"] >= 0.5)
        assert (r["verdict"], r["verdict_reason"]) == (t["verdict"], t["reason"])
        rlo, rhi = r["representational_score_ci"]
        assert rlo <= r["representational_score"] <= rhi
    sanity = rows["sanity-tiny"]
    # identical heads up to a rotation/permutation: aligned representations, and the
    # partner passes where mean ablation fails, so the verdict is decided
    assert sanity["representational_score"] == 1.0
    assert sanity["verdict"] == "equivalent" and sanity["paired_test"]["p_value"] < 0.05

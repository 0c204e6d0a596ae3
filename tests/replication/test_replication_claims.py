"""The claims schema: validated at construction, round-trips through JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from structlens.replication.claims import ClaimsDocument
from structlens.verdicts import VERDICTS, Claim

DOCS = Path(__file__).resolve().parents[2] / "docs" / "replication"


def _claim(**kw):
    base = dict(id="c1", paper="0.71", ours=0.5, ci=(0.4, 0.6), verdict="partly", settings={})
    return Claim(**(base | kw))


def test_claim_rejects_an_unknown_verdict():
    with pytest.raises(ValueError, match="is not one of"):
        _claim(verdict="partly reproduced")


@pytest.mark.parametrize("ci", [(0.6, 0.4), (0.1, float("nan")), (1.0,)])
def test_claim_rejects_a_bad_interval(ci):
    with pytest.raises(ValueError, match="two finite numbers"):
        _claim(ci=ci)


def test_a_missing_interval_needs_a_reason():
    with pytest.raises(ValueError, match="ci_reason"):
        _claim(ci=None)
    assert _claim(ci=None, ci_reason="a count").to_json()["ci"] is None


def test_document_requires_the_method_blocks_and_round_trips(tmp_path):
    with pytest.raises(ValueError, match="lacks"):
        ClaimsDocument("ndm", "test", (_claim(),), {"tests": [{"whole_space_share": 0.1}]})
    doc = ClaimsDocument(
        "ndm", "test", (_claim(),), {"tests": [{"whole_space_share": 0.1, "screened": False}]}
    )
    back = ClaimsDocument.load(doc.write(tmp_path / "ndm.json"))
    assert back == doc
    raw = json.loads((tmp_path / "ndm.json").read_text())
    assert raw["claims"][0]["ci"] == [0.4, 0.6] and raw["tests"][0]["screened"] is False
    with pytest.raises(ValueError, match="repeat"):
        ClaimsDocument("ndm", "t", (_claim(), _claim()), doc.blocks)


@pytest.mark.parametrize("method", ["koopman", "ndm", "causal-dimension", "equivalence"])
def test_committed_claims_follow_the_schema(method):
    doc = ClaimsDocument.load(DOCS / f"{method}.json")
    assert doc.method == method
    assert all(c.verdict in VERDICTS for c in doc.claims)


def test_verdict_moves_lists_every_claim_old_and_new():
    from structlens.replication.markdown import verdict_moves

    now = [
        Claim("a", "p", 0.5, (0.4, 0.6), "reproduced", {}),
        Claim("b", "p", "two of three", None, "partly", {}, ci_reason="counts"),
    ]
    lines = verdict_moves({"a": ("0.1", "not reproduced"), "c": ("3", "partly")}, now, "abc123")
    assert lines[0].startswith("| claim | previous protocol (at abc123)")
    assert "| `a` | 0.1 → not reproduced | 0.500 → reproduced |" in lines
    assert "| `b` | — (new claim) | two of three → partly |" in lines
    assert "| `c` | 3 → partly | — (not measured in this run) |" in lines

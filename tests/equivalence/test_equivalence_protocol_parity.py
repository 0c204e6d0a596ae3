"""One protocol, one answer: the ``equiv`` CLI, ``structlens analyze`` and the equivalence
replication run the same sanity stage (the tiny model against its rotated, head-permuted copy),
so at the same protocol instance (``smoke``) they give the same typed comparison: scores,
nulls, paired decisions, CONGRUITY and caveats."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from structlens.cli import equiv
from structlens.equivalence.protocol import PROFILES
from structlens.results import to_jsonable


def assert_same(got, want, path="result"):
    """Equal structures: strings, booleans and integers exactly, floats to 1e-10."""
    if isinstance(want, dict):
        assert set(got) == set(want), path
        for key in want:
            assert_same(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{path}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool):
        assert isinstance(got, (int, float)), path
        assert math.isclose(got, want, rel_tol=1e-10, abs_tol=1e-12), (path, got, want)
    else:
        assert got == want, (path, got, want)


def _json(obj):
    return json.loads(json.dumps(to_jsonable(obj)))


@pytest.fixture(scope="module")
def drivers(tmp_path_factory):
    """The sanity stage's comparison (and check) from each driver, as JSON."""
    from structlens.analyze import AnalyzeConfig, run_analysis
    from structlens.models import load_model
    from structlens.replication.equivalence import run as rep

    protocol = PROFILES["smoke"]
    tmp = tmp_path_factory.mktemp("parity")
    out = {}

    r = CliRunner().invoke(
        equiv.app,
        ["sanity", "tiny-llama-deep", "--protocol", "smoke", "--out", str(tmp / "cli"), "-q"],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp / "cli" / "sanity.json").read_text())
    assert doc["sanity"]["protocol"] == protocol.to_json()
    out["cli"] = (doc, doc["sanity"])

    cfg = AnalyzeConfig(
        profile="smoke", stages=("equivalence",), out=tmp / "analyze", progress=False
    )
    assert cfg.settings.equivalence == protocol
    section = run_analysis(cfg, load_model("tiny-llama-deep")).sections["equivalence"]
    assert section["details"]["protocol"] == protocol.to_json()
    row = section["details"]["rows"][0]
    out["analyze"] = (row["comparison"], row["sanity"])

    replication = rep.EquivalenceReplication(rep.PROFILES["smoke"], tmp / "replication")
    (sc,) = [s for s in rep.SCENARIOS if s.name == "sanity-tiny"]
    res = replication.scenario(sc)
    # the row states that B is a copy (as the sanity stage itself assumes)
    assert replication.protocols["sanity-tiny"] == protocol.replace(relation="copy")
    out["replication"] = (_json(res), _json(replication.sanity["sanity-tiny"]))
    # the claims document's sanity block carries both copies' CONGRUITY
    from structlens.equivalence import verdicts

    blocks = verdicts.blocks({"sanity-tiny": res}, replication.sanity, {"sanity-tiny": protocol})
    assert [r["known"] for r in blocks["sanity"]["congruity"]] == ["equivalent"] * 2
    return out


@pytest.mark.parametrize("driver", ["analyze", "replication"])
def test_sanity_comparison_equals_the_cli(drivers, driver):
    want, _ = drivers["cli"]
    got, _ = drivers[driver]
    fields = [k for k in got if k != "layer_similarity"]
    assert "heads" in fields and "congruity" in fields and "caveats" in fields
    assert_same({k: got[k] for k in fields}, {k: want[k] for k in fields})
    assert_same(got["layer_similarity"], want["layer_similarity"])
    # the known answer: a function-preserving copy passes on every matched head
    assert want["heads"]["score"] == 1.0 and want["decision"] == "equivalent"


@pytest.mark.parametrize("driver", ["analyze", "replication"])
def test_sanity_check_equals_the_cli(drivers, driver):
    _, want = drivers["cli"]
    _, got = drivers[driver]
    for key in ("passed", "reason", "heads_recovered", "unrotated"):
        assert_same(got[key], want[key], key)
    assert want["passed"] and want["heads_recovered"] == 1.0
    # the unrotated copy ran CONGRUITY (the smoke protocol's), both estimates beside
    assert set(want["unrotated"]["variance_weighted"]) >= {"decision_rate_ab", "base_r2_ab"}
    assert want["unrotated_max_abs_logit_diff"] < 1e-3


def test_another_protocol_changes_the_answer(drivers, tmp_path):
    """The comparison can fail: another split rule gives other held-out prompts and KLs."""
    path = tmp_path / "protocol.json"
    path.write_text(json.dumps(PROFILES["smoke"].to_json() | {"heldout_fraction": 0.25}))
    args = ["sanity", "tiny-llama", "--protocol", str(path), "--out", str(tmp_path), "-q"]
    r = CliRunner().invoke(equiv.app, args)
    assert r.exit_code == 0, r.output
    other = json.loads((tmp_path / "sanity.json").read_text())
    want, _ = drivers["cli"]
    assert other["n_heldout"] < want["n_heldout"]
    assert other["heads"]["kl"] != want["heads"]["kl"]

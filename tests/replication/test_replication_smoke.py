"""Every replication's ``--profile smoke`` runs end to end on tiny models, writes its markdown
and a schema-valid claims JSON, and a second run is served entirely from the stage cache."""

from __future__ import annotations

import importlib
import json

import pytest
import torch

from structlens.replication import METHODS
from structlens.replication.claims import REQUIRED_BLOCKS, VERDICTS, ClaimsDocument


@pytest.fixture(autouse=True)
def one_thread():
    # The shared CI machine is oversubscribed; intra-op threads then mostly wait on each other.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _run(method, tmp_path):
    module = importlib.import_module(METHODS[method])
    return module.run("smoke", out=tmp_path / "cache", doc_dir=tmp_path / "docs")


@pytest.mark.parametrize("method", ["koopman", "equivalence", "ndm"])
def test_smoke_profile_writes_markdown_and_valid_claims(method, tmp_path):
    _, cache = _run(method, tmp_path)
    md = (tmp_path / "docs" / f"{method}.md").read_text()
    assert md.startswith("# ") and f"structlens.replication {method} --profile smoke" in md
    doc = ClaimsDocument.load(tmp_path / "docs" / f"{method}.json")
    assert doc.method == method and doc.claims
    assert {c.verdict for c in doc.claims} <= set(VERDICTS)
    raw = json.loads((tmp_path / "docs" / f"{method}.json").read_text())
    for path in REQUIRED_BLOCKS[method]:
        assert path.split(".")[0].removesuffix("[]") in raw
    assert cache.events and not any(cache.hits())  # a fresh cache computes every stage


def test_causal_dimension_second_run_is_all_hits_with_identical_documents(tmp_path):
    method = "causal-dimension"
    _, first = _run(method, tmp_path)
    assert first.events and not any(first.hits())
    md = (tmp_path / "docs" / f"{method}.md").read_text()
    js = (tmp_path / "docs" / f"{method}.json").read_text()
    doc = ClaimsDocument.load(tmp_path / "docs" / f"{method}.json")
    assert {c.id for c in doc.claims} >= {"exact_kappa", "kappa_pr_lower_bound"}
    assert set(json.loads(js)["kappa"]["ratio_last_doubling"]) == {"1", "2"}
    _, second = _run(method, tmp_path)
    assert [e.key for e in second.events] == [e.key for e in first.events]
    assert all(second.hits())
    assert (tmp_path / "docs" / f"{method}.md").read_text() == md
    assert (tmp_path / "docs" / f"{method}.json").read_text() == js


@pytest.mark.slow  # three spawned training processes and two evaluations: ~3 min here
def test_ndm_device_training_path_runs_on_the_cpu(tmp_path, monkeypatch):
    """The gpu profile's device training (pack → per-layer processes → training directory)
    end to end on the tiny model, on the CPU; evaluation then uses the device-trained run and
    still evaluates the CPU run for comparison."""
    from structlens.replication.ndm import run as ndm_run

    monkeypatch.setitem(ndm_run.PROFILES, "smoke", ndm_run.SMOKE | {"device_training": True})
    R, cache = _run("ndm", tmp_path)
    assert R["device_run"] and R["evaluate_cpu"] is not None
    names = [e.name for e in cache.events]
    assert "train-device" in names and names.count("evaluate") == 2
    assert R["train"]["command"] == "structlens.replication.ndm.device_train train"
    assert sorted(R["train"]["results"]) == ["0", "1", "2"]
    md = (tmp_path / "docs" / "ndm.md").read_text()
    assert "Trained with `structlens.replication.ndm.device_train`" in md
    assert ClaimsDocument.load(tmp_path / "docs" / "ndm.json").blocks["settings"]["device_run"]

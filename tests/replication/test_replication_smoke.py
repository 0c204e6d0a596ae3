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

"""The NDM replication's smoke profile carries the layer sweep, the screen, restarts and SAE
settings through to the claims JSON and the markdown, from the run's own results."""

from __future__ import annotations

import math

import pytest
import torch

from structlens.replication.claims import ClaimsDocument
from structlens.replication.ndm import run as ndm_run
from structlens.results import to_jsonable


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the shared CI machine is oversubscribed
    root = tmp_path_factory.mktemp("ndm-smoke")
    try:
        R, _ = ndm_run.run("smoke", out=root / "cache", doc_dir=root / "docs")
    finally:
        torch.set_num_threads(before)
    return R, root / "docs"


def test_tests_block_is_the_runs_screen(smoke):
    R, docs = smoke
    ev = R.evaluate
    doc = ClaimsDocument.load(docs / "ndm.json")
    tests = doc.blocks["tests"]
    assert [t["test"] for t in tests] == list(
        ndm_run.PROFILES["smoke"].tests
    )  # the RoPE-transferable set
    assert doc.blocks["screen"] == {"min_whole_space_share": 0.3, "applied_to_gini": True}
    for t in tests:
        e = ev.effects[t["test"]]
        clean = e["clean_metric_mean"]
        share = e["full_effect_mean"] / clean if clean > 0 else math.nan
        if math.isnan(share):
            assert t["whole_space_share"] is None and not t["screened"]
        else:
            assert t["whole_space_share"] == pytest.approx(share)
            assert t["screened"] == (share >= 0.3)
        assert (t["gini_dimension"] == "no signal") == (not t["screened"])
    claim = next(c for c in doc.claims if c.id == "mean_gini_ndm_vs_baselines")
    if not any(t["screened"] for t in tests):
        assert claim.verdict == "not tested" and claim.ours is None


def test_the_layer_sweep_places_the_tests_and_the_training(smoke):
    """NDM is trained, and every test evaluated, at the layer the sweep chose; the claims JSON
    and the markdown hold every candidate's share."""
    R, docs = smoke
    sweep = R.sweep
    assert sweep.rule == "share_sweep" and [c.test for c in sweep.choices] == list(
        ndm_run.PROFILES["smoke"].tests
    )
    assert R.evaluate.layers == sweep.chosen and R.train.layers == sweep.layers
    # as JSON, NaN shares (the random model does not do most tasks) as "nan"
    assert to_jsonable(R.evaluate.layer_sweep) == sweep.to_json()
    doc = ClaimsDocument.load(docs / "ndm.json")
    assert to_jsonable(doc.blocks["layer_sweep"]) == sweep.to_json()
    assert doc.blocks["settings"]["layers"] == sweep.layers
    md = (docs / "ndm.md").read_text()
    assert "## Layers of the patching tests" in md
    for c in sweep.choices:
        assert c.candidates and f"| {c.test} | " in md and f"**{c.chosen}: " in md


def test_restarts_and_sae_settings_reach_the_run(smoke):
    R, docs = smoke
    for layer in map(str, R.sweep.layers):
        table = R.train.results[layer]["restarts"]
        assert len(table) == ndm_run.PROFILES["smoke"].protocol.restarts == 2
    sae = R.evaluate.baselines[str(R.sweep.layers[0])]["sae"]
    assert (
        sae["tol"] == 0.01 and 1 <= sae["epochs"] <= ndm_run.PROFILES["smoke"].protocol.sae_epochs
    )
    assert len(sae["fvu_history"]) == sae["epochs"]
    md = (docs / "ndm.md").read_text()
    # protocol history is hand-written in docs/replication/changes-ndm.md, not generated
    assert "## What changed and why" not in md and "| test | layer | positions |" in md
    for t in list(ndm_run.PROFILES["smoke"].tests):
        assert f"| {t} |" in md


def test_claims_document_holds_the_claims_of_the_runs_records(smoke):
    """The claims JSON is :func:`structlens.ndm.verdicts.claims` of the run's typed Results,
    field by field, with the training run's convergence behind the Gini verdict."""
    from structlens.ndm.verdicts import claims
    from structlens.results import to_jsonable

    R, docs = smoke
    doc = ClaimsDocument.load(docs / "ndm.json")
    found = claims(R.evaluate, R.train, R.toy, R.planted, R.browse)
    assert [c.to_json() for c in doc.claims] == to_jsonable([c.to_json() for c in found])
    by_id = {c.id: c for c in doc.claims}
    assert set(by_id) >= {"mean_gini_ndm_vs_baselines", "toy_recovery", "preimage_browser_scale"}
    gini = by_id["mean_gini_ndm_vs_baselines"]
    screened = [row["test"] for row in R.evaluate.screen if row["screened"]]
    assert gini.settings["screened_tests"] == screened
    converged = all(R.train.layer(R.evaluate.layers[t])["converged"] for t in screened)
    if not screened or not converged:  # no signal, or a partition that is not the answer
        assert gini.verdict == "not tested" and (gini.note or gini.ci_reason)
    browser = by_id["preimage_browser_scale"]
    assert browser.ours == R.browse[0].n_activations


def test_gpu_profile_trains_on_1e5_activations_and_evaluates_500_prompts():
    from structlens.ndm.device_train import DEVICE_CONFIG

    g = ndm_run.PROFILES["gpu"]
    cfg = DEVICE_CONFIG | g.device_config
    assert g.protocol.corpus_prompts * 100 >= 100_000  # windows of <= 128 tokens (~117)
    assert g.device_rows >= 100_000
    # the packed rows are exactly the bank plus one refresh cycle of queries
    assert cfg["bank_size"] + cfg["refresh_interval"] * cfg["batch_size"] == g.device_rows
    assert (cfg["merge_start"], cfg["merge_interval"]) == (20_000, 8_000)  # the paper's
    assert g.protocol.patch_prompts >= 500 and g.protocol.restarts > 1


def test_the_depth_rule_is_rendered_as_the_mapped_layers_without_a_sweep():
    from types import SimpleNamespace

    from structlens.ndm.protocol import PROFILES
    from structlens.ndm.stages import LayerChoice, LayerSweep
    from structlens.replication.markdown import Template
    from structlens.replication.ndm import render

    selection = PROFILES["paper"].replace(layer_rule="depth").layer_selection()
    sweep = LayerSweep(selection, [LayerChoice("induction", 17, (), (), (), 17)])
    t = Template(render.TEMPLATE)
    text = render._sweep(t, SimpleNamespace(sweep=sweep), None)  # depth: no evaluation read
    assert "(the depth rule; no layer is measured): induction 17." in text and "|" not in text
    assert (
        t.blocks["layer_rule depth"].format_map(selection) == "`round((l+1)·30/12) − 1`, halves up"
    )

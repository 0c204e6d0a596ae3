"""Subspace patching evaluation on a tiny random Llama with SmolLM2's tokenizer."""

import copy
import dataclasses

import numpy as np
import pytest
import torch

from structlens.data.tasks import make_task, pad_batch
from structlens.interventions import patch, subspace_basis
from structlens.interventions.fastrun import metric_logits, resumed, truncated
from structlens.models import load_model
from structlens.models.loading import Model
from structlens.ndm.baselines import random_rotation
from structlens.ndm.evaluate import (
    PAPER_TESTS,
    bootstrap_gini,
    corrupted_prompts,
    map_layer,
    metric_positions,
    name_swap_corruption,
    patch_positions,
    patch_subspaces,
    routing_rates,
    summarize_gini,
)

# the fixtures take SmolLM2's tokenizer, which comes from loading the real model
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # The shared CI machine is oversubscribed; intra-op threads then mostly wait on each other.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok():
    return load_model("smollm2-135m").tokenizer


@pytest.fixture(scope="module")
def tiny(tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return Model(LlamaForCausalLM(cfg), tok, "tiny-llama-smol", "test")


@pytest.fixture(scope="module")
def ioi(tok):
    return make_task("ioi", tok, n=10, seed=0)


def _blocks(R, partition):
    bounds = np.concatenate([[0], np.cumsum(partition)])
    return [R[:, bounds[s] : bounds[s + 1]] for s in range(len(partition))]


def test_map_layer_matches_relative_depth():
    assert [map_layer(t.gpt2_layer, 30) for t in PAPER_TESTS] == [12, 17, 22, 22, 24]
    assert [map_layer(l, 12) for l in range(12)] == list(range(12))
    with pytest.raises(ValueError, match="gpt2_layer"):
        map_layer(12, 30)


def test_fast_runs_match_full_model(tiny, ioi):
    ids, mask = pad_batch(ioi.clean[:4], tok_pad := tiny.tokenizer.pad_token_id)
    del tok_pad
    with torch.no_grad():
        full = tiny.forward(ids, mask)
    from structlens.interventions import run_with_cache

    with truncated(tiny, 1):
        _, cache = run_with_cache(tiny, ids, mask, ["blocks.1.hook_resid_post"])
    _, ref = run_with_cache(tiny, ids, mask, ["blocks.1.hook_resid_post"])
    torch.testing.assert_close(cache["blocks.1.hook_resid_post"], ref["blocks.1.hook_resid_post"])
    pos = metric_positions(ioi.subset(list(range(4))))
    with torch.no_grad(), resumed(tiny, 1, ref["blocks.1.hook_resid_post"]):
        part = metric_logits(tiny, ids, mask, pos)
    expect = torch.stack([full[i, pos[i]] for i in range(4)])
    torch.testing.assert_close(part, expect, atol=1e-4, rtol=1e-4)
    # The stand-ins are removed afterwards.
    with torch.no_grad():
        torch.testing.assert_close(tiny.forward(ids, mask), full)


def test_subspace_patch_matches_foundation_patch_and_all_subspaces_equal_full(tiny, ioi):
    d, layer = tiny.d_model, 1
    R = random_rotation(d, seed=3)
    partition = [16, 8, 8]
    corr = corrupted_prompts(ioi, "position_swap")
    positions = patch_positions(ioi, ["IO+1", "S+1"])
    runs = patch_subspaces(
        tiny,
        ioi,
        corr,
        layer,
        positions,
        {"rand": _blocks(R, partition), "whole": [R]},
        batch_size=4,
    )
    run = runs["rand"]
    # One basis spanning everything is the full patch.
    np.testing.assert_allclose(runs["whole"].effects[:, 0], run.full_effect, atol=1e-5)
    # Against the foundation's patch() with basis=subspace_basis(R, cols) on the full model.
    ids, mask = pad_batch(ioi.clean, tiny.tokenizer.pad_token_id)
    cids, _ = pad_batch(corr, tiny.tokenizer.pad_token_id)
    site = f"blocks.{layer}.hook_resid_post"
    from structlens.interventions import run_with_cache

    _, ccache = run_with_cache(tiny, cids, mask, [site])
    idx = list(range(len(ioi.clean)))
    with torch.no_grad():
        clean = ioi.metric(ioi.gather_logits(tiny.forward(ids, mask), idx), idx).double().numpy()
        out = patch(
            tiny,
            ids,
            mask,
            site,
            ccache[site],
            positions=positions,
            basis=subspace_basis(torch.as_tensor(R, dtype=torch.float32), range(16, 24)),
        )
    patched = ioi.metric(ioi.gather_logits(out, idx), idx).double().numpy()
    np.testing.assert_allclose(run.clean_metric, clean, atol=1e-4)
    np.testing.assert_allclose(run.effects[:, 1], clean - patched, atol=1e-4)


def test_effects_add_up_for_a_linear_metric(tiny, ioi):
    # With the final norm removed, logits after the last layer are linear in its resid_post,
    # so the logit-difference metric is linear and the effects of the subspaces of a
    # partition add up exactly to the effect of patching the whole space.
    R = random_rotation(tiny.d_model, seed=5)
    norm = tiny.hf.model.norm
    tiny.hf.model.norm = torch.nn.Identity()
    try:
        runs = patch_subspaces(
            tiny,
            ioi,
            corrupted_prompts(ioi, "abc"),
            2,
            patch_positions(ioi, ["END", "S2"]),
            {"r": _blocks(R, [8, 8, 8, 4, 4])},
        )
    finally:
        tiny.hf.model.norm = norm
    run = runs["r"]
    assert np.abs(run.full_effect).max() > 1e-3
    np.testing.assert_allclose(run.effects.sum(1), run.full_effect, atol=1e-5)


def _patch_with_rows(args, stack_rows):
    """``patch_subspaces``'s runs and the rows of each resumed pass (one-token probes left
    out), seen by the last layer, which only resumed passes and probes compute."""
    rows = []

    def record(_module, inputs, _output):
        if inputs[0].shape[1] > 1:
            rows.append(inputs[0].shape[0])

    handle = args[0].layers[-1].register_forward_hook(record)
    try:
        return patch_subspaces(*args, batch_size=4, stack_rows=stack_rows), rows
    finally:
        handle.remove()


@pytest.mark.parametrize("names", [["IO+1", "S2"], ["ALL"]])
def test_stacked_subspaces_match_one_pass_per_subspace(tiny, ioi, names):
    # float64 weights, so stacking can change the numbers by double round-off only; batches
    # of 4, 4 and 2 prompts, each with 3 + 5 + 2 + 0 residuals (clean, corrupted, whole space,
    # then the methods' subspaces), stacked 3 (10 is not a multiple of 3) and 6 at a time
    model = Model(copy.deepcopy(tiny.hf).double(), tiny.tokenizer, "tiny-llama-smol-f64", "test")
    bases = {
        "a": _blocks(random_rotation(32, seed=7), [8, 8, 4, 4, 8]),
        "b": _blocks(random_rotation(32, seed=8), [16, 16]),
        "none": [],
    }
    args = (model, ioi, corrupted_prompts(ioi, "abc"), 1, patch_positions(ioi, names), bases)
    one, one_rows = _patch_with_rows(args, 1)
    stacked, stacked_rows = _patch_with_rows(args, 12)
    assert one_rows == [4] * 20 + [2] * 10
    assert stacked_rows == [12, 12, 12, 4] * 2 + [12, 8]
    assert one.keys() == stacked.keys()
    for method, run in one.items():
        assert run.effects.shape == (10, len(bases[method]))
        for field in dataclasses.fields(run):
            want, got = getattr(run, field.name), getattr(stacked[method], field.name)
            assert got.shape == want.shape and got.dtype == want.dtype
            if want.dtype.kind == "f":
                np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
            else:
                np.testing.assert_array_equal(got, want)
    assert np.abs(one["a"].effects).max() > 1e-3  # the patches do change the metric
    with pytest.raises(ValueError, match="stack_rows"):
        patch_subspaces(*args, stack_rows=0)


def test_name_swap_and_positions(ioi):
    ns = name_swap_corruption(ioi)
    for i, (c, t) in enumerate(zip(ns, ioi.clean, strict=True)):
        io, s, s2 = (ioi.positions[k][i] for k in ("IO", "S", "S2"))
        assert len(c) == len(t)
        assert c[io] == t[s] and c[s] == t[io] and c[s2] == t[io]
        assert [c[j] for j in range(len(t)) if j not in (io, s, s2)] == [
            t[j] for j in range(len(t)) if j not in (io, s, s2)
        ]
    assert patch_positions(ioi, ["ALL"]) is None
    assert patch_positions(ioi, ["METRIC"]) == metric_positions(ioi)
    with pytest.raises(ValueError, match="no position"):
        patch_positions(ioi, ["NOPE"])
    with pytest.raises(ValueError, match="no corruption"):
        corrupted_prompts(ioi, "nope")


def test_bad_bases_and_prompts_raise(tiny, ioi):
    corr = corrupted_prompts(ioi, "abc")
    with pytest.raises(ValueError, match="orthonormal"):
        patch_subspaces(tiny, ioi, corr, 1, None, {"x": [np.ones((32, 2))]})
    with pytest.raises(ValueError, match="d=32"):
        patch_subspaces(tiny, ioi, corr, 1, None, {"x": [np.eye(16)]})
    with pytest.raises(ValueError, match="corrupted prompts"):
        patch_subspaces(tiny, ioi, corr[:3], 1, None, {"x": [np.eye(32)]})
    with pytest.raises(ValueError, match="layer"):
        patch_subspaces(tiny, ioi, corr, 7, None, {"x": [np.eye(32)]})


def test_gini_summary_and_bootstrap():
    rng = np.random.default_rng(0)
    # Test A: one subspace carries the whole effect; test B: spread evenly.
    conc = np.zeros((40, 4))
    conc[:, 0] = 1.0 + 0.1 * rng.standard_normal(40)
    even = 1.0 + 0.01 * rng.standard_normal((40, 4))
    from structlens.ndm.evaluate import PatchRun

    def run(e):
        z = np.zeros(e.shape[0])
        return PatchRun(z, z, e, e.sum(1), np.zeros(e.shape, int), z, z)

    runs = {"a": {"ndm": run(conc), "id": run(even)}, "b": {"ndm": run(conc), "id": run(even)}}
    dims = {"a": [1, 1, 1, 1], "b": [1, 1, 1, 1]}
    var = {t: {"ndm": [1.0] * 4, "id": [1.0] * 4} for t in runs}
    out = summarize_gini(runs, dims, var, n_boot=200)
    assert out["gini"]["a"]["ndm"]["unnormalized"]["value"] == pytest.approx(0.75)
    assert out["gini_mean"]["id"]["dimension"]["value"] < 0.01
    lo, hi = out["gini_mean_diff"]["id"]["dimension"]["ci"]
    assert lo > 0.7 and hi <= 0.75 + 1e-12
    assert out["gini_mean_diff"]["id"]["dimension"]["p_above"] == 0.0  # no draw at or below 0
    flat = summarize_gini(
        {"a": {"ndm": run(even), "id": run(even)}}, {"a": [1] * 4},
        {"a": {"ndm": [1.0] * 4, "id": [1.0] * 4}}, n_boot=200,
    )  # fmt: skip
    assert flat["gini_mean_diff"]["id"]["dimension"]["p_above"] == 1.0  # identical: never above
    boots = bootstrap_gini(conc, [1, 1, 1, 1], [1, 1, 1, 1], n_boot=50, seed=1)
    np.testing.assert_allclose(boots["unnormalized"], 0.75)
    with pytest.raises(ValueError, match="n_prompts"):
        bootstrap_gini(conc[:1], [1] * 4, [1] * 4)


def test_routing_rates_count_top1(tok):
    task = make_task("knowledge_conflict", tok, n=6, seed=0)
    from structlens.ndm.evaluate import PatchRun

    ctx = np.asarray(task.answers["context"])
    par = np.asarray(task.answers["parametric"])
    top = np.stack([ctx, par, np.full(6, -1)], 1)
    z = np.zeros(6)
    run = PatchRun(z, z, np.zeros((6, 3)), z, top, ctx, par)
    r = routing_rates(run, task)
    assert r["clean"] == {"context_rate": 1.0, "param_rate": 0.0}
    assert r["full"] == {"context_rate": 0.0, "param_rate": 1.0}
    assert r["subspaces"][2] == {"context_rate": 0.0, "param_rate": 0.0}


@pytest.mark.slow
def test_smollm2_subspace_patch_matches_foundation_patch():
    model = load_model("smollm2-135m")
    task = make_task("ioi", model.tokenizer, n=4, seed=0)
    R = random_rotation(model.d_model, seed=0)
    corr = corrupted_prompts(task, "position_swap")
    positions = patch_positions(task, ["S2"])
    runs = patch_subspaces(model, task, corr, 17, positions, {"r": [R[:, :64]]}, batch_size=4)
    ids, mask = pad_batch(task.clean, model.tokenizer.pad_token_id)
    cids, _ = pad_batch(corr, model.tokenizer.pad_token_id)
    site = "blocks.17.hook_resid_post"
    from structlens.interventions import run_with_cache

    _, ccache = run_with_cache(model, cids, mask, [site])
    basis = subspace_basis(torch.as_tensor(R, dtype=torch.float32), range(64))
    out = patch(model, ids, mask, site, ccache[site], positions=positions, basis=basis)
    idx = list(range(4))
    patched = task.metric(task.gather_logits(out, idx), idx).double().numpy()
    np.testing.assert_allclose(runs["r"].clean_metric - patched, runs["r"].effects[:, 0], atol=2e-3)

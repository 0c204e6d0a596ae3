"""Models split by a device_map (accelerate): the same sites, patches and fingerprint as on
one device; bad placement arguments get one-line errors; ``revision`` reaches the hub cache."""

from __future__ import annotations

import importlib.util

import huggingface_hub.constants
import pytest
import torch

from structlens.capture.capture import ModelRef, collect
from structlens.errors import InputError
from structlens.interventions.hooks import hooked
from structlens.interventions.patching import patch, run_with_cache, run_with_grads
from structlens.models.loading import ModelUnavailableError, load_model
from structlens.models.tiny import build_tiny

# layer 0 computes in place; layers 1-2 and the final norm are read from disk each pass
SPLIT = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.layers.2": "disk",
    "model.norm": "disk",
    "lm_head": "cpu",
}


def _saved(tmp_path_factory, name: str) -> str:
    path = tmp_path_factory.mktemp(name)
    hf, tok = build_tiny(name)
    hf.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = _saved(tmp_path_factory, "tiny-llama")
    return load_model(path), load_model(path, device_map=SPLIT)


def test_split_model_holds_weights_off_device(pair):
    one, split = pair
    assert split.offloaded and not one.offloaded
    assert split.device == torch.device("cpu")
    assert split.load_options["device_map"] == SPLIT


def test_every_site_matches_one_device(pair):
    one, split = pair
    sites = one.site_names()  # norm scales, patterns and rotary sites included
    ids = torch.tensor([[1, 5, 9, 3, 7], [2, 4, 6, 8, 10]])
    mask = torch.ones_like(ids)
    with torch.no_grad(), hooked(one, sites) as a:
        out_a = one.forward(ids, mask)
    with torch.no_grad(), hooked(split, sites) as b:
        out_b = split.forward(ids, mask)
    torch.testing.assert_close(out_b, out_a, rtol=0, atol=1e-6)
    for s in sites:
        torch.testing.assert_close(b[s], a[s], rtol=0, atol=1e-6, msg=s)
    got = collect(split, [[1, 5, 9], [2, 4, 6, 8]], sites[:6], positions="last")
    want = collect(one, [[1, 5, 9], [2, 4, 6, 8]], sites[:6], positions="last")
    for s in sites[:6]:
        torch.testing.assert_close(got[s], want[s], rtol=0, atol=1e-6)


def test_fingerprint_reads_offloaded_weights(pair):
    one, split = pair
    assert split.fingerprint() == one.fingerprint()
    # a positive control: an edited weight changes it
    other = load_model(one.source, device_map=SPLIT)
    with torch.no_grad():
        other.hf.lm_head.weight[0, 0] += 1.0
    assert other.fingerprint() != one.fingerprint()


def test_patches_and_gradients_match_one_device(pair):
    one, split = pair
    clean, corrupt = torch.tensor([[1, 5, 9, 3]]), torch.tensor([[1, 7, 9, 2]])
    mask = torch.ones_like(clean)
    site = "blocks.2.ln1.hook_normalized"  # a norm site on a disk-offloaded layer
    _, src = run_with_cache(one, corrupt, mask, [site])
    for model_out in (
        lambda m: patch(m, clean, mask, site, src[site], positions=[[2]]),
        lambda m: patch(m, clean, mask, "blocks.1.hook_mlp_out", src[site] * 0),
        lambda m: run_with_grads(m, clean, mask, [site], lambda y: y[:, -1, 3])[2][site],
    ):
        torch.testing.assert_close(model_out(split), model_out(one), rtol=1e-5, atol=1e-6)


def test_model_ref_reloads_the_same_placement(pair):
    one, split = pair
    ref = ModelRef.of(split)
    fresh = ModelRef(**{**ref.__getstate__(), "live": None}).get()
    assert fresh.offloaded and fresh.load_options == split.load_options
    assert fresh.fingerprint() == one.fingerprint()


# tied unembedding, post-LN, MoE neurons and sinks, a hybrid, structlens's own attention
# forward (the last three swap module forwards under accelerate's hooks)
@pytest.mark.parametrize(
    "name",
    ["tiny-gpt2", "tiny-bert", "tiny-qwen3-moe", "tiny-gpt-oss", "tiny-qwen3-next", "tiny-falcon"],
)
def test_auto_map_across_families(tmp_path_factory, name):
    path = _saved(tmp_path_factory, name)
    one = load_model(path)
    split = load_model(path, device_map="auto", max_memory={"cpu": "60KB"})  # spills to disk
    assert split.offloaded
    assert split.fingerprint() == one.fingerprint()  # GPT-2 ties its unembedding
    sites = one.site_names()
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad(), hooked(one, sites) as a:
        one.forward(ids, torch.ones_like(ids))
    with torch.no_grad(), hooked(split, sites) as b:
        split.forward(ids, torch.ones_like(ids))
    for s in sites:
        torch.testing.assert_close(b[s], a[s], rtol=0, atol=1e-6, msg=s)
    with torch.no_grad():  # the sites' forwards are swapped back: accelerate's hooks still run
        again = split.forward(ids, torch.ones_like(ids))
    torch.testing.assert_close(again, one.forward(ids, torch.ones_like(ids)), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(name="tiny-llama", device_map="auto"), "built-in"),
        (dict(name="x.gguf", device_map="auto"), "GGUF"),
        (dict(name="gpt2", device_map="everywhere"), "use one of"),
        (dict(name="gpt2", device_map={"model": 3.5}), "cpu, disk"),
        (dict(name="gpt2", max_memory={"cpu": "1GiB"}), "device_map"),
        (dict(name="gpt2", device="cpu", device_map="auto"), "not both"),
        (dict(name="gpt2", quantization="3bit"), "8bit"),
    ],
)
def test_bad_placement_is_refused(kwargs, words):
    name = kwargs.pop("name")
    with pytest.raises(InputError, match=words):
        load_model(name, **kwargs)


def test_revision_of_a_local_directory_is_refused(pair):
    with pytest.raises(InputError, match="local path"):
        load_model(pair[0].source, revision="step1000")


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is not None, reason="installed")
def test_quantization_without_bitsandbytes_names_the_package():
    with pytest.raises(ModelUnavailableError, match="pip install bitsandbytes"):
        load_model("gpt2", quantization="8bit")


def test_revision_selects_the_checkpoint(tmp_path, monkeypatch):
    # a hub cache holding two revisions of one repo, read offline
    repo = tmp_path / "models--structlens-test--tiny"
    weights = {}
    for rev, seed, commit in (("step1", 1, "a" * 40), ("step2", 2, "b" * 40)):
        hf, tok = build_tiny("tiny-llama", seed=seed)
        hf.save_pretrained(repo / "snapshots" / commit)
        tok.save_pretrained(repo / "snapshots" / commit)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / rev).write_text(commit)
        weights[rev] = hf.lm_head.weight.detach().clone()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for rev in ("step1", "step2"):
        m = load_model("structlens-test/tiny", revision=rev)
        assert torch.equal(m.hf.lm_head.weight, weights[rev])
        assert m.source.endswith(f"@{rev}")
    with pytest.raises(ModelUnavailableError, match="revision 'step3'"):
        load_model("structlens-test/tiny", revision="step3")


def test_jacobian_kappa_matches_one_device(pair):
    # the exact Jacobian's torch.func.jvp runs through layers whose weights are read from
    # disk inside the transform (structlens.models.placement.transform_safe_offload)
    from structlens.causal_dim.jacobian import JacobianConfig
    from structlens.causal_dim.model import model_causal_dimension

    one, split = pair
    prompts, cfg = [[1, 5, 9, 3], [2, 4, 6]], JacobianConfig(n_groups=2)
    a = model_causal_dimension(one, 1, prompts, cfg)
    b = model_causal_dimension(split, 1, prompts, cfg)
    assert a.erank > 1.0  # not a degenerate Σ
    torch.testing.assert_close(
        torch.from_numpy(b.sigma), torch.from_numpy(a.sigma), rtol=1e-5, atol=1e-9
    )


def test_equivalence_rows_match_one_device(pair):
    from structlens.equivalence.collect import collect_rows

    one, split = pair
    tokens = [[1, 5, 9, 3, 7], [2, 4, 6]]
    a = collect_rows(one, tokens, start=1, sentence=False, batch_size=2)
    b = collect_rows(split, tokens, start=1, sentence=False, batch_size=2)
    for rows_a, rows_b in zip(a, b, strict=True):
        for x, y in zip(rows_a, rows_b, strict=True):
            torch.testing.assert_close(torch.from_numpy(y), torch.from_numpy(x), rtol=0, atol=1e-6)


def _two_gpu_map(n_layers: int) -> dict[str, int]:
    half = n_layers // 2
    layers = {f"model.layers.{i}": int(i >= half) for i in range(n_layers)}
    return {"model.embed_tokens": 0, "model.rotary_emb": 0, **layers, "model.norm": 1, "lm_head": 1}


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_gpus_give_the_captures_patches_and_kappa_of_one(tmp_path_factory):
    from structlens.causal_dim.jacobian import JacobianConfig
    from structlens.causal_dim.model import model_causal_dimension

    path = _saved(tmp_path_factory, "tiny-llama")
    one = load_model(path, device="cuda:0")
    two = load_model(path, device_map=_two_gpu_map(one.n_layers))
    assert two.devices == (torch.device("cuda:0"), torch.device("cuda:1"))
    ids = torch.tensor([[1, 5, 9, 3, 7], [2, 4, 6, 8, 10]], device="cuda:0")
    mask = torch.ones_like(ids)
    sites = one.site_names()
    with torch.no_grad(), hooked(one, sites) as a:
        one.forward(ids, mask)
    with torch.no_grad(), hooked(two, sites) as b:
        two.forward(ids, mask)
    for s in sites:
        assert b[s].device == torch.device("cuda:0"), s  # brought to the input device
        torch.testing.assert_close(b[s], a[s], rtol=1e-5, atol=1e-5, msg=s)
    site = "blocks.2.hook_resid_pre"  # computed on the second GPU
    _, src = run_with_cache(one, ids[:1].flip(1), mask[:1], [site])
    torch.testing.assert_close(
        patch(two, ids[:1], mask[:1], site, src[site]),
        patch(one, ids[:1], mask[:1], site, src[site]),
        rtol=1e-5,
        atol=1e-5,
    )
    prompts, cfg = [[1, 5, 9, 3], [2, 4, 6]], JacobianConfig(n_groups=2)
    ka = model_causal_dimension(one, 1, prompts, cfg)
    kb = model_causal_dimension(two, 1, prompts, cfg)
    torch.testing.assert_close(
        torch.from_numpy(kb.sigma), torch.from_numpy(ka.sigma), rtol=1e-4, atol=1e-7
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cpu_offload_to_a_gpu_matches_one_device(tmp_path_factory):
    path = _saved(tmp_path_factory, "tiny-llama")
    one = load_model(path, device="cuda:0")
    placed = {k: 0 for k in SPLIT} | {"model.layers.1": "cpu", "model.layers.2": "disk"}
    split = load_model(path, device_map=placed)
    assert split.offloaded and split.devices == (torch.device("cuda:0"),)
    ids = torch.tensor([[1, 5, 9, 3, 7]], device="cuda:0")
    sites = one.site_names()
    with torch.no_grad(), hooked(one, sites) as a:
        one.forward(ids, torch.ones_like(ids))
    with torch.no_grad(), hooked(split, sites) as b:
        split.forward(ids, torch.ones_like(ids))
    for s in sites:
        torch.testing.assert_close(b[s], a[s], rtol=1e-5, atol=1e-5, msg=s)


def test_cli_places_and_refuses(pair, tmp_path):
    from typer.testing import CliRunner

    from structlens.cli.main import app

    one, _ = pair
    spec = ",".join(f"{module}={dev}" for module, dev in SPLIT.items())
    run = CliRunner().invoke
    r = run(app, ["sites", one.source, "--device-map", spec, "--out", str(tmp_path), "-q"])
    assert r.exit_code == 0, r.output
    listed = (tmp_path / "sites.json").read_text()
    assert all(f'"{s}"' in listed for s in one.site_names())
    for args, words in (
        (["--device-map", "model.layers.0"], "use one of"),
        (["--device-map", "auto", "--max-memory", "cpu"], "KEY=VALUE"),
        (["--device-map", "auto", "--device", "cuda:0"], "not both"),
        (["--revision", "step1"], "local path"),
    ):
        r = run(app, ["sites", one.source, *args, "--out", str(tmp_path)])
        assert r.exit_code == 2 and words in r.output, (args, r.output)


def test_truncated_and_resumed_runs_match_one_device(pair):
    from structlens.interventions.fastrun import metric_logits, resumed, truncated

    one, split = pair
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    mask = torch.ones_like(ids)
    site = "blocks.1.hook_resid_post"
    out = {}
    for key, m in (("one", one), ("split", split)):
        with torch.no_grad(), truncated(m, 1), hooked(m, [site]) as c:
            m.forward(ids, mask)
        with torch.no_grad(), resumed(m, 1, c[site]):
            out[key] = (c[site], metric_logits(m, ids, mask, [[2, 4]]))
    for a, b in zip(out["one"], out["split"], strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
    torch.testing.assert_close(split.forward(ids, mask), one.forward(ids, mask), rtol=0, atol=1e-6)

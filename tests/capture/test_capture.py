import json

import pytest
import torch

from structlens.capture import ActivationStore, StoreError, capture, collect, select_positions
from structlens.execution import LocalExecutor

SITES = [
    "hook_embed",
    "blocks.0.hook_resid_pre",
    "blocks.1.hook_attn_out",
    "blocks.2.attn.hook_z",
    "blocks.2.hook_resid_post",
]


def _prompts(model, n=12):
    rng = torch.Generator().manual_seed(0)
    return [
        (
            f"p{i}",
            torch.randint(
                0, 256, (int(torch.randint(5, 30, (1,), generator=rng)),), generator=rng
            ).tolist(),
        )
        for i in range(n)
    ]


def test_capture_matches_plain_hf_outputs(tiny, tmp_path):
    prompts = _prompts(tiny)
    store = capture(
        tiny,
        prompts,
        ["blocks.1.hook_resid_pre", "blocks.2.hook_resid_post"],
        root=tmp_path,
        batch_size=5,
        shard_mb=0.01,
        progress=False,
    )
    assert len(store.metadata["shards"]) > 1
    idx = store.load_index()
    pre, post = store.load("blocks.1.hook_resid_pre"), store.load("blocks.2.hook_resid_post")
    for i, (_, toks) in enumerate(prompts):
        with torch.no_grad():
            out = tiny.hf(input_ids=torch.tensor([toks]), output_hidden_states=True)
        sel = idx["prompt_index"] == i
        assert torch.equal(idx["position"][sel], torch.arange(len(toks)))
        assert torch.equal(idx["token_id"][sel], torch.tensor(toks))
        assert torch.allclose(pre[sel], out.hidden_states[1][0], atol=1e-5)
        if tiny.n_layers > 3 or not tiny.causal:
            continue
        # the last layer's resid_post is the input of the final norm
        assert torch.allclose(
            tiny.base_module(tiny.family.final_norm)(post[sel]), out.hidden_states[3][0], atol=1e-5
        )
    assert store.prompt_ids == [p for p, _ in prompts]


def test_cache_hit_and_metadata(llama, tmp_path):
    prompts = _prompts(llama)
    s1 = capture(llama, prompts, SITES, root=tmp_path, progress=False, data_name="rand")
    mtimes = [s1.shard_path(i).stat().st_mtime_ns for i in range(len(s1.metadata["shards"]))]
    s2 = capture(llama, prompts, SITES, root=tmp_path, progress=False)
    assert s2.path == s1.path
    assert mtimes == [s2.shard_path(i).stat().st_mtime_ns for i in range(len(mtimes))]
    meta = json.loads((s1.path / "metadata.json").read_text())
    assert meta["sites"]["blocks.2.attn.hook_z"] == [llama.n_heads, llama.d_head]
    assert meta["model"]["fingerprint"] == llama.fingerprint()
    assert meta["complete"] and meta["data"]["name"] == "rand"
    s3 = capture(llama, prompts, SITES, root=tmp_path, dtype="bfloat16", progress=False)
    assert s3.path != s1.path and s3.load("hook_embed").dtype == torch.bfloat16


class _Crash(LocalExecutor):
    """Runs the first ``n`` items, then fails as a killed worker would."""

    def __init__(self, n):
        self.n = n

    def map(self, fn, items, **kw):
        for i, item in enumerate(items):
            if i == self.n:
                raise KeyboardInterrupt
            yield fn(item)


def test_interrupted_capture_resumes_to_identical_shards(llama, tmp_path):
    prompts = _prompts(llama, 20)
    ref = capture(llama, prompts, SITES, root=tmp_path / "ref", shard_mb=0.02, progress=False)
    n_shards = len(ref.metadata["shards"])
    assert n_shards >= 3
    with pytest.raises(KeyboardInterrupt):
        capture(
            llama,
            prompts,
            SITES,
            root=tmp_path / "run",
            shard_mb=0.02,
            progress=False,
            executor=_Crash(2),
        )
    partial = ActivationStore(tmp_path / "run" / ref.path.name)
    assert not partial.complete and len(partial.missing_shards()) == n_shards - 2
    with pytest.raises(StoreError, match="incomplete"):
        partial.load("hook_embed")
    done = capture(llama, prompts, SITES, root=tmp_path / "run", shard_mb=0.02, progress=False)
    assert done.complete
    for i in range(n_shards):
        assert done.shard_path(i).read_bytes() == ref.shard_path(i).read_bytes()


def test_positions_and_collect(llama):
    prompts = _prompts(llama, 4)
    lengths = [len(t) for _, t in prompts]
    last = collect(llama, prompts, ["blocks.0.hook_resid_post"], positions="last")
    assert last["position"].tolist() == [n - 1 for n in lengths]
    full = collect(llama, prompts, ["blocks.0.hook_resid_post"])
    pick = full["position"] == torch.tensor(lengths)[full["prompt_index"]] - 1
    assert torch.equal(full["blocks.0.hook_resid_post"][pick], last["blocks.0.hook_resid_post"])
    named = select_positions(lengths, "A,END", {"A": [0] * 4, "END": [n - 1 for n in lengths]})
    assert named == [[0, n - 1] for n in lengths]


def test_capture_bad_inputs(llama, tmp_path):
    prompts = _prompts(llama, 3)
    with pytest.raises(ValueError, match="Did you mean"):
        capture(llama, prompts, ["blocks.0.hook_resid_prE"], root=tmp_path)
    with pytest.raises(ValueError, match="unknown name"):
        capture(llama, prompts, SITES, root=tmp_path, positions="IO")
    with pytest.raises(ValueError, match="outside"):
        select_positions([3], [[5]])
    with pytest.raises(ValueError, match="unique"):
        capture(llama, [("a", [1, 2]), ("a", [3])], SITES, root=tmp_path)
    with pytest.raises(ValueError, match="no tokens"):
        capture(llama, [("a", [])], SITES, root=tmp_path)
    with pytest.raises(StoreError, match="not an activation store"):
        ActivationStore(tmp_path)


@pytest.mark.parametrize("lengths", ["equal", "ragged"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_shards_written_in_place_equal_the_gathered_batches(llama, tmp_path, lengths, dtype):
    # new: hooks write into preallocated shard buffers (no gather when every position is kept);
    # old/reference: per-batch gathered tensors concatenated (collect)
    g = torch.Generator().manual_seed(1)
    n = [12] * 7 if lengths == "equal" else [5, 12, 7, 9, 3, 12, 8]
    prompts = [torch.randint(0, 256, (k,), generator=g).tolist() for k in n]
    sites = ["blocks.0.hook_resid_pre", "blocks.1.attn.hook_z"]
    store = capture(
        llama,
        prompts,
        sites,
        root=tmp_path,
        batch_size=3,
        shard_mb=0.005,
        dtype=dtype,
        progress=False,
    )
    assert len(store.metadata["shards"]) > 1
    # the reference batches each shard's prompts exactly as the capture did
    parts = [
        collect(
            llama, prompts[sh["prompt_start"] : sh["prompt_stop"]], sites, batch_size=3, dtype=dtype
        )
        for sh in store.metadata["shards"]
    ]
    for s in sites:
        got, want = store.load(s), torch.cat([p[s] for p in parts])
        assert got.dtype == want.dtype and torch.equal(got, want)
    idx = store.load_index()
    for k in ("position", "token_id"):
        assert torch.equal(idx[k], torch.cat([p[k] for p in parts]))


def test_dense_reads_keep_model_tensors_and_survive_in_place_changes(llama):
    from structlens.capture import iter_activations

    toks = [list(range(3, 19)), list(range(40, 56))]  # equal lengths: a dense batch
    sites = ["blocks.1.hook_resid_pre", "blocks.1.hook_mlp_out", "blocks.2.hook_resid_post"]

    def buffers():
        return {s: torch.empty(32, llama.d_model) for s in sites}

    ref = buffers()  # written by copies inside the hooks: the values at read time
    list(iter_activations(llama, toks, sites, into=ref))
    (plain,) = iter_activations(llama, toks, sites)
    for s in sites:
        assert torch.equal(plain[s], ref[s])
    # a later module that changes layer 1's input in place, after it was read
    layer = llama.hf.model.layers[1]
    handle = layer.register_forward_hook(lambda mod, args, out: args[0].add_(1.0))
    try:
        (changed,) = iter_activations(llama, toks, sites)
        into = buffers()
        list(iter_activations(llama, toks, sites, into=into))
    finally:
        handle.remove()
    for s in sites:
        assert torch.equal(changed[s], into[s]), s
    assert torch.equal(changed[sites[0]], ref[sites[0]])  # read before the change

"""Distributed capture on a local Ray cluster: identical stores, worker faults, driver resume."""

import json
from pathlib import Path

import pytest
import torch

from structlens.capture import ActivationStore, capture
from structlens.capture.store import write_metadata
from structlens.execution import get_executor
from structlens.models import load_model

SITES = ["hook_embed", "blocks.0.hook_resid_pre", "blocks.2.attn.hook_z", "blocks.2.hook_mlp_out"]


@pytest.fixture(scope="module")
def model():
    return load_model("tiny-llama")


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 30, (18,), generator=gen).tolist()
    return [
        (f"p{i}", torch.randint(0, 256, (n,), generator=gen).tolist())
        for i, n in enumerate(lengths)
    ]


@pytest.fixture(scope="module")
def local_store(model, prompts, tmp_path_factory):
    root = tmp_path_factory.mktemp("local")
    return capture(model, prompts, SITES, root=root, shard_mb=0.02, progress=False)


def _files(store: ActivationStore) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(store.path.iterdir())}


def test_ray_capture_equals_local_shard_for_shard(
    ray_cluster, model, prompts, local_store, tmp_path
):
    store = capture(
        model,
        prompts,
        SITES,
        root=tmp_path,
        shard_mb=0.02,
        progress=False,
        executor=get_executor("ray", max_workers=2),
    )
    assert len(local_store.metadata["shards"]) >= 4
    # same content hash (directory name), same metadata, same bytes in every shard, no extras
    assert store.path.name == local_store.path.name
    assert _files(store) == _files(local_store)


def test_killed_capture_worker_is_retried_and_store_is_identical(
    ray_cluster, model, prompts, local_store, tmp_path
):
    from _ray_faults import KillingRayExecutor

    marker = tmp_path / "killed"
    victim = 2
    store = capture(
        model,
        prompts,
        SITES,
        root=tmp_path / "run",
        shard_mb=0.02,
        progress=False,
        executor=KillingRayExecutor(victim, marker, max_workers=1),
    )
    assert marker.exists(), "the worker was never killed: the test did not test anything"
    assert store.complete
    # every shard exactly once (no leftover temporary files), byte-identical to the local run
    assert _files(store) == _files(local_store)


def test_interrupted_driver_resumes_on_ray_without_rewriting(
    ray_cluster, model, prompts, local_store, tmp_path
):
    root = tmp_path / "run"
    first = capture(model, prompts, SITES, root=root, shard_mb=0.02, progress=False)
    n = len(first.metadata["shards"])
    lost = [1, n - 1]
    # what an interrupted driver leaves: shards missing and the store marked incomplete
    for i in lost:
        first.shard_path(i).unlink()
    meta = json.loads((first.path / "metadata.json").read_text())
    meta["complete"] = False
    write_metadata(first.path, meta)
    kept = {i: first.shard_path(i).stat() for i in range(n) if i not in lost}

    store = capture(
        model,
        prompts,
        SITES,
        root=root,
        shard_mb=0.02,
        progress=False,
        executor=get_executor("ray", max_workers=1),
    )
    for i, st in kept.items():
        now = store.shard_path(i).stat()
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns), f"shard {i} rewritten"
    assert _files(store) == _files(local_store)
    assert Path(store.path).parent == root

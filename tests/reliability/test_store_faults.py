"""Activation-store faults: each is detected with a message naming the shard, and a rerun of
the same capture repairs the store to bytes identical to an undisturbed capture."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from structlens.capture import ActivationStore, StoreError, capture
from structlens.capture.store import write_metadata
from structlens.models import load_model

SITES = ["hook_embed", "blocks.1.hook_resid_post"]
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _prompts(n=16):
    g = torch.Generator().manual_seed(0)
    return [(f"p{i}", torch.randint(0, 256, (12,), generator=g).tolist()) for i in range(n)]


@pytest.fixture(scope="module")
def model():
    return load_model("tiny-llama")


def _capture(model, root, **kw):
    return capture(model, _prompts(), SITES, root=root, shard_mb=0.01, progress=False, **kw)


@pytest.fixture(scope="module")
def reference(model, tmp_path_factory):
    store = _capture(model, tmp_path_factory.mktemp("ref"))
    assert len(store.metadata["shards"]) >= 4
    return store


def _shard_bytes(store):
    return [store.shard_path(i).read_bytes() for i in range(len(store.metadata["shards"]))]


def _same_as_reference(store, reference):
    assert store.path.name == reference.path.name
    assert _shard_bytes(store) == _shard_bytes(reference)
    ActivationStore(store.path, verify=True)


def _truncate(p):
    p.write_bytes(p.read_bytes()[:-100])


def _delete(p):
    p.unlink()


def _overwrite_4k(p):
    data = bytearray(p.read_bytes())
    data[-4096:] = os.urandom(4096)
    p.write_bytes(bytes(data))


def _flip_one_byte(p):
    data = bytearray(p.read_bytes())
    data[-1] ^= 1
    p.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage,detected_on_open",
    [(_truncate, True), (_delete, True), (_overwrite_4k, False), (_flip_one_byte, False)],
    ids=["truncated", "deleted", "overwritten-4k", "one-byte"],
)
def test_damaged_shard_is_named_and_repaired(model, reference, tmp_path, damage, detected_on_open):
    store = _capture(model, tmp_path)
    damage(store.shard_path(2))
    name = store.metadata["shards"][2]["file"]
    if detected_on_open:
        with pytest.raises(StoreError, match=name):
            ActivationStore(store.path)
    else:  # same size: the cheap check passes, reading the shard or verify=True does not
        opened = ActivationStore(store.path)
        with pytest.raises(StoreError, match=f"{name}.*structlens capture"):
            opened.load("hook_embed")
        with pytest.raises(StoreError, match=name):
            ActivationStore(store.path, verify=True)
    _same_as_reference(_capture(model, tmp_path), reference)


def test_damaged_shard_is_caught_by_store_statistics(model, tmp_path):
    from structlens.capture.statistics import store_statistic

    store = _capture(model, tmp_path)
    _overwrite_4k(store.shard_path(1))
    with pytest.raises(StoreError, match=store.metadata["shards"][1]["file"]):
        store_statistic(store, _token_count, merge=_add, progress=False)


def _token_count(shard):
    return int(shard["prompt_index"].numel())


def _add(a, b):
    return a + b


def test_edited_metadata_is_detected_and_recaptured(model, reference, tmp_path):
    store = _capture(model, tmp_path)
    meta_file = store.path / "metadata.json"
    meta = json.loads(meta_file.read_text())
    meta["n_tokens"] += 1
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(StoreError, match="modified"):
        ActivationStore(store.path)
    _same_as_reference(_capture(model, tmp_path), reference)


@pytest.mark.parametrize(
    "name", ["../other/shard-00000.safetensors", "/etc/passwd", "..", "sub/shard.safetensors"]
)
def test_shard_names_must_stay_inside_the_store(model, reference, tmp_path, name):
    store = _capture(model, tmp_path)
    meta = dict(store.metadata)
    meta["shards"] = [dict(s) for s in meta["shards"]]
    meta["shards"][0]["file"] = name
    write_metadata(store.path, meta)  # a consistent digest: only the name check can refuse it
    with pytest.raises(StoreError, match="plain file name"):
        ActivationStore(store.path)
    _same_as_reference(_capture(model, tmp_path), reference)


def test_symlinked_shard_is_refused_and_replaced(model, reference, tmp_path):
    other = _capture(model, tmp_path / "other")
    store = _capture(model, tmp_path / "run")
    target = other.shard_path(0)
    before = target.read_bytes()
    store.shard_path(0).unlink()
    store.shard_path(0).symlink_to(target)
    with pytest.raises(StoreError, match="symlink"):
        ActivationStore(store.path)
    repaired = _capture(model, tmp_path / "run")
    assert not repaired.shard_path(0).is_symlink()
    assert target.read_bytes() == before
    _same_as_reference(repaired, reference)


def test_symlinked_metadata_is_refused(model, tmp_path):
    store = _capture(model, tmp_path / "a")
    other = tmp_path / "b"
    other.mkdir()
    (other / "metadata.json").symlink_to(store.path / "metadata.json")
    with pytest.raises(StoreError, match="symlink"):
        ActivationStore(other)


def test_not_a_store_and_old_format(model, tmp_path):
    with pytest.raises(StoreError, match="not an activation store"):
        ActivationStore(tmp_path)
    store = _capture(model, tmp_path)
    meta = json.loads((store.path / "metadata.json").read_text())
    meta["store_format"] = 1
    write_metadata(store.path, meta)
    with pytest.raises(StoreError, match="format 1"):
        ActivationStore(store.path)


def test_unrecorded_shard_is_rewritten(model, reference, tmp_path):
    # a shard file whose digest never reached the metadata (a crash between the two writes)
    store = _capture(model, tmp_path)
    meta = json.loads((store.path / "metadata.json").read_text())
    meta["complete"] = False
    for k in ("bytes", "sha256"):
        meta["shards"][3].pop(k)
    write_metadata(store.path, meta)
    _overwrite_4k(store.shard_path(3))
    _same_as_reference(_capture(model, tmp_path), reference)


_WORKER = textwrap.dedent(
    """
    import sys, torch
    from structlens.capture import capture
    from structlens.models import load_model
    g = torch.Generator().manual_seed(0)
    prompts = [(f"p{i}", torch.randint(0, 256, (12,), generator=g).tolist()) for i in range(16)]
    capture(load_model("tiny-llama"), prompts, SITES, root=sys.argv[1], shard_mb=0.01,
            progress=False)
    """
).replace("SITES", repr(SITES))


def _worker(root, **kw):
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", _WORKER, str(root)], env=env, **kw)


def test_kill_9_mid_capture_resumes_byte_identical(model, reference, tmp_path):
    proc = _worker(tmp_path)
    store_dir = tmp_path / reference.path.name
    deadline = time.time() + 120
    while time.time() < deadline and len(list(store_dir.glob("shard-*.safetensors"))) < 2:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not ActivationStore(store_dir, verify=None).complete
    _same_as_reference(_capture(model, tmp_path), reference)


def test_file_size_limit_mid_write_leaves_no_partial_shard(model, reference, tmp_path):
    import resource

    shard_size = len(reference.shard_path(0).read_bytes())

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (shard_size // 2, shard_size // 2))

    proc = _worker(tmp_path, preexec_fn=limit, stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0 and b"File too large" in err
    store_dir = tmp_path / reference.path.name
    assert not list(store_dir.glob("shard-*")) and not list(store_dir.glob(".shard-*"))
    _same_as_reference(_capture(model, tmp_path), reference)


def test_concurrent_captures_agree(reference, tmp_path):
    procs = [_worker(tmp_path) for _ in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    _same_as_reference(ActivationStore(tmp_path / reference.path.name), reference)


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o007, 0o660)])
def test_output_files_honour_the_umask(model, tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        store = _capture(model, tmp_path)
    finally:
        os.umask(old)
    for p in [store.path / "metadata.json", store.shard_path(0)]:
        assert p.stat().st_mode & 0o777 == mode

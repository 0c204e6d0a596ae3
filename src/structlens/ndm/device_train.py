"""Train NDM on pre-captured activations on another machine (e.g. a GPU host without the model).

``structlens ndm train`` captures and trains in one process, which needs the model where the
training runs.  This script splits the two so the optimisation can run on an accelerator that
only receives activations:

    # here: pack the residuals of an `ndm train` activation store (float16, a file per layer group)
    python -m structlens.ndm.device_train pack TRAIN_DIR --layers 12,17 --out a.st
    # there: one process per layer, each stopped after --seconds of wall time (checkpointed)
    python -m structlens.ndm.device_train train a.st --device cuda --out OUT
    # here: OUT has the layout of `ndm train --out` (ndm_train.json, ndm-L*/, R-L*.safetensors),
    # so `structlens ndm evaluate --train OUT` uses it; `structlens replicate ndm --profile gpu`
    # runs both steps as one cached stage.

Activations travel as float16 (the residual stream of SmolLM2 stays far inside float16's range;
its relative rounding, 5e-4, is far below nearest-neighbour distances).  Every optimisation
setting is recorded in ``ndm_train.json``; the run is deterministic in the number of steps, and
the wall-time limit only decides how many steps are taken (recorded, with ``converged``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

DEVICE_CONFIG = {
    # the paper's unit size, batch and threshold; a bank as large as ~19k activations allow
    "unit_size": 32,
    "batch_size": 128,
    "bank_size": 9_856,  # + 20 x 128 queries per refresh = 12,416 rows (the packed subset)
    "refresh_interval": 20,
    "lr": 1e-3,
    "max_steps": 40_000,
    "merge_start": 3_000,
    "merge_interval": 1_500,
    "merge_threshold": 0.04,
    "mi_samples": 4_096,
    "log_interval": 100,
    "seed": 0,
}
CHUNK_STEPS = 250


def settings(overrides: dict[str, Any]) -> dict[str, Any]:
    """The settings a device run trains with: :data:`DEVICE_CONFIG` with ``overrides``, and
    ``chunk_steps`` (steps between checkpoints, :data:`CHUNK_STEPS` unless overridden; with a
    time limit it decides where a run stops).  A cache key of the run is made from these, so
    a change of a default reaches it."""
    return {**DEVICE_CONFIG, "chunk_steps": CHUNK_STEPS, **overrides}


def pack(train_dir: Path, layers: list[int], out: Path, rows: int | None = None) -> None:
    from structlens.capture.store import ActivationStore
    from structlens.sites import site_name

    meta = json.loads((train_dir / "ndm_train.json").read_text())
    store = ActivationStore(meta["store"])
    tensors = {
        f"L{layer}": store.load(site_name("resid_post", layer)).to(torch.float16)
        for layer in layers
    }
    if rows is not None:  # the same seeded subset of token rows at every layer
        n = next(iter(tensors.values())).shape[0]
        keep = torch.randperm(n, generator=torch.Generator().manual_seed(0))[: min(rows, n)]
        tensors = {k: v[keep.sort().values].contiguous() for k, v in tensors.items()}
    for name, t in tensors.items():
        if not bool(torch.isfinite(t).all()):
            raise SystemExit(f"{name}: float16 overflow; pack in float32 instead.")
    out.parent.mkdir(parents=True, exist_ok=True)
    header = {k: meta[k] for k in ("model", "store", "data", "protocol")}
    save_file(tensors, str(out), metadata={"train_meta": json.dumps(header)})
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB): {list(tensors)}")


def _train_layer(
    args: tuple[str, str, str, float | None, str, dict[str, Any], int],
) -> dict[str, Any]:
    path, name, device, seconds, out, overrides, threads = args
    from structlens.ndm import NDM, NDMConfig
    from structlens.ndm.experiment import save_rotation

    torch.set_num_threads(threads)
    with safe_open(path, framework="pt") as f:
        h = f.get_tensor(name).float()
    config = settings(overrides)
    chunk = config.pop("chunk_steps")
    cfg = NDMConfig(**config, device=device)
    layer = int(name[1:])
    ckpt = Path(out) / "checkpoints" / f"L{layer}"
    t0 = time.perf_counter()
    target = 0
    while True:
        target += chunk
        res = NDM(cfg).fit(h, checkpoint_dir=ckpt, stop_at_step=target)
        elapsed = time.perf_counter() - t0
        print(f"L{layer}: step {res.steps}, partition {res.partition}, {elapsed:.0f} s", flush=True)
        out_of_time = seconds is not None and elapsed > seconds
        if res.converged or res.steps >= cfg.max_steps or out_of_time:
            break
    res.save(Path(out) / f"ndm-L{layer}")
    save_rotation(Path(out) / f"R-L{layer}.safetensors", res.rotation, res.partition)
    return {"layer": layer, **res.training_record(h.shape[0], elapsed)}


def _threads_per_layer(device: str, layers: int) -> int:
    """Torch threads of each layer's process: on the CPU the free cores shared out (at least
    one each, so layers beyond the cores take turns instead of spinning threads against each
    other); on an accelerator two, for the host-side work."""
    if device != "cpu":
        return 2
    return max(1, len(os.sched_getaffinity(0)) // layers)


def train(
    path: Path, device: str, seconds: float | None, out: Path, overrides: dict[str, Any]
) -> None:
    """Train every layer of the packed ``path`` on ``device``, one process per layer, each
    until the stopping rule, ``max_steps`` or ``seconds`` of wall time (``None``: no limit),
    into ``out``."""
    from structlens.results import atomic_write_json

    with safe_open(str(path), framework="pt") as f:
        names = sorted(f.keys(), key=lambda s: int(s[1:]))
        header = json.loads(f.metadata()["train_meta"])
    out.mkdir(parents=True, exist_ok=True)
    threads = _threads_per_layer(device, len(names))
    jobs = [(str(path), n, device, seconds, str(out), overrides, threads) for n in names]
    with mp.get_context("spawn").Pool(len(jobs)) as pool:
        rows = pool.map(_train_layer, jobs)
    results = {str(r.pop("layer")): r for r in rows}
    payload = {
        **header,
        "command": "structlens.ndm.device_train train",
        "layers": [int(k) for k in results],
        "partition": {k: v["partition"] for k, v in results.items()},
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
        "seconds_limit": seconds,
        "threads_per_layer": threads,
        "results": results,
    }
    atomic_write_json(out / "ndm_train.json", payload)
    print(json.dumps({k: (v["steps"], v["partition"]) for k, v in results.items()}))


def merge(parts: list[Path], out: Path) -> None:
    """Join the outputs of several ``train`` runs (layer groups) into one training directory."""
    import shutil

    from structlens.results import atomic_write_json

    out.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] | None = None
    for part in parts:
        meta = json.loads((part / "ndm_train.json").read_text())
        if payload is None:
            payload = meta
        else:
            payload["results"].update(meta["results"])
            payload["partition"].update(meta["partition"])
        for item in part.iterdir():
            if item.name.startswith(("ndm-L", "R-L")):
                dest = out / item.name
                if item.is_dir():
                    shutil.copytree(item, dest, dirs_exist_ok=True)
                else:
                    shutil.copy2(item, dest)
    assert payload is not None
    payload["layers"] = sorted(int(k) for k in payload["results"])
    atomic_write_json(out / "ndm_train.json", payload)
    print(f"wrote {out}: layers {payload['layers']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("train_dir", type=Path)
    p.add_argument("--layers", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rows", type=int, default=None, help="keep a seeded subset of token rows")
    t = sub.add_parser("train")
    t.add_argument("arrays", type=Path)
    t.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    t.add_argument("--seconds", type=float, default=240.0)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--config", default="{}", help="JSON overrides of DEVICE_CONFIG (smoke runs)")
    m = sub.add_parser("merge")
    m.add_argument("parts", type=Path, nargs="+")
    m.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    if a.cmd == "pack":
        pack(a.train_dir, [int(x) for x in a.layers.split(",")], a.out, a.rows)
    elif a.cmd == "train":
        train(a.arrays, a.device, a.seconds, a.out, json.loads(a.config))
    else:
        merge(a.parts, a.out)


if __name__ == "__main__":
    main()

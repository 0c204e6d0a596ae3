"""Benchmark: subspace patching (``patch_subspaces``) one subspace per pass vs stacked.

Run: ``.venv/bin/python benchmarks/ndm/patching.py [--threads N] [--cases gemma,smollm2]``.

Each case times :func:`structlens.ndm.evaluate.patch_subspaces` on the same inputs twice:
``stack_rows=1`` (one resumed forward pass per subspace, the code path before stacking) and
the default ``stack_rows`` (patched copies of the prompt batch stacked along the batch
dimension), alternating, and reports the largest difference of their outputs, which must be
floating-point round-off (float32 weights).  The inputs are those of the analyze profiles'
NDM patching: the IOI ``s_inhibition_name`` test (name-swap corruption, patched at END) at its
mapped layer, random orthonormal bases with the profile's subspace size for each method:

* ``gemma3-270m`` with ``--profile smoke``: 16 prompts, subspaces of 8 (80 at d = 640);
* ``smollm2-135m`` with ``--profile cpu``: 24 prompts (batches of 16 and 8), subspaces of 32
  (18 at d = 576), four methods as NDM and its three baselines.

Gemma keeps two of the smoke profile's four methods to bound the one-per-pass run's time
(the per-subspace cost does not depend on the method).  Writes ``patching.json`` next to
this file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from structlens.models import load_model
from structlens.ndm.evaluate import (
    corrupted_prompts,
    make_test_task,
    map_layer,
    patch_positions,
    patch_subspaces,
    patch_tests_for,
)

HERE = Path(__file__).parent
CASES = {
    "gemma": {"model": "gemma3-270m", "profile": "smoke", "prompts": 16, "unit": 8, "methods": 2},
    "smollm2": {"model": "smollm2-135m", "profile": "cpu", "prompts": 24, "unit": 32, "methods": 4},
}
TEST = "s_inhibition_name"


def random_bases(d: int, unit: int, methods: int, seed: int = 0) -> dict[str, list[np.ndarray]]:
    """Per method, the column blocks of ``unit`` of a random orthogonal ``d x d`` matrix."""
    rng = np.random.default_rng(seed)
    out = {}
    for m in range(methods):
        q = np.linalg.qr(rng.standard_normal((d, d)))[0]
        out[f"method{m}"] = [q[:, s : s + unit] for s in range(0, d, unit)]
    return out


def largest_difference(a: dict, b: dict) -> dict[str, float]:
    """Largest relative difference of the float fields (over the field's largest magnitude)
    and the number of differing integer entries (top-1 tokens), over every method."""
    rel, flips = 0.0, 0
    for method, run in a.items():
        for field in dataclasses.fields(run):
            x, y = getattr(run, field.name), getattr(b[method], field.name)
            if x.dtype.kind == "f":
                scale = max(float(np.abs(x).max(initial=0.0)), 1e-300)
                rel = max(rel, float(np.abs(x - y).max(initial=0.0)) / scale)
            else:
                flips += int((x != y).sum())
    return {"max_relative_difference": rel, "top1_differences": flips}


def bench_case(name: str, spec: dict) -> dict:
    model = load_model(spec["model"])
    test = next(t for t in patch_tests_for(model) if t.name == TEST)
    task = make_test_task(test, model.tokenizer, n=spec["prompts"], seed=0)
    layer = map_layer(test.gpt2_layer, model.n_layers)
    bases = random_bases(model.d_model, spec["unit"], spec["methods"])
    args = (model, task, corrupted_prompts(task, test.corruption), layer)
    kwargs = {"positions": patch_positions(task, test.positions), "bases": bases}
    patch_subspaces(*args, **{**kwargs, "bases": {}})  # warm-up: first-call allocations
    runs, seconds = {}, {}
    for label, stack_rows in (("one_per_pass", 1), ("stacked", None)):
        extra = {} if stack_rows is None else {"stack_rows": stack_rows}
        t0 = time.perf_counter()
        runs[label] = patch_subspaces(*args, **kwargs, **extra)
        seconds[label] = time.perf_counter() - t0
        print(f"{name} {label}: {seconds[label]:.1f} s", flush=True)
    subspaces = sum(len(b) for b in bases.values())
    batches = -(-spec["prompts"] // 16)
    return {
        **spec,
        "test": TEST,
        "layer": layer,
        "d_model": model.d_model,
        "subspaces": subspaces,
        "forwards_one_per_pass": batches * (subspaces + 3),
        "seconds": seconds,
        "speedup": seconds["one_per_pass"] / seconds["stacked"],
        **largest_difference(runs["one_per_pass"], runs["stacked"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--cases", default=",".join(CASES))
    opts = parser.parse_args()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    out = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "torch": torch.__version__},
        "load_average_before": os.getloadavg(),
        "cases": {name: bench_case(name, CASES[name]) for name in opts.cases.split(",")},
        "load_average_after": os.getloadavg(),
    }  # fmt: skip
    path = HERE / "patching.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["cases"], indent=2))


if __name__ == "__main__":
    main()

"""Exact Σ = E[JᵀJ]: batched forward mode (structlens) vs a per-direction backward loop.

The callable is transformer-like with d = 576 (SmolLM2-135M's width): RMSNorm → SwiGLU MLP
residual block → RMSNorm → unembedding to V logits, float32.  The baseline builds each
Jacobian row by row with one ``torch.autograd.grad`` per output direction (V backward passes
per vector); structlens vmaps one forward-mode JVP over blocks of the d basis tangents (one
primal pass per block of vectors).  Both accumulate JᵀJ in float64.  Each method runs in its own
subprocess (peak memory), with 1 torch thread; the load average before and after is recorded.
Each worker first runs its method once on one vector, untimed: the first ``torch.func`` call of
a process pays a one-time set-up (lazy imports, about 2 s here) that is not part of computing
Σ; it is recorded as ``first_call_seconds``.  Target: forward mode ≥ 10× the loop, Σ equal to
1e-6 (relative).  About 1–2 minutes idle.

    .venv/bin/python benchmarks/jacobian/run.py
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
SETTINGS = {"d": 576, "hidden": 1536, "vocab": 2048, "n": 4, "threads": 1, "seed": 0}


def make_model(s: dict):
    g = torch.Generator().manual_seed(s["seed"])
    d, h, v = s["d"], s["hidden"], s["vocab"]
    w_gate = torch.randn(h, d, generator=g) / d**0.5
    w_up = torch.randn(h, d, generator=g) / d**0.5
    w_down = torch.randn(d, h, generator=g) / h**0.5
    w_out = torch.randn(v, d, generator=g) / d**0.5

    def rms(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def f(hid: torch.Tensor) -> torch.Tensor:
        z = rms(hid)
        hid = hid + (torch.nn.functional.silu(z @ w_gate.T) * (z @ w_up.T)) @ w_down.T
        return rms(hid) @ w_out.T

    residuals = torch.randn(s["n"], d, generator=g) * 2.0
    return f, residuals


def backward_loop(f, residuals: torch.Tensor) -> np.ndarray:
    d = residuals.shape[1]
    sigma = torch.zeros(d, d, dtype=torch.float64)
    for h in residuals:
        h = h[None].clone().requires_grad_(True)
        y = f(h)[0]
        rows = []
        for v in range(y.shape[0]):
            (g,) = torch.autograd.grad(y[v], h, retain_graph=True)
            rows.append(g[0])
        j = torch.stack(rows).double()
        sigma += j.T @ j
    return (sigma / residuals.shape[0]).numpy()


def worker(method: str, s: dict) -> dict:
    torch.set_num_threads(s["threads"])
    f, residuals = make_model(s)
    if method == "structlens_forward":
        from structlens.causal_dim import CausalDimension, JacobianConfig

        def sigma_of(h: torch.Tensor) -> np.ndarray:
            return CausalDimension(JacobianConfig(max_rows=1152, n_groups=1)).fit(f, h).sigma
    elif method == "backward_loop":

        def sigma_of(h: torch.Tensor) -> np.ndarray:
            return backward_loop(f, h)
    else:
        raise ValueError(method)
    t0 = time.perf_counter()
    sigma_of(residuals[:1])
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    sigma = sigma_of(residuals)
    elapsed = time.perf_counter() - t0
    np.save(HERE / f".sigma_{method}.npy", sigma)
    return {
        "method": method,
        "seconds": elapsed,
        "first_call_seconds": first,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", type=str)
    args = ap.parse_args()
    s = SETTINGS
    if args.worker:
        print(json.dumps(worker(args.worker, s)))
        return
    load_before = os.getloadavg()
    print(f"load average before: {load_before}", flush=True)
    rows = {}
    for method in ("structlens_forward", "backward_loop"):
        p = subprocess.run(
            [sys.executable, __file__, "--worker", method], capture_output=True, text=True
        )
        if p.returncode != 0:
            raise SystemExit(p.stderr)
        rows[method] = json.loads(p.stdout.strip().splitlines()[-1])
        print(rows[method], flush=True)
    a = np.load(HERE / ".sigma_structlens_forward.npy")
    b = np.load(HERE / ".sigma_backward_loop.npy")
    for m in rows:
        (HERE / f".sigma_{m}.npy").unlink()
    from structlens.stats.ranks import effective_ranks

    ra, rb = effective_ranks(matrix=a), effective_ranks(matrix=b)
    out = {
        "machine": f"{os.cpu_count()} CPU cores; 1 torch thread per method",
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "settings": s,
        "torch": torch.__version__,
        "methods": rows,
        "speedup_forward_over_backward_loop": rows["backward_loop"]["seconds"]
        / rows["structlens_forward"]["seconds"],
        "peak_memory_ratio_forward_over_backward_loop": rows["structlens_forward"]["peak_rss_mib"]
        / rows["backward_loop"]["peak_rss_mib"],
        "max_relative_difference": float(np.abs(a - b).max() / np.abs(b).max()),
        "target": "speedup >= 10, max_relative_difference <= 1e-6",
        "erank": {"forward": ra.entropy_effective_rank, "backward_loop": rb.entropy_effective_rank},
        "participation_ratio": {
            "forward": ra.participation_ratio,
            "backward_loop": rb.participation_ratio,
        },
    }
    out["target_met"] = bool(
        out["speedup_forward_over_backward_loop"] >= 10 and out["max_relative_difference"] <= 1e-6
    )
    (HERE / "results.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

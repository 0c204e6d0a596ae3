"""Benchmark: structlens KSG vs NPEET and scikit-learn; NDM training-step throughput.

Run: ``.venv/bin/python benchmarks/ndm/run.py [--npeet PATH_TO/entropy_estimators.py]``.

NPEET is not on PyPI; fetch github:gregversteeg/NPEET into an ignored folder (e.g. /tmp) and
pass its ``npeet/entropy_estimators.py``.  Writes results.json next to this file.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import time
import tracemalloc
from pathlib import Path

import numpy as np
import torch

from structlens.ndm.search import RotatedKeys, neighbor_distance_loss
from structlens.stats.mutual_info import mutual_information

HERE = Path(__file__).parent


def timed(fn):
    tracemalloc.start()
    t0 = time.perf_counter()
    value = fn()
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return value, elapsed, peak


def bench_npeet(path: str | None, n: int, dx: int, dy: int) -> dict:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, dx))
    y = 0.5 * x[:, :dy] + rng.standard_normal((n, dy))
    mutual_information(x[:500], y[:500], k=3, algorithm="numba")  # compile outside the timing
    ours, t_ours, m_ours = timed(lambda: mutual_information(x, y, k=3))
    out = {
        "n": n,
        "dims": [dx, dy],
        "k": 3,
        "ours_nats": ours,
        "ours_s": t_ours,
        "ours_peak_bytes": m_ours,
    }
    if path is None:
        out["npeet"] = "not run: pass --npeet path/to/npeet/entropy_estimators.py"
        return out
    spec = importlib.util.spec_from_file_location("npeet_ee", path)
    ee = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ee)
    np.random.seed(0)  # noqa: NPY002 - NPEET draws its 1e-10 noise from the global generator
    bits, t_np, m_np = timed(lambda: ee.mi(x, y, k=3, base=2))
    out.update(
        npeet_nats=bits * np.log(2),
        npeet_s=t_np,
        npeet_peak_bytes=m_np,
        abs_diff_nats=abs(bits * np.log(2) - ours),
        speedup=t_np / t_ours,
        memory_ratio_npeet_over_ours=m_np / max(m_ours, 1),
    )
    return out


def bench_sklearn(n: int) -> list[dict]:
    from sklearn.feature_selection import mutual_info_regression

    rows = []
    rng = np.random.default_rng(1)
    for rho in (0.0, 0.5, 0.9):
        x = rng.standard_normal(n)
        y = 3.0 * (rho * x + np.sqrt(1 - rho**2) * rng.standard_normal(n)) + 7.0
        ours, t_ours, _ = timed(
            lambda x=x, y=y: mutual_information(x, y, k=3, standardize="coordinate")
        )
        skl, t_skl, _ = timed(
            lambda x=x, y=y: mutual_info_regression(x[:, None], y, n_neighbors=3, random_state=0)[0]
        )
        rows.append(
            {
                "n": n,
                "rho": rho,
                "closed_form_nats": -0.5 * np.log(1 - rho**2),
                "ours_nats": ours,
                "ours_clipped_nats": max(ours, 0.0),
                "sklearn_nats": float(skl),
                "abs_diff_clipped": abs(max(ours, 0.0) - float(skl)),
                "ours_s": t_ours,
                "sklearn_s": t_skl,
                "speedup": t_skl / t_ours,
            }
        )
    return rows


def bench_throughput(
    bank: int, d: int, batch: int, steps: int, n_sub: int, device: str = "cpu"
) -> dict:
    """Median NDM training step (matrix_exp + search + exact loss + backward) on ``device``."""
    dev = torch.device(device)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(bank, d, generator=gen).to(dev)
    partition = [d // n_sub] * n_sub
    R = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))[0].to(dev)
    A = torch.zeros(d, d, dtype=torch.float64, device=dev, requires_grad=True)
    sync()
    t0 = time.perf_counter()
    rk = RotatedKeys(keys, R, partition)
    sync()
    t_project = time.perf_counter() - t0
    times = []
    for _ in range(steps + 1):  # the first step (allocations, kernel selection) is not counted
        q = torch.randn(batch, d, generator=gen).to(dev)
        sync()
        t0 = time.perf_counter()
        Rt = R @ torch.linalg.matrix_exp(A - A.T)
        nn = rk.nearest(q, Rt.detach())
        loss = neighbor_distance_loss(q, keys, nn, Rt, partition)
        loss.backward()
        sync()
        times.append(time.perf_counter() - t0)
    step = float(np.median(times[1:]))
    return {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "bank": bank,
        "d": d,
        "batch": batch,
        "partition": partition,
        "median_step_s": step,
        "queries_per_s": batch / step,
        "key_projection_s": t_project,
        "note": "step = matrix_exp + search (rerank 8) + exact loss + backward; "
        "the bank is re-projected every reproject_interval steps (cost key_projection_s)",
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--npeet", default=None)
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--bank", type=int, default=400_000)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    load_before = os.getloadavg()
    print(f"load average before: {load_before}", flush=True)
    results = {
        "machine": f"{platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} torch threads ({os.cpu_count()} CPU cores)",
        "load_average_before": load_before,
        "npeet_vector": bench_npeet(args.npeet, args.n, 32, 32),
        "sklearn_1d": bench_sklearn(args.n),
        "throughput_cpu": bench_throughput(args.bank, 576, 128, args.steps, 18),
    }
    results["load_average_after"] = os.getloadavg()
    (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

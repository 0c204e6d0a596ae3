"""Benchmark: structlens KSG vs NPEET and scikit-learn; the NDM training step (step.py).

Run: ``.venv/bin/python benchmarks/ndm/run.py --reference PATH [--ksg --npeet PATH]``.

``--reference`` is a checkout of github:Sappique/SubspacePartition outside the repo (run side
by side, never imported by structlens).  The KSG comparisons run only with ``--ksg`` (their
previous results are kept otherwise).  NPEET is not on PyPI; fetch github:gregversteeg/NPEET
into an ignored folder (e.g. /tmp) and pass its ``npeet/entropy_estimators.py``.  Writes
results.json next to this file.
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
from step import bench_step

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ksg", action="store_true", help="rerun the KSG comparisons")
    ap.add_argument("--npeet", default=None)
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--reference", type=Path, default=None, help="SubspacePartition checkout")
    ap.add_argument("--banks", type=int, nargs="+", default=[8192, 409_600])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (ours and reference)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = HERE / "results.json"
    previous = json.loads(out.read_text()) if out.exists() else {}
    load_before = os.getloadavg()
    print(f"load average before: {load_before}", flush=True)
    results = {
        "machine": f"{platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} torch threads ({os.cpu_count()} CPU cores)",
        "load_average_before": load_before,
    }
    if args.ksg:
        results["npeet_vector"] = bench_npeet(args.npeet, args.n, 32, 32)
        results["sklearn_1d"] = bench_sklearn(args.n)
    else:
        for key in ("npeet_vector", "sklearn_1d"):
            results[key] = previous.get(key, "not run: pass --ksg")
        results["ksg_from_run_of"] = previous.get("ksg_from_run_of", "2026-12-01 19:32 UTC")
    results["ndm_step"] = bench_step(args.reference, args.banks, repeats=args.steps)
    results["load_average_after"] = os.getloadavg()
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["ndm_step"], indent=2))


if __name__ == "__main__":
    main()

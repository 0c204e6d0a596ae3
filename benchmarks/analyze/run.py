"""Whole job: wall time and peak memory of ``structlens analyze`` with its per-stage breakdown.

Runs ``structlens analyze MODEL --profile PROFILE`` in a child process on an empty output
directory (nothing cached), so every stage computes.  Records the wall time, the child's peak
resident memory (``ru_maxrss`` of the finished child), each stage's seconds from
``analysis.json``, and the load average before and after, in results.json next to this file.
There is no peer for the whole job; the target (issue 14) is 20 minutes on 2 CPU cores for
the ``cpu`` profile of SmolLM2-135M.

    python benchmarks/analyze/run.py [--model smollm2-135m] [--profile cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
TARGET_MINUTES = {"cpu": 20.0, "smoke": 3.0}


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip()
    except OSError:
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--out", type=Path, default=None, help="default: a fresh temporary folder")
    args = ap.parse_args()

    out = args.out or Path(tempfile.mkdtemp(prefix="structlens-analyze-bench-"))
    if (out / "cache").exists():
        sys.exit(f"{out} already holds a cache; pass an empty --out so that every stage runs.")
    load_before = os.getloadavg()
    print(f"load average before: {load_before}", flush=True)
    cmd = [sys.executable, "-m", "structlens.cli.main", "analyze", args.model,
           "--profile", args.profile, "--out", str(out), "--quiet"]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    load_after = os.getloadavg()
    run = json.loads((out / "analysis.json").read_text())["run"]
    stages = {name: s["seconds"] for name, s in run["stages"].items()}
    target = TARGET_MINUTES.get(args.profile)
    result = {
        "model": args.model,
        "profile": args.profile,
        "layers": run["layers"],
        "wall_seconds": round(wall, 1),
        "wall_minutes": round(wall / 60, 2),
        "peak_rss_gib": round(peak_kib / 2**20, 2),
        "stage_seconds": stages,
        "target_minutes": target,
        "target_met": None if target is None else wall / 60 <= target,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "cpu_count": os.cpu_count(),
        "torch_threads": None,
        "platform": platform.platform(),
        "commit": _git_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    try:
        import torch

        result["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    path = HERE / f"results_{args.profile}.json" if args.profile != "cpu" else HERE / "results.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

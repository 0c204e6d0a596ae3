"""One BLAS thread or two for the N × N part of an EDMDc fit, idle and beside a busy process.

Times a Cholesky solve of an N × N Gram against N right-hand sides plus ``numpy.linalg.eig``
of the result (the part of a fit after the statistics pass) with the BLAS libraries' default
threads, with ``OPENBLAS_THREAD_TIMEOUT=4`` (threads sleep sooner instead of spinning) and
with one thread, each in a fresh process (the variables are read at load), idle and while a
busy loop holds one core.  Prints the best and median of 5 per setting; writes
``results_solve_threads.json``.

    .venv/bin/python benchmarks/koopman/solve_threads.py [--sizes 520 1032]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
SETTINGS = {"default": {}, "timeout4": {"OPENBLAS_THREAD_TIMEOUT": "4"},
            "one_thread": {"OPENBLAS_NUM_THREADS": "1"}}  # fmt: skip

CHILD = """
import sys, time, numpy as np, scipy.linalg as sl
n = int(sys.argv[1]); rng = np.random.default_rng(0)
g = rng.standard_normal((4 * n, n)); g = g.T @ g; b = rng.standard_normal((n, n))
def fit():
    np.linalg.eig(sl.cho_solve(sl.cho_factor(g), b))
fit(); ts = []
for _ in range(5):
    t = time.perf_counter(); fit(); ts.append(time.perf_counter() - t)
print(min(ts), sorted(ts)[2])
"""


def timed(n: int, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(n)], env={**os.environ, **env},
                         capture_output=True, text=True, check=True)  # fmt: skip
    best, median = map(float, out.stdout.split())
    return {"best_s": best, "median_s": median}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[520, 1032])
    args = ap.parse_args()
    results: dict = {"load_average_before": os.getloadavg(), "cpu_count": os.cpu_count()}
    for state in ("idle", "busy"):
        busy = (
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            if state == "busy"
            else None
        )
        try:
            time.sleep(1.0 if busy else 0.0)
            for n in args.sizes:
                for name, env in SETTINGS.items():
                    r = timed(n, env)
                    results[f"{state}/N={n}/{name}"] = r
                    print(f"{state:5s} N={n:5d} {name:10s} best {r['best_s']:.3f} s "
                          f"median {r['median_s']:.3f} s", flush=True)  # fmt: skip
        finally:
            if busy:
                busy.kill()
    results["load_average_after"] = os.getloadavg()
    (HERE / "results_solve_threads.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

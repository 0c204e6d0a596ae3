"""How fast a bad option is refused: every command group given one bad option value, timed
as a user sees it (a fresh ``structlens`` process, from start to its one-line error).

There is no peer; the target is an answer in under 1 s on this 2-core machine, before any
model loads or torch, transformers or SciPy import.  Each command runs ``--repeats`` times
and the best wall time is kept; the load average before and after goes into results.json.

    .venv/bin/python benchmarks/cli/bad_args.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
TARGET_S = 1.0
M = "tiny-llama"
#: (name, argv): one bad value per command group, each refused by its option checks.
CASES = [
    ("capture", ["capture", M, "--sites", "hook_embed", "--max-prompts", "-3"]),
    ("tasks eval", ["tasks", "eval", "--model", M, "-n", "0"]),
    ("sae train", ["sae", "train", M, "--width", "0"]),
    ("koopman fit", ["koopman", "fit", M, "--dictionary", "nope"]),
    ("ndm train", ["ndm", "train", M, "--steps", "0"]),
    ("causal-dim sweep", ["causal-dim", "sweep", M, "--widths", "0"]),
    ("equiv compare", ["equiv", "compare", M, M, "--map", "nope"]),
    ("analyze", ["analyze", M, "--profile", "nope"]),
    ("calibrate", ["calibrate", "--profile", "nope"]),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    exe = shutil.which("structlens", path=str(Path(sys.executable).parent)) or "structlens"
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv in CASES:
            times, code, err = [], None, ""
            for _ in range(args.repeats):
                t = time.perf_counter()
                r = subprocess.run([exe, *argv], capture_output=True, text=True, cwd=tmp)
                times.append(time.perf_counter() - t)
                code, err = r.returncode, (r.stdout + r.stderr).strip().splitlines()[-1:]
            rows.append({"command": name, "argv": argv, "exit_code": code, "error": err,
                         "best_s": min(times), "times_s": times})  # fmt: skip
            print(f"{name}: {min(times):.2f} s ({code})", flush=True)
    worst = max(r["best_s"] for r in rows)
    result = {
        "cases": rows,
        "worst_best_s": worst,
        "target_s": TARGET_S,
        "target_met": worst < TARGET_S and all(r["exit_code"] == 2 for r in rows),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    (HERE / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("worst_best_s", "target_met")}))


if __name__ == "__main__":
    main()

"""Recovery of planted partitions by NDM with re-splitting before merges, over seeds and shapes.

Run (one core, as measured for docs/ndm.md):

    OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python benchmarks/ndm/planted_recovery.py \\
        --out benchmarks/ndm/results/planted_recovery.json

For each shape and seed ``s``, ``planted_partition(sizes, 6000, seed=s)`` (d = 16) is
decomposed by one NDM run (no restarts) from 2-D units: 2,500 rotation-only steps, then a
merge round every 100 steps, each planned merge first checked by ``resplit_trials`` re-split
trials (``NDMConfig.resplit_trials``).  A run *recovers* the partition when its sizes equal
the planted ones and every matched subspace overlap is >= 0.95
(``structlens.ndm.pipeline.planted_recovery``).  ``--resplit-trials 0`` measures the same
schedule without re-splitting.  Prints one line per shape; ``--out`` writes every row.
About 20-30 s per seed on one core of the shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from structlens.ndm.ndm import NDMConfig
from structlens.ndm.pipeline import planted_recovery

SHAPES = "4,4,8;2,6,8;4,4,4,4"


def config(resplit_trials: int) -> NDMConfig:
    return NDMConfig(
        unit_size=2, lr=1e-2, batch_size=64, max_steps=4000, bank_size=1024,
        refresh_interval=40, reproject_interval=10, merge_start=2500, merge_interval=100,
        mi_samples=1000, init="random", log_interval=100, resplit_trials=resplit_trials,
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=SHAPES, help="';'-separated sizes, e.g. '4,4,8;8,8'")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--resplit-trials", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    cfg = config(args.resplit_trials)
    record = {
        "command": "benchmarks/ndm/planted_recovery.py "
        + f"--shapes '{args.shapes}' --seeds {args.seeds} --resplit-trials {args.resplit_trials}",
        "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s), "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}",
        "load_average_before": list(os.getloadavg()),
        "n_samples": 6000,
        "ndm_config": cfg.to_dict(),
        "shapes": [],
    }
    for shape in args.shapes.split(";"):
        sizes = [int(x) for x in shape.split(",")]
        t0 = time.perf_counter()
        out = planted_recovery(sizes, range(args.seeds), cfg, n_samples=6000)
        out["seconds"] = time.perf_counter() - t0
        record["shapes"].append(out)
        lo, hi = out["ci"]
        print(
            f"{sizes}: {out['recovered']}/{out['n']} recovered (95% CI {lo:.2f}-{hi:.2f}), "
            f"{out['seconds']:.0f} s",
            flush=True,
        )
        if args.out:  # after every shape, so a long run leaves what it measured
            record["load_average_after"] = list(os.getloadavg())
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()

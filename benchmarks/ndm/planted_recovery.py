"""Recovery of planted partitions by NDM with re-splitting, over seeds and shapes.

Run (one core, as measured for docs/ndm.md):

    OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python benchmarks/ndm/planted_recovery.py \\
        --out benchmarks/ndm/planted_recovery.json

For each shape and seed ``s`` (seeds 0 to ``--seeds`` - 1), ``planted_partition(sizes, 6000,
seed=s)`` (d = 16) is decomposed by one NDM run (no restarts) from 2-D units: 2,500
rotation-only steps, then a merge round every 100 steps.  With ``resplit_trials`` (default 8)
each planned merge is first checked by re-split trials, and a round with nothing to merge
tries to split every subspace larger than a unit (the split/undo pass; both in
``NDMConfig.resplit_trials``).  A run *recovers* the partition when its sizes equal the planted
ones and every matched subspace overlap is >= 0.95
(``structlens.ndm.pipeline.planted_recovery``).  ``--resplit-trials 0`` measures the same
schedule without either step.  Seeds run in the outer loop and shapes in the inner one, and
``--out`` is rewritten after every run, so an interrupted measurement leaves the same seeds
0..k-1 for every shape.  Prints one line per shape at the end.  ``--exp-gradient`` defaults to
``pytorch`` (autograd's gradient of the exponential, with which ``planted_recovery.json`` was
measured), not to ``NDMConfig``'s ``float32`` (``planted_recovery_float32_gradient.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import torch

from structlens.ndm.ndm import NDMConfig
from structlens.ndm.pipeline import planted_recovery
from structlens.stats.intervals import wilson_interval

SHAPES = "4,4,8;2,6,8;4,4,4,4"
N_SAMPLES = 6000


def config(
    resplit_trials: int,
    retraction: Literal["exp", "cayley"] = "exp",
    exp_gradient: Literal["pytorch", "float64", "float32"] = "pytorch",
) -> NDMConfig:
    return NDMConfig(
        unit_size=2, lr=1e-2, batch_size=64, max_steps=4000, bank_size=1024,
        refresh_interval=40, reproject_interval=10, merge_start=2500, merge_interval=100,
        mi_samples=1000, init="random", log_interval=100, resplit_trials=resplit_trials,
        retraction=retraction, exp_gradient=exp_gradient,
    )  # fmt: skip


def summary(sizes: list[int], rows: list[dict[str, Any]], cfg: NDMConfig) -> dict[str, Any]:
    k = sum(r["recovered"] for r in rows)
    return {
        "sizes": sizes,
        "rows": rows,
        "recovered": k,
        "n": len(rows),
        "ci": list(wilson_interval(k, len(rows))),
        "failures": sorted(str(r["partition"]) for r in rows if not r["recovered"]),
        "seconds_per_seed": sum(r["seconds"] for r in rows) / len(rows),
        "restarts": cfg.restarts,
        "resplit_trials": cfg.resplit_trials,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=SHAPES, help="';'-separated sizes, e.g. '4,4,8;8,8'")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--resplit-trials", type=int, default=8)
    ap.add_argument("--retraction", choices=["exp", "cayley"], default="exp")
    ap.add_argument("--exp-gradient", choices=["pytorch", "float64", "float32"], default="pytorch")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    cfg = config(args.resplit_trials, args.retraction, args.exp_gradient)
    shapes = [[int(x) for x in shape.split(",")] for shape in args.shapes.split(";")]
    record: dict[str, Any] = {
        "command": "benchmarks/ndm/planted_recovery.py "
        + f"--shapes '{args.shapes}' --seeds {args.seeds} --resplit-trials {args.resplit_trials}"
        + f" --retraction {args.retraction} --exp-gradient {args.exp_gradient}",
        "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s), "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}",
        "load_average_before": list(os.getloadavg()),
        "n_samples": N_SAMPLES,
        "ndm_config": cfg.to_dict(),
        "complete": False,
        "shapes": [],
    }
    rows: list[list[dict[str, Any]]] = [[] for _ in shapes]
    t0 = time.perf_counter()
    for seed in range(args.seeds):
        for i, sizes in enumerate(shapes):
            rows[i] += planted_recovery(sizes, [seed], cfg, n_samples=N_SAMPLES)["rows"]
            if args.out:  # after every run, so an interrupted measurement keeps what it did
                record["shapes"] = [summary(s, r, cfg) for s, r in zip(shapes, rows) if r]
                record["complete"] = seed == args.seeds - 1 and i == len(shapes) - 1
                record["seconds"] = time.perf_counter() - t0
                record["load_average_after"] = list(os.getloadavg())
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(record, indent=1) + "\n")
    for sizes, r in zip(shapes, rows, strict=True):
        out = summary(sizes, r, cfg)
        lo, hi = out["ci"]
        print(
            f"{sizes}: {out['recovered']}/{out['n']} recovered (95% CI {lo:.2f}-{hi:.2f}), "
            f"{out['seconds_per_seed']:.0f} s per seed, failures {out['failures']}",
            flush=True,
        )


if __name__ == "__main__":
    main()

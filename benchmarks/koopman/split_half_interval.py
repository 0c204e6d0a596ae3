"""Width and coverage of the split-half slope interval against its settings, on the planted
linear depth maps of the calibration (``structlens.calibration.koopman.planted_rows``).

    .venv/bin/python benchmarks/koopman/split_half_interval.py simple --groups 8 --repeats 10

prints one JSON line: the mean and sd of the slope over instances, the mean CI width, its
ratio to 3.92·sd (1: as wide as the spread implies), the coverage of the true slope and the
rate at which the CI contains −0.5.  The half sizes stay those of 8 groups so that only the
named setting changes.  Seeds start at 20000, apart from the calibration's scoring seeds.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from structlens.calibration.koopman import FAMILIES, PROTOCOL, planted_rows
from structlens.koopman.convergence import half_sizes_for, split_half_convergence
from structlens.koopman.edmdc import EDMDc
from structlens.koopman.stages import fit_dictionary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("family", choices=sorted(FAMILIES))
    ap.add_argument("--groups", type=int, default=8, help="Jackknife groups (2..16).")
    ap.add_argument("--repeats", type=int, default=PROTOCOL.split_half_repeats)
    ap.add_argument("--instances", type=int, default=40)
    args = ap.parse_args()
    truth = FAMILIES[args.family]
    cfg = PROTOCOL.edmdc(split_half=True)
    slopes, widths, covered, accepted = [], [], 0, 0
    for s in range(args.instances):
        rows = planted_rows(args.family, seed=20_000 + s)
        dic = fit_dictionary(PROTOCOL, "identity", rows)
        blocks = EDMDc(dic, cfg).statistics(
            rows.X, rows.U, rows.Y, rows.prompt_ids,
            n_blocks=PROTOCOL.split_half_blocks, seed=PROTOCOL.seed,
        )  # fmt: skip
        sh = split_half_convergence(
            blocks, cfg, n_repeats=args.repeats, seed=PROTOCOL.seed, n_groups=args.groups,
            half_sizes=half_sizes_for(len(blocks), 8),
        )  # fmt: skip
        lo, hi = sh.slope_ci
        slopes.append(sh.slope)
        widths.append(hi - lo)
        covered += lo <= truth <= hi
        accepted += lo <= -0.5 <= hi
    sl = np.asarray(slopes)
    print(json.dumps({
        "family": args.family, "groups": args.groups, "repeats": args.repeats,
        "instances": args.instances, "mean_slope": round(float(sl.mean()), 3),
        "sd_slope": round(float(sl.std()), 3), "mean_width": round(float(np.mean(widths)), 3),
        "width_over_spread": round(float(np.mean(widths) / (3.92 * sl.std())), 2),
        "coverage": covered / args.instances, "contains_minus_half": accepted / args.instances,
    }))  # fmt: skip


if __name__ == "__main__":
    main()

"""Pooling many weightings of the same prompt blocks: a loop against one product per chunk.

The Koopman stage's split-half curves, noise floor, permutation nulls and spectral-radius
bootstrap fit thousands of halves and resamples, each a weighting of the same prompt blocks'
moments.  This times, on SmolLM2-sized synthetic statistics (d = 576 state and control, a
few "massive" state coordinates with mean 1e3 and spread 1, a control spectrum ∝ 1/j so that
90% of Var(u) takes ~290 components), pooling every row of a weight matrix

- ``loop``: ``merge_statistics(blocks, w)`` per row (the code before ``pool_many``);
- ``many``: ``merge_statistics_many(blocks, W)`` (the same moments, state included);
- ``many_no_state``: ``merge_statistics_many(blocks, W, with_state=False)``, what the
  callers now pool (their fits read only the operator's moments);

and the two stage functions whose pooling changed, before (their loop, restored by
monkeypatching) and after: ``split_half_convergence`` at the protocol's split-half shapes and
``_radius_bootstrap`` at the spectrum fit's.  Writes ``results_pool_many.json``; timings are
best of ``--repeats`` with one BLAS thread (the stage's setting).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/koopman/pool_many.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from structlens.koopman import convergence, stages
from structlens.koopman.dictionaries import IdentityDictionary, PCADictionary
from structlens.koopman.edmdc import (
    EDMDc,
    EDMDcStatistics,
    control_basis,
    merge_statistics,
    merge_statistics_many,
    solve,
)
from structlens.koopman.protocol import KoopmanProtocol
from structlens.stats.lanes import serial_blas

HERE = Path(__file__).parent
D = 576  # SmolLM2-135M's width
TOKENS_PER_PROMPT = 16


def synthetic_rows(m: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """``(X, U, Y, prompt_ids)``: a linear layer map with a 1/j control spectrum and four
    massive state coordinates (mean 1e3, spread 1)."""
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(np.arange(1, D + 1))
    basis = np.linalg.qr(rng.standard_normal((D, D)))[0]
    X = (rng.standard_normal((m, D)) * scale) @ basis.T
    X[:, :4] = 1e3 + rng.standard_normal((m, 4))
    U = (rng.standard_normal((m, D)) * scale) @ np.linalg.qr(rng.standard_normal((D, D)))[0]
    A = 0.5 * np.linalg.qr(rng.standard_normal((D, D)))[0]
    Y = X @ A.T + U + 0.05 * rng.standard_normal((m, D))
    return X, U, Y, np.arange(m) // TOKENS_PER_PROMPT


def best_of(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def half_weights(K: int, sizes: list[int], pairs: int, seed: int) -> np.ndarray:
    """0/1 rows: ``pairs`` random disjoint half pairs of ``j`` blocks for each ``j``."""
    rng = np.random.default_rng(seed)
    rows = []
    for j in sizes:
        for _ in range(pairs):
            order = rng.permutation(K)
            for half in (order[:j], order[j : 2 * j]):
                w = np.zeros(K, dtype=np.int64)
                w[half] = 1
                rows.append(w)
    return np.stack(rows)


def boot_weights(K: int, B: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([np.bincount(rng.integers(0, K, K), minlength=K) for _ in range(B)])


def largest_difference(blocks: list[EDMDcStatistics], W: np.ndarray) -> float:
    """Largest relative difference (per matrix, to its largest entry) between the loop's and
    the batched moments over every 10th row."""
    worst = 0.0
    rows = W[::10]
    for w, got in zip(rows, merge_statistics_many(blocks, rows), strict=True):
        want = merge_statistics(blocks, w)
        pairs = [(got.zy, want.zy)] + ([(got.state, want.state)] if want.state else [])
        for a, b in pairs:
            for name in ("mean_x", "mean_y", "s_xx", "s_xy", "s_yy"):
                x, y = getattr(a, name), getattr(b, name)
                worst = max(worst, float(np.max(np.abs(x - y)) / np.max(np.abs(y))))
    return worst


def pooling_case(
    name: str, blocks: list[EDMDcStatistics], W: np.ndarray, repeats: int
) -> dict[str, Any]:
    def loop() -> None:
        for w in W:
            merge_statistics(blocks, w)

    def many(with_state: bool) -> Callable[[], None]:
        def run() -> None:
            for _ in merge_statistics_many(blocks, W, with_state=with_state):
                pass

        return run

    z = blocks[0].zy
    out: dict[str, Any] = {
        "case": name,
        "blocks": len(blocks),
        "rows": len(W),
        "mean_nonzero_per_row": float((W > 0).sum(1).mean()),
        "zy_width": z.d_x,
        "state_width": None if blocks[0].state is None else blocks[0].state.d_x,
    }
    with serial_blas():
        out["loop_s"] = best_of(loop, repeats)
        out["many_s"] = best_of(many(True), repeats)
        if blocks[0].state is not None:
            out["many_no_state_s"] = best_of(many(False), repeats)
        out["max_rel_diff"] = largest_difference(blocks, W)
    out["speedup_many"] = out["loop_s"] / out["many_s"]
    if "many_no_state_s" in out:
        out["speedup_many_no_state"] = out["loop_s"] / out["many_no_state_s"]
    print(json.dumps(out))
    return out


def projected(blocks: list[EDMDcStatistics], cfg: Any) -> list[EDMDcStatistics]:
    V = control_basis(merge_statistics(blocks), cfg)[0]
    return [b.project_controls(V) for b in blocks]


def _loop_many(parts: Any, weights: Any, **_: Any) -> Any:
    parts = list(parts)
    return iter([merge_statistics(parts, w) for w in np.asarray(weights)])


def stage_split_half(blocks: list[EDMDcStatistics], cfg: Any) -> dict[str, Any]:
    def run() -> Any:
        return convergence.split_half_convergence(blocks, cfg, n_repeats=40)

    t = time.perf_counter()
    after = run()
    t_after = time.perf_counter() - t
    batched = convergence.merge_statistics_many
    convergence.merge_statistics_many = _loop_many  # type: ignore[assignment]
    try:
        t = time.perf_counter()
        before = run()
        t_before = time.perf_counter() - t
    finally:
        convergence.merge_statistics_many = batched
    diff = float(np.max(np.abs(after.w_inf - before.w_inf) / np.abs(before.w_inf)))
    return {
        "stage": "split_half_convergence, 40 pairs (the full curve and 8 jackknife ones; one run)",
        "blocks": len(blocks), "before_s": t_before, "after_s": t_after,
        "speedup": t_before / t_after, "max_rel_diff_w_inf": diff,
        "slope_before": before.slope, "slope_after": after.slope,
    }  # fmt: skip


def stage_bootstrap(blocks: list[EDMDcStatistics], cfg: Any, dic: Any, B: int) -> dict[str, Any]:
    def before() -> list[float]:
        rng = np.random.default_rng(0)
        radii = np.empty(B)
        for b in range(B):
            counts = np.bincount(rng.integers(0, len(blocks), len(blocks)), minlength=len(blocks))
            ev = solve(merge_statistics(blocks, counts), cfg, dic).eigenvalues
            radii[b] = float(np.max(np.abs(ev)))
        return [float(v) for v in np.percentile(radii, [2.5, 97.5])]

    t = time.perf_counter()
    ci_after = stages._radius_bootstrap(blocks, cfg, B, 0)
    t_after = time.perf_counter() - t
    t = time.perf_counter()
    ci_before = before()
    t_before = time.perf_counter() - t
    assert ci_after is not None
    return {
        "stage": f"_radius_bootstrap, {B} resamples (one run each)",
        "blocks": len(blocks), "zy_width": blocks[0].zy.d_x, "before_s": t_before,
        "after_s": t_after, "speedup": t_before / t_after,
        "max_rel_diff_ci": float(max(abs(a - b) / abs(b) for a, b in zip(ci_after, ci_before))),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results_pool_many.json")
    args = ap.parse_args()
    results: dict[str, Any] = {
        "load_average_before": os.getloadavg(), "cpu_count": os.cpu_count(),
        "platform": platform.platform(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }  # fmt: skip
    protocol = KoopmanProtocol()
    cfg, cfg_half = protocol.edmdc(), protocol.edmdc(split_half=True)
    X, U, Y, ids = synthetic_rows(64 * 320)
    pca64 = PCADictionary(64).fit(X)
    pca32 = PCADictionary(32).fit(X)
    ident = IdentityDictionary().fit(X)

    def blocks_of(dic: Any, config: Any, K: int) -> list[EDMDcStatistics]:
        out = EDMDc(dic, config).statistics(X, U, Y, ids, n_blocks=K, seed=0)
        return [b for b in out if b.n > 0]

    b64 = blocks_of(pca64, cfg, 64)
    r = control_basis(merge_statistics(b64), cfg)[0].shape[1]
    results["control_rank_at_90pct"] = r
    cases = []
    # the brief's shape: 64 blocks, N = 64, the control basis of protocol.edmdc()
    cases.append(pooling_case(
        f"64 blocks, PCA-64 projected on r = {r} (halves of 1..16 blocks, 40 pairs each)",
        projected(b64, cfg), half_weights(len(b64), [1, 2, 4, 8, 16], 40, 1), args.repeats,
    ))  # fmt: skip
    cases.append(pooling_case(
        "64 blocks, PCA-64 unprojected (200 bootstrap resamples)",
        b64, boot_weights(len(b64), 200, 2), args.repeats,
    ))  # fmt: skip
    del b64
    # the protocol's shapes: split-half PCA-32 on 32 blocks with r = 16, bootstrap on 16
    b32 = blocks_of(pca32, cfg_half, protocol.split_half_blocks)
    cases.append(pooling_case(
        "32 blocks, PCA-32 projected on r = 16 (the split-half grid: halves of 1..8, 40 pairs)",
        projected(b32, cfg_half), half_weights(len(b32), [1, 2, 4, 8], 40, 3), args.repeats,
    ))  # fmt: skip
    b16 = blocks_of(pca64, cfg, protocol.henrici_blocks)
    cases.append(pooling_case(
        "16 blocks, PCA-64 unprojected (200 bootstrap resamples)",
        b16, boot_weights(len(b16), 200, 4), args.repeats,
    ))  # fmt: skip
    b16_id = blocks_of(ident, cfg, protocol.henrici_blocks)
    cases.append(pooling_case(
        "16 blocks, identity (N = 576, state in Z; 200 bootstrap resamples)",
        b16_id, boot_weights(len(b16_id), 200, 5), args.repeats,
    ))  # fmt: skip
    del b16_id
    results["pooling"] = cases
    with serial_blas():
        results["stages"] = [
            stage_split_half(b32, cfg_half),
            stage_bootstrap(b16, cfg, pca64, protocol.spectrum_bootstrap),
        ]
    print(json.dumps(results["stages"], indent=2))
    results["load_average_after"] = os.getloadavg()
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

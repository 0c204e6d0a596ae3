"""EDMDc statistics: structlens vs pykoopman vs the GEMM bound, on the same in-memory problem.

Problem (where the methods coincide): i.i.d. states x ~ N(0, I) with y = A x + B u + 0.1·noise,
N state features (identity dictionary), 8 controls, uncentred least squares without ridge or
truncation (structlens: ``IdentityDictionary``, ``EDMDcConfig(alpha=0, center=False)``;
pykoopman: ``Identity`` observables + ``EDMDc``).  Both fit the same in-memory ``X, U, Y``
arrays.  Eigenvalues are compared by the exact bottleneck distance.

The bound is the floating-point work every EDMDc fit must do: ``Zᵀ Z`` (a symmetric rank-k
update, ``M·N_z²`` flops) plus ``Zᵀ Y`` (``2·M·N_z·N`` flops) with ``Z = [X, U]``, divided by
this machine's float64 GEMM rate measured in the same run (best of several large square
products).  ``fraction_of_gemm_bound = bound / structlens time`` (1.0 = at the bound; the goal
is ≥ 1/1.3).  ``direct_products_s`` is the measured time of NumPy's ``Z.T @ Z`` (syrk) and
``Z.T @ Y`` on the actual data, as a check on the rate-derived bound.  structlens' time is
split into the statistics pass (``structlens_statistics_s``, the part the bound describes)
and the rest of the fit (an ``N × N`` solve and eigendecomposition, which pykoopman does too).

Sizes: M = 100,000, N = 512 and M = 200,000, N = 1,024, all three contenders back to back in
one process (so outside load hits them alike), each size repeated ``--repeats`` times and the
best time kept.  The load average before and after goes into results.json.

    .venv/bin/python benchmarks/koopman/run.py [--quick] [--repeats 2] [--loaded]

Takes about 2–3 minutes on an idle 2-core machine.  ``--lanes`` instead times the statistics
pass alone at M = 100,000, N = 512 three ways, interleaved: in row lanes (the default), on one
lane with the BLAS library's own threads (the path before the lanes; ``torch`` limited to one
thread, which sets the lane count), and on one core (one lane, one BLAS thread), and writes
``results_lanes.json`` (``lane_efficiency`` = one-core time / (lanes time × cores)).
``--loaded`` times the M = 100,000, N = 512 case while one other process spins on a core
(a busy loop started and stopped by this script) and writes ``results_loaded.json``: the
ratios a user sees on a shared machine, beside the idle ones of ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).parent
N_CTRL = 8
SIZES = ((100_000, 512), (200_000, 1024))
QUICK_SIZES = ((20_000, 128),)


def problem(m: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n)) / np.sqrt(n)
    a *= 0.9 / np.max(np.abs(np.linalg.eigvals(a)))
    b = rng.standard_normal((n, N_CTRL)) / np.sqrt(N_CTRL)
    x = rng.standard_normal((m, n))
    u = rng.standard_normal((m, N_CTRL))
    y = x @ a.T
    y += u @ b.T
    y += 0.1 * rng.standard_normal((m, n))
    return x, u, y


def gemm_rate(size: int = 2048, repeats: int = 5) -> float:
    """Best float64 GEMM rate (flop/s) of square ``size`` products, NumPy's BLAS."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((size, size)), rng.standard_normal((size, size))
    a @ b  # warm-up (thread pool, page faults)
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2.0 * size**3 / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def fit_structlens(x: np.ndarray, u: np.ndarray, y: np.ndarray, split: dict) -> np.ndarray:
    """``EDMDc.fit`` as its two halves, timing the statistics pass into ``split``."""
    from structlens.koopman import EDMDc, EDMDcConfig, IdentityDictionary

    est = EDMDc(IdentityDictionary().fit(x[:2]), EDMDcConfig(alpha=0.0, center=False))
    t = time.perf_counter()
    stats = est.statistics(x, u, y)[0]
    split.setdefault("structlens_statistics", []).append(time.perf_counter() - t)
    return est.fit_from_statistics(stats).eigenvalues


def fit_pykoopman(x: np.ndarray, u: np.ndarray, y: np.ndarray, split: dict) -> np.ndarray:
    import pykoopman as pk

    model = pk.Koopman(observables=pk.observables.Identity(), regressor=pk.regression.EDMDc())
    model.fit(x, y=y, u=u)
    return np.asarray(model.lamda_array)


def direct_products(x: np.ndarray, u: np.ndarray, y: np.ndarray) -> float:
    """Time of ``Z.T @ Z`` (NumPy dispatches ``A.T @ A`` to syrk) and ``Z.T @ Y`` (Z formed
    beforehand, untimed)."""
    z = np.concatenate([x, u], axis=1)
    t = time.perf_counter()
    z.T @ z
    z.T @ y
    return time.perf_counter() - t


def one_size(m: int, n: int, repeats: int, rate: float) -> dict:
    from structlens.stats.matching import bottleneck_distance

    x, u, y = problem(m, n)
    nz = n + N_CTRL
    flops = m * nz * nz + 2.0 * m * nz * n
    out: dict = {"M": m, "N": n, "n_controls": N_CTRL, "flops": flops, "bound_s": flops / rate}
    times: dict[str, list[float]] = {"structlens": [], "pykoopman": [], "direct_products": []}
    times["structlens_statistics"] = []
    eig: dict[str, np.ndarray] = {}
    for _ in range(repeats):
        for name, fn in (("structlens", fit_structlens), ("pykoopman", fit_pykoopman)):
            t = time.perf_counter()
            try:
                eig[name] = fn(x, u, y, times)
            except ImportError as e:  # peer not installed: say so, keep the rest
                out[f"{name}_error"] = f"{type(e).__name__}: {e}"
                continue
            times[name].append(time.perf_counter() - t)
            print(f"  M={m:,} N={n} {name}: {times[name][-1]:.2f} s", flush=True)
        times["direct_products"].append(direct_products(x, u, y))
    for name, ts in times.items():
        if ts:
            out[f"{name}_s"] = min(ts)
            out[f"{name}_times_s"] = ts
    ours = out["structlens_s"]
    out["fraction_of_gemm_bound"] = out["bound_s"] / ours
    # the statistics pass alone (the fit adds an N x N solve and eigendecomposition)
    out["fraction_of_gemm_bound_statistics"] = out["bound_s"] / out["structlens_statistics_s"]
    out["fraction_of_direct_products"] = out["direct_products_s"] / ours
    if "pykoopman_s" in out:
        out["speedup_vs_pykoopman"] = out["pykoopman_s"] / ours
        out["bottleneck_vs_pykoopman"] = bottleneck_distance(eig["structlens"], eig["pykoopman"])
    out["max_abs_eigenvalue"] = float(np.max(np.abs(eig["structlens"])))
    return out


def lanes_check(repeats: int) -> dict:
    """The statistics pass in lanes, on one lane, and on one core (see the module docstring)."""
    from threadpoolctl import threadpool_limits

    from structlens.koopman import EDMDc, EDMDcConfig, IdentityDictionary

    x, u, y = problem(*SIZES[0])
    est = EDMDc(IdentityDictionary().fit(x[:2]), EDMDcConfig(alpha=0.0, center=False))
    threads = torch.get_num_threads()
    times: dict[str, list[float]] = {"lanes": [], "one_lane": [], "one_core": []}
    for _ in range(repeats):
        for name in times:
            torch.set_num_threads(threads if name == "lanes" else 1)
            with threadpool_limits(1 if name == "one_core" else None, user_api="blas"):
                times[name].append(_timed(lambda: est.statistics(x, u, y)))
            print(f"  {name}: {times[name][-1]:.2f} s", flush=True)
    torch.set_num_threads(threads)
    best = {f"{k}_s": min(v) for k, v in times.items()}
    return {
        "M": SIZES[0][0],
        "N": SIZES[0][1],
        "threads": threads,
        **best,
        **{f"{k}_times_s": v for k, v in times.items()},
        "speedup_vs_one_lane": best["one_lane_s"] / best["lanes_s"],
        "lane_efficiency": best["one_core_s"] / (best["lanes_s"] * threads),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one small size (smoke run)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--lanes", action="store_true", help="the statistics pass with/without lanes")
    ap.add_argument("--loaded", action="store_true", help="M=100k, N=512 beside a busy process")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    load_before = os.getloadavg()
    print(f"load average before: {load_before}", flush=True)
    import structlens.koopman  # noqa: F401  (imports are not part of any timed fit)

    if args.lanes:
        lanes = {"load_average_before": load_before, **lanes_check(args.repeats)}
        lanes["load_average_after"] = os.getloadavg()
        (HERE / "results_lanes.json").write_text(json.dumps(lanes, indent=2) + "\n")
        print(json.dumps(lanes, indent=2))
        return

    try:
        import pykoopman  # noqa: F401
    except ImportError:
        pass
    rate = gemm_rate()
    print(f"float64 GEMM rate: {rate / 1e9:.1f} GFLOP/s", flush=True)
    if args.loaded:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(1.0)  # let the busy loop take its core
            case = one_size(*SIZES[0], args.repeats, rate)
        finally:
            busy.kill()
        loaded = {"load_average_before": load_before, "busy_processes": 1, "case": case}
        loaded["load_average_after"] = os.getloadavg()
        for key in ("speedup_vs_pykoopman", "fraction_of_gemm_bound"):
            loaded[key] = case.get(key)
        (HERE / "results_loaded.json").write_text(json.dumps(loaded, indent=2) + "\n")
        print(json.dumps(loaded, indent=2))
        return
    sizes = QUICK_SIZES if args.quick else SIZES
    results = {
        "machine": {
            "cpu_cores": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "load_average_before": load_before,
        },
        "gemm_rate_flops": rate,
        "cases": [one_size(m, n, args.repeats, rate) for m, n in sizes],
    }
    results["machine"]["load_average_after"] = os.getloadavg()
    head = results["cases"][0]
    for key in ("speedup_vs_pykoopman", "fraction_of_gemm_bound"):
        results[key] = head.get(key)  # the headline case: M = 100k, N = 512
    results["targets"] = {
        "speedup_vs_pykoopman": ">= 1.0",
        "fraction_of_gemm_bound": ">= 0.77 (within 1.3x of the bound)",
    }
    out = HERE / ("results_quick.json" if args.quick else "results.json")
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    print(f"load average after: {results['machine']['load_average_after']}")


if __name__ == "__main__":
    main()

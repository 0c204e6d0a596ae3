"""Benchmarks for one GPU lease: matmul ceilings, EDMDc Gram accumulation, NDM step, SAE training.

    python benchmarks/gpu/run.py --out results.json        # on a CUDA machine

Each section times structlens' own code path on the device with CUDA synchronisation around the
timed region, after a warm-up:

* ``peaks``: dense matmul rate (8192³; fp64, fp32 without TF32, TF32, bf16), the ceiling the
  other numbers are read against;
* ``gram``: the EDMDc sufficient statistics (``CrossMoments`` on device blocks,
  float64 products) at M = 200,000 samples × N = 1,024 lifted features + 8 controls, and at
  10× M, with the device memory it held beyond the input; agreement with the NumPy path on a
  subset;
* ``ndm_step``: NDM training step against a 400,000-key bank (d = 576, 18 subspaces);
* ``sae``: TopK SAE training tokens/s, structlens vs EleutherAI sparsify on the same data, and
  structlens ReLU (SAELens is not installable on the device machine).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _time_cuda(fn, reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def peaks(n: int = 8192) -> dict:
    out = {}
    for name, dtype, tf32 in (
        ("fp64", torch.float64, False),
        ("fp32", torch.float32, False),
        ("tf32", torch.float32, True),
        ("bf16", torch.bfloat16, False),
    ):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        s = _time_cuda(lambda a=a, b=b: a @ b, reps=5 if dtype == torch.float64 else 10)
        out[name] = {"n": n, "seconds": s, "tflops": 2 * n**3 / s / 1e12}
        del a, b
    torch.backends.cuda.matmul.allow_tf32 = False
    return out


def gram(m: int, n_feat: int = 1024, n_ctrl: int = 8, block: int = 16_384) -> dict:
    from structlens.stats.moments import CrossMoments

    g = torch.Generator(device="cuda").manual_seed(0)
    dz = n_feat + n_ctrl
    n_blocks = -(-m // block)
    blocks = [
        (
            torch.randn(min(block, m - i * block), dz, device="cuda", generator=g),
            torch.randn(min(block, m - i * block), n_feat, device="cuda", generator=g),
        )
        for i in range(n_blocks)
    ]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()

    def run() -> CrossMoments:
        # one stream: the sums stay on the device, one host merge at the end
        return CrossMoments(dz, n_feat, second_y="diag").update_chunks(blocks)

    run()  # warm-up: cuBLAS handles, allocator
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    acc = run()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    flops = 2.0 * m * dz * (dz + n_feat)  # S_aa and S_ab as full products
    out = {
        "M": m,
        "features": n_feat,
        "controls": n_ctrl,
        "block_rows": block,
        "seconds": seconds,
        "samples_per_s": m / seconds,
        "fp64_tflops_achieved": flops / seconds / 1e12,
        "device_bytes_beyond_input": torch.cuda.max_memory_allocated() - base,
    }
    z0, y0 = blocks[0]
    ref = CrossMoments(dz, n_feat, second_y="diag")
    ref.update(z0.cpu().numpy(), y0.cpu().numpy())
    dev = CrossMoments(dz, n_feat, second_y="diag")
    dev.update(z0, y0)
    out["max_rel_diff_vs_numpy_block"] = float(
        np.abs(dev.s_xy - ref.s_xy).max() / np.abs(ref.s_xy).max()
    )
    assert acc.n == m
    return out


def ndm_step() -> dict:
    bench = _load("bench_ndm", ROOT / "benchmarks" / "ndm" / "run.py")
    return bench.bench_throughput(400_000, 576, 128, 20, 18, device="cuda")


def sae(repeats: int = 2) -> dict:
    settings = {
        "d_in": 576,
        "d_sae": 32_768,
        "k": 32,
        "batch": 4096,
        "steps": 60,
        "lr": 2e-4 / (32_768 / 2**14) ** 0.5,
        "device": "cuda",
        "threads": 4,
    }
    runs: dict[str, list[dict]] = {}
    errors: dict[str, str] = {}
    for _ in range(repeats):
        for lib, arch in (("structlens", "topk"), ("sparsify", "topk"), ("structlens", "relu")):
            cmd = [
                sys.executable,
                str(ROOT / "benchmarks" / "sae" / "run.py"),
                "--worker",
                lib,
                arch,
                "--settings",
                json.dumps(settings),
            ]
            p = subprocess.run(cmd, capture_output=True, text=True)
            key = f"{lib}/{arch}"
            if p.returncode != 0:
                errors[key] = p.stderr.strip()[-2000:]
                continue
            r = json.loads(p.stdout.strip().splitlines()[-1])
            runs.setdefault(key, []).append(r)
            print(key, f"{r['tokens_per_s']:.0f} tok/s FVU {r['fvu']:.4f}", flush=True)
    best = {k: max(v, key=lambda r: r["tokens_per_s"]) for k, v in runs.items()}
    out = {"settings": settings, "runs": runs, "best": best, "errors": errors}
    if "structlens/topk" in best and "sparsify/topk" in best:
        out["topk_speedup_vs_sparsify"] = (
            best["structlens/topk"]["tokens_per_s"] / best["sparsify/topk"]["tokens_per_s"]
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=HERE / "results.json")
    ap.add_argument("--sections", default="peaks,gram,ndm_step,sae")
    args = ap.parse_args()
    results: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    for section in args.sections.split(","):
        t0 = time.perf_counter()
        try:
            if section == "gram":
                results[section] = [gram(200_000), gram(2_000_000)]
                fp64 = results.get("peaks", {}).get("fp64", {}).get("tflops")
                for case in results[section] if fp64 else ():
                    # the bound: syrk (M·N_z²) + gemm (2·M·N_z·N) at the fp64 rate of this run
                    dz, n = case["features"] + case["controls"], case["features"]
                    case["bound_s"] = case["M"] * dz * (dz + 2 * n) / (fp64 * 1e12)
                    case["fraction_of_gemm_bound"] = case["bound_s"] / case["seconds"]
            else:
                results[section] = globals()[section]()
        except Exception as err:  # one failed section must not lose the others
            results[section] = {"error": f"{type(err).__name__}: {err}"}
        print(section, f"{time.perf_counter() - t0:.1f} s", json.dumps(results[section])[:600])
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

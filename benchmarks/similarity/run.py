"""Benchmark: linear CKA and SVCCA on 100,000 x 576 activations against peer libraries.

Peers, on the same data in the same run:
* anatome (PyPI ``ultimate-anatome`` 0.1.1): ``linear_cka_distance`` (feature space, torch)
  and ``svcca_distance_keeping_fixed_dims``; its import of ``uutils`` (ultimate-utils, not
  used by these functions) is satisfied by an empty stub module.
* torch-cka (PyPI ``torch-cka`` 0.21): ``CKA.compare`` -- minibatch CKA with unbiased HSIC on
  ``b x b`` Grams; compared with ``structlens.equivalence.MinibatchCKA`` on the same batches.
* a plain Gram-matrix implementation (numpy, float64, ``n x n`` Grams): only at the ``n`` that
  fit in memory (the Gram at n = 100k would take 80 GB).

Every measurement runs in a fresh subprocess; peak memory is the largest growth of the
resident set size (sampled from /proc/self/statm every 2 ms by a thread) over its level just
before the computation starts, so the input arrays (and any dtype conversion done before the
timer starts) are not counted for anyone. Data: synthetic residual-stream-like activations
(heavy-tailed latent factors, a large mean, four "massive activation" dimensions), float32,
Y a noisy nonlinear next-layer transform of X.

Run: ``.venv/bin/python benchmarks/similarity/run.py`` (writes results.json next to it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("STRUCTLENS_BENCH_DIR", "/tmp/structlens_bench_similarity"))
N_FULL, D = 100_000, 576
SVCCA_KEEP = 0.99
MINIBATCH = 1000


def make_data() -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    if (DATA / "y.npy").exists():
        return
    rng = np.random.default_rng(0)
    latent = rng.standard_t(df=4, size=(N_FULL, 96))
    mix = rng.normal(size=(96, D)) / np.sqrt(96)
    x = latent @ mix + 0.3 * rng.normal(size=(N_FULL, D)) + rng.normal(size=D) * 2.0
    massive = rng.choice(D, size=4, replace=False)
    x[:, massive] = 8.0 * x[:, massive] + 300.0
    b = rng.normal(size=(D, D)) / np.sqrt(D)
    y = 0.5 * x + np.tanh(x @ b) @ b.T + 2.0 * rng.standard_t(df=5, size=(N_FULL, D))
    np.save(DATA / "x.npy", x.astype(np.float32))
    np.save(DATA / "y.npy", y.astype(np.float32))


def _stub_uutils() -> None:
    pkg = types.ModuleType("uutils")
    sub = types.ModuleType("uutils.torch_uu")
    pkg.torch_uu = sub
    sys.modules["uutils"], sys.modules["uutils.torch_uu"] = pkg, sub


def _svcca_dims(x: np.ndarray, y: np.ndarray) -> int:
    """Directions the variance rule keeps (min over the two sides); peers get it as a count."""
    from structlens.equivalence import CrossMoments
    from structlens.equivalence.cca import _principal

    m = CrossMoments(x.shape[1], y.shape[1]).update(x, y)
    kx = _principal(m.s_xx, SVCCA_KEEP, "variance")[0].size
    ky = _principal(m.s_yy, SVCCA_KEEP, "variance")[0].size
    return int(min(kx, ky))


class PeakRSS:
    """Samples this process's resident set size in a thread; ``peak`` is the maximum seen."""

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.start = self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self._rss())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())
        return (self.peak - self.start) / 2**20


def worker(impl: str, n: int, extra: int) -> dict:
    import torch

    from structlens.equivalence import MinibatchCKA, hsic, linear_cka, svcca

    torch.set_num_threads(os.cpu_count() or 1)
    x = np.load(DATA / "x.npy")[:n]
    y = np.load(DATA / "y.npy")[:n]
    if impl.startswith("anatome"):
        _stub_uutils()
        from anatome import similarity as an
    if impl == "torch_cka_minibatch_centred":
        # centring changes no CKA value; it shows the float32 cancellation of the raw run
        x, y = x - x.mean(0, dtype=np.float64), y - y.mean(0, dtype=np.float64)
        x, y = x.astype(np.float32), y.astype(np.float32)
    if impl.startswith("anatome") and impl.endswith("fp64"):
        tx, ty = torch.from_numpy(x.astype(np.float64)), torch.from_numpy(y.astype(np.float64))
    else:
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    if impl.startswith("torch_cka_minibatch"):
        from torch.utils.data import DataLoader, TensorDataset
        from torch_cka import CKA

        class Lookup(torch.nn.Module):
            def __init__(self, data: torch.Tensor) -> None:
                super().__init__()
                self.data = data
                self.out = torch.nn.Identity()

            def forward(self, idx: torch.Tensor) -> torch.Tensor:
                return self.out(self.data[idx])

        loader = DataLoader(TensorDataset(torch.arange(n)), batch_size=extra, shuffle=False)
        cka = CKA(Lookup(tx), Lookup(ty), "A", "B", ["out"], ["out"])
    mem = PeakRSS()
    t0 = time.perf_counter()
    if impl == "structlens_cka":
        value = linear_cka(x, y)
    elif impl == "structlens_cka_debiased":
        value = linear_cka(x, y, debiased=True)
    elif impl == "structlens_cka_fp32":
        value = linear_cka(x, y, precision="float32")
    elif impl == "structlens_svcca":
        value = svcca(x, y, keep=extra)
    elif impl == "structlens_svcca_fp32":
        value = svcca(x, y, keep=extra, precision="float32")
    elif impl == "structlens_minibatch":
        mb = MinibatchCKA()
        for s in range(0, n, extra):
            mb.update(x[s : s + extra], y[s : s + extra])
        value = mb.value()
    elif impl.startswith("anatome_cka_debiased"):
        value = 1.0 - float(an.linear_cka_distance(tx, ty, reduce_bias=True))
    elif impl.startswith("anatome_cka"):
        value = 1.0 - float(an.linear_cka_distance(tx, ty, reduce_bias=False))
    elif impl.startswith("anatome_svcca"):
        value = 1.0 - float(
            an.svcca_distance_keeping_fixed_dims(tx, ty, extra, "svd", "original_anatome")
        )
    elif impl.startswith("torch_cka_minibatch"):
        cka.compare(loader)
        value = float(cka.export()["CKA"][0, 0])
    elif impl in ("gram_cka", "gram_cka_debiased"):
        # torch's matmul: numpy's bundled OpenBLAS segfaults on the 20k x 20k product here
        xd, yd = torch.from_numpy(x).double(), torch.from_numpy(y).double()
        k, ell = (xd @ xd.T).numpy(), (yd @ yd.T).numpy()
        del xd, yd
        deb = impl.endswith("debiased")
        value = hsic(k, ell, deb) / np.sqrt(hsic(k, k, deb) * hsic(ell, ell, deb))
    else:
        raise ValueError(impl)
    seconds = time.perf_counter() - t0
    return {"value": float(value), "seconds": seconds, "peak_extra_mb": mem.stop()}


def run(impl: str, n: int, extra: int = 0) -> dict:
    cmd = [sys.executable, __file__, "--worker", impl, str(n), str(extra)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        lines = out.stderr.strip().splitlines()
        why = lines[-1] if lines else f"exit status {out.returncode}"
        print(f"{impl:28s} n={n:>6d}  FAILED: {why}", flush=True)
        return {"impl": impl, "n": n, "error": why}
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res.update(impl=impl, n=n)
    print(
        f"{impl:28s} n={n:>6d}  value={res['value']:.8f}  {res['seconds']:8.2f} s  "
        f"{res['peak_extra_mb']:9.1f} MB",
        flush=True,
    )
    return res


HEADLINE = {
    "structlens_cka",
    "structlens_cka_fp32",
    "anatome_cka",
    "anatome_cka_fp64",
    "structlens_svcca",
    "anatome_svcca",
    "structlens_minibatch",
    "torch_cka_minibatch_centred",
}


def _fastest(tries: list[dict]) -> dict:
    """The fastest of several runs of one contender, with every time kept."""
    ok = [t for t in tries if "error" not in t]
    if not ok:
        return tries[0]
    best = dict(min(ok, key=lambda t: t["seconds"]))
    best["times_s"] = [t["seconds"] for t in ok]
    return best


def main(headline: bool = False, repeats: int = 2) -> None:
    """Every row (≈ 13 min on 2 cores), or with ``headline`` the n = 100k comparisons with
    anatome and torch-cka, best of ``repeats`` interleaved rounds, plus the memory-vs-n rows
    (≈ 3 min per round idle)."""
    load_before = os.getloadavg()
    print(f"load average before: {load_before}", flush=True)
    make_data()
    x = np.load(DATA / "x.npy")
    y = np.load(DATA / "y.npy")
    k = _svcca_dims(x, y)
    del x, y
    print(f"SVCCA keeps {k} directions ({SVCCA_KEEP:.0%} of variance); peers get k={k}.")
    rows = []
    for n in (25_000, 50_000) if headline else (25_000, 50_000, N_FULL):
        rows.append(run("structlens_cka", n))  # memory of ours should not grow with n
    if headline:
        # the n = 100k contenders take turns, ``repeats`` rounds, and each keeps its fastest
        calls = [
            (impl, N_FULL, k if "svcca" in impl else MINIBATCH if "minibatch" in impl else 0)
            for impl in sorted(HEADLINE)
        ]
        rounds = [[run(*c) for c in calls] for _ in range(repeats)]
        rows += [_fastest(list(tries)) for tries in zip(*rounds)]
    else:
        rows += _all_other_rows(k)
    _compare_and_write(rows, k, load_before, headline)


def _all_other_rows(k: int) -> list[dict]:
    rows = [
        run("structlens_cka_fp32", N_FULL),
        run("structlens_cka_debiased", N_FULL),
        run("anatome_cka", N_FULL),
        run("anatome_cka_fp64", N_FULL),
        run("anatome_cka_debiased", N_FULL),
        run("anatome_cka_debiased_fp64", N_FULL),
        run("structlens_svcca", N_FULL, k),
        run("structlens_svcca_fp32", N_FULL, k),
        run("anatome_svcca", N_FULL, k),
        run("anatome_svcca_fp64", N_FULL, k),
        run("structlens_minibatch", N_FULL, MINIBATCH),
        run("torch_cka_minibatch", N_FULL, MINIBATCH),
        run("torch_cka_minibatch_centred", N_FULL, MINIBATCH),
    ]
    for n in (10_000, 20_000):
        rows += [run("gram_cka", n), run("structlens_cka", n)]
    rows += [run("gram_cka_debiased", 10_000), run("structlens_cka_debiased", 10_000)]
    return rows


def _compare_and_write(rows: list[dict], k: int, load_before: tuple, headline: bool) -> None:
    def get(impl: str, n: int) -> dict:
        return next(r for r in rows if r["impl"] == impl and r["n"] == n)

    have = {(r["impl"], r["n"]) for r in rows}

    comparisons = []
    pairs = [
        ("structlens_cka", "anatome_cka", N_FULL),
        ("structlens_cka_fp32", "anatome_cka", N_FULL),
        ("structlens_cka", "anatome_cka_fp64", N_FULL),
        ("structlens_cka_debiased", "anatome_cka_debiased", N_FULL),
        ("structlens_cka_debiased", "anatome_cka_debiased_fp64", N_FULL),
        ("structlens_svcca", "anatome_svcca", N_FULL),
        ("structlens_svcca_fp32", "anatome_svcca", N_FULL),
        ("structlens_svcca", "anatome_svcca_fp64", N_FULL),
        ("structlens_minibatch", "torch_cka_minibatch", N_FULL),
        ("structlens_minibatch", "torch_cka_minibatch_centred", N_FULL),
        ("structlens_cka", "gram_cka", 10_000),
        ("structlens_cka", "gram_cka", 20_000),
        ("structlens_cka_debiased", "gram_cka_debiased", 10_000),
    ]
    for ours, peer, n in pairs:
        if (ours, n) not in have or (peer, n) not in have:
            continue
        a, b = get(ours, n), get(peer, n)
        if "error" in a or "error" in b:
            comparisons.append(
                {"ours": ours, "peer": peer, "n": n, "error": a.get("error") or b.get("error")}
            )
            continue
        comparisons.append(
            {
                "ours": ours,
                "peer": peer,
                "n": n,
                "ours_value": a["value"],
                "peer_value": b["value"],
                "abs_diff": abs(a["value"] - b["value"]),
                "time_ratio_peer_over_ours": b["seconds"] / a["seconds"],
                "peak_mem_ours_mb": a["peak_extra_mb"],
                "peak_mem_peer_mb": b["peak_extra_mb"],
                "mem_ratio_peer_over_ours": b["peak_extra_mb"] / max(a["peak_extra_mb"], 1.0),
            }
        )
    result = {
        "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}, Python "
        f"{platform.python_version()}, numpy {np.__version__}",
        "data": f"synthetic float32 {N_FULL} x {D}, heavy-tailed, 4 massive dimensions",
        "svcca_dims": k,
        "minibatch_size": MINIBATCH,
        "mode": "headline" if headline else "full",
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "runs": rows,
        "comparisons": comparisons,
    }
    (HERE / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(comparisons, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        p = argparse.ArgumentParser()
        p.add_argument("--worker", nargs=3)
        impl, n, extra = p.parse_args().worker
        print(json.dumps(worker(impl, int(n), int(extra))))
    else:
        p = argparse.ArgumentParser()
        p.add_argument("--headline", action="store_true")
        p.add_argument("--repeats", type=int, default=2, help="rounds of the headline rows")
        args = p.parse_args()
        main(headline=args.headline, repeats=args.repeats)

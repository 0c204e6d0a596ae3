"""SAE training throughput: structlens vs SAELens vs EleutherAI sparsify on the CPU.

Same architecture, width, batch, optimiser (Adam, same lr) and data for every library; each
(library, architecture) runs in its own subprocess (clean peak-memory numbers), twice,
interleaved, and the faster run counts.  Only the training loop is timed (forward, backward,
optimiser step, decoder-norm handling); data are generated before timing.  Reconstruction
quality is reported as FVU on held-out tokens with each library's own encode/decode.

    .venv/bin/python benchmarks/sae/run.py            # writes results.json and README.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SETTINGS = {
    "d_in": 256,
    "d_sae": 8192,
    "k": 32,
    "batch": 2048,
    "steps": 24,
    "lr": 2e-4 / (8192 / 2**14) ** 0.5,
    "l1": 1.0,
    "n_atoms": 4096,
    "active_atoms": 24,
    "seed": 0,
    "threads": 1,
    "device": "cpu",
}
PEERS = {
    # SAELens's use_sparse_activations=True TopK fails in training_forward_pass on the CPU
    # (aten::view on a SparseCPU tensor, sae-lens 6.54.12), so only its dense path is timed.
    "topk": ["structlens", "saelens", "sparsify"],
    "relu": ["structlens", "saelens"],
}


def make_data(s: dict) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Sparse combinations of random atoms plus noise (a stand-in for residual activations)."""
    g = torch.Generator().manual_seed(s["seed"])
    atoms = torch.randn(s["n_atoms"], s["d_in"], generator=g)
    atoms /= atoms.norm(dim=1, keepdim=True)
    offset = torch.randn(s["d_in"], generator=g)

    def batch(n: int) -> torch.Tensor:
        idx = torch.randint(0, s["n_atoms"], (n, s["active_atoms"]), generator=g)
        coef = torch.empty(n, s["active_atoms"]).exponential_(generator=g)
        x = torch.einsum("na,nad->nd", coef, atoms[idx]) + offset
        return x + 0.05 * torch.randn(n, s["d_in"], generator=g)

    return [batch(s["batch"]) for _ in range(s["steps"] + 1)], batch(8192)


def fvu(x: torch.Tensor, recon: torch.Tensor) -> float:
    return float((x - recon).pow(2).sum() / (x - x.mean(0)).pow(2).sum())


def worker(lib: str, arch: str, s: dict) -> dict:
    torch.set_num_threads(s["threads"])
    torch.manual_seed(s["seed"])
    dev = torch.device(s["device"])
    batches, held = make_data(s)
    batches, held = [b.to(dev) for b in batches], held.to(dev)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    d, m, k, lr = s["d_in"], s["d_sae"], s["k"], s["lr"]
    if lib == "structlens":
        from structlens.sae import SAETrainConfig, SAETrainer

        cfg = SAETrainConfig(
            architecture=arch,
            d_sae=m,
            k=k,
            lr=lr,
            sparsity_coefficient=s["l1"],
            decoder_norm="unit" if arch == "topk" else "free",
        )
        trainer = SAETrainer(cfg, d, device=dev)

        def step(x: torch.Tensor) -> None:
            trainer.step(x)

        def recon(x: torch.Tensor) -> torch.Tensor:
            return trainer.sae(x)

        def l0(x: torch.Tensor) -> float:
            return float((trainer.sae.encode(x) > 0).sum(-1).float().mean())
    elif lib.startswith("saelens"):
        from sae_lens.saes.sae import TrainCoefficientConfig, TrainStepInput

        if arch == "topk":
            from sae_lens import TopKTrainingSAE, TopKTrainingSAEConfig

            sae = TopKTrainingSAE(
                TopKTrainingSAEConfig(
                    d_in=d, d_sae=m, k=k, use_sparse_activations=lib == "saelens_sparse"
                )
            )
        else:
            from sae_lens import StandardTrainingSAE, StandardTrainingSAEConfig

            sae = StandardTrainingSAE(
                StandardTrainingSAEConfig(d_in=d, d_sae=m, l1_coefficient=s["l1"])
            )
        coeffs = {
            n: (c.value if isinstance(c, TrainCoefficientConfig) else c)
            for n, c in sae.get_coefficients().items()
        }
        opt = torch.optim.Adam(sae.parameters(), lr=lr, betas=(0.9, 0.999))
        n_step = [0]

        def step(x: torch.Tensor) -> None:
            out = sae.training_forward_pass(
                TrainStepInput(
                    sae_in=x,
                    coefficients=coeffs,
                    dead_neuron_mask=None,
                    n_training_steps=n_step[0],
                    is_logging_step=False,
                )
            )
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            opt.step()
            n_step[0] += 1

        def recon(x: torch.Tensor) -> torch.Tensor:
            f = sae.encode(x)
            return sae.decode(f.to_dense() if f.is_sparse else f)

        def l0(x: torch.Tensor) -> float:
            f = sae.encode(x)
            f = f.to_dense() if f.is_sparse else f
            return float((f > 0).sum(-1).float().mean())
    elif lib == "sparsify":
        from sparsify import SparseCoder, SparseCoderConfig

        sae = SparseCoder(d, SparseCoderConfig(num_latents=m, k=k), device=dev)
        opt = torch.optim.Adam(sae.parameters(), lr=lr, betas=(0.9, 0.999))

        def step(x: torch.Tensor) -> None:
            out = sae(x)
            opt.zero_grad(set_to_none=True)
            out.fvu.backward()
            sae.remove_gradient_parallel_to_decoder_directions()
            opt.step()
            sae.set_decoder_norm_to_unit_norm()

        def recon(x: torch.Tensor) -> torch.Tensor:
            return sae(x).sae_out

        def l0(x: torch.Tensor) -> float:
            return float((sae.encode(x).top_acts > 0).sum(-1).float().mean())
    else:
        raise ValueError(lib)
    step(batches[0])  # warm-up (allocations, lazy init) is not timed
    sync()
    t0 = time.perf_counter()
    for x in batches[1:]:
        step(x)
    sync()
    elapsed = time.perf_counter() - t0
    with torch.no_grad():
        quality = fvu(held, recon(held))
        mean_l0 = l0(held)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "library": lib,
        "architecture": arch,
        "tokens_per_s": s["steps"] * s["batch"] / elapsed,
        "seconds": elapsed,
        "fvu": quality,
        "l0": mean_l0,
        "peak_rss_mib": peak / 1024,
        "training_rss_mib": (peak - base_rss) / 1024,
    }


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"torch": torch.__version__, "python": platform.python_version()}
    for pkg in ("sae-lens", "eai-sparsify", "structlens"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs=2, metavar=("LIB", "ARCH"))
    ap.add_argument("--settings", type=str, default=None)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    s = dict(SETTINGS, **json.loads(args.settings)) if args.settings else SETTINGS
    if args.worker:
        print(json.dumps(worker(*args.worker, s)))
        return
    load_before = os.getloadavg()
    print(f"load average before: {load_before}", flush=True)
    runs: dict[tuple[str, str], list[dict]] = {}
    errors: dict[str, str] = {}
    for _ in range(args.repeats):
        for arch, libs in PEERS.items():
            for lib in libs:
                cmd = [sys.executable, __file__, "--worker", lib, arch, "--settings", json.dumps(s)]
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    errors[f"{lib}/{arch}"] = p.stderr.strip().splitlines()[-1]
                    continue
                r = json.loads(p.stdout.strip().splitlines()[-1])
                runs.setdefault((lib, arch), []).append(r)
                print(
                    f"{lib:15s} {arch:5s} {r['tokens_per_s']:9.0f} tok/s  FVU {r['fvu']:.4f}  "
                    f"L0 {r['l0']:.1f}  peak {r['peak_rss_mib']:.0f} MiB",
                    flush=True,
                )
    best = {key: max(v, key=lambda r: r["tokens_per_s"]) for key, v in runs.items()}
    table = []
    for arch, libs in PEERS.items():
        ours = best.get(("structlens", arch))
        peers = [best[(lib, arch)] for lib in libs[1:] if (lib, arch) in best]
        for r in [ours, *peers]:
            if r is None:
                continue
            row = dict(r)
            if ours is not None:
                row["speedup_of_structlens"] = ours["tokens_per_s"] / r["tokens_per_s"]
                row["training_memory_ratio_structlens_over_this"] = ours["training_rss_mib"] / max(
                    r["training_rss_mib"], 1e-9
                )
                row["fvu_minus_structlens"] = r["fvu"] - ours["fvu"]
            table.append(row)
    out = {
        "machine": f"{os.cpu_count()} CPU cores, no GPU",
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "settings": s,
        "versions": versions(),
        "runs": {f"{k[0]}/{k[1]}": v for k, v in runs.items()},
        "best": table,
        "errors": errors,
    }
    (HERE / "results.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()

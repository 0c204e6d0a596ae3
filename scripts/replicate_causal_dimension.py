"""Replicate the causal-dimensionality claims on SmolLM2-135M-Instruct (CPU-sized).

    .venv/bin/python scripts/replicate_causal_dimension.py            # every stage, then the doc
    .venv/bin/python scripts/replicate_causal_dimension.py --stage jacobian   # one stage

Stages cache their JSON under ``--out`` (default ``results/causal-dimension``), so a rerun only
does what is missing; ``doc`` rewrites docs/replication/causal-dimension.md from those JSONs.
Stages ``jacobian`` and ``sweep`` are independent and can run as two processes at once.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "replication" / "causal-dimension.md"

SETTINGS = {
    "model": "smollm2-135m",
    "jacobian_layers": [15, 25, 20, 10, 5],
    "jacobian_vectors": {"15": 4, "default": 2},
    "jacobian_prompt_tokens": 24,
    "sweep_layer": 15,
    "widths": [512, 1024, 2048, 4096, 8192, 16384],
    "architecture": "topk",
    "k": 32,
    # A fixed rate: with the width rule and lr_base 1e-3, widths 512–2048 got 2.8e-3–5.7e-3
    # and diverged (training FVU 2.7–5.1) in a first run; 1e-3 trained 16384 to FVU 0.32.
    "lr": 1e-3,
    "batch_size": 512,
    "epochs": 3,
    "prompt_tokens": 128,
    "n_train_prompts": 400,
    "n_eval_prompts": 24,
    "n_ce_prompts": 8,
    "n_blocks": 64,
    "n_bootstrap": 200,
    "ablation_width": 4096,
    "ioi_prompts": 32,
    "seed": 0,
}
QUICK = SETTINGS | {
    "model": "tiny-llama",
    "jacobian_layers": [1, 2],
    "jacobian_prompt_tokens": 8,
    "sweep_layer": 1,
    "widths": [64, 128, 256, 512, 1024, 2048],
    "k": 4,
    "batch_size": 64,
    "epochs": 1,
    "prompt_tokens": 32,
    "n_train_prompts": 40,
    "n_eval_prompts": 8,
    "n_ce_prompts": 4,
    "n_blocks": 8,
    "n_bootstrap": 20,
    "ablation_width": 256,
    "ioi_prompts": 0,
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def prompts_split(model, s: dict) -> tuple[list, list, list]:
    from structlens.data.corpus import chunk_documents, load_texts

    chunks = chunk_documents(load_texts(None), model.tokenizer, max_tokens=s["prompt_tokens"])
    full = [list(c.token_ids) for c in chunks if len(c.token_ids) == s["prompt_tokens"]]
    # Held-out evaluation prompts are every 20th window; training uses the rest.
    held = full[::20]
    train = [p for i, p in enumerate(full) if i % 20][: s["n_train_prompts"]]
    return train, held[: s["n_eval_prompts"]], held[s["n_eval_prompts"] :]


def stage_jacobian(out: Path, s: dict) -> None:
    from structlens.causal import JacobianConfig
    from structlens.causal.experiment import kappa_by_layer
    from structlens.models import load_model

    model = load_model(s["model"])
    _, _, rest = prompts_split(model, s)
    done = json.loads((out / "kappa.json").read_text()) if (out / "kappa.json").exists() else {}
    layers = done.get("layers", [])
    have = {entry["layer"] for entry in layers}
    for layer in s["jacobian_layers"]:
        if layer in have:
            continue
        n = s["jacobian_vectors"].get(str(layer), s["jacobian_vectors"]["default"])
        prompts = [p[: s["jacobian_prompt_tokens"]] for p in rest[:n]]
        t = time.time()
        cfg = JacobianConfig(output="log_probs", n_groups=n, max_rows=model.d_model)
        res = kappa_by_layer(model, [layer], prompts, cfg)
        entry = res["layers"][0] | {"seconds": time.time() - t}
        layers.append(entry)
        done = {
            "d": res["d"],
            "settings": res["settings"],
            "layers": sorted(layers, key=lambda e: e["layer"]),
        }
        (out / "kappa.json").write_text(json.dumps(done))
        log(
            f"layer {layer}: erank {entry['erank']:.1f} PR {entry['participation_ratio']:.1f} "
            f"({n} vectors, {entry['seconds']:.0f} s)"
        )


def sweep_tag(s: dict) -> str:
    return (
        f"sweep-L{s['sweep_layer']}-{s['architecture']}-k{s['k']}-lr{s['lr']:g}-"
        f"e{s['epochs']}-n{s['n_train_prompts']}"
    )


def stage_sweep(out: Path, s: dict) -> None:
    from structlens.causal.experiment import (
        ce_recovered_by_width,
        collect_residuals,
        four_cell,
        ioi_recovery,
        sae_quality,
        sweep_analysis,
        train_width_sweep,
    )
    from structlens.causal.model import residual_grads
    from structlens.causal.sweep import WidthSweepConfig
    from structlens.models import load_model
    from structlens.sae import SAETrainConfig, load_sae, save_sae

    torch.manual_seed(s["seed"])
    model = load_model(s["model"])
    train, evalp, rest = prompts_split(model, s)
    layer = s["sweep_layer"]
    # Everything that depends on the SAEs lives under a directory named by their settings,
    # so changing a training setting retrains instead of reusing stale results.
    out = out / sweep_tag(s)
    out.mkdir(parents=True, exist_ok=True)
    sae_dir = out / "saes"
    widths = s["widths"]
    if not all((sae_dir / str(w) / "cfg.json").exists() for w in widths):
        t = time.time()
        acts = collect_residuals(model, layer, train)
        log(f"captured {acts.shape[0]} training tokens at layer {layer} ({time.time() - t:.0f} s)")
        base = SAETrainConfig(architecture=s["architecture"], k=s["k"], lr=s["lr"], seed=s["seed"])
        t = time.time()
        trained = train_width_sweep(
            acts, widths, base, batch_size=s["batch_size"], epochs=s["epochs"], seed=s["seed"]
        )
        train_info = {}
        for w, r in trained.items():
            save_sae(r.sae, sae_dir / str(w))
            train_info[str(w)] = {
                "tokens": r.tokens,
                "steps": r.steps,
                "final_fvu": r.final_fvu,
                "final_l0": r.final_l0,
                "dead_fraction": r.dead_fraction,
                "learning_rate": r.learning_rate,
            }
        (out / "training.json").write_text(
            json.dumps(
                {
                    "n_train_tokens": int(acts.shape[0]),
                    "seconds": time.time() - t,
                    "per_width": train_info,
                }
            )
        )
        log(f"trained {len(widths)} SAEs ({time.time() - t:.0f} s)")
        del acts
    saes = {w: load_sae(sae_dir / str(w)) for w in widths}
    grads_path = out / "eval_acts_grads.pt"
    if grads_path.exists():
        pairs = torch.load(grads_path)
    else:
        t = time.time()
        pairs = list(residual_grads(model, layer, evalp))
        torch.save(pairs, grads_path)
        log(
            f"eval acts+grads: {sum(a.shape[0] for a, _ in pairs)} tokens ({time.time() - t:.0f} s)"
        )
    eval_acts = torch.cat([a for a, _ in pairs])
    kappa = out.parent / "kappa.json"
    exact = None
    if kappa.exists():
        for e in json.loads(kappa.read_text())["layers"]:
            if e["layer"] == layer:
                exact = e["erank"]
    cfg = WidthSweepConfig(n_bootstrap=s["n_bootstrap"], seed=s["seed"])
    sweep, _ = sweep_analysis(saes, pairs, cfg, n_blocks=s["n_blocks"], exact_erank=exact)
    quality = {str(w): sae_quality(sae, eval_acts) for w, sae in saes.items()}
    (out / "sweep.json").write_text(
        json.dumps(
            sweep.to_json()
            | {
                "widths": sweep.widths.tolist(),
                "n_repr": sweep.n_repr.tolist(),
                "n_causal": sweep.n_causal.tolist(),
                "n_repr_growth": sweep.n_repr_growth.tolist(),
                "n_causal_growth": sweep.n_causal_growth.tolist(),
                "n_causal_ci": sweep.n_causal_ci.tolist(),
                "n_repr_ci": sweep.n_repr_ci.tolist(),
                "quality": quality,
                "layer": layer,
            },
            default=str,
        )
    )
    log(f"sweep: n_repr {sweep.n_repr.tolist()} n_causal {sweep.n_causal.tolist()}")
    if not (out / "ce.json").exists():
        t = time.time()
        ce = ce_recovered_by_width(model, layer, saes, rest[: s["n_ce_prompts"]])
        (out / "ce.json").write_text(json.dumps({str(k): v for k, v in ce.items()}))
        log(f"CE recovered ({time.time() - t:.0f} s)")
    sae = saes[s["ablation_width"]]
    (out / "fourcell.json").write_text(json.dumps(four_cell(sae, pairs, seed=s["seed"])))
    log("four-cell done")
    if s["ioi_prompts"] and not (out / "ioi.json").exists():
        t = time.time()
        ioi = ioi_recovery(model, layer, sae, n_prompts=s["ioi_prompts"], seed=s["seed"])
        (out / "ioi.json").write_text(json.dumps(ioi))
        log(f"IOI recovery {ioi['recall_top_of_all']:.2f} ({time.time() - t:.0f} s)")


def stage_synthetic(out: Path, s: dict) -> None:
    from structlens.causal import SyntheticCausalModel, atp_recall
    from structlens.sae import SAETrainConfig, train_sae

    if (out / "synthetic.json").exists():
        return
    model = SyntheticCausalModel(d=32, n_atoms=256, n_causal=8, vocab=64, active=4, seed=0)
    sae = train_sae(
        SAETrainConfig(architecture="topk", d_sae=512, k=4, lr=2e-3),
        (model.sample(512) for _ in range(600)),
    ).sae
    acts = model.sample(4000)
    grads = model.metric_grads(acts)
    rec = {k: atp_recall(sae, model.causal, acts, grads, top_k=k).to_json() for k in (8, 11, 26)}
    (out / "synthetic.json").write_text(json.dumps(rec))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "causal-dimension")
    ap.add_argument(
        "--stage", default="all", choices=["all", "jacobian", "sweep", "synthetic", "doc"]
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="tiny-llama smoke run of every stage (seconds; numbers meaningless)",
    )
    args = ap.parse_args()
    settings = QUICK if args.quick else SETTINGS
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "settings.json").write_text(json.dumps(settings, indent=1))
    torch.set_num_threads(2)
    stages = {"jacobian": stage_jacobian, "sweep": stage_sweep, "synthetic": stage_synthetic}
    for name, fn in stages.items():
        if args.stage in ("all", name):
            log(f"stage {name}")
            fn(args.out, settings)
    if args.stage in ("all", "doc"):
        from structlens.report.causal import write_replication_doc

        doc = args.out / "doc.md" if args.quick else DOC
        write_replication_doc(args.out, settings, doc, sweep_dir=args.out / sweep_tag(settings))
        log(f"wrote {doc}")


if __name__ == "__main__":
    main()

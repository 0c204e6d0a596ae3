"""Replicate the causal-dimensionality claims on SmolLM2-135M-Instruct.

    .venv/bin/python scripts/replicate_causal_dimension.py                  # CPU profile, all
    .venv/bin/python scripts/replicate_causal_dimension.py --profile gpu --device cuda
    .venv/bin/python scripts/replicate_causal_dimension.py --stage jacobian # one stage

Stages (each caches under ``--out``, default ``results/causal-dimension/<profile>``, so a rerun
does only what is missing): ``jacobian`` (per-vector exact Grams, one file per vector, then
κ with CIs), ``train`` (capture the training residuals once, then every SAE on that one
stream, one SAE at a time, saved as it finishes), ``analyze`` (AtP with the error term from
one backward pass per batch, reused by every SAE: width sweep, quality, CE recovered,
four-cell, architectures, ε by depth, IOI), ``synthetic`` and ``doc`` (rewrites
docs/replication/causal-dimension.md from the JSONs).  ``jacobian`` and ``train`` are
independent and can run as two processes at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "replication" / "causal-dimension.md"

CPU = {
    "profile": "cpu",
    "model": "smollm2-135m",
    "jacobian_layers": [15, 5, 10, 20, 25],
    # Rounds: every layer gets the first count before any gets the next (a stopped run still
    # covers all layers); L15 (the sweep layer, compared with κ̂) gets more vectors first.
    "jacobian_rounds": [
        {"default": 16},
        {"15": 64, "default": 16},
        {"15": 64, "default": 32},
        {"15": 128, "default": 32},
        {"15": 128, "default": 64},
    ],
    "jacobian_prompt_tokens": 24,
    # Each bootstrap replicate and curve draw is one eigendecomposition of a d × d matrix.
    "kappa_bootstrap": 100,
    "kappa_curve_draws": 10,
    "sweep_layer": 15,
    "widths": [512, 1024, 2048, 4096, 8192, 16384, 32768],
    "architecture": "topk",
    "k": 32,
    # A fixed rate: with the width rule and lr_base 1e-3, widths 512–2048 got 2.8e-3–5.7e-3
    # and diverged (training FVU 2.7–5.1) in a first run; 1e-3 trained 16384 to FVU 0.32.
    "lr": 1e-3,
    "batch_size": 256,
    # One epoch: the 2-core machine was shared with ~15 runnable jobs during the run.
    "epochs": 1,
    # Features silent for this many training tokens count as dead and get the aux-k loss.
    "dead_tokens": 25_000,
    "prompt_tokens": 128,
    "n_train_prompts": 400,
    "n_eval_prompts": 36,
    # The CPU profile ran on 2 cores shared with ~12 runnable jobs: 400 training windows
    # (~5·10⁴ tokens, half the corpus), 12 of the unused ones join the held-out evaluation.
    "n_eval_extra": 12,
    "train_tokens": None,  # cap on the captured tokens each SAE trains on (None = all)
    "n_ce_prompts": 8,
    "n_blocks": 64,
    "n_bootstrap": 200,
    "ablation_width": 2048,
    "arch_controls": ["jumprelu", "relu"],
    "depth_layers": [5, 10, 20],
    "depth_width": 512,
    "ioi_prompts": 32,
    "seed": 0,
}
GPU = CPU | {
    "profile": "gpu",
    "jacobian_rounds": [{"default": 64}, {"15": 220, "default": 128}],
    "widths": [512, 1024, 2048, 4096, 8192, 16384, 32768],
    "batch_size": 1024,
    "epochs": 8,
    "dead_tokens": 100_000,
    "n_train_prompts": 800,
    "n_eval_extra": 27,
    "depth_layers": [5, 10, 20, 25],
}
QUICK = CPU | {
    "profile": "quick",
    "model": "tiny-llama",
    "jacobian_layers": [1, 2],
    "jacobian_rounds": [{"default": 3}, {"1": 5, "default": 3}],
    "jacobian_prompt_tokens": 8,
    "sweep_layer": 1,
    "widths": [64, 128, 256, 512, 1024, 2048],
    "k": 4,
    "batch_size": 64,
    "epochs": 1,
    "dead_tokens": 1000,
    "prompt_tokens": 32,
    "n_train_prompts": 40,
    "n_eval_prompts": 8,
    "n_eval_extra": 4,
    "n_ce_prompts": 4,
    "n_blocks": 8,
    "n_bootstrap": 20,
    "ablation_width": 256,
    "depth_layers": [0, 2],
    "depth_width": 128,
    "ioi_prompts": 0,  # the byte-level test tokenizer has no single-token names
}
PROFILES = {"cpu": CPU, "gpu": GPU, "quick": QUICK}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def part(out: Path, name: str, fn) -> None:
    """Run one analysis part; a failure is logged and recorded, and the others still run."""
    t = time.time()
    try:
        fn()
        log(f"{name} done ({time.time() - t:.0f} s)")
    except Exception:  # noqa: BLE001 - one broken part must not lose the rest of a long run
        log(f"{name} FAILED\n{traceback.format_exc()}")
        fails = out / "failures.json"
        prev = json.loads(fails.read_text()) if fails.exists() else {}
        fails.write_text(json.dumps(prev | {name: traceback.format_exc()}))


def prompts_split(model, s: dict) -> tuple[list, list, list]:
    """(train, eval, ce) prompts: every 20th full window is held out; eval = the first
    held-out windows plus the training windows left over, CE = the next held-out ones."""
    from structlens.data.corpus import chunk_documents, load_texts

    chunks = chunk_documents(load_texts(None), model.tokenizer, max_tokens=s["prompt_tokens"])
    full = [list(c.token_ids) for c in chunks if len(c.token_ids) == s["prompt_tokens"]]
    held = full[::20]
    other = [p for i, p in enumerate(full) if i % 20]
    n_tr, n_ev = s["n_train_prompts"], s["n_eval_prompts"]
    evalp = held[:n_ev] + other[n_tr : n_tr + s["n_eval_extra"]]
    return other[:n_tr], evalp, held[n_ev : n_ev + s["n_ce_prompts"]]


def jacobian_prompts(model, s: dict) -> list[list[int]]:
    """Held-out windows of ``jacobian_prompt_tokens`` tokens, chunk-major within a window
    index, so the first vectors all come from different chunks."""
    from structlens.data.corpus import chunk_documents, load_texts

    chunks = chunk_documents(load_texts(None), model.tokenizer, max_tokens=s["prompt_tokens"])
    held = [list(c.token_ids) for c in chunks if len(c.token_ids) == s["prompt_tokens"]][::20]
    n = s["jacobian_prompt_tokens"]
    starts = range(0, s["prompt_tokens"] - n + 1, n + 2)
    return [c[a : a + n] for a in starts for c in held]


def stage_jacobian(out: Path, s: dict, device: str) -> None:
    """Per-vector exact Grams, saved one file per vector (resumable), in rounds over layers."""
    import numpy as np

    from structlens.causal_dim import JacobianConfig
    from structlens.causal_dim.model import vector_grams
    from structlens.models import load_model

    model = load_model(s["model"], device=device)
    prompts = jacobian_prompts(model, s)
    cfg = JacobianConfig(output="log_probs", max_rows=model.d_model)
    for round_target in s["jacobian_rounds"]:
        for layer in s["jacobian_layers"]:
            target = min(round_target.get(str(layer), round_target["default"]), len(prompts))
            folder = out / "grams" / f"L{layer}"
            folder.mkdir(parents=True, exist_ok=True)
            have = len(list(folder.glob("[0-9][0-9][0-9][0-9].npy")))
            if have >= target:
                continue
            t = time.time()
            for i, g in enumerate(
                vector_grams(model, layer, prompts[have:target], cfg), start=have
            ):
                np.save(folder / f"{i:04d}.tmp.npy", g.numpy())
                (folder / f"{i:04d}.tmp.npy").rename(folder / f"{i:04d}.npy")
            log(
                f"layer {layer}: {target} vectors ({(time.time() - t) / (target - have):.1f} s/vec)"
            )
    # Once, at the end: the bootstrap and curves cost hundreds of eigendecompositions per layer.
    summarize_kappa(out, s)


def load_grams(out: Path, layer: int):
    import numpy as np

    files = sorted((out / "grams" / f"L{layer}").glob("[0-9][0-9][0-9][0-9].npy"))
    return np.stack([np.load(f) for f in files]) if files else None


def summarize_kappa(out: Path, s: dict) -> None:
    from structlens.causal_dim.kappa import kappa_curve, kappa_from_grams
    from structlens.results import to_jsonable

    layers = []
    for layer in s["jacobian_layers"]:
        g = load_grams(out, layer)
        if g is None or g.shape[0] < 2:
            continue
        res = kappa_from_grams(g, n_bootstrap=s["kappa_bootstrap"], seed=s["seed"])
        sizes = sorted({n for n in (1, 2, 4, 8, 16, 32, 64, 128) if n < g.shape[0]} | {len(g)})
        curve = kappa_curve(g, sizes, n_draws=s["kappa_curve_draws"], seed=s["seed"])
        layers.append(to_jsonable(res) | {"layer": layer, "curve": curve})
    settings = {
        "output": "log_probs",
        "outputs": "same",
        "position": "last token of each window",
        "prompt_tokens": s["jacobian_prompt_tokens"],
    }
    (out / "kappa.json").write_text(
        json.dumps(
            {"d": layers[0]["d"] if layers else None, "settings": settings, "layers": layers}
        )
    )


def sae_jobs(s: dict) -> list[tuple[str, dict, int]]:
    """(name, SAETrainConfig kwargs, layer) in training order: the width sweep (smallest
    first), the architecture controls, then the depth SAEs."""
    base = {"k": s["k"], "lr": s["lr"], "seed": s["seed"], "dead_tokens": s["dead_tokens"]}
    sweep = [
        (f"topk-{w}", base | {"architecture": "topk", "d_sae": w}, s["sweep_layer"])
        for w in s["widths"]
    ]
    arch = [
        (
            f"{a}-{s['ablation_width']}",
            base | {"architecture": a, "d_sae": s["ablation_width"], "target_l0": float(s["k"])},
            s["sweep_layer"],
        )
        for a in s["arch_controls"]
    ]
    depth = [
        (f"depth-L{layer}-topk-{s['depth_width']}", base | {"d_sae": s["depth_width"]}, layer)
        for layer in s["depth_layers"]
    ]
    return sweep + arch + depth


def stage_train(out: Path, s: dict, device: str) -> None:
    from structlens.causal_dim.experiment import shuffled_batches
    from structlens.causal_dim.model import residual_batches_multi
    from structlens.models import load_model
    from structlens.sae import SAETrainConfig, save_sae, train_sae

    layers = sorted({s["sweep_layer"], *s["depth_layers"]})
    acts_path = out / "train_acts.pt"
    if acts_path.exists():
        acts = torch.load(acts_path, weights_only=True)
    else:
        model = load_model(s["model"], device=device)
        train, _, _ = prompts_split(model, s)
        t = time.time()
        parts: dict[int, list] = {layer: [] for layer in layers}
        for batch in residual_batches_multi(model, layers, train):
            for layer, a in batch.items():
                parts[layer].append(a.half())
        acts = {layer: torch.cat(v) for layer, v in parts.items()}
        torch.save(acts, acts_path)
        log(
            f"captured {acts[layers[0]].shape[0]} tokens at layers {layers} "
            f"({time.time() - t:.0f} s)"
        )
        del model
    for name, kw, layer in sae_jobs(s):
        folder = out / "saes" / name
        if (folder / "train.json").exists():
            continue
        t = time.time()
        x = acts[layer][: s["train_tokens"]].to(device).float()
        batches = shuffled_batches(x, s["batch_size"], s["epochs"], s["seed"])
        res = train_sae(SAETrainConfig(**kw), batches, device=device, tail_tokens=20_000)
        save_sae(res.sae.cpu(), folder)
        info = {
            "layer": layer,
            "n_train_tokens": int(x.shape[0]),
            "tokens": res.tokens,
            "steps": res.steps,
            "epochs": s["epochs"],
            "final_fvu": res.final_fvu,
            "final_l0": res.final_l0,
            "l0_matched": res.l0_matched,
            "dead_fraction": res.dead_fraction,
            "learning_rate": res.learning_rate,
            "seconds": time.time() - t,
            "device": device,
        }
        (folder / "train.json").write_text(json.dumps(info))
        log(
            f"trained {name}: FVU {res.final_fvu:.3f} L0 {res.final_l0:.1f} "
            f"({info['seconds']:.0f} s)"
        )


def _train_info(out: Path, name: str) -> dict:
    return json.loads((out / "saes" / name / "train.json").read_text())


def stage_analyze(out: Path, s: dict, device: str) -> None:
    from structlens.causal_dim import FeatureStats, calibrate_epsilon
    from structlens.causal_dim.experiment import (
        ce_recovered_by_width,
        four_cell,
        ioi_recovery,
        sae_quality,
        sweep_analysis,
    )
    from structlens.causal_dim.model import residual_grads_multi
    from structlens.causal_dim.sweep import WidthSweepConfig, analyze_width_sweep
    from structlens.models import load_model
    from structlens.results import to_jsonable
    from structlens.sae import load_sae

    torch.manual_seed(s["seed"])
    model = load_model(s["model"], device=device)
    _, evalp, cep = prompts_split(model, s)
    L = s["sweep_layer"]
    layers = sorted({L, *s["depth_layers"]})
    done = {n for n, _, _ in sae_jobs(s) if (out / "saes" / n / "train.json").exists()}
    saes = {n: load_sae(out / "saes" / n) for n in sorted(done)}
    grads_path = out / "eval_acts_grads.pt"
    if grads_path.exists():
        pairs = torch.load(grads_path, weights_only=True)
    else:
        t = time.time()
        pairs = {layer: [] for layer in layers}
        for batch in residual_grads_multi(model, layers, evalp):
            for layer, ag in batch.items():
                pairs[layer].append(ag)
        torch.save(pairs, grads_path)
        n_tok = sum(a.shape[0] for a, _ in pairs[L])
        log(f"eval acts+grads: {n_tok} tokens at {layers} ({time.time() - t:.0f} s)")
    eval_acts = {layer: torch.cat([a for a, _ in v]) for layer, v in pairs.items()}
    exact = None
    if (out / "kappa.json").exists():
        for e in json.loads((out / "kappa.json").read_text())["layers"]:
            if e["layer"] == L:
                exact = e["erank"]
    topk = {w: saes[f"topk-{w}"] for w in s["widths"] if f"topk-{w}" in saes}
    cfg = WidthSweepConfig(n_bootstrap=s["n_bootstrap"], seed=s["seed"])
    sweep_eps: list[float] = []

    def sweep() -> None:
        res, stats = sweep_analysis(topk, pairs[L], cfg, n_blocks=s["n_blocks"], exact_erank=exact)
        sweep_eps.append(res.epsilon)
        # Total and largest AtP per width: does a wider SAE split the same causal mass?
        atp = {str(w): st.scores()[0] for w, st in stats.items()}
        mass = {w: {"sum": float(a.sum()), "max": float(a.max())} for w, a in atp.items()}
        # Sensitivity to the base width: ε from the top 2% of a wider base (same tokens).
        bases = {}
        for b in [w for w in topk if w > min(topk)][:2]:
            sub = {w: st for w, st in stats.items() if w >= b}
            if len(sub) >= 2:
                r = analyze_width_sweep(sub, dataclasses.replace(cfg, n_bootstrap=0))
                bases[str(b)] = {"widths": r.widths.tolist(), "n_causal": r.n_causal.tolist()}
        quality = {str(w): sae_quality(sae, eval_acts[L]) for w, sae in topk.items()}
        training = {str(w): _train_info(out, f"topk-{w}") for w in topk}
        (out / "sweep.json").write_text(
            json.dumps(
                to_jsonable(res)
                | {"layer": L, "site": f"blocks.{L}.hook_resid_pre"}
                | {"quality": quality, "training": training, "atp_mass": mass}
                | {"other_bases": bases},
                default=str,
            )
        )
        log(f"sweep: n_repr {res.n_repr.tolist()} n_causal {res.n_causal.tolist()}")

    def ce() -> None:
        path = out / "ce.json"
        have = json.loads(path.read_text()) if path.exists() else {}
        todo = {n: sae for n, sae in saes.items() if n not in have and not n.startswith("depth")}
        if todo:
            got = ce_recovered_by_width(model, L, todo, cep)
            path.write_text(json.dumps(have | {str(k): v for k, v in got.items()}))

    def arch() -> None:
        w = s["ablation_width"]
        scores = {}
        for a in ["topk", *s["arch_controls"]]:
            if f"{a}-{w}" in saes:
                st = FeatureStats(w, n_blocks=1)
                for acts, grads in pairs[L]:
                    st.update(saes[f"{a}-{w}"], acts, grads)
                scores[a] = st.scores()
        # Common thresholds: the sweep's ε (98th percentile at the base width) and TopK's
        # own 98th percentile at this width; each architecture's own ε is listed too.
        eps_topk = calibrate_epsilon(scores["topk"][0], 0.02) if "topk" in scores else None
        rows = {}
        for a, (atp, fires) in scores.items():
            eps_own = calibrate_epsilon(atp, 0.02)
            rows[a] = {
                "n_repr": int((fires >= 1).sum()),
                "epsilon_own": eps_own,
                "n_causal_at_sweep_epsilon": int((atp > sweep_eps[0]).sum()) if sweep_eps else None,
                "n_causal_at_topk_epsilon": int((atp > eps_topk).sum()) if eps_topk else None,
                "top2pct_atp_share": float(atp[atp > eps_own].sum() / max(atp.sum(), 1e-300)),
                "quality": sae_quality(saes[f"{a}-{w}"], eval_acts[L]),
                "training": _train_info(out, f"{a}-{w}"),
            }
        (out / "arch.json").write_text(json.dumps({"width": w, "layer": L, "rows": rows}))

    def depth() -> None:
        rows = []
        for layer in layers:
            name = (
                f"topk-{s['depth_width']}"
                if layer == L
                else f"depth-L{layer}-topk-{s['depth_width']}"
            )
            if name not in saes:
                continue
            st = FeatureStats(s["depth_width"], n_blocks=1)
            gnorm = []
            for acts, grads in pairs[layer]:
                st.update(saes[name], acts, grads)
                gnorm.append(grads.norm(dim=1))
            atp, fires = st.scores()
            rows.append(
                {
                    "layer": layer,
                    "epsilon": calibrate_epsilon(atp, 0.02),
                    "mean_atp": float(atp.mean()),
                    "median_grad_norm": float(torch.cat(gnorm).median()),
                    "n_repr": int((fires >= 1).sum()),
                    "quality": sae_quality(saes[name], eval_acts[layer]),
                }
            )
        (out / "depth.json").write_text(json.dumps({"width": s["depth_width"], "rows": rows}))

    def fourcell() -> None:
        sae = saes[f"topk-{s['ablation_width']}"]
        (out / "fourcell.json").write_text(json.dumps(four_cell(sae, pairs[L], seed=s["seed"])))

    def ioi() -> None:
        if (out / "ioi.json").exists():
            return
        sae = saes[f"topk-{s['ablation_width']}"]
        res = ioi_recovery(model, L, sae, n_prompts=s["ioi_prompts"], seed=s["seed"])
        (out / "ioi.json").write_text(json.dumps(res))

    if len(topk) >= 2:
        part(out, "sweep", sweep)
    for name, fn in [("ce", ce), ("arch", arch), ("depth", depth), ("fourcell", fourcell)]:
        part(out, name, fn)
    if s["ioi_prompts"]:
        part(out, "ioi", ioi)


def stage_synthetic(out: Path, s: dict, device: str) -> None:
    from structlens.causal_dim import SyntheticCausalModel, atp_recall
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
    ap.add_argument("--profile", default="cpu", choices=sorted(PROFILES))
    ap.add_argument(
        "--out", type=Path, default=None, help="default results/causal-dimension/<profile>"
    )
    ap.add_argument(
        "--stage",
        default="all",
        choices=["all", "jacobian", "kappa", "train", "analyze", "synthetic", "doc"],
    )
    ap.add_argument("--device", default="cpu", help="torch device for the model and training")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (shared machine: 1)")
    args = ap.parse_args()
    settings = PROFILES[args.profile]
    out = args.out or ROOT / "results" / "causal-dimension" / args.profile
    out.mkdir(parents=True, exist_ok=True)
    (out / "settings.json").write_text(json.dumps(settings, indent=1))
    torch.set_num_threads(args.threads)
    stages = {
        "jacobian": lambda: stage_jacobian(out, settings, args.device),
        # κ from whatever Grams are on disk (the jacobian stage ends with the same summary).
        "kappa": lambda: summarize_kappa(out, settings),
        "train": lambda: stage_train(out, settings, args.device),
        "analyze": lambda: stage_analyze(out, settings, args.device),
        "synthetic": lambda: stage_synthetic(out, settings, args.device),
    }
    for name, fn in stages.items():
        # "all" skips "kappa": the jacobian stage already ends with that summary.
        if args.stage == name or (args.stage == "all" and name != "kappa"):
            log(f"stage {name}")
            fn()
    if args.stage in ("all", "doc"):
        from structlens.report.causal import write_replication_doc

        doc = out / "doc.md" if args.profile == "quick" else DOC
        write_replication_doc(out, settings, doc)
        log(f"wrote {doc}")


if __name__ == "__main__":
    main()

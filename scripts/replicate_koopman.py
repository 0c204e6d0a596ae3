"""Replicate the Koopman spectral-identifiability claims on SmolLM2-135M-Instruct.

    .venv/bin/python scripts/replicate_koopman.py [--out results/replication/koopman] [--quick]

Captures resid_pre / attn_out over the bundled corpus plus IOI prompts for a layer range,
measures each claim, writes ``<out>/replication.json``, figures under ``<out>`` and renders
``docs/replication/koopman.md``.  Everything is seeded; a re-run reuses the activation store.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from structlens.data.tasks import make_task
from structlens.koopman import (
    EDMDc,
    EDMDcConfig,
    PCADictionary,
    RandomFourierDictionary,
    RandomReLUDictionary,
    SAEDictionary,
    SpectralDictionary,
    balanced_truncation,
    invariance_residual_split,
    solve,
    split_half_convergence,
)
from structlens.koopman.data import capture_depth, depth_prompts, load_layer, load_layers
from structlens.koopman.interventions import compare_ablations
from structlens.koopman.pipeline import summarise_fit
from structlens.models import load_model
from structlens.report.koopman import plot_ablation, plot_eigenvalues, plot_split_half
from structlens.stats.matching import bottleneck_distance
from structlens.stats.robust import tail_diagnostic

ROOT = Path(__file__).resolve().parents[1]


def log(msg: str, t0: float) -> None:
    print(f"[{time.time() - t0:7.1f}s] {msg}", flush=True)


def train_small_sae(X: np.ndarray, d_sae: int, k: int, seed: int) -> tuple[SAEDictionary, dict]:
    """TopK SAE on the (RMS-normalised) states; the scale is folded back into the encoder."""
    from structlens.sae import SAETrainConfig, train_sae

    scale = float(np.sqrt(np.mean(np.sum((X - X.mean(0)) ** 2, axis=1)) / X.shape[1]))
    Xn = torch.as_tensor(X / scale, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)

    def batches():
        for _ in range(3):
            perm = torch.randperm(len(Xn), generator=gen)
            for s in range(0, len(Xn) - 255, 256):
                yield Xn[perm[s : s + 256]]

    cfg = SAETrainConfig(architecture="topk", d_sae=d_sae, k=k, seed=seed, lr=1e-3)
    tr = train_sae(cfg, batches())
    sae = tr.sae
    dic = SAEDictionary(
        sae.W_enc.detach().double().numpy() / scale,
        sae.b_enc.detach().double().numpy(),
        sae.b_dec.detach().double().numpy() * scale,
        activation="topk",
        k=k,
    )
    return dic, {"d_sae": d_sae, "k": k, "final_fvu": tr.final_fvu, "dead": tr.dead_fraction}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/replication/koopman")
    ap.add_argument("--n-corpus", type=int, default=300)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--n-task", type=int, default=50)
    ap.add_argument("--layers", default="4-12")
    ap.add_argument("--probe-layers", default="6,10")
    ap.add_argument("--n-ioi", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--doc", default=str(ROOT / "docs/replication/koopman.md"))
    ap.add_argument("--render-only", help="Render the doc from a saved replication JSON.")
    a = ap.parse_args()
    if a.render_only:
        Path(a.doc).write_text(render(json.loads(Path(a.render_only).read_text())))
        return
    t0 = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    lo, hi = (int(s) for s in a.layers.split("-"))
    layers = list(range(lo, hi + 1))
    probes = [int(s) for s in a.probe_layers.split(",")]
    model = load_model("smollm2-135m")
    prompts = depth_prompts(
        model.tokenizer,
        n_corpus=a.n_corpus,
        max_tokens=a.prompt_tokens,
        n_task=a.n_task,
        seed=a.seed,
    )
    store = capture_depth(model, prompts, layers, root=out / "activations")
    log(f"captured {store.n_tokens} tokens x {len(store.sites)} sites", t0)
    R: dict[str, Any] = {
        "settings": {
            "model": "smollm2-135m",
            "n_prompts": len(prompts),
            "n_corpus": a.n_corpus,
            "prompt_tokens": a.prompt_tokens,
            "n_ioi_in_fit": a.n_task,
            "tokens_per_layer": int(store.n_tokens),
            "layers": layers,
            "probe_layers": probes,
            "seed": a.seed,
            "machine": f"{platform.machine()}, 2 shared CPU cores",
        }
    }
    cfg_small = EDMDcConfig(alpha=1e-6, control_rank=16)
    cfg = EDMDcConfig(alpha=1e-6, control_rank=32)

    # 1. split-half rate
    R["split_half"] = {}
    curves = {}
    for layer in probes:
        X, U, Y, pid = load_layer(store, layer)
        for name, dic in (("pca32", PCADictionary(32)), ("pca8", PCADictionary(8))):
            dic.fit(X)
            blocks = EDMDc(dic, cfg_small).statistics(X, U, Y, pid, n_blocks=32, seed=a.seed)
            # A hashed prompt block can be (nearly) empty; a half built from one block must
            # still have more samples than features + controls.
            need = 2 * (dic.n_features + 16)
            blocks = [b for b in blocks if b.n > need]
            sh = split_half_convergence(blocks, cfg_small, n_repeats=10, n_bootstrap=500)
            R["split_half"][f"L{layer}/{name}"] = {
                "slope": sh.slope,
                "slope_ci": sh.slope_ci,
                "slope_last4": sh.slope_last4,
                "slope_w2": sh.slope_w2,
                "n_samples": sh.n_samples.tolist(),
                "w_inf_mean": sh.w_inf_mean.tolist(),
                "eig_condition_max": sh.eig_condition_max,
                "eig_condition_median": float(np.median(sh.eig_condition)),
                "n_blocks": len(blocks),
            }
            curves[f"L{layer} {name}"] = (sh.n_samples, sh.w_inf_mean, sh.slope)
    plot_split_half(curves, out / "split_half.png")
    log("split-half done", t0)
    (out / "partial.json").write_text(json.dumps(R, indent=1, default=float))

    # 2. non-normality and dissociation; 5. tails
    R["fits"], R["tails"] = {}, {}
    spectra = {}
    for layer in probes:
        X, U, Y, pid = load_layer(store, layer)
        R["tails"][f"L{layer}/raw_state"] = tail_diagnostic(X).__dict__
        rff = RandomFourierDictionary(256, seed=a.seed, include_state=False).fit(X)
        R["tails"][f"L{layer}/rff256_lifted"] = tail_diagnostic(rff.transform(X)).__dict__
        for name, dic in (
            ("pca64", PCADictionary(64)),
            ("pca32", PCADictionary(32)),
        ):
            dic.fit(X)
            est = EDMDc(dic, cfg)
            stats = est.statistics(X, U, Y)[0]
            res = solve(stats, cfg, dic)
            R["fits"][f"L{layer}/{name}"] = summarise_fit(res, 8)
            R["tails"][f"L{layer}/{name}_lifted"] = tail_diagnostic(stats.tails).__dict__
            if name == "pca32":
                mom = est.fit_median_of_means(X, U, Y, pid, n_blocks=10, seed=a.seed)
                R["tails"][f"L{layer}/pca32_mom_vs_mean_winf"] = bottleneck_distance(
                    mom.eigenvalues, res.eigenvalues
                )
                spectra[f"L{layer} pca32"] = res.eigenvalues
    plot_eigenvalues(spectra, out / "eigenvalues.png")
    log("fits done", t0)
    (out / "partial.json").write_text(json.dumps(R, indent=1, default=float))

    # 3. invariance gap
    R["invariance"] = {}
    for layer in probes[:1]:
        X, U, Y, pid = load_layer(store, layer)
        sae, sae_info = train_small_sae(X, 256, 16, a.seed)
        R["sae"] = sae_info
        log(f"SAE trained {sae_info}", t0)
        for name, dic in (
            ("sae_topk256", sae),
            ("spectral16", SpectralDictionary(n_modes=16, k=32, q=6)),
            ("rff256", RandomFourierDictionary(256, seed=a.seed, include_state=False)),
            ("relu256", RandomReLUDictionary(256, seed=a.seed)),
        ):
            dic.fit(X, U, Y)
            inv = invariance_residual_split(dic, X, U, Y, pid, cfg, seed=a.seed)
            R["invariance"][f"L{layer}/{name}"] = {
                "pooled": inv.pooled,
                "mean": inv.mean,
                "median": inv.median,
                "n_dead": inv.n_dead,
            }
    log("invariance done", t0)
    (out / "partial.json").write_text(json.dumps(R, indent=1, default=float))

    # 4. IOI ablation ordering
    task = make_task("ioi", model.tokenizer, n=a.n_ioi, seed=a.seed + 1)
    R["ioi"] = {}
    rows = []
    for layer in probes:
        X, U, Y, pid = load_layer(store, layer)
        dic = PCADictionary(32).fit(X)
        res = EDMDc(dic, cfg).fit(X, U, Y)
        for positions in ("all", "END"):
            c = compare_ablations(
                model, task, layer, res, dic, 4, positions=positions, n_random=3, seed=a.seed
            )
            R["ioi"][f"L{layer}/{positions}"] = {
                "dimension": c.dimension,
                "clean_logit_diff": c.clean_metric_mean,
                "depth_to_readout": model.n_layers - layer,
                **{
                    m: {"mean": float(c.mean[j]), "ci": c.ci[j].tolist()}
                    for j, m in enumerate(c.methods)
                },
            }
            rows.append((f"L{layer} {positions}", c.methods, c.mean, c.ci))
            log(f"IOI L{layer} {positions}: {c.mean}", t0)
            (out / "partial.json").write_text(json.dumps(R, indent=1, default=float))
    plot_ablation(rows, out / "ioi_ablation.png")

    # 6. reduction bounds on the pooled operator
    X, U, Y, pid = load_layers(store, layers)
    dic = PCADictionary(32).fit(X)
    res = EDMDc(dic, cfg).fit(X, U, Y)
    R["reduction"] = {"layers": f"{lo}-{hi}", "horizon": len(layers)}
    for r in (4, 8, 16):
        red = balanced_truncation(res.A, res.B, res.C, r, len(layers), input_cov=res.control_cov)
        R["reduction"][str(r)] = {
            "error": red.error,
            "enns_glover": red.enns_glover,
            "markov_bound": red.markov_bound,
            "instance_error": red.instance_error,
            "instance_bound": red.instance_bound,
            "effective_rank": red.effective_rank,
            "rho0": red.rho0,
        }
    log("reduction done", t0)
    R["wall_seconds"] = time.time() - t0
    (out / "replication.json").write_text(json.dumps(R, indent=1, default=float))
    Path(a.doc).write_text(render(R))
    log(f"wrote {a.doc}", t0)


def _ci(c: list[float]) -> str:
    return f"[{c[0]:.3f}, {c[1]:.3f}]"


def _unfinished(L: list[str], section: int) -> str:
    L.append(
        f"**Not measured in this run** (sections {section}–6 did not finish in the time "
        "available on the shared machine); rerun the script to complete them.\n"
    )
    return "\n".join(L) + "\n"


def render(R: dict[str, Any]) -> str:
    s = R["settings"]
    L = []
    L.append("# Replication: Koopman spectral identifiability on SmolLM2-135M-Instruct\n")
    L.append(
        "Produced by `.venv/bin/python scripts/replicate_koopman.py` (figures and "
        "`replication.json` under `results/replication/koopman/`). The paper has no public text or "
        "code, so its figures cannot be quoted; each claim is the one stated in issue 3.\n"
    )
    L.append(
        f"Settings: {s['n_prompts']} prompts ({s['n_corpus']} bundled-corpus chunks of "
        f"{s['prompt_tokens']} tokens plus {s['n_ioi_in_fit']} IOI prompts), "
        f"{s['tokens_per_layer']} token samples per layer, one sample per token; x = "
        "resid_pre(l), u = attn_out(l), y = resid_pre(l+1). Per-layer operators at layers "
        f"{s['probe_layers']}; pooled operator over layers {s['layers'][0]}-{s['layers'][-1]}. "
        "Ridge α = 1e-6 (relative); control rank 32 (16 for split-half, so that one prompt "
        f"block has more samples than features). Seed {s['seed']}. {s['machine']}; wall time "
        f"{R.get('wall_seconds', float('nan')) / 60:.1f} min.\n"
    )
    L.append("## 1. Split-half rate ≈ −1/2\n")
    if "split_half" not in R:
        return _unfinished(L, 1)
    L.append(
        "| fit | slope (W∞) | 95% CI | slope last 4 | slope W₂ | max κ(λ) | median κ(λ) | M range |"
    )
    L.append("|---|---|---|---|---|---|---|---|")
    slopes = []
    for key, v in R["split_half"].items():
        slopes.append(v)
        L.append(
            f"| {key} | {v['slope']:.3f} | {_ci(v['slope_ci'])} | {v['slope_last4']:.3f} | "
            f"{v['slope_w2']:.3f} | {v['eig_condition_max']:.3g} | "
            f"{v['eig_condition_median']:.3g} | {v['n_samples'][0]:.0f}–{v['n_samples'][-1]:.0f} |"
        )
    inside = sum(v["slope_ci"][0] <= -0.5 <= v["slope_ci"][1] for v in slopes)
    verdict = (
        "reproduced"
        if inside == len(slopes)
        else "partly reproduced"
        if inside
        else "not reproduced"
    )
    L.append(
        f"\n32 hashed prompt blocks (blocks with <= 2(N + r) samples dropped; kept: "
        f"{[v['n_blocks'] for v in slopes]}), halves of 1, 2, 4, ... blocks, 10 random half "
        f"pairs per size, bootstrap over pairs. −0.5 lies inside {inside} of {len(slopes)} CIs. "
        f"**Verdict: {verdict}.** "
        "The rate is asymptotic and needs κ(λ) ≪ √M; compare the κ columns with √M.\n"
    )
    L.append("## 2. Non-normal realisation with modal/principal dissociation\n")
    if "fits" not in R:
        return _unfinished(L, 2)
    L.append(
        "| fit | ρ(A) | Henrici rel. | κ(V) | max κ(λ) | dissociation k | largest angle (°) | mean cos² |"  # noqa: E501
    )
    L.append("|---|---|---|---|---|---|---|---|")
    for key, v in R["fits"].items():
        nn, d = v["non_normality"], v.get("dissociation", {})
        L.append(
            f"| {key} | {v['spectral_radius']:.3f} | {nn['henrici_relative']:.3f} | "
            f"{nn['kappa_V']:.3g} | {nn['eig_condition_max']:.3g} | {d.get('k', '-')} | "
            f"{d.get('largest_angle_deg', float('nan')):.1f} | {d.get('mean_cos2', float('nan')):.3f} |"  # noqa: E501
        )
    nonnormal = all(v["non_normality"]["henrici_relative"] > 0.1 for v in R["fits"].values())
    dissoc = all(v.get("dissociation", {}).get("mean_cos2", 1) < 0.5 for v in R["fits"].values())
    verdict = (
        "reproduced"
        if nonnormal and dissoc
        else "partly reproduced"
        if nonnormal or dissoc
        else "not reproduced"
    )
    L.append(
        f"\nRule: non-normal if the relative Henrici departure > 0.1; dissociated if the mean cos² "
        f"between the top-k PCA directions and the dominant modes' span is < 0.5. **Verdict: {verdict}.**\n"  # noqa: E501
    )
    L.append("## 3. Invariance gap: SAE vs spectral vs random\n")
    if "invariance" not in R or len(R["invariance"]) < 4:
        return _unfinished(L, 3)
    L.append(
        f"SAE: TopK trained here by `structlens.sae.train_sae` on the layer's resid_pre: {R.get('sae')}.\n"  # noqa: E501
    )
    L.append("| dictionary | pooled 1−R² (held-out prompts) | mean | median | dead |")
    L.append("|---|---|---|---|---|")
    inv = R["invariance"]
    for key, v in inv.items():
        L.append(
            f"| {key} | {v['pooled']:.4f} | {v['mean']:.4f} | {v['median']:.4f} | {v['n_dead']} |"
        )
    g = {k.split("/")[1]: v["pooled"] for k, v in inv.items()}
    ok = g["sae_topk256"] > g["spectral16"] and g["sae_topk256"] > g["relu256"]
    partly = g["sae_topk256"] > g["spectral16"] or g["sae_topk256"] > g["relu256"]
    verdict = "reproduced" if ok else "partly reproduced" if partly else "not reproduced"
    L.append(
        f"\nClaim: the SAE's residual is larger than both the spectral and the random dictionary's. "  # noqa: E501
        f"**Verdict: {verdict}.** Widths differ (SAE 256, spectral 16, RFF/ReLU 256): the spectral "
        "dictionary is selected for invariance on held-out rows, so its low residual is by "
        "construction.\n"
    )
    L.append("## 4. IOI ablation ordering PCA > modes > random\n")
    if not R.get("ioi"):
        return _unfinished(L, 4)
    L.append(
        "Normalised logit-difference change (LD_abl − LD_clean)/mean LD_clean, k = 4 real dimensions, mean-ablation to the corpus mean at resid_pre(l), 95% bootstrap CI over prompts; random = mean of 3 orthonormal draws.\n"  # noqa: E501
    )
    L.append("| layer/positions | layers to read-out | modes | PCA | random |")
    L.append("|---|---|---|---|---|")
    orders = []
    for key, v in R["ioi"].items():
        L.append(
            f"| {key} | {v['depth_to_readout']} | {v['modes']['mean']:+.3f} {_ci(v['modes']['ci'])} | "  # noqa: E501
            f"{v['pca']['mean']:+.3f} {_ci(v['pca']['ci'])} | {v['random']['mean']:+.3f} {_ci(v['random']['ci'])} |"  # noqa: E501
        )
        eff = {m: abs(v[m]["mean"]) for m in ("modes", "pca", "random")}
        orders.append(eff["pca"] > eff["modes"] > eff["random"])
    verdict = (
        "reproduced" if all(orders) else "partly reproduced" if any(orders) else "not reproduced"
    )
    L.append(
        f"\nOrdering by |effect| PCA > modes > random holds in {sum(orders)} of {len(orders)} "
        f"settings. **Verdict: {verdict}.** Depth distance is covered only by two layers.\n"
    )
    L.append("## 5. Heavy tails removed by lifting?\n")
    L.append("| features | median kurtosis | p95 kurtosis | heavy (p95 > 10) |")
    L.append("|---|---|---|---|")
    for key, v in R["tails"].items():
        if isinstance(v, dict):
            L.append(
                f"| {key} | {v['median_kurtosis']:.2f} | {v['p95_kurtosis']:.2f} | {v['heavy']} |"
            )
    mom = {k: v for k, v in R["tails"].items() if not isinstance(v, dict)}
    L.append(f"\nW∞ between median-of-means (10 prompt blocks) and plain spectra: {mom}.\n")
    raw_heavy = [v["heavy"] for k, v in R["tails"].items() if isinstance(v, dict) and "raw" in k]
    lift_heavy = [
        v["heavy"] for k, v in R["tails"].items() if isinstance(v, dict) and "lifted" in k
    ]
    if not any(raw_heavy):
        verdict = (
            "not reproduced: the raw residual states are not heavy-tailed at these layers "
            "(p95 excess kurtosis below 10), so there is nothing for lifting to remove"
        )
    elif not any(lift_heavy):
        verdict = "reproduced"
    else:
        verdict = "partly reproduced" if not all(lift_heavy) else "not reproduced"
    L.append(f"**Verdict: {verdict}.**\n")
    L.append("## 6. Reduction bound sharper than Enns–Glover\n")
    if "reduction" not in R:
        return _unfinished(L, 6)
    red = R["reduction"]
    L.append(f"Pooled operator over layers {red['layers']} (PCA-32), horizon {red['horizon']}.\n")
    L.append(
        "| order | actual error | Enns–Glover | a-posteriori Markov | instance error | instance bound | eff. rank Σ_u | ρ₀ |"  # noqa: E501
    )
    L.append("|---|---|---|---|---|---|---|---|")
    tighter = []
    for r in ("4", "8", "16"):
        v = red[r]
        L.append(
            f"| {r} | {v['error']:.3g} | {v['enns_glover']:.3g} | {v['markov_bound']:.3g} | "
            f"{v['instance_error']:.3g} | {v['instance_bound']:.3g} | {v['effective_rank']:.2f} | {v['rho0']:.3f} |"  # noqa: E501
        )
        tighter.append(v["instance_bound"] < v["enns_glover"] and v["error"] <= v["enns_glover"])
    verdict = (
        "reproduced" if all(tighter) else "partly reproduced" if any(tighter) else "not reproduced"
    )
    L.append(
        f"\nThe instance bound certifies the error on inputs shaped like the attention writes "
        f"(a different norm from Enns–Glover's worst case), so the comparison is of certificates. "
        f"**Verdict: {verdict}.**\n"
    )
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()

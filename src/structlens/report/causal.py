"""Figures and the replication report for causal dimensionality.

* :func:`plot_width_sweep`: N_repr and N_causal against SAE width on log axes, with bootstrap
  bands and the saturating fits of N_causal.
* :func:`plot_spectrum`: eigenvalues of Σ (descending, log scale) per layer.
* :func:`plot_kappa_curve`: κ and κ_PR of Σ̂ against the number of residual vectors.
* :func:`write_replication_doc`: docs/replication/causal-dimension.md from the JSON files the
  replication script writes (``kappa.json``, ``sweep.json``, ``ce.json``, ``fourcell.json``,
  ``arch.json``, ``depth.json``, ``ioi.json``, ``synthetic.json``, ``saes/*/train.json``);
  sections whose file is missing are left out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from structlens.report import save_figure


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _fit_curve(name: str, fit: dict[str, float], m: np.ndarray) -> np.ndarray:
    k, h = fit["K"], fit["m_half"]
    if name == "michaelis_menten":
        return k * m / (m + h)
    if name == "exponential":
        return k * -np.expm1(-m / h)
    return k / (1 + (h / m) ** fit["n"])


def plot_width_sweep(sweep: dict[str, Any], path: str | Path) -> Path:
    """N_repr and N_causal vs width (log–log) with CIs and fitted N_causal curves."""
    plt = _plt()
    w = np.asarray(sweep["widths"], dtype=float)
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for key, label, color in (("n_repr", "N_repr", "C0"), ("n_causal", "N_causal", "C3")):
        y = np.asarray(sweep[key], dtype=float)
        ax.plot(w, y, "o-", color=color, label=label)
        ci = np.asarray(sweep.get(f"{key}_ci", []), dtype=float)
        if ci.shape == (2, w.size) and np.all(np.isfinite(ci)):
            ax.fill_between(w, ci[0], ci[1], color=color, alpha=0.2)
    grid = np.geomspace(w.min(), w.max() * 4, 100)
    for (name, fit), style in zip(sweep.get("fits", {}).items(), ("--", ":", "-."), strict=False):
        ax.plot(
            grid,
            _fit_curve(name, fit, grid),
            style,
            color="C3",
            lw=1,
            label=f"{name} K={fit['K']:.0f}",
        )
    ax.plot(w, w, color="grey", lw=0.5, label="N = m")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("SAE width m")
    ax.set_ylabel("features")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def plot_spectrum(kappa: dict[str, Any], path: str | Path) -> Path:
    """Eigenvalues of Σ = E[JᵀJ], descending, log scale, one curve per layer."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for entry in kappa["layers"]:
        lam = np.clip(np.asarray(entry["eigenvalues"], dtype=float), 1e-300, None)
        ax.plot(
            np.arange(1, lam.size + 1),
            lam,
            label=f"layer {entry['layer']} "
            f"(κ={entry['erank']:.0f}, PR={entry['participation_ratio']:.0f})",
        )
    ax.set_yscale("log")
    ax.set_xlabel("index")
    ax.set_ylabel("eigenvalue of Σ")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def plot_kappa_curve(kappa: dict[str, Any], path: str | Path) -> Path:
    """Few-vector bias: κ (erank) and κ_PR of Σ̂ from n random vectors, per layer."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for i, entry in enumerate(kappa["layers"]):
        c = entry["curve"]
        n = np.asarray(c["sizes"], dtype=float)
        for key, style in (("erank", "o-"), ("pr", "s:")):
            y, sd = np.asarray(c[key]), np.asarray(c[f"{key}_sd"])
            ax.errorbar(
                n,
                y,
                yerr=sd,
                fmt=style,
                color=f"C{i}",
                ms=3,
                lw=1,
                capsize=2,
                label=f"L{entry['layer']} {'κ' if key == 'erank' else 'κ_PR'}",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("residual vectors in Σ̂")
    ax.set_ylabel("effective rank")
    ax.legend(fontsize=6, ncol=2)
    return save_figure(fig, path)


def _load(out: Path, name: str) -> dict[str, Any] | None:
    p = out / name
    return json.loads(p.read_text()) if p.exists() else None


def _num(x: Any) -> float:
    """JSON numbers, with the strings "nan"/"inf" that to_jsonable writes for non-finite."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def _fmt(x: Any, nd: int = 2) -> str:
    v = _num(x)
    return f"{v:.{nd}f}" if np.isfinite(v) else "n/a"


def _ci(pair: Any, nd: int = 2) -> str:
    return f"[{_fmt(pair[0], nd)}, {_fmt(pair[1], nd)}]"


def _trained(out: Path) -> dict[str, dict[str, Any]]:
    """``saes/<name>/train.json`` for every SAE the script trained."""
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(out.glob("saes/*/train.json"))}


def _rise(entry: dict[str, Any]) -> float:
    """κ(n) / κ(n') on the few-vector curve, n' the largest size ≤ n/2 (1 = levelled off)."""
    c = entry["curve"]
    sizes, er = np.asarray(c["sizes"]), np.asarray(c["erank"])
    half = np.flatnonzero(sizes <= sizes[-1] / 2)
    return float(er[-1] / er[half[-1]]) if half.size else float("nan")


def _kappa_verdict(layers: list[dict[str, Any]]) -> str:
    rises = [_rise(e) for e in layers]
    top = max(e["kappa_over_d"] for e in layers)
    if any(r > 1.1 for r in rises):
        return (
            f"inconclusive: κ(n)/κ(n/2) = {min(rises):.2f}–{max(rises):.2f}, still rising, so "
            f"these κ/d (max {top:.2f}) are lower bounds"
        )
    return "not reproduced (κ/d < 0.5 and levelled off)" if top < 0.5 else "consistent"


def _claims(
    d: int,
    kappa: dict[str, Any] | None,
    sweep: dict[str, Any] | None,
    four: dict[str, Any] | None,
    syn: dict[str, Any] | None,
    ioi: dict[str, Any] | None,
    arch: dict[str, Any] | None,
    depth: dict[str, Any] | None,
) -> list[str]:
    rows: list[str] = []

    def row(claim: str, paper: str, ours: str, verdict: str) -> None:
        rows.append(f"| {claim} | {paper} | {ours} | {verdict} |")

    klayer = {e["layer"]: e for e in kappa["layers"]} if kappa else {}
    if sweep:
        w = sweep["widths"]
        gr, gc = sweep["n_repr_growth"][-1], sweep["n_causal_growth"][-1]
        grc = [c[-1] for c in sweep["n_repr_growth_ci"]]
        gcc = [c[-1] for c in sweep["n_causal_growth_ci"]]
        wedge, wci = _num(sweep["wedge"]), sweep["wedge_ci"]
        gap = _num(wci[0]) > 1.5 or (not _num(gc) > 0 and _num(grc[0]) > 1.5)
        if gap and _num(gcc[0]) > 1.5:
            verdict = "reproduced qualitatively (ratio CI above 1.5, N_causal grows)"
        elif gap:
            verdict = (
                "gap reproduced and far stronger; N_causal growth not reproduced (its CI "
                "reaches ≤ 1.5×: no saturating growth to fit)"
            )
        else:
            verdict = "not reproduced"
        row(
            "Wedge: N_repr grows much faster than N_causal with width",
            "64× width → N_repr 15.6×, N_causal 4.35× (ratio 3.6)",
            f"{w[-1] / w[0]:.0f}× width ({w[0]}→{w[-1]}) → N_repr {_fmt(gr)}× {_ci(grc)}, "
            f"N_causal {_fmt(gc)}× {_ci(gcc)}; ratio {_fmt(wedge)} {_ci(wci)}",
            verdict,
        )
        k, kci = _num(sweep["kappa_hat"]), sweep["kappa_hat_ci"]
        # The fits bound K below by max N_causal; a K on that bound means N_causal(m) shows
        # no saturating growth, and κ̂ is just the largest count.
        pinned = np.isfinite(k) and k <= max(sweep["n_causal"]) * (1 + 1e-6)
        if not np.isfinite(k):
            kv = "no fit (N_causal reaches 0 at some width)"
        elif pinned:
            kv = "not reproduced: N_causal(m) does not rise, the fit sits at K = max N_causal"
        elif _num(kci[1]) < 0.5 * d:
            kv = "not reproduced (κ̂ ≪ d)"
        else:
            kv = "consistent"
        row(
            "κ̂ (asymptote of N_causal(m)) is a large share of d",
            "κ̂ ≈ 1990, 95% CI [545, 5130]; κ̂/d ≈ 0.86",
            f"κ̂ = {_fmt(k, 0)} {_ci(kci, 0)} (Michaelis–Menten); κ̂/d = {_fmt(k / d)} "
            f"{_ci([_num(kci[0]) / d, _num(kci[1]) / d])}",
            kv,
        )
        ex = klayer.get(sweep["layer"])
        if ex and np.isfinite(k):
            lo, hi = _num(kci[0]) / ex["erank_ci"][1], _num(kci[1]) / ex["erank_ci"][0]
            rising = _rise(ex) > 1.1
            if lo <= 1 <= hi:
                verdict = "agree (ratio interval covers 1)"
            elif hi < 1 and rising:
                verdict = "κ̂ below exact κ, which is itself still rising with n: κ̂ < κ"
            elif rising:
                verdict = "inconclusive (exact κ still rising with n)"
            else:
                verdict = "disagree"
            row(
                "κ̂ from the sweep ≈ exact causal dimension (erank of Σ)",
                "κ̂ ≈ 1990 vs κ_PR ≈ 280 (no exact κ reported)",
                f"L{sweep['layer']}: κ̂ = {_fmt(k, 0)} vs exact κ = {_fmt(ex['erank'], 1)} "
                f"{_ci(ex['erank_ci'], 1)} (n = {ex['n_vectors']}); ratio "
                f"{_fmt(k / ex['erank'])} (CI-bounds {_ci([lo, hi])})",
                verdict,
            )
    else:
        row("Wedge", "15.6× vs 4.35×", "not run", "—")
    if kappa:
        row(
            "Exact causal dimension κ = erank(Σ), κ/d",
            "κ̂/d ≈ 0.86 (Gemma-2-2B L12)",
            "; ".join(
                f"L{e['layer']}: κ = {e['erank']:.0f} {_ci(e['erank_ci'], 0)}, "
                f"κ/d = {e['kappa_over_d']:.3f} (n = {e['n_vectors']})"
                for e in kappa["layers"]
            ),
            _kappa_verdict(kappa["layers"]),
        )
        # Equal for flat spectra, so compare with a rounding tolerance.
        lower = all(e["participation_ratio"] <= e["erank"] * (1 + 1e-9) for e in kappa["layers"])
        row(
            "κ_PR is a lower bound on κ",
            "κ_PR ≈ 280 ≪ κ̂ ≈ 1990",
            "; ".join(
                f"L{e['layer']}: κ_PR = {e['participation_ratio']:.1f} "
                f"{_ci(e['participation_ratio_ci'], 1)} vs κ = {e['erank']:.1f}"
                for e in kappa["layers"]
            ),
            "reproduced (PR ≤ erank holds for every spectrum: exp H₂ ≤ exp H₁)"
            if lower
            else "violated (bug)",
        )
    if four:
        inf = four["inflation"]["random_enc/learned_dec"]
        row(
            "Random orthonormal encoder inflates N_causal",
            "9.27×",
            f"{_fmt(inf)}× (random enc/learned dec vs learned/learned, width {four['width']}, "
            f"ε of the learned cell)",
            "reproduced (direction)" if inf > 1.5 else "not reproduced (no inflation)",
        )
    if syn:
        r = {k: v["recall"] for k, v in syn.items()}
        row(
            "AtP recall of the true causal directions on a synthetic model",
            "0 (recall collapse)",
            ", ".join(f"top {k}: {v:.3f}" for k, v in r.items()),
            "reproduced" if max(r.values()) == 0 else "not reproduced (recall > 0)",
        )
    if ioi:
        row(
            "IOI: exact-patching top features inside AtP's top 5%",
            "— (98.2% is not a public figure)",
            f"{100 * ioi['recall_top_of_all']:.0f}% of the top {ioi['n_ground_truth']} "
            f"(top 5% of all {ioi['width']}); {100 * ioi['recall_top_of_fired']:.0f}% (top 5% "
            f"of the {ioi['n_fired_at_end']} firing at END); Spearman "
            f"{ioi['spearman_fired']:.2f}",
            "AtP recovers the task features" if ioi["recall_top_of_all"] >= 0.8 else "partly",
        )
    if depth and len(depth["rows"]) >= 2:
        r0, r1 = depth["rows"][0], depth["rows"][-1]
        row(
            "ε falls with depth",
            "20× from layer 1 to 23 (Gemma-2-2B, 26 layers)",
            f"ε(L{r0['layer']}) / ε(L{r1['layer']}) = "
            f"{_num(r0['epsilon']) / _num(r1['epsilon']):.2f} (width {depth['width']})",
            "reproduced (direction and size)"
            if _num(r0["epsilon"]) > 10 * _num(r1["epsilon"])
            else "direction reproduced, size not (paper 20×)"
            if _num(r0["epsilon"]) > 1.2 * _num(r1["epsilon"])
            else "not reproduced",
        )
    if arch and "topk" in arch["rows"]:
        rr = arch["rows"]
        row(
            "Architecture invariance of N_causal (same width, matched L0)",
            "— (stated for the method, no number)",
            ", ".join(f"{a}: {v['n_causal_at_topk_epsilon']}" for a, v in rr.items())
            + f" features above TopK's ε (width {arch['width']}); eval FVU "
            + ", ".join(f"{a} {v['quality']['fvu']:.2f}" for a, v in rr.items()),
            "holds within 2×"
            if max(v["n_causal_at_topk_epsilon"] for v in rr.values())
            <= 2 * max(1, min(v["n_causal_at_topk_epsilon"] for v in rr.values()))
            else "does not hold here (N_causal depends on the architecture"
            + (
                "; the other SAEs also reconstruct much worse than TopK, a confound)"
                if max(v["quality"]["fvu"] for v in rr.values())
                > 1.5 * rr["topk"]["quality"]["fvu"]
                else ")"
            ),
        )
    return rows


def write_replication_doc(out: str | Path, settings: dict[str, Any], path: str | Path) -> Path:
    """Render docs/replication/causal-dimension.md from the JSON files in ``out``; figures
    (``width_sweep.png``, ``sigma_spectrum.png``, ``kappa_vs_n.png``) go to ``out``."""
    out = Path(out)
    kappa, sweep, ce = _load(out, "kappa.json"), _load(out, "sweep.json"), _load(out, "ce.json")
    four, ioi = _load(out, "fourcell.json"), _load(out, "ioi.json")
    arch, depth = _load(out, "arch.json"), _load(out, "depth.json")
    syn = _load(out, "synthetic.json") or _load(out.parent, "synthetic.json")
    trained = _trained(out)
    if kappa and kappa["layers"]:
        kappa["layers"].sort(key=lambda e: e["layer"])
        sizes = sorted({int(n) for e in kappa["layers"] for n in e["curve"]["sizes"]})
        plot_spectrum(kappa, out / "sigma_spectrum.png")
        plot_kappa_curve(kappa, out / "kappa_vs_n.png")
    else:
        kappa = None
    if sweep:
        plot_width_sweep(sweep, out / "width_sweep.png")
    d = kappa["d"] if kappa else 576
    try:
        where = out.relative_to(Path(path).resolve().parents[2])
    except ValueError:
        where = out
    s = settings
    lines = [
        "# Replication: causal dimensionality on SmolLM2-135M-Instruct",
        "",
        f"Generated by `.venv/bin/python scripts/replicate_causal_dimension.py --profile "
        f"{s['profile']}` (every stage caches under `{where}`; figures `width_sweep.png`, "
        "`sigma_spectrum.png`, `kappa_vs_n.png` there). Paper: Sarkar & Deka, arXiv "
        "2605.08740 (Gemma-2-2B, d = 2304, Gemma Scope SAEs 16k–1M trained on 4–16B tokens). "
        f"Here: SmolLM2-135M-Instruct (d = {d}), a 2-core CPU shared with other jobs, "
        "self-trained SAEs on the bundled Austen corpus (~10⁵ tokens). All CIs are 95% bootstrap "
        "percentile intervals (token blocks for the sweep, residual vectors for κ).",
        "",
        "## Claims vs measurements",
        "",
        "| claim | paper | ours | verdict |",
        "|---|---|---|---|",
        *_claims(d, kappa, sweep, four, syn, ioi, arch, depth),
        "",
    ]
    if sweep:
        L = sweep["layer"]
        tr = sweep["training"][str(sweep["widths"][0])]
        lines += [
            f"## Width sweep at `blocks.{L}.hook_resid_pre`",
            "",
            f"TopK SAEs, k = {s['k']} at every width (matched L0 by construction), trained one "
            f"after another on the SAME shuffled stream: {tr['n_train_tokens']} residual tokens "
            f"(position 0 dropped) × {s['epochs']} epochs, batch {s['batch_size']}, Adam, lr "
            f"{s['lr']:g} at every width, aux-k loss for features silent for "
            f"{s['dead_tokens']} tokens. The paper's SAEs saw 4–16B tokens; ours saw "
            f"{tr['tokens']:.1e} token-steps, so the wide ones are under-trained (see eval "
            "FVU and dead fractions below). AtP: zero-ablation of each feature with the SAE "
            "spliced with its error term, metric = summed next-token NLL, on "
            f"{sweep['n_tokens']} held-out tokens from one backward pass per batch reused by "
            "every width. ε = 98th percentile of base-width AtP over all base features "
            f"(ε = {_num(sweep['epsilon']):.3g} nats, CI {_ci(sweep['epsilon_ci'], 5)}); "
            "N_repr = features firing on ≥ 1 evaluation token; N_causal = features with "
            "AtP > ε. Σ AtP / max AtP: sum and largest of the per-feature scores (nats per "
            "token). Quality on the evaluation tokens; dead = never fires on them.",
            "",
            "| width | N_repr (CI) | N_causal (CI) | N_repr growth | N_causal growth | Σ AtP | "
            "max AtP | FVU | L0 | dead (eval) | train FVU | CE recovered |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for i, wd in enumerate(sweep["widths"]):
            q = sweep["quality"][str(wd)]
            t = sweep["training"][str(wd)]
            mass = sweep.get("atp_mass", {}).get(str(wd), {})
            c = (ce or {}).get(f"topk-{wd}", {}).get("ce_loss_recovered")
            rci = [sweep["n_repr_ci"][0][i], sweep["n_repr_ci"][1][i]]
            cci = [sweep["n_causal_ci"][0][i], sweep["n_causal_ci"][1][i]]
            lines.append(
                f"| {wd} | {sweep['n_repr'][i]:.0f} {_ci(rci, 0)} | {sweep['n_causal'][i]:.0f} "
                f"{_ci(cci, 0)} | {_num(sweep['n_repr_growth'][i]):.2f} | "
                f"{_num(sweep['n_causal_growth'][i]):.2f} | {_fmt(mass.get('sum'), 3)} | "
                f"{_fmt(mass.get('max'), 4)} | {q['fvu']:.3f} | {q['l0']:.1f} | "
                f"{q['dead_fraction']:.3f} | {t['final_fvu']:.3f} | {_fmt(c, 3)} |"
            )
        for b, r in sweep.get("other_bases", {}).items():
            lines.append(
                f"\nBase width {b} instead (ε from its top 2%, same tokens): N_causal over "
                f"{r['widths']} = {[int(x) for x in r['n_causal']]}."
            )
        lines += [
            "",
            "Saturating fits of N_causal(m) (least squares on log N; K = asymptote = κ̂; CI over "
            f"{sweep['n_bootstrap']} bootstrap resamples of token blocks, ε recomputed in each):",
            "",
            "| fit | K = κ̂ | 95% CI | m½ | RMS log residual | replicates fitted |",
            "|---|---|---|---|---|---|",
        ]
        for name, fit in sweep["fits"].items():
            lines.append(
                f"| {name} | {fit['K']:.0f} | {_ci(fit['K_ci'], 0)} | {fit['m_half']:.0f} | "
                f"{fit['rms_log_residual']:.3f} | {fit['n_bootstrap_fitted']} |"
            )
        if ce:
            first = next(iter(ce.values()))
            lines += [
                "",
                f"CE loss recovered = (CE_zero − CE_SAE)/(CE_zero − CE_clean) with the SAE "
                f"replacing the residual at positions ≥ 1 on {s['n_ce_prompts']} held-out "
                f"prompts; CE clean {first['ce_clean']:.3f}, zero-ablated "
                f"{first['ce_ablated']:.3f} nats/token.",
            ]
        lines.append("")
    if kappa:
        lines += [
            "## Exact κ by layer",
            "",
            f"Σ = mean over residual vectors of JᵀJ, J = ∂ log_softmax(logits at the same "
            f"position)/∂ resid_pre, exact (forward mode over all {d} directions; the "
            "unembedding enters through an exact d × d factor of its Gram), one vector per "
            f"window: the last token of a {s['jacobian_prompt_tokens']}-token window of "
            "held-out Austen text, windows from different 128-token chunks first. SE = "
            "jackknife over vectors; CI = bootstrap over vectors. Both cover vector sampling "
            "only: the Jacobians are exact.",
            "",
            "| layer | vectors | κ = erank | SE | 95% CI | κ/d | κ(n)/κ(n/2) | κ_PR | κ_PR CI | "
            "stable rank |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for e in kappa["layers"]:
            lines.append(
                f"| {e['layer']} | {e['n_vectors']} | {e['erank']:.1f} | {e['erank_se']:.1f} | "
                f"{_ci(e['erank_ci'], 1)} | {e['kappa_over_d']:.3f} | {_fmt(_rise(e))} | "
                f"{e['participation_ratio']:.1f} | {_ci(e['participation_ratio_ci'], 1)} | "
                f"{e['stable_rank']:.2f} |"
            )
        lines += [
            "",
            "Few-vector bias (`kappa_vs_n.png`): κ of Σ̂ built from n random vectors (mean ± sd "
            f"over {s.get('kappa_curve_draws', 20)} subsets). erank is concave in the "
            "normalised spectrum, so Σ̂ from few vectors under-states κ; the curve shows how "
            "fast it levels off; κ(n)/κ(n/2) in the table above is its last step.",
            "",
            "| layer | " + " | ".join(f"n={n}" for n in sizes) + " |",
            "|---|" + "---|" * len(sizes),
        ]
        for e in kappa["layers"]:
            c = e["curve"]
            cells = {
                int(n): f"{m:.1f} ± {sd:.1f}"
                for n, m, sd in zip(c["sizes"], c["erank"], c["erank_sd"], strict=True)
            }
            lines.append(f"| {e['layer']} | " + " | ".join(cells.get(n, "") for n in sizes) + " |")
        lines.append("")
    if four:
        lines += [
            "## Four-cell encoder/decoder ablation",
            "",
            f"TopK width {four['width']} at the sweep layer; random = random orthonormal frame "
            "(encoder rows / decoder rows); each cell spliced with its own error term; ε from "
            f"the learned/learned cell (top 2%); {four['n_tokens']} evaluation tokens.",
            "",
            "| cell | N_repr | N_causal | N_causal inflation |",
            "|---|---|---|---|",
        ]
        for cell in four["n_causal"]:
            lines.append(
                f"| {cell} | {four['n_repr'][cell]} | {four['n_causal'][cell]} | "
                f"{four['inflation'][cell]:.2f}× |"
            )
        lines.append("")
    if arch:
        lines += [
            "## Architecture invariance",
            "",
            f"Width {arch['width']} at layer {arch['layer']}, same stream and epochs; "
            f"ReLU (L1) and JumpReLU controlled to L0 = {s['k']} during training and "
            "calibrated to it at the end; TopK has L0 = k exactly. N_causal is counted against "
            "two common thresholds (the sweep's ε and TopK's own 98th percentile at this width).",
            "",
            "| SAE | FVU | L0 | dead (eval) | CE recovered | N_repr | N_causal @ sweep ε | "
            "N_causal @ TopK ε | own ε | AtP share of own top 2% |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for a, v in arch["rows"].items():
            q = v["quality"]
            c = (ce or {}).get(f"{a}-{arch['width']}", {}).get("ce_loss_recovered")
            lines.append(
                f"| {a} | {q['fvu']:.3f} | {q['l0']:.1f} | {q['dead_fraction']:.3f} | "
                f"{_fmt(c, 3)} | "
                f"{v['n_repr']} | {v['n_causal_at_sweep_epsilon']} | "
                f"{v['n_causal_at_topk_epsilon']} | {v['epsilon_own']:.3g} | "
                f"{v['top2pct_atp_share']:.2f} |"
            )
        lines.append("")
    if depth:
        lines += [
            "## ε by depth",
            "",
            f"TopK width {depth['width']}, k = {s['k']}, one SAE per layer on the same "
            "training prompts; ε = 98th percentile of AtP over all features (LM loss, same "
            "evaluation tokens).",
            "",
            "| layer | ε (nats) | mean AtP | median ‖∇_h L‖ | N_repr | FVU |",
            "|---|---|---|---|---|---|",
        ]
        for r in depth["rows"]:
            lines.append(
                f"| {r['layer']} | {r['epsilon']:.3g} | {r['mean_atp']:.3g} | "
                f"{r['median_grad_norm']:.3g} | {r['n_repr']} | {r['quality']['fvu']:.3f} |"
            )
        lines.append("")
    if ioi:
        lines += [
            "## IOI task-specific recovery",
            "",
            f"{ioi['n_prompts']} IOI prompts, TopK width {ioi['width']} at the sweep layer, "
            "features at the END position; metric logit(IO) − logit(S). Ground truth: the "
            f"top {ioi['n_ground_truth']} features by mean |Δ metric| under exact "
            "zero-ablation (SAE spliced with its error term, one forward per feature and "
            f"prompt). AtP's top 5%: {ioi['k_all']} of all features, {ioi['k_fired']} of the "
            f"{ioi['n_fired_at_end']} firing at END. Spearman(AtP, exact) over the firing "
            f"features = {ioi['spearman_fired']:.3f}.",
            "",
        ]
    if syn:
        k0 = next(iter(syn.values()))
        lines += [
            "## Synthetic model",
            "",
            "8 known causal directions (the model reads out only them, through tanh) among "
            "256 random sparse atoms in d = 32 (`SyntheticCausalModel`, 4 active atoms per "
            "token), TopK SAE width 512, k = 4, trained on 3·10⁵ samples; metric = "
            "logsumexp of the logits. Recall = share of the 8 directions matched "
            f"(|cos| ≥ {k0['cos_threshold']}) by the decoder row of a feature among AtP's "
            "top k; chance = the same for k random features: "
            + ", ".join(
                f"top {k}: {v['recall']:.3f} (chance {v['chance_recall']:.3f})"
                for k, v in syn.items()
            )
            + ".",
            "",
        ]
    if trained:
        lines += [
            "## Training log (all SAEs)",
            "",
            "| SAE | layer | token-steps | steps | train FVU | train L0 | dead (train) | s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, t in trained.items():
            lines.append(
                f"| {name} | {t['layer']} | {t['tokens']} | {t['steps']} | "
                f"{t['final_fvu']:.3f} | {t['final_l0']:.1f} | {t['dead_fraction']:.3f} | "
                f"{t['seconds']:.0f} |"
            )
        lines.append("")
    if sweep:
        t0 = sweep["training"][str(sweep["widths"][0])]
        scale = (
            f"SAEs trained on {t0['n_train_tokens']} tokens × {t0['epochs']} epoch(s) instead "
            f"of 4–16B, and a {sweep['widths'][-1] / sweep['widths'][0]:.0f}× width span "
            "(paper 64×)"
        )
    else:
        scale = "no SAE sweep in this run"
    lines += [
        "## Caveats",
        "",
        f"- Scale: d = {d} instead of 2304; {scale}. The wide SAEs see each token about once "
        "and are under-trained (compare eval FVU and dead fractions across widths), which by "
        "itself can depress N_repr and N_causal at large widths.",
        "- κ̂ ≈ erank(Σ) is the paper's assumption, not an identity: AtP probes E[∇L ∇Lᵀ] "
        "(rank ≤ 1 per token), Σ = E[JᵀJ] of all output directions. Σ here is of log-probs at "
        "the same position (`--outputs downstream`, `--output raw` exist in the CLI).",
        "- ε is the 98th percentile over all base-width features (non-firing ones included), "
        "so N_causal(base) = ⌈0.02·m_base⌉ up to ties, by construction.",
        "- Percentile bootstrap intervals of counts of distinct things (N_repr) and of erank "
        "sit partly below the point estimate: a resample holds fewer distinct tokens or "
        "vectors, and both statistics grow with that number. Read them as spreads, not as "
        "bias-corrected intervals.",
        "- The GPU profile (`--profile gpu --device cuda`: 512–32768, 8 epochs, 128–220 "
        "vectors per layer) is configured but was not run for this report (no device time).",
        "",
    ]
    return _finish(lines, path)


def _finish(lines: list[str], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path

"""Figures and the replication report for causal dimensionality.

* :func:`plot_width_sweep`: N_repr and N_causal against SAE width on log axes, with bootstrap
  bands and the saturating fits of N_causal.
* :func:`plot_spectrum`: eigenvalues of Σ (descending, log scale) per layer.
* :func:`write_replication_doc`: docs/replication/causal-dimension.md from the JSON files the
  replication script writes (``kappa.json``, ``sweep.json``, ``training.json``, ``ce.json``,
  ``fourcell.json``, ``ioi.json``, ``synthetic.json``); missing files give "not run" rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


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
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


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
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


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
    try:
        return f"{float(x):.{nd}f}"
    except (TypeError, ValueError):
        return str(x)


def write_replication_doc(
    out: str | Path, settings: dict[str, Any], path: str | Path, sweep_dir: str | Path | None = None
) -> Path:
    """Render the replication report from the JSON files in ``out`` (κ, synthetic) and
    ``sweep_dir`` (default ``out``: SAE-dependent results); figures go to ``out``."""
    out = Path(out)
    sd = Path(sweep_dir) if sweep_dir is not None else out
    kappa, sweep = _load(out, "kappa.json"), _load(sd, "sweep.json")
    train, ce = _load(sd, "training.json"), _load(sd, "ce.json")
    four, ioi = _load(sd, "fourcell.json"), _load(sd, "ioi.json")
    syn = _load(out, "synthetic.json")
    if kappa:
        plot_spectrum(kappa, out / "sigma_spectrum.png")
    if sweep:
        plot_width_sweep(sweep, out / "width_sweep.png")
    d = kappa["d"] if kappa else 576
    rows: list[str] = []

    def row(claim: str, paper: str, ours: str, verdict: str) -> None:
        rows.append(f"| {claim} | {paper} | {ours} | {verdict} |")

    if sweep:
        w = sweep["widths"]
        span = w[-1] / w[0]
        gr, gc = sweep["n_repr_growth"][-1], sweep["n_causal_growth"][-1]
        if not gc >= 1:
            verdict = "not reproduced (N_causal does not grow with width)"
        elif gr > 1.5 * gc:
            verdict = "reproduced (qualitatively)"
        else:
            verdict = "not reproduced"
        row(
            "Wedge: N_repr grows much faster than N_causal",
            "64× width → N_repr 15.6×, N_causal 4.35× (wedge 3.6)",
            f"{span:.0f}× width → N_repr {gr:.2f}×, N_causal {gc:.2f}× (wedge "
            f"{_fmt(sweep['wedge'])})",
            verdict,
        )
        ci = sweep["kappa_hat_ci"]
        row(
            "κ̂/d ≈ 0.86 (κ̂ ≈ 1990, CI [545, 5130])",
            "0.86",
            f"κ̂ = {_fmt(sweep['kappa_hat'], 0)} (95% CI [{_fmt(ci[0], 0)}, {_fmt(ci[1], 0)}]), "
            f"κ̂/d = {_fmt(_num(sweep['kappa_hat']) / d)}",
            "see discussion",
        )
    else:
        row("Wedge", "15.6× vs 4.35×", "not run", "—")
    if kappa:
        ks = ", ".join(
            f"L{e['layer']}: κ={e['erank']:.0f}, κ_PR={e['participation_ratio']:.0f}"
            for e in kappa["layers"]
        )
        ratios = [e["kappa_over_d"] for e in kappa["layers"]]
        row(
            "Causal dimension is a large share of d (κ̂/d ≈ 0.86)",
            "0.86 (Gemma-2-2B L12)",
            "exact κ/d = "
            + ", ".join(f"L{e['layer']}: {e['kappa_over_d']:.3f}" for e in kappa["layers"]),
            "not reproduced (exact erank is a small share of d)"
            if max(ratios) < 0.5
            else "reproduced",
        )
        lower = all(e["participation_ratio"] <= e["erank"] for e in kappa["layers"])
        row(
            "κ_PR is a lower bound on κ (280 vs 1990)",
            "κ_PR ≈ 280 ≪ κ̂",
            ks,
            "reproduced (holds by construction: PR ≤ erank)" if lower else "not reproduced",
        )
    if four:
        inf = four["inflation"]["random_enc/learned_dec"]
        row(
            "Random orthonormal encoder inflates N_causal",
            "9.27×",
            f"{_fmt(inf)}× (width {four['width']})",
            "reproduced (direction)" if inf > 1.5 else "not reproduced",
        )
    if syn:
        r = {k: v["recall"] for k, v in syn.items()}
        row(
            "AtP recall of true causal directions on a synthetic model",
            "0",
            ", ".join(f"top {k}: {v:.3f}" for k, v in r.items()),
            "reproduced" if max(r.values()) == 0 else "not reproduced (recall > 0)",
        )
    if ioi:
        row(
            "Task-specific recovery: exact top features inside AtP's top 5%",
            "98.2%",
            f"{100 * ioi['recall_top_of_all']:.0f}% of top-{ioi['n_ground_truth']} "
            f"(of all {ioi['width']} features), {100 * ioi['recall_top_of_fired']:.0f}% "
            f"(top 5% of the {ioi['n_fired_at_end']} firing at END)",
            "reproduced" if ioi["recall_top_of_all"] >= 0.9 else "partly",
        )

    lines = [
        "# Replication: causal dimensionality on SmolLM2-135M-Instruct",
        "",
        "Generated by `.venv/bin/python scripts/replicate_causal_dimension.py` (stages cache "
        f"their JSON under `{out.relative_to(out.parents[1]) if len(out.parents) > 1 else out}`"
        "; figures `sigma_spectrum.png`, `width_sweep.png` there). Paper: Sarkar & Deka, "
        "arXiv 2605.08740 (Gemma-2-2B, d = 2304, Gemma Scope SAEs 16k–1M trained on 4–16B "
        "tokens). Here: SmolLM2-135M-Instruct (d = 576), 2 CPU cores, self-trained SAEs.",
        "",
        "## Claims vs measurements",
        "",
        "| claim | paper | ours | verdict |",
        "|---|---|---|---|",
        *rows,
        "",
    ]
    if kappa:
        lines += [
            "## Exact κ by layer",
            "",
            f"Σ = mean over residual vectors of JᵀJ, J = ∂ log_softmax(logits at the same "
            f"position)/∂ resid_pre, exact (forward-mode, all {d} directions), one vector per "
            f"prompt (last token of a {settings['jacobian_prompt_tokens']}-token window of held-"
            "out Austen text). ± = jackknife SE over vectors (token sampling only).",
            "",
            "| layer | vectors | κ = erank | κ/d | κ_PR | stable rank | numerical rank |",
            "|---|---|---|---|---|---|---|",
        ]
        for e in kappa["layers"]:
            lines.append(
                f"| {e['layer']} | {e['n_vectors']} | {e['erank']:.1f} ± {_fmt(e['erank_se'], 1)}"
                f" | {e['kappa_over_d']:.3f} | {e['participation_ratio']:.1f} ± "
                f"{_fmt(e['participation_ratio_se'], 1)} | {e['stable_rank']:.2f} | "
                f"{e['numerical_rank']} |"
            )
        missing = sorted(
            set(settings.get("jacobian_layers", [])) - {e["layer"] for e in kappa["layers"]}
        )
        if missing:
            lines += [
                "",
                f"Layers {missing} were configured but not run (time budget); rerun "
                "the script to add them (finished layers are kept).",
            ]
        lines.append("")
    if sweep:
        lines += [
            f"## Width sweep at layer {sweep['layer']}",
            "",
            f"TopK SAEs, k = {settings['k']} at every width (matched L0 by construction), "
            f"widths {sweep['widths']}, trained together on one stream of "
            f"{train['n_train_tokens'] if train else '?'} residual tokens × "
            f"{settings['epochs']} epochs (batch {settings['batch_size']}, lr = "
            f"{settings['lr']:g} at every width, Adam). The paper's SAEs saw 4–16B tokens: ours "
            f"saw ~{(train['n_train_tokens'] * settings['epochs'] / 4e9) if train else 0:.1e}× "
            "that. AtP metric: LM loss (summed next-token NLL) on "
            f"{sweep['n_tokens']} held-out tokens, one backward pass per batch reused across "
            "widths; position 0 (attention sink) excluded everywhere. "
            "ε = the 98th percentile of base-width AtP over all base features; N_repr = "
            "features firing ≥ 1 time on the evaluation tokens.",
            "",
            "| width | N_repr | N_causal (95% CI) | N_repr growth | N_causal growth | FVU | L0 | "
            "dead (eval) | CE recovered |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for i, wd in enumerate(sweep["widths"]):
            q = sweep["quality"][str(wd)]
            c = ce.get(str(wd), {}).get("ce_loss_recovered") if ce else None
            lo, hi = sweep["n_causal_ci"][0][i], sweep["n_causal_ci"][1][i]
            lines.append(
                f"| {wd} | {sweep['n_repr'][i]:.0f} | {sweep['n_causal'][i]:.0f} "
                f"({_fmt(lo, 0)}–{_fmt(hi, 0)}) | {sweep['n_repr_growth'][i]:.2f} | "
                f"{sweep['n_causal_growth'][i]:.2f} | {q['fvu']:.3f} | {q['l0']:.1f} | "
                f"{q['dead_fraction']:.3f} | {_fmt(c, 3)} |"
            )
        lines += [
            "",
            "Saturating fits of N_causal (least squares on log N; K = asymptote, "
            "95% bootstrap CI over 64 token blocks):",
            "",
        ]
        lines += ["| fit | K | K 95% CI | m½ | RMS log residual |", "|---|---|---|---|---|"]
        for name, fit in sweep["fits"].items():
            lines.append(
                f"| {name} | {fit['K']:.0f} | [{_fmt(fit['K_ci'][0], 0)}, "
                f"{_fmt(fit['K_ci'][1], 0)}] | {fit['m_half']:.0f} | "
                f"{fit['rms_log_residual']:.3f} |"
            )
        if sweep.get("exact_erank"):
            lines += [
                "",
                f"κ̂ (Michaelis–Menten) / exact erank of Σ at this layer = "
                f"{_fmt(sweep['kappa_hat_over_erank'])} (exact erank "
                f"{sweep['exact_erank']:.1f}).",
            ]
        if ce:
            first = next(iter(ce.values()))
            lines += [
                "",
                f"CE (nats/token): clean {first['ce_clean']:.3f}, zero-ablated "
                f"{first['ce_ablated']:.3f}.",
            ]
        lines.append("")
    if four:
        lines += [
            "## Four-cell encoder/decoder ablation",
            "",
            f"Width {four['width']}, ε from the learned/learned cell (top 2%), "
            f"{four['n_tokens']} evaluation tokens.",
            "",
            "| cell | N_repr | N_causal | inflation |",
            "|---|---|---|---|",
        ]
        for cell in four["n_causal"]:
            lines.append(
                f"| {cell} | {four['n_repr'][cell]} | {four['n_causal'][cell]} | "
                f"{four['inflation'][cell]:.2f} |"
            )
        lines.append("")
    if ioi:
        lines += [
            "## IOI task-specific recovery",
            "",
            f"{ioi['n_prompts']} IOI prompts, SAE width {ioi['width']}, features at the "
            "END position of the sweep layer; ground truth = top "
            f"{ioi['n_ground_truth']} features by exact zero-ablation (|Δ logit diff|, "
            "SAE spliced with error term); Spearman(AtP, exact) over the "
            f"{ioi['n_fired_at_end']} features firing at END: "
            f"{ioi['spearman_fired']:.3f}.",
            "",
        ]
    lines += [
        "## Caveats",
        "",
        "- Scale: d = 576 instead of 2304, and SAEs trained on ~10⁵ tokens instead of 4–16B; "
        "wide SAEs here are far from converged (see FVU and dead fractions), which by itself "
        "depresses N_causal at large widths. The width span is 32× (paper 64×).",
        "- κ is estimated from few residual vectors (the exact Σ costs d forward-mode passes "
        "per vector on a 2-core machine). The spectral entropy is concave in Σ/tr Σ, so by "
        "Jensen the erank of a few-vector Σ̂ is biased low in expectation: read our κ as "
        "likely underestimates of the population κ for this position/output convention.",
        "- The paper's κ̂ comes from saturating fits of N_causal(m); AtP probes "
        "E[∇L ∇Lᵀ] (rank ≤ 1 per token), not E[JᵀJ], so κ̂ ≈ erank(Σ) is an assumption we "
        "test, not an identity. Σ here is of log-probs at the same position; "
        "`--positions downstream` and `--output raw` are available.",
        "- ε is the 98th percentile over all base-width features (non-firing ones included), "
        "so N_causal(base) = ⌈0.02·m_base⌉ up to ties by construction.",
        "",
    ]
    return _finish(lines, path)


def _finish(lines: list[str], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path

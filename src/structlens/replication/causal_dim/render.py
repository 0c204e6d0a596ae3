"""Markdown and claims JSON of the causal-dimensionality replication.

:func:`write` renders ``causal-dimension.md`` (``template.md`` filled from one
:class:`~structlens.replication.causal_dim.run.Run`: the claims of
:func:`structlens.causal_dim.verdicts.claims` and one block per section that ran, each table
row a ``row`` block of the template) and ``causal-dimension.json``
(:class:`~structlens.replication.claims.ClaimsDocument`); figures go to the run's directory.
Verdicts are the Claims'; nothing here decides one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from structlens.causal_dim import verdicts
from structlens.replication.causal_dim.run import METHOD, Run
from structlens.replication.claims import ClaimsDocument
from structlens.replication.markdown import Template, ci, fmt, with_calibration, write_text
from structlens.sites import site_name
from structlens.verdicts import Claim

TEMPLATE = Path(__file__).with_name("template.md")
IOI_NOT_RUN = "this profile runs no IOI prompts (ioi_prompts = 0)"


def _value(x: Any) -> str:
    return "—" if x is None else x if isinstance(x, str) else f"{float(x):.4g}"


def claims_of(run: Run) -> list[Claim]:
    """The run's claims, in the table's order."""
    ioi_why = IOI_NOT_RUN if not run.settings.get("ioi_prompts") else "the IOI section failed"
    return verdicts.claims(
        run.d_model, run.kappa, run.sweep, four=run.fourcell, synthetic=run.synthetic,
        ioi=run.ioi, ioi_not_run=ioi_why, depth=run.depth, arch=run.arch, growth=run.growth,
        cross=run.cross_kappa, models=(run.settings["model"], run.cross_model or ""),
        d_models=(run.d_model, run.cross_d_model),
        percentile=run.settings["protocol"]["percentile"],
        cross_not_run="the cross-family stage failed (its traceback is in the run's log)"
        if "cross_family" in run.failures else "no cross-family model in this run",
    )  # fmt: skip


def _claim_row(c: Claim) -> dict[str, Any]:
    ours = _value(c.ours) + (f" [{_value(c.ci[0])}, {_value(c.ci[1])}]" if c.ci else "")
    return {"claim": verdicts.PAPER[c.id][0], "paper": c.paper, "ours": ours,
            "verdict": c.verdict, "note": c.note}  # fmt: skip


def _ce(run: Run, name: str) -> str:
    return fmt((run.ce.by_sae if run.ce else {}).get(name, {}).get("ce_loss_recovered"), 3)


def _sweep(run: Run, t: Template, p: dict[str, Any]) -> list[str]:
    sw, d = run.sweep, run.d_model
    assert sw is not None
    t0 = run.trained[f"topk-{sw.widths[0]}"]
    rows = [
        sw.quality[str(w)] | vars(run.trained[f"topk-{w}"]) | {
            "w": w, "n_repr": sw.n_repr[i], "n_repr_lo": sw.n_repr_ci[0][i],
            "n_repr_hi": sw.n_repr_ci[1][i], "n_causal": sw.n_causal[i],
            "n_causal_lo": sw.n_causal_ci[0][i], "n_causal_hi": sw.n_causal_ci[1][i],
            "repr_growth": sw.n_repr_growth[i], "causal_growth": sw.n_causal_growth[i],
            "atp_sum": fmt(sw.atp_mass.get(str(w), {}).get("sum"), 3),
            "atp_max": fmt(sw.atp_mass.get(str(w), {}).get("max"), 4),
            "ce": _ce(run, f"topk-{w}"), "dead_fraction": sw.quality[str(w)]["dead_fraction"],
        }
        for i, w in enumerate(sw.widths)
    ]  # fmt: skip
    gate = (f"interpretable (held-out FVU falls with width, within {sw.fvu_rise_tol:.0%} "
            "plus 1.645 SE per step)" if sw.sweep_status == "interpretable"
            else f"**not interpretable** ({sw.sweep_cause}): {sw.sweep_reason}; no κ̂ is "
            "fitted")  # fmt: skip
    values = p | {
        "site": site_name("resid_pre", sw.layer), "base_width": sw.base_width,
        "base_over_d": sw.base_width / d, "n_train_tokens": t0.n_train_tokens,
        "n_train_chunks": run.n_train_chunks, "n_generated": run.n_generated,
        "n_massive": t0.n_massive_dropped, "gate": gate, "n_tokens": sw.n_tokens,
        "epsilon": sw.epsilon, "epsilon_ci": ci(sw.epsilon_ci, 5),
    }  # fmt: skip
    base = [
        r | {
            "base": b, "base_over_d": int(b) / d, "n_causal": [int(x) for x in r["n_causal"]],
            "n_causal_growth": fmt(r["n_causal_growth"]), "kappa_hat": fmt(r["kappa_hat"], 0),
            "reason": f" ({r['kappa_hat_reason']})" if r.get("kappa_hat_reason") else "",
        }
        for b, r in sw.base_width_sensitivity.items()
    ]  # fmt: skip
    out = [t.section("sweep", values, rows)]
    if base:
        out.append(t.section("base_width", {}, base))
    fits = [f | {"name": n} for n, f in sw.fits.items()]
    out.append(t.section("fits", {"n_bootstrap": sw.n_bootstrap}, fits) if fits
               else t.section("no_fits", {}))  # fmt: skip
    if run.ce:
        first = next(iter(run.ce.by_sae.values()))
        out.append(t.section("ce", first | {"ce_prompts": p["ce_prompts"]}))
    return out


def _kappa(run: Run, t: Template, p: dict[str, Any]) -> str:
    fits = run.kappa
    sizes = sorted({int(n) for f in fits for n in f.curve_sizes})
    curve = [
        "| layer | " + " | ".join(f"n={n}" for n in sizes) + " |",
        "|---" * (1 + len(sizes)) + "|",
    ]
    for f in fits:
        points = zip(f.curve_sizes, f.curve_erank, f.curve_erank_sd, strict=True)
        cells = {int(n): f"{m:.1f} ± {sd:.1f}" for n, m, sd in points}
        curve.append(f"| {f.layer} | " + " | ".join(cells.get(n, "") for n in sizes) + " |")
    values = p | {"d": run.d_model, "tolerance": fits[0].tolerance, "curve": "\n".join(curve)}
    return t.section("kappa", values, (vars(f) for f in fits))


def _cross_family(run: Run, t: Template, p: dict[str, Any]) -> str:
    paper_width = verdicts.PAPER_SETTING["base_width"]
    values = {
        "percentile": p["percentile"], "share": 1 - p["percentile"] / 100,
        "paper_width": paper_width,
        "by_construction": verdicts.n_causal_by_construction(p["percentile"], paper_width),
        "model": run.settings["model"], "d": run.d_model, "n_layers": run.n_layers,
        "cross_model": run.cross_model, "cross_d": run.cross_d_model,
        "cross_n_layers": run.cross_n_layers, "match": verdicts.SCALE_MATCH,
    }  # fmt: skip
    rows = []
    for f in run.kappa:
        g = run.cross_kappa.get(f.layer)
        if g is None:
            continue
        ratio, low, high = verdicts.kappa_ratio(f, g)
        rows.append({
            "layer": f.layer, "cross_layer": g.layer, "depth": f.layer / run.n_layers,
            "cross_depth": g.layer / run.cross_n_layers, "kappa": f.erank,
            "kappa_ci": f.erank_ci, "kappa_over_d": f.kappa_over_d, "cross_kappa": g.erank,
            "cross_kappa_ci": g.erank_ci, "cross_kappa_over_d": g.kappa_over_d,
            "plugin": f.erank_plugin, "cross_plugin": g.erank_plugin,
            "n_vectors": f.n_vectors, "cross_n_vectors": g.n_vectors,
            "identified": f.identified, "cross_identified": g.identified,
            "ratio": ratio, "low": low, "high": high,
        })  # fmt: skip
    return t.section("cross_family", values, rows)


def _sections(run: Run, t: Template, p: dict[str, Any]) -> list[str]:
    """The replication-only sections that ran, each a template block with its rows."""
    out = []
    if run.fourcell:
        keys = ("l0", "n_repr", "n_causal", "inflation")
        cells = [{"arch": a, "cell": c, **{k: v[k][c] for k in keys}}
                 for a, v in run.fourcell.architectures.items() for c in v["n_causal"]]  # fmt: skip
        out.append(t.section("fourcell", {"width": run.fourcell.width}, cells))
    if run.arch:
        w = run.arch.width
        rows = [v | {"arch": a, "ce": _ce(run, f"{a}-{w}")} for a, v in run.arch.rows.items()]
        out.append(t.section("arch", {"width": w, "layer": run.arch.layer, **p}, rows))
    if run.growth:
        g = run.growth
        rows = [v | {"arch": a, "fvus": ", ".join(f"{x:.2f}" for x in v["fvu"]),
                     "l0s": ", ".join(f"{x:.1f}" for x in v["l0"])}
                for a, v in g.rows.items()]  # fmt: skip
        out.append(t.section("growth", {"widths": g.widths, "layer": g.layer, "k": g.k}, rows))
    if run.depth:
        rows = [r | {"search": _k_search(run.depth.k_search.get(str(r["layer"])))}
                for r in run.depth.rows]  # fmt: skip
        out.append(t.section("depth", {"width": run.depth.width, **p}, rows))
    if run.ioi:
        out.append(t.section("ioi", vars(run.ioi)))
    if run.synthetic:
        syn = run.synthetic
        values = syn.model | syn.sae | {
            "samples": 512 * syn.steps,
            "cos_threshold": next(iter(syn.rotated.values()))["cos_threshold"],
            "rotated": ", ".join(f"top {k}: {v['recall']:.3f} (chance {v['chance_recall']:.3f})"
                                 for k, v in syn.rotated.items()),
            "atoms": ", ".join(f"top {k}: {v['recall']:.3f}" for k, v in syn.atoms.items()),
        }  # fmt: skip
        out.append(t.section("synthetic", values))
    if run.trained:
        rows = [vars(r) | {"name": n} for n, r in sorted(run.trained.items())]
        out.append(t.section("training", {}, rows))
    return out


def _k_search(found: dict[str, Any] | None) -> str:
    """One depth row's k search: every k tried with its held-out FVU, and how it ended."""
    if found is None:
        return "target (the sweep's SAE)"
    tried = ", ".join(f"{k}: {f:.3f}" for k, f in zip(found["ks"], found["fvus"], strict=True))
    return f"{tried} ({found['stop']}; target {found['target_fvu']:.3f})"


def render_markdown(run: Run, source: str) -> str:
    """docs/replication/causal-dimension.md from one run's Results; figures
    (``width_sweep.png``, ``sigma_spectrum.png``, ``kappa_vs_n.png``) go to ``run.out``.
    Sections whose stage did not run are left out."""
    from structlens.report.causal import plot_kappa_curve, plot_spectrum, plot_width_sweep

    t, p, paper, out = Template(TEMPLATE), run.settings["protocol"], verdicts.PAPER_SETTING, run.out
    head = {f"paper_{k}": v for k, v in paper.items()}
    head |= {"source": source, "out": out, "model": run.settings["model"], "d": run.d_model}
    parts = [t.section("header", head, map(_claim_row, claims_of(run)))]
    if run.sweep:
        plot_width_sweep(run.sweep, out / "width_sweep.png")
        parts += _sweep(run, t, p)
    if run.kappa:
        plot_spectrum({f.layer: f for f in run.kappa}, out / "sigma_spectrum.png")
        plot_kappa_curve({f.layer: f.curve() for f in run.kappa}, out / "kappa_vs_n.png")
        parts.append(_kappa(run, t, p))
    if run.kappa and run.cross_kappa:
        parts.append(_cross_family(run, t, p))
    parts += _sections(run, t, p)
    scale = "no SAE sweep in this run"
    if run.sweep:
        w, t0 = run.sweep.widths, run.trained[f"topk-{run.sweep.widths[0]}"]
        scale = (
            f"SAEs trained on {t0.n_train_tokens} tokens (to convergence of the held-out FVU, "
            f"at most {p['sae_max_epochs']} epochs) instead of {paper['sae_tokens']}, and a "
            f"{w[-1] / w[0]:.0f}× width span (paper {paper['width_span']}×)"
        )
    parts.append(t.section("caveats", head | {"scale": scale}))
    return "\n\n".join(parts) + "\n"


def claims(run: Run, source: str) -> ClaimsDocument:
    """The run's claims and the sweep and κ blocks of the protocol."""
    blocks: dict[str, Any] = {"settings": dict(run.settings)}
    sw = run.sweep
    if sw is not None:
        status, reason = verdicts.kappa_hat_status(sw)
        keep = ("layer", "widths", "base_width", "d_model", "heldout_fvu", "train_fvu",
                "fvu_gap", "fvu_rise_allowance", "fvu_monotone", "sweep_status",
                "sweep_cause", "kappa_hat", "base_width_sensitivity")  # fmt: skip
        trained = {w: run.trained[f"topk-{w}"] for w in sw.widths}
        tokens = {str(w): {"n_train_tokens": r.n_train_tokens, "token_steps": r.tokens}
                  for w, r in trained.items()}  # fmt: skip
        blocks["sweep"] = {k: getattr(sw, k) for k in keep} | {
            "sweep_reason": sw.sweep_reason or None, "kappa_hat_status": status,
            "kappa_hat_reason": reason, "training_tokens": tokens,
            "training_texts": {"corpus_chunks": run.n_train_chunks, "generated": run.n_generated},
        }  # fmt: skip
    else:
        keys = ("base_width", "d_model", "fvu_monotone", "kappa_hat_status")
        blocks["sweep"] = dict.fromkeys(keys, None) | {"not_run": "no width sweep in this run"}
    blocks["kappa"] = {
        "ratio_last_doubling": {str(f.layer): f.ratio_last_doubling for f in run.kappa},
        "identified": {str(f.layer): f.identified for f in run.kappa},
        "residual_bias": {str(f.layer): f.residual_bias for f in run.kappa},
    }
    blocks["cross_family"] = {
        "model": run.cross_model, "d_model": run.cross_d_model, "n_layers": run.cross_n_layers,
        "layers": {str(a): f.layer for a, f in run.cross_kappa.items()},
        "identified": {str(a): f.identified for a, f in run.cross_kappa.items()},
    }  # fmt: skip
    return ClaimsDocument(METHOD, source, tuple(claims_of(run)), blocks)


def write(run: Run, doc_dir: str | Path) -> tuple[Path, Path]:
    """Write ``causal-dimension.md`` and ``causal-dimension.json`` into ``doc_dir``."""
    from structlens.replication import command

    doc_dir = Path(doc_dir)
    source = command(METHOD, run.settings["profile"])
    text = with_calibration(render_markdown(run, source), "causal_dim")
    md = write_text(doc_dir / f"{METHOD}.md", text)
    js = claims(run, source).write(doc_dir / f"{METHOD}.json")
    return md, js

"""``report.html``: one self-contained page for an analysis (``structlens analyze``).

The page is rendered from ``analysis.json`` alone (so ``structlens report DIR`` re-renders
it without recomputing): a summary (model, what ran, headline numbers with their 95% CIs,
every caveat), one section per method with sortable tables and figures, and the NDM preimage
browser.  Figures are inline SVG drawn with matplotlib (deterministic ids, no timestamp);
the style sheet and the script are inlined from ``report/assets``; no URL outside the page
is referenced.  Every string from the data is escaped (tables, captions) or inserted by the
script as text (the browser), so prompts cannot inject HTML.
"""

from __future__ import annotations

import functools
import html
import io
import json
import math
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from structlens.verdicts import calibration_notes

__all__ = ["render_html", "write_report"]

SECTIONS = {
    "tasks": "Circuit tasks",
    "koopman": "Koopman spectral analysis",
    "ndm": "NDM subspaces",
    "causal_dim": "Causal dimensionality",
    "equivalence": "Interpretive equivalence",
}


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) >= 1e4 or (0 < abs(x) < 1e-3) else f"{x:.{digits}f}"
    return str(x)


def _with_ci(value: Any, ci: Sequence[float] | None, digits: int = 3) -> str:
    """``value [lo, hi]`` as escaped HTML (the CI greyed), or just the value."""
    out = _e(_fmt(value, digits))
    if ci is not None and value is not None and all(isinstance(c, (int, float)) for c in ci):
        out += f' <span class="ci">[{_e(_fmt(ci[0], digits))}, {_e(_fmt(ci[1], digits))}]</span>'
    return out


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], table_id: str = "") -> str:
    """A sortable table; a cell is a plain value or ``(html, sort_value)``."""
    ident = f' id="{_e(table_id)}"' if table_id else ""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for cell in row:
            if isinstance(cell, tuple):
                shown, key = cell
            else:
                shown, key = _e(_fmt(cell)), cell
            sort = "" if key is None else _e(key if isinstance(key, str) else _fmt(key, 12))
            cells.append(f'<td data-v="{sort}">{shown}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<table class="sortable"{ident}><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _ci_cell(value: Any, ci: Sequence[float] | None, digits: int = 3) -> tuple[str, Any]:
    return _with_ci(value, ci, digits), value


# ---------------------------------------------------------------------------------- figures


def _svg(draw: Callable[[Any], None], size: tuple[float, float] = (6.0, 3.6)) -> str:
    """Inline SVG of a matplotlib figure drawn by ``draw(fig)``, byte-identical across runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with plt.rc_context({"svg.hashsalt": "structlens", "svg.fonttype": "none", "font.size": 9}):
        fig = plt.figure(figsize=size)
        try:
            draw(fig)
            fig.tight_layout()
            buf = io.StringIO()
            fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
        finally:
            plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _figure(fig_id: str, caption: str, draw: Callable[[Any], None], size=(6.0, 3.6)) -> str:
    return (
        f'<figure class="fig" id="{_e(fig_id)}">{_svg(draw, size)}'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


def _errbars(ax: Any, x: Sequence[float], values: Sequence[Any], cis: Sequence[Any], **kw: Any):
    import numpy as np

    v = np.array([np.nan if a is None else a for a in values], dtype=float)
    lo = np.array([np.nan if c is None else c[0] for c in cis], dtype=float)
    hi = np.array([np.nan if c is None else c[1] for c in cis], dtype=float)
    err = np.vstack([np.clip(v - lo, 0, None), np.clip(hi - v, 0, None)])
    ax.errorbar(x, v, yerr=np.nan_to_num(err), fmt="o", capsize=3, **kw)


# --------------------------------------------------------------------------------- sections


def _caveat_list(caveats: Sequence[dict[str, str]], method: str | None = None) -> str:
    if not caveats:
        return '<p class="muted">No caveats.</p>'
    items = []
    for c in caveats:
        where = f"{_e(SECTIONS.get(method, method))}: " if method else ""
        items.append(
            f'<li><span class="kind">{_e(c.get("kind", ""))}</span> {where}'
            f"{_e(c.get('message', ''))}</li>"
        )
    return f'<ul class="caveats">{"".join(items)}</ul>'


def _calibration(method: str) -> str:
    """The measured error rates of the rules this section's verdicts come from."""
    notes = calibration_notes(method)
    if not notes:
        return ""
    items = "".join(f"<li>{_e(n)}</li>" for n in notes)
    return f'<p class="muted">Calibration of its rules on planted structure:</p><ul>{items}</ul>'


def _summary(doc: dict[str, Any]) -> str:
    run = doc["run"]
    stages = run.get("stages", {})
    ran = ", ".join(
        f"{SECTIONS.get(s, s)} ({v['status']}, {v['seconds']:.0f} s)" for s, v in stages.items()
    )
    rows = []
    for method in SECTIONS:
        for key, h in doc.get(method, {}).get("headline", {}).items():
            rows.append(
                [
                    (_e(SECTIONS[method]), SECTIONS[method]),
                    (_e(h.get("label") or key), h.get("label") or key),
                    _ci_cell(h.get("value"), h.get("ci")),
                    (_e(h.get("unit", "")), h.get("unit", "")),
                ]
            )
    all_caveats = "".join(
        _caveat_list(doc[m]["caveats"], m) for m in SECTIONS if doc.get(m, {}).get("caveats")
    )
    return (
        '<section id="summary"><h2>Summary</h2>'
        f"<p>Model <b>{_e(run['model'])}</b> (fingerprint {_e(run.get('fingerprint', ''))}, "
        f"{_e(run.get('n_layers'))} layers, d = {_e(run.get('d_model'))}), profile "
        f"<b>{_e(run['profile'])}</b>, analysis layers {_e(run.get('layers'))}, seed "
        f"{_e(run.get('seed'))}.</p><p>Ran: {_e(ran)}.</p>"
        "<p>Headline numbers with 95% confidence intervals in brackets; a dash means the "
        "estimate is not identified (see the caveats).</p>"
        + _table(["method", "quantity", "value [95% CI]", "unit"], rows, "summary-table")
        + "<h3>Caveats</h3>"
        + (all_caveats or '<p class="muted">No caveats.</p>')
        + "</section>"
    )


def _tasks(sec: dict[str, Any]) -> str:
    rows = sec["details"]["rows"]
    out = _table(
        ["task", "n", "accuracy [95% Wilson CI]", "mean metric [95% t CI]", "metric"],
        [
            [
                (_e(r["task"]), r["task"]),
                r["n"],
                _ci_cell(r["accuracy"], r["accuracy_ci"]),
                _ci_cell(r["metric_mean"], r["metric_ci"]),
                (_e(r["metric"]), r["metric"]),
            ]
            for r in rows
        ],
        "tasks-table",
    )
    if rows:

        def draw(fig: Any) -> None:
            ax = fig.add_subplot(111)
            _errbars(ax, range(len(rows)), [r["accuracy"] for r in rows],
                     [r["accuracy_ci"] for r in rows])  # fmt: skip
            ax.set_xticks(range(len(rows)), [r["task"] for r in rows])
            ax.set_ylim(0, 1.05)
            ax.set_xlabel("task")
            ax.set_ylabel("accuracy (fraction of prompts)")

        out += _figure("fig-tasks", "Accuracy per task with 95% Wilson intervals.", draw, (5, 3))
    return out


def _koopman_convergence(layers: Sequence[dict[str, Any]], fig: Any) -> None:
    import numpy as np

    ax = fig.add_subplot(111)
    for r in layers:
        m, w = np.array(r["half_samples"]), np.array(r["w_inf_mean"])
        ax.loglog(m, w, "o-", label=f"layer {r['layer']} (slope {r['slope']:+.2f})")
    if layers:
        m = np.array(layers[0]["half_samples"])
        ref = layers[0]["w_inf_mean"][0] * (m / m[0]) ** -0.5
        ax.loglog(m, ref, "k--", label="M^-1/2 reference")
    ax.set_xlabel("samples per half M (token positions)")
    ax.set_ylabel("split-half W∞ distance of spectra")
    ax.legend(fontsize=7)


def _koopman_spectrum(r: dict[str, Any], fig: Any) -> None:
    import numpy as np

    ax = fig.add_subplot(111)
    ev = np.array(r["eigenvalues"])
    if r.get("mom_eigenvalues"):
        mom = np.array(r["mom_eigenvalues"])
        ax.scatter(mom[:, 0], mom[:, 1], s=10, marker="x", color="tab:gray",
                   label="median-of-means fit")  # fmt: skip
    ax.scatter(ev[:, 0], ev[:, 1], s=14, color="tab:blue", label="pooled fit")
    t = np.linspace(0, 2 * np.pi, 200)
    ax.plot(np.cos(t), np.sin(t), "k:", lw=0.8, label="unit circle")
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel("Re λ (dimensionless)")
    ax.set_ylabel("Im λ (dimensionless)")
    ax.set_title(f"layer {r['layer']}, {r['dictionary']}")
    ax.legend(fontsize=7)


def _koopman_invariance(rows: Sequence[dict[str, Any]], fig: Any) -> None:
    ax = fig.add_subplot(111)
    ax.bar(range(len(rows)), [r["pooled"] for r in rows], color="tab:green")
    ax.set_xticks(range(len(rows)), [r["dictionary"] for r in rows])
    ax.set_xlabel("dictionary")
    ax.set_ylabel("held-out 1 − R² (pooled)")


def _koopman(sec: dict[str, Any]) -> str:
    det = sec["details"]
    layers = det["layers"]
    out = _table(
        ["layer", "dictionary", "samples", "split-half slope [95% CI]", "max κ(λ)",
         "spectral radius [95% CI]", "rel. Henrici", "κ(V)"],
        [
            [r["layer"], (_e(r["dictionary"]), r["dictionary"]), r["n_samples"],
             _ci_cell(r["slope"], r["slope_ci"]), r["eig_condition_max"],
             _ci_cell(r["spectral_radius"], r["spectral_radius_ci"]), r["henrici_relative"],
             r["kappa_V"]]
            for r in layers
        ],
        "koopman-table",
    )  # fmt: skip
    out += _figure(
        "fig-koopman-convergence",
        "Split-half spectral distance against samples per half (log-log).",
        functools.partial(_koopman_convergence, layers),
    )
    if layers:
        out += _figure(
            "fig-koopman-spectrum",
            "Eigenvalues of the lifted layer map: the pooled fit and the median-of-means fit.",
            functools.partial(_koopman_spectrum, layers[len(layers) // 2]),
            (4.5, 4.2),
        )
    out += "<h3>Invariance residual by dictionary</h3>" + _table(
        ["dictionary", "features", "pooled 1 − R²", "median 1 − R²", "dead features"],
        [[(_e(r["dictionary"]), r["dictionary"]), r["n_features"], r["pooled"], r["median"],
          r["n_dead"]] for r in det["invariance"]],
        "invariance-table",
    )  # fmt: skip
    out += _figure(
        "fig-koopman-invariance",
        f"Held-out one-step residual of the dictionary features (layer {det['invariance_layer']},"
        " dictionary and operator fitted on the other half of the prompts).",
        functools.partial(_koopman_invariance, det["invariance"]), (5, 3),
    )  # fmt: skip
    return out


def _ndm(sec: dict[str, Any]) -> str:
    det = sec["details"]
    out = _table(
        ["layer", "subspaces", "partition", "steps", "stopped because", "activations"],
        [[t["layer"], len(t["partition"]), (_e(t["partition"]), len(t["partition"])), t["steps"],
          (_e(t["stop_reason"]), t["stop_reason"]), t["n_activations"]]
         for t in det["trained"]],
        "ndm-training-table",
    )  # fmt: skip

    def merges(fig: Any) -> None:
        ax = fig.add_subplot(111)
        for t in det["trained"]:
            h = t["merge_history"]
            ax.plot([m["step"] for m in h], [m["max_mi"] for m in h], "o-",
                    label=f"layer {t['layer']}")  # fmt: skip
        if det["trained"]:
            ax.axhline(det["trained"][0]["threshold"], color="k", ls="--", label="threshold")
        ax.set_xlabel("training step")
        ax.set_ylabel("largest KSG MI / (d_a + d_b) (nats per dim)")
        ax.legend(fontsize=7)

    out += _figure("fig-ndm-merges", "KSG merge history: the largest pairwise MI per merge round.",
                   merges)  # fmt: skip
    out += _table(
        ["test", "layer", "whole-space effect [95% CI]", "share of clean metric", "screen"],
        [[(_e(t["test"]), t["test"]), t["layer"],
          _ci_cell(t["full_effect"], t["full_effect_ci"]),
          t["whole_space_share"],
          "passes" if t["screened"] else "no signal"] for t in det["tests"]],
        "ndm-tests-table",
    )  # fmt: skip
    gini = det.get("gini") or {}
    if gini:
        methods = list(gini["mean"])
        out += "<h3>Patching-test Gini (dimension-normalised)</h3>"
        tests = list(gini["per_test"])
        out += _table(
            ["method", "mean Gini [95% CI]", *tests, "NDM − method [95% CI]"],
            [
                [(_e(m), m), _ci_cell(gini["mean"][m]["value"], gini["mean"][m]["ci"]),
                 *[("no signal", None) if gini["per_test"][t] == "no signal" else
                   _ci_cell(gini["per_test"][t][m]["value"], gini["per_test"][t][m]["ci"])
                   for t in tests],
                 _ci_cell(gini["ndm_minus"][m]["value"], gini["ndm_minus"][m]["ci"])
                 if m in gini["ndm_minus"] else ("—", None)]
                for m in methods
            ],
            "gini-table",
        )  # fmt: skip

        def bars(fig: Any) -> None:
            ax = fig.add_subplot(111)
            _errbars(ax, range(len(methods)), [gini["mean"][m]["value"] for m in methods],
                     [gini["mean"][m]["ci"] for m in methods])  # fmt: skip
            ax.set_xticks(range(len(methods)), methods)
            ax.set_xlabel("rotation")
            ax.set_ylabel("mean Gini of patching effects (0–1)")

        out += _figure("fig-ndm-gini", "Mean Gini over the patching tests with 95% bootstrap "
                       "intervals over prompts.", bars, (5, 3))  # fmt: skip
    out += _browser(det["browser"])
    return out


def _browser(browser: dict[str, Any]) -> str:
    data = json.dumps(browser, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    # "<" never appears raw inside the script element, so "</script>" cannot end it early.
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return (
        '<div class="browser" id="preimage-browser"><h3>Preimage browser</h3>'
        f"<p>Layer {_e(browser['layer'])}: {_e(len(browser['entries']))} stored contexts (the top "
        "activating contexts of every subspace plus a random sample). Pick a subspace to see "
        "its top activating contexts (largest projection norm, token highlighted); search the "
        "stored contexts by token or text; the query box finds the nearest stored activations "
        "(cosine similarity inside the subspace) to the first context containing the text.</p>"
        '<label>subspace <select id="preimage-subspace"></select></label>'
        '<h4>Top activating contexts</h4><ul id="preimage-top"></ul>'
        '<h4>Search</h4><input id="preimage-search" type="search" placeholder="token or text">'
        '<ul id="preimage-results"></ul>'
        '<h4>Nearest stored activations</h4><input id="preimage-query" type="text" '
        'placeholder="text of a stored context"><button id="preimage-query-go" type="button">'
        'find nearest</button><ul id="preimage-neighbours"></ul>'
        f'<script type="application/json" id="preimage-data">{data}</script></div>'
    )


def _causal(sec: dict[str, Any]) -> str:
    det = sec["details"]
    rows = det["layers"]
    out = _table(
        ["layer", "κ (erank) [95% CI]", "κ_PR [95% CI]", "vectors", "identified",
         "residual bias", "plug-in κ(n/2)", "plug-in κ(n)/κ(n/2)"],
        [[r["layer"], _ci_cell(r["kappa"], r["kappa_ci"]),
          _ci_cell(r["kappa_pr"], r["kappa_pr_ci"]), r["n_vectors"],
          "yes" if r["identified"] else "no", r["residual_bias"], r["kappa_half"],
          r["convergence_ratio"]] for r in rows],
        "kappa-table",
    )  # fmt: skip

    def kappa(fig: Any) -> None:
        ax = fig.add_subplot(111)
        _errbars(ax, [r["layer"] for r in rows], [r["kappa"] for r in rows],
                 [r["kappa_ci"] for r in rows], label="κ (erank)")  # fmt: skip
        ax.plot([r["layer"] for r in rows], [r["kappa_half"] for r in rows], "x",
                label="plug-in κ from n/2 vectors")  # fmt: skip
        ax.axhline(det["d_model"], color="k", ls=":", label="d_model")
        ax.set_xlabel("layer")
        ax.set_ylabel("κ (residual dimensions)")
        ax.legend(fontsize=7)

    def spectra(fig: Any) -> None:
        import numpy as np

        ax = fig.add_subplot(111)
        for r in rows:
            lam = np.clip(np.array(r["eigenvalues"]), 1e-300, None)
            ax.semilogy(np.arange(1, lam.size + 1), lam / lam.max(), label=f"layer {r['layer']}")
        ax.set_xlabel("eigenvalue index")
        ax.set_ylabel("λ_i / λ_1 of Σ = E[JᵀJ]")
        ax.legend(fontsize=7)

    methods = sorted({str(r.get("kappa_ci_method", "jackknife")) for r in rows})
    out += _figure("fig-kappa", f"Exact κ by layer (bias-corrected point, {', '.join(methods)} "
                   "interval) and the plug-in κ from half the vectors.", kappa)  # fmt: skip
    out += _figure("fig-kappa-spectra", "Normalised spectra of Σ.", spectra)
    sw = det.get("sweep") or {}
    if sw:
        out += f"<h3>SAE width sweep (layer {_e(sw['layer'])})</h3>"
        out += _table(
            ["width", "N_repr [95% CI]", "N_causal [95% CI]"],
            [[w, _ci_cell(sw["n_repr"][i], [sw["n_repr_ci"][0][i], sw["n_repr_ci"][1][i]]),
              _ci_cell(sw["n_causal"][i], [sw["n_causal_ci"][0][i], sw["n_causal_ci"][1][i]])]
             for i, w in enumerate(sw["widths"])],
            "sweep-table",
        )  # fmt: skip
        khat = (
            _with_ci(sw["kappa_hat"], sw["kappa_hat_ci"])
            if sw["identified"]
            else "<b>unidentified</b> (see caveats)"
        )
        out += (f"<p>Wedge {_with_ci(sw['wedge'], sw['wedge_ci'])}; κ̂ ({_e(sw['fit_model'])}) "
                f"{khat}.</p>")  # fmt: skip

        def wedge(fig: Any) -> None:
            ax = fig.add_subplot(111)
            ax.loglog(sw["widths"], sw["n_repr"], "o-", label="N_repr (features firing)")
            ax.loglog(sw["widths"], [max(v, 0.5) for v in sw["n_causal"]], "s-",
                      label="N_causal (|AtP| > ε)")  # fmt: skip
            ax.set_xlabel("SAE width m (features)")
            ax.set_ylabel("features (count)")
            ax.legend(fontsize=7)

        out += _figure("fig-wedge", "The width-sweep wedge: represented vs causal features.",
                       wedge)  # fmt: skip
    return out


_R2_LABEL = {
    "uniform_average": "uniform (reference; decides)",
    "variance_weighted": "variance-weighted (rotation-invariant)",
}


def _congruity_table(rows: Sequence[dict[str, Any]]) -> str:
    """CONGRUITY of each pair, one line per way of averaging per-coordinate encoding R²
    (the reference's uniform average, which decides, and the variance-weighted one beside
    it); the sanity copies carry their known answer."""
    if not rows:
        return ""
    lines = [
        [(_e(r["pair"]), r["pair"]), r["known"] or "—", _R2_LABEL[m],
         e["decision_rate_ab"], e["decision_rate_ba"], e["mean_p_ab"], e["mean_p_ba"],
         e["base_r2_ab"], e["base_r2_ba"], e["decision"]]
        for r in rows for m in _R2_LABEL if (e := r.get(m))
    ]  # fmt: skip
    return (
        "<p>CONGRUITY (the reference's point test on accumulated residual streams) with the "
        "encoding R² averaged uniformly over coordinates, as the reference does (its decision "
        "is the one reported), and weighted by each coordinate's variance, which a rotation of "
        "the residual basis leaves unchanged. The sanity copies compute the same function as "
        "the model, so a correct test does not call them different.</p>"
        + _table(
            ["pair", "known", "encoding R²", "decision rate A→B", "decision rate B→A",
             "mean p A→B", "mean p B→A", "clean-run R² A→B", "clean-run R² B→A", "decision"],
            lines,
            "congruity-table",
        )
    )  # fmt: skip


def _equivalence(sec: dict[str, Any]) -> str:
    rows = sec["details"]["rows"]
    out = _table(
        ["pair", "probe", "head score [95% CI]", "null score [95% CI]", "layer score [95% CI]",
         "decisions"],
        [[(_e(r["pair"]), r["pair"]), (_e(r["probe"]), r["probe"]),
          _ci_cell(r["score"], r["score_ci"]), _ci_cell(r["null_score"], r["null_score_ci"]),
          _ci_cell(r["layer_score"], r["layer_score_ci"]),
          (_e(", ".join(f"{k}: {v}" for k, v in r["decisions"].items())), None)] for r in rows],
        "equivalence-table",
    )  # fmt: skip
    out += _congruity_table(sec["details"].get("congruity") or [])
    if rows:

        def bars(fig: Any) -> None:
            ax = fig.add_subplot(111)
            x = list(range(len(rows)))
            _errbars(ax, [i - 0.1 for i in x], [r["score"] for r in rows],
                     [r["score_ci"] for r in rows], label="matched partner")  # fmt: skip
            _errbars(ax, [i + 0.1 for i in x], [r["null_score"] for r in rows],
                     [r["null_score_ci"] for r in rows], label="mean-ablation null")  # fmt: skip
            ax.set_xticks(x, [f"pair {i + 1}" for i in x])
            ax.set_ylim(-0.05, 1.05)
            ax.set_xlabel("model pair (rows of the table, in order)")
            ax.set_ylabel("share of heads passing (0–1)")
            ax.legend(fontsize=7)

        def heat(fig: Any) -> None:
            ax = fig.add_subplot(111)
            im = ax.imshow(rows[0]["layer_similarity"], cmap="viridis", vmin=0, vmax=1)
            ax.set_xlabel("layer of model B")
            ax.set_ylabel("layer of model A")
            fig.colorbar(im, ax=ax, label="debiased linear CKA (0–1)")

        out += _figure("fig-equivalence", "Equivalence score against its null.", bars, (5, 3))
        out += _figure("fig-layer-similarity", f"Layer similarity, {rows[0]['pair']}.", heat,
                       (4.5, 3.8))  # fmt: skip
    return out


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "tasks": _tasks,
    "koopman": _koopman,
    "ndm": _ndm,
    "causal_dim": _causal,
    "equivalence": _equivalence,
}


def _asset(name: str) -> str:
    return resources.files("structlens.report").joinpath("assets").joinpath(name).read_text("utf-8")


def render_html(doc: dict[str, Any]) -> str:
    """The report page for an ``analysis.json`` document."""
    present = [m for m in SECTIONS if m in doc]
    nav = '<a href="#summary">Summary</a>' + "".join(
        f'<a href="#{m}">{_e(SECTIONS[m])}</a>' for m in present
    )
    body = [_summary(doc)]
    for m in present:
        sec = doc[m]
        body.append(
            f'<section id="{m}"><h2>{_e(SECTIONS[m])}</h2>'
            f"{_caveat_list(sec.get('caveats', []))}{_calibration(m)}{RENDERERS[m](sec)}"
            "</section>"
        )
    title = f"structlens analysis: {doc['run']['model']}"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{_e(title)}</title><style>{_asset('report.css')}</style></head><body>"
        f"<h1>{_e(title)}</h1><nav>{nav}</nav>{''.join(body)}"
        f"<script>{_asset('report.js')}</script></body></html>\n"
    )


def write_report(directory: str | Path) -> Path:
    """Render ``directory/analysis.json`` to ``directory/report.html``; returns its path."""
    from structlens.errors import InputError
    from structlens.results import atomic_write_bytes, read_json_object

    path = Path(directory) / "analysis.json"
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist; run `structlens analyze MODEL --out {directory}` first."
        )
    doc = read_json_object(path, "structlens analysis (JSON)")
    if not isinstance(doc.get("run"), dict) or "model" not in doc["run"]:
        raise InputError(
            f"{path} has no 'run' record naming the model, so `structlens analyze` did not "
            f"write it; run `structlens analyze MODEL --out {directory}` again."
        )
    out = Path(directory) / "report.html"
    atomic_write_bytes(out, render_html(_finite(doc)).encode("utf-8"))
    return out


def _finite(obj: Any) -> Any:
    """Non-finite floats (and their JSON spellings, see :func:`structlens.results.to_jsonable`)
    as ``None``; the preimage browser holds text, which is left alone."""
    if isinstance(obj, dict):
        return {k: v if k == "browser" else _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, str) and obj in ("nan", "inf", "-inf", "NaN", "Infinity", "-Infinity"):
        return None
    return obj

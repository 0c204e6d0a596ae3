"""Figures for interpretive equivalence: similarity heat maps with the matching drawn on them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from structlens.equivalence.compare import ComparisonResult, MatchedComponents
from structlens.report import save_figure


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_layer_matching(
    result: MatchedComponents | ComparisonResult,
    path: str | Path,
    *,
    label_a: str | None = None,
    label_b: str | None = None,
    title: str = "",
) -> Path:
    """Heat map of ``result.layer_similarity`` ``[layers_a, layers_b]`` with the matched layer
    pairs of ``result.matching["layers"]`` marked.

    Rows are layers of A, columns layers of B; each matched pair ``(a, b)`` gets a ring and
    the pairs are joined in depth order.  The rings of a :class:`ComparisonResult` whose
    layers were validated are green where the pair passed and red where it failed; otherwise
    they are white.  The axes are labelled ``label_a``/``label_b``, by default the models of
    a :class:`ComparisonResult` (``"model A"``/``"model B"`` for :class:`MatchedComponents`).
    """
    plt = _plt()
    s = np.asarray(result.layer_similarity, dtype=float)
    pairs = result.matching["layers"]["pairs"]
    passed: list[bool] | None = None
    names = ("model A", "model B")
    if isinstance(result, ComparisonResult):
        names = (result.model_a, result.model_b)
        if result.layer_validation:
            passed = [r["passed"] for r in result.layer_validation]
    label_a = names[0] if label_a is None else label_a
    label_b = names[1] if label_b is None else label_b
    la, lb = s.shape
    fig, ax = plt.subplots(figsize=(1.6 + 0.28 * lb, 1.2 + 0.28 * la))
    im = ax.imshow(s, cmap="viridis", vmin=min(0.0, float(np.nanmin(s))), vmax=1.0, aspect="auto")
    if pairs:
        pa = np.array([p[0] for p in pairs])
        pb = np.array([p[1] for p in pairs])
        order = np.argsort(pa)
        ax.plot(pb[order], pa[order], color="white", lw=0.8, alpha=0.7)
        colours = (
            ["white"] * len(pairs)
            if passed is None
            else ["#2ca02c" if ok else "#d62728" for ok in passed]
        )
        ax.scatter(pb, pa, s=60, facecolors="none", edgecolors=colours, linewidths=1.6)
    ax.set_xlabel(f"{label_b} layer")
    ax.set_ylabel(f"{label_a} layer")
    step_a, step_b = max(1, la // 12), max(1, lb // 12)
    ax.set_xticks(range(0, lb, step_b))
    ax.set_yticks(range(0, la, step_a))
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label="similarity")
    return save_figure(fig, path)

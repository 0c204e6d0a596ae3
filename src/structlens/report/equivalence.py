"""Figures for interpretive equivalence: similarity heat maps with the matching drawn on them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from structlens.report import save_figure


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_layer_matching(
    similarity: np.ndarray,
    pairs: Sequence[Sequence[int]],
    path: str | Path,
    *,
    label_a: str = "model A",
    label_b: str = "model B",
    title: str = "",
    passed: Sequence[bool] | None = None,
) -> Path:
    """Heat map of a ``[layers_a, layers_b]`` similarity matrix with matched pairs marked.

    Rows are layers of A, columns layers of B; each matched pair ``(a, b)`` gets a ring
    (green when its validation passed, red when it failed, white when not validated) and the
    pairs are joined in depth order.
    """
    plt = _plt()
    s = np.asarray(similarity, dtype=float)
    if s.ndim != 2:
        raise ValueError(f"similarity must be a 2-D [layers_a, layers_b] matrix, got {s.shape}.")
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

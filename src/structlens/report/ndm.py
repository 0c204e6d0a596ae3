"""Figures for NDM: patching effects per subspace (from
:class:`~structlens.ndm.evaluate.PatchRun`) and the merge history of training (from
:class:`~structlens.ndm.ndm.NDMResult`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from structlens.ndm.ndm import NDMResult
from structlens.report import save_figure


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_effect_heatmap(
    effects: Mapping[str, Sequence[float]], partition: Sequence[int], title: str, path: str | Path
) -> Path:
    """Heat map of the normalised effects of patching each subspace (method rows, subspace
    columns; 1 = the whole-space effect), ``effects[method]`` one value per subspace (e.g.
    :meth:`PatchRun.normalized_effects`), columns labelled with the subspace dimensions of
    ``partition``."""
    plt = _plt()
    methods = list(effects)
    data = np.array([effects[m] for m in methods], dtype=float)
    bound = max(1.0, float(np.nanmax(np.abs(data)))) if data.size else 1.0
    fig, ax = plt.subplots(figsize=(1.0 + 0.45 * data.shape[1], 0.6 + 0.45 * len(methods)))
    im = ax.imshow(data, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
    ax.set_yticks(range(len(methods)), methods)
    ax.set_xticks(
        range(len(partition)), [f"{s}\n{d}d" for s, d in enumerate(partition)], fontsize=7
    )
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label="effect / whole-space effect")
    return save_figure(fig, path)


def plot_merge_history(runs: Mapping[str, NDMResult], path: str | Path) -> Path:
    """Number of subspaces over training steps (merge rounds) and the loss curve, one
    :class:`NDMResult` per run (``runs[label]``); the loss is logged every
    ``config["log_interval"]`` steps."""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    for label, r in runs.items():
        hist = r.merge_history
        n0 = len(hist[0]["partition_before"]) if hist else len(r.partition)
        steps = [0] + [h["step"] for h in hist] + [r.steps]
        counts = [n0] + [len(h["partition_after"]) for h in hist] + [len(r.partition)]
        a.step(steps, counts, where="post", label=label)
        every = r.config["log_interval"]
        loss = r.loss_history
        b.plot(np.arange(1, len(loss) + 1) * every, loss, marker="o" if len(loss) < 20 else None)
    a.set_xlabel("step")
    a.set_ylabel("subspaces")
    a.set_title("merge history")
    b.set_xlabel("step")
    b.set_ylabel("mean neighbour distance")
    b.set_title("NDM loss")
    a.legend(fontsize=7)
    return save_figure(fig, path)


def plot_evaluation(doc: Mapping[str, Any], out: str | Path) -> list[Path]:
    """The effect heat map of every screened test of an ``ndm evaluate`` document (its
    ``effects`` and ``partition``), as ``out/effects-<test>.png``."""
    paths = []
    for test, e in doc["effects"].items():
        if e["screened"]:
            paths.append(
                plot_effect_heatmap(
                    {m: v["normalized"] for m, v in e["methods"].items()},
                    doc["partition"][str(e["layer"])],
                    f"{test} (layer {e['layer']}, {e['corruption']})",
                    Path(out) / f"effects-{test}.png",
                )
            )
    return paths

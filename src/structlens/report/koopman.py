"""Figures for the Koopman analysis (matplotlib, Agg backend; PNG files).

The entry points take results: :func:`plot_fit_spectra` (``EDMDcResult`` s),
:func:`plot_split_half_results` (``SplitHalfResult`` s) and :func:`plot_report` (a
``KoopmanReport``, whose ``results`` are the JSON summaries of its fits).  They draw through
the array-level :func:`plot_eigenvalues`, :func:`plot_split_half` and :func:`plot_ablation`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from structlens.koopman.convergence import SplitHalfResult  # noqa: E402
from structlens.koopman.edmdc import EDMDcResult  # noqa: E402
from structlens.report import save_figure  # noqa: E402

if TYPE_CHECKING:
    from structlens.koopman.experiment import KoopmanReport

__all__ = [
    "plot_ablation",
    "plot_eigenvalues",
    "plot_fit_spectra",
    "plot_report",
    "plot_split_half",
    "plot_split_half_results",
]


def plot_eigenvalues(
    spectra: Mapping[str, np.ndarray], path: str | Path, title: str = "Koopman spectrum"
) -> Path:
    """Eigenvalues of one or more operators on the complex plane, with the unit circle."""
    fig, ax = plt.subplots(figsize=(5, 5))
    t = np.linspace(0, 2 * np.pi, 400)
    ax.plot(np.cos(t), np.sin(t), color="0.6", lw=1, label="unit circle")
    for label, ev in spectra.items():
        ev = np.asarray(ev)
        ax.scatter(ev.real, ev.imag, s=12, label=label, alpha=0.8)
    ax.axhline(0, color="0.85", lw=0.5)
    ax.axvline(0, color="0.85", lw=0.5)
    ax.set_aspect("equal")
    ax.set_xlabel("Re λ")
    ax.set_ylabel("Im λ")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="best")
    return save_figure(fig, path)


def plot_split_half(
    curves: Mapping[str, tuple[np.ndarray, np.ndarray, float]],
    path: str | Path,
    title: str = "Split-half spectral distance",
) -> Path:
    """Log-log mean W∞ against per-half M; ``curves[label] = (M, w_inf_mean, slope)``.

    An M^{-1/2} reference line is drawn through the first curve's first point.
    """
    fig, ax = plt.subplots(figsize=(5.5, 4))
    first = True
    for label, (m, d, slope) in curves.items():
        m, d = np.asarray(m, float), np.asarray(d, float)
        ax.loglog(m, d, "o-", label=f"{label} (slope {slope:.2f})")
        if first:
            ax.loglog(m, d[0] * (m / m[0]) ** -0.5, "k--", lw=1, label="M^-1/2")
            first = False
    ax.set_xlabel("samples per half, M")
    ax.set_ylabel("mean W∞ between half spectra")
    ax.set_title(title)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def plot_ablation(
    rows: Sequence[tuple[str, Sequence[str], np.ndarray, np.ndarray]],
    path: str | Path,
    title: str = "IOI ablation at equal dimension",
) -> Path:
    """Grouped bars: ``rows`` of ``(group label, methods, means, cis (n, 2))``."""
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(rows) + 2), 4))
    methods = list(rows[0][1])
    width = 0.8 / len(methods)
    for j, meth in enumerate(methods):
        x = np.arange(len(rows)) + (j - (len(methods) - 1) / 2) * width
        means = np.array([r[2][j] for r in rows])
        ci = np.array([r[3][j] for r in rows])
        err = np.abs(ci.T - means)
        ax.bar(x, means, width, yerr=err, capsize=3, label=meth)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xticks(np.arange(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.set_ylabel("normalised logit-difference change")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_fit_spectra(
    fits: Mapping[str, EDMDcResult], path: str | Path, title: str = "Koopman spectrum"
) -> Path:
    """The eigenvalues of each fitted operator (``fits[label]``) on the complex plane, with
    the unit circle."""
    return plot_eigenvalues({label: r.eigenvalues for label, r in fits.items()}, path, title)


def plot_split_half_results(
    results: Mapping[str, SplitHalfResult],
    path: str | Path,
    title: str = "Split-half spectral distance",
) -> Path:
    """Log-log mean W∞ between the half spectra against per-half M, one curve per
    ``results[label]`` with its slope, and an M^{-1/2} reference line."""
    curves = {label: (r.n_samples, r.w_inf_mean, r.slope) for label, r in results.items()}
    return plot_split_half(curves, path, title)


def plot_report(report: KoopmanReport, out: str | Path) -> Path | None:
    """The figure of a :class:`~structlens.koopman.experiment.KoopmanReport` in ``out``:
    the spectra (``fit``), the split-half curves (``convergence``) or the IOI ablation bars
    (``modes``); ``None`` for the analyses without one."""
    out = Path(out)
    per_dict = []
    if report.analysis in ("fit", "convergence"):
        per_dict = [
            (f"L{k} {name}", e) for k, per in report.results.items() for name, e in per.items()
        ]
    if report.analysis == "fit":
        spectra = {k: np.array([complex(*z) for z in e["eigenvalues"]]) for k, e in per_dict}
        return plot_eigenvalues(spectra, out / "eigenvalues.png")
    if report.analysis == "convergence":
        curves = {
            k: (np.array(s["n_samples"]), np.array(s["w_inf_mean"]), s["slope"])
            for k, s in per_dict
        }
        return plot_split_half(curves, out / "split_half.png")
    if report.analysis == "modes":
        rows = []
        for label, r in report.results.items():
            rows.append((f"L{label}", r["methods"], np.array(r["mean"]), np.array(r["ci"])))
        return plot_ablation(rows, out / "ioi_ablation.png")
    return None

"""Figures for causal dimensionality.

* :func:`plot_width_sweep`: N_repr and N_causal of a
  :class:`~structlens.causal_dim.sweep.WidthSweepResult` against SAE width on log axes, with
  bootstrap bands and the saturating fits of N_causal.
* :func:`plot_spectrum`: eigenvalues of Σ (descending, log scale) of one
  :class:`~structlens.causal_dim.kappa.KappaResult` per layer; :func:`plot_spectra` draws the
  same from bare spectra (the ``causal-dim jacobian`` command, whose single-prompt runs have
  no jackknife and so no ``KappaResult``).
* :func:`plot_kappa_curve`: κ and κ_PR of Σ̂ against the number of residual vectors, one
  :class:`~structlens.causal_dim.kappa.KappaCurve` per layer.

The replication's markdown lives in :mod:`structlens.replication.causal_dim.render`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from structlens.causal_dim.kappa import KappaCurve, KappaResult
from structlens.causal_dim.sweep import WidthSweepResult
from structlens.report import save_figure
from structlens.stats.ranks import effective_ranks


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


def plot_width_sweep(sweep: WidthSweepResult, path: str | Path) -> Path:
    """N_repr and N_causal vs width (log–log) with their bootstrap bands and the fitted
    N_causal curves of ``sweep.fits``; a band is left out when its interval is not finite
    (no bootstrap)."""
    plt = _plt()
    w = np.asarray(sweep.widths, dtype=float)
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for y, ci, label, color in (
        (sweep.n_repr, sweep.n_repr_ci, "N_repr", "C0"),
        (sweep.n_causal, sweep.n_causal_ci, "N_causal", "C3"),
    ):
        ax.plot(w, np.asarray(y, dtype=float), "o-", color=color, label=label)
        band = np.asarray(ci, dtype=float)
        if band.shape == (2, w.size) and np.all(np.isfinite(band)):
            ax.fill_between(w, band[0], band[1], color=color, alpha=0.2)
    grid = np.geomspace(w.min(), w.max() * 4, 100)
    for (name, fit), style in zip(sweep.fits.items(), ("--", ":", "-."), strict=False):
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


def plot_spectra(spectra: Mapping[int, ArrayLike], path: str | Path) -> Path:
    """Eigenvalues of Σ = E[JᵀJ], descending, log scale, one curve per layer.

    ``spectra[layer]`` is that layer's spectrum (any order); each curve is labelled with the
    κ (erank) and κ_PR computed from it.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for layer, eigenvalues in spectra.items():
        lam = np.sort(np.asarray(eigenvalues, dtype=float))[::-1]
        ranks = effective_ranks(lam)
        ax.plot(
            np.arange(1, lam.size + 1),
            np.clip(lam, 1e-300, None),
            label=f"layer {layer} "
            f"(κ={ranks.entropy_effective_rank:.0f}, PR={ranks.participation_ratio:.0f})",
        )
    ax.set_yscale("log")
    ax.set_xlabel("index")
    ax.set_ylabel("eigenvalue of Σ")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def plot_spectrum(kappa: Mapping[int, KappaResult], path: str | Path) -> Path:
    """The spectrum of Σ̂ of each layer's :class:`KappaResult` (``kappa[layer]``), labelled
    with its κ and κ_PR (see :func:`plot_spectra`)."""
    return plot_spectra({layer: r.eigenvalues for layer, r in kappa.items()}, path)


def plot_kappa_curve(curves: Mapping[int, KappaCurve], path: str | Path) -> Path:
    """Few-vector bias: κ (erank) and κ_PR of Σ̂ from n random vectors with their standard
    deviations over subsets, one :class:`KappaCurve` per layer (``curves[layer]``)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for i, (layer, c) in enumerate(curves.items()):
        n = np.asarray(c.sizes, dtype=float)
        for y, sd, name, style in ((c.erank, c.erank_sd, "κ", "o-"), (c.pr, c.pr_sd, "κ_PR", "s:")):
            ax.errorbar(
                n,
                np.asarray(y),
                yerr=np.asarray(sd),
                fmt=style,
                color=f"C{i}",
                ms=3,
                lw=1,
                capsize=2,
                label=f"L{layer} {name}",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("residual vectors in Σ̂")
    ax.set_ylabel("effective rank")
    ax.legend(fontsize=6, ncol=2)
    return save_figure(fig, path)

"""Figures for causal dimensionality.

* :func:`plot_width_sweep`: N_repr and N_causal against SAE width on log axes, with bootstrap
  bands and the saturating fits of N_causal.
* :func:`plot_spectrum`: eigenvalues of Σ (descending, log scale) per layer.
* :func:`plot_kappa_curve`: κ and κ_PR of Σ̂ against the number of residual vectors.

The replication's markdown lives in :mod:`structlens.replication.causal_dim.render`.
"""

from __future__ import annotations

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

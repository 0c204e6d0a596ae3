"""κ from per-vector Jacobian Grams: point estimate, jackknife / bootstrap CIs and the
few-vector bias curve.

Input is a stack ``G`` [n, d, d] of per-residual-vector Grams ``G_i = J(x_i)ᵀ J(x_i)`` (one
row of :class:`structlens.causal_dim.EJOPAccumulator` per vector).  ``Σ̂ = mean_i G_i``; κ is the
entropy effective rank (Roy–Vetterli, ``exp`` of the Shannon entropy in nats of the normalised
eigenvalues of ``Σ̂``), κ_PR the participation ratio ``(Σλ)² / Σλ²``.

Uncertainty is over the sampled residual vectors only (the Jacobians themselves are exact):

* jackknife: leave-one-vector-out estimates, ``SE = sqrt((n−1)/n · Σ (κ_(i) − κ̄)²)``;
* bootstrap: ``n_bootstrap`` resamples of the ``n`` vectors with replacement, percentile CI.

Σ̂ ↦ κ is concave in the normalised spectrum, so κ(Σ̂_n) is biased low for small ``n`` and
rises towards κ(Σ) as ``n`` grows; :func:`kappa_curve` measures that by subsampling ``n' ≤ n``
vectors without replacement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from structlens.results import Result
from structlens.stats.ranks import CONVENTION, effective_ranks


def _stack(grams: np.ndarray | torch.Tensor | Sequence[np.ndarray]) -> np.ndarray:
    if isinstance(grams, torch.Tensor):
        grams = grams.detach().cpu().numpy()
    g = np.asarray(grams if isinstance(grams, np.ndarray) else np.stack(grams), dtype=np.float64)
    if g.ndim != 3 or g.shape[1] != g.shape[2]:
        raise ValueError(f"grams must be [n, d, d] (one Gram per vector), got shape {g.shape}.")
    if not np.all(np.isfinite(g)):
        raise ValueError("grams contain NaN or inf.")
    return g


def _ranks(sigma: np.ndarray) -> tuple[float, float]:
    r = effective_ranks(np.linalg.eigvalsh((sigma + sigma.T) / 2))
    return r.entropy_effective_rank, r.participation_ratio


@dataclasses.dataclass(frozen=True)
class KappaResult(Result):
    """κ (erank) and κ_PR of ``Σ̂ = mean_i G_i`` with jackknife SEs and bootstrap CIs.

    ``eigenvalues`` are those of ``Σ̂``, descending.  CIs are percentile intervals at level
    ``ci`` over ``n_bootstrap`` resamples of the vectors; they quantify vector sampling only
    and are centred on a biased-low estimate when ``n_vectors`` is small (see the module).
    """

    erank: float
    participation_ratio: float
    stable_rank: float
    numerical_rank: int
    kappa_over_d: float
    erank_se: float
    participation_ratio_se: float
    erank_ci: list
    participation_ratio_ci: list
    eigenvalues: np.ndarray
    d: int
    n_vectors: int
    n_bootstrap: int
    ci: float
    convention: str


def kappa_from_grams(
    grams: np.ndarray | torch.Tensor | Sequence[np.ndarray],
    *,
    n_bootstrap: int = 200,
    ci: float = 0.95,
    seed: int = 0,
) -> KappaResult:
    """Effective ranks of the mean Gram with jackknife SEs and bootstrap CIs.

    Parameters
    ----------
    grams : array [n, d, d]
        Per-vector ``JᵀJ`` (symmetric PSD), n ≥ 2.
    n_bootstrap : int
        Bootstrap resamples of the vectors (0 disables the CI; it is then ``[nan, nan]``).
    ci : float
        Two-sided CI level in (0, 1).
    seed : int
        Seeds the bootstrap.
    """
    g = _stack(grams)
    n, d, _ = g.shape
    if n < 2:
        raise ValueError(f"need at least 2 vectors for an error estimate, got {n}.")
    if n_bootstrap < 0 or not 0 < ci < 1:
        raise ValueError("n_bootstrap must be ≥ 0 and ci must lie in (0, 1).")
    total = g.sum(0)
    sigma = total / n
    lam = np.linalg.eigvalsh((sigma + sigma.T) / 2)[::-1]
    full = effective_ranks(lam)
    loo = np.array([_ranks((total - g[i]) / (n - 1)) for i in range(n)])
    se = np.sqrt((n - 1) / n * np.sum((loo - loo.mean(0)) ** 2, axis=0))
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(n_bootstrap):
        counts = np.bincount(rng.integers(0, n, n), minlength=n).astype(np.float64)
        boot.append(_ranks(np.tensordot(counts, g, axes=1) / n))
    alpha = 100 * (1 - ci) / 2
    if boot:
        lo, hi = np.percentile(np.array(boot), [alpha, 100 - alpha], axis=0)
    else:
        lo = hi = np.full(2, np.nan)
    return KappaResult(
        erank=full.entropy_effective_rank,
        participation_ratio=full.participation_ratio,
        stable_rank=full.stable_rank,
        numerical_rank=full.numerical_rank,
        kappa_over_d=full.entropy_effective_rank / d,
        erank_se=float(se[0]),
        participation_ratio_se=float(se[1]),
        erank_ci=[float(lo[0]), float(hi[0])],
        participation_ratio_ci=[float(lo[1]), float(hi[1])],
        eigenvalues=lam.copy(),
        d=d,
        n_vectors=n,
        n_bootstrap=n_bootstrap,
        ci=ci,
        convention=CONVENTION,
    )


def kappa_curve(
    grams: np.ndarray | torch.Tensor | Sequence[np.ndarray],
    sizes: Sequence[int],
    *,
    n_draws: int = 20,
    seed: int = 0,
) -> dict[str, list[float]]:
    """Few-vector bias: κ and κ_PR of ``Σ̂`` from random subsets of ``n'`` vectors.

    For each ``n'`` in ``sizes`` (``1 ≤ n' ≤ n``), ``n_draws`` subsets are drawn without
    replacement (one subset when ``n' = n``).  Returns ``sizes`` and the mean and standard
    deviation over draws of the erank and the participation ratio.
    """
    g = _stack(grams)
    n = g.shape[0]
    sizes = [int(s) for s in sizes]
    if not sizes or min(sizes) < 1 or max(sizes) > n:
        raise ValueError(f"sizes must be a non-empty list of integers in [1, {n}].")
    if n_draws < 1:
        raise ValueError("n_draws must be positive.")
    rng = np.random.default_rng(seed)
    out: dict[str, list[float]] = {k: [] for k in ("erank", "erank_sd", "pr", "pr_sd")}
    for s in sizes:
        vals = np.array(
            [
                _ranks(g[rng.choice(n, s, replace=False)].mean(0))
                for _ in range(1 if s == n else n_draws)
            ]
        )
        out["erank"].append(float(vals[:, 0].mean()))
        out["erank_sd"].append(float(vals[:, 0].std()))
        out["pr"].append(float(vals[:, 1].mean()))
        out["pr_sd"].append(float(vals[:, 1].std()))
    return {"sizes": [float(s) for s in sizes]} | out


__all__ = ["KappaResult", "kappa_curve", "kappa_from_grams"]

"""κ from per-vector Jacobian Grams: point estimate, a valid jackknife interval, the
few-vector bias curve and the doubling convergence rule.

Input is a stack ``G`` [n, d, d] of per-residual-vector Grams ``G_i = J(x_i)ᵀ J(x_i)`` (one
row of :class:`structlens.causal_dim.EJOPAccumulator` per vector).  ``Σ̂ = mean_i G_i``; κ is the
entropy effective rank (Roy–Vetterli, ``exp`` of the Shannon entropy in nats of the normalised
eigenvalues of ``Σ̂``), κ_PR the participation ratio ``(Σλ)² / Σλ²``.

Σ̂ ↦ κ is concave in the normalised spectrum, so the plug-in κ(Σ̂_n) is biased low by O(1/n)
and rises towards κ(Σ) as ``n`` grows.  That rules out the percentile bootstrap: a resample
with duplicated vectors has fewer distinct Grams, so its κ is lower still, and the interval
sits *below* the plug-in estimate (which itself is below κ(Σ)).  The interval used here is the
delete-one **jackknife**, which is valid for smooth functions of a mean:

* ``κ_(i)`` = κ without vector ``i``; ``SE = sqrt((n−1)/n · Σ (κ_(i) − κ̄)²)``;
* bias-corrected estimate ``κ_J = n·κ − (n−1)·κ̄`` (removes the O(1/n) bias);
* interval ``κ_J ± t_{n−1, (1+ci)/2} · SE``.

The interval targets κ(Σ), so when the plug-in bias exceeds the sampling error the plug-in κ
lies below it: the signal to add vectors.  :func:`doubling_ratio` /
:func:`kappa_until_converged` implement the rule "add vectors until κ(n)/κ(n/2) < 1.05";
:func:`kappa_curve` measures the bias curve by subsampling ``n' ≤ n`` vectors without
replacement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

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
    """κ (erank) and κ_PR of ``Σ̂ = mean_i G_i`` with jackknife SEs and intervals.

    ``erank``/``participation_ratio`` are the plug-in values of ``Σ̂``;
    ``erank_jackknife``/``participation_ratio_jackknife`` the bias-corrected estimates the
    intervals (``*_ci``, level ``ci``) are centred on (see the module docstring).
    ``ratio_last_doubling`` is ``κ(n) / κ(n/2)`` (:func:`doubling_ratio`); ``eigenvalues`` are
    those of ``Σ̂``, descending.
    """

    erank: float
    participation_ratio: float
    stable_rank: float
    numerical_rank: int
    kappa_over_d: float
    erank_se: float
    participation_ratio_se: float
    erank_jackknife: float
    participation_ratio_jackknife: float
    erank_ci: list
    participation_ratio_ci: list
    ratio_last_doubling: float
    eigenvalues: np.ndarray
    d: int
    n_vectors: int
    ci: float
    ci_method: str
    convention: str


def kappa_from_grams(
    grams: np.ndarray | torch.Tensor | Sequence[np.ndarray], *, ci: float = 0.95
) -> KappaResult:
    """Effective ranks of the mean Gram with jackknife SEs and bias-corrected intervals.

    Parameters
    ----------
    grams : array [n, d, d]
        Per-vector ``JᵀJ`` (symmetric PSD), n ≥ 2.
    ci : float
        Two-sided interval level in (0, 1).
    """
    from scipy.stats import t as student_t

    g = _stack(grams)
    n, d, _ = g.shape
    if n < 2:
        raise ValueError(f"need at least 2 vectors for an error estimate, got {n}.")
    if not 0 < ci < 1:
        raise ValueError(f"ci must lie in (0, 1), got {ci}.")
    total = g.sum(0)
    sigma = total / n
    lam = np.linalg.eigvalsh((sigma + sigma.T) / 2)[::-1]
    full = effective_ranks(lam)
    plug = np.array([full.entropy_effective_rank, full.participation_ratio])
    loo = np.array([_ranks((total - g[i]) / (n - 1)) for i in range(n)])
    se = np.sqrt((n - 1) / n * np.sum((loo - loo.mean(0)) ** 2, axis=0))
    corrected = n * plug - (n - 1) * loo.mean(0)
    half = float(student_t.ppf((1 + ci) / 2, n - 1)) * se
    return KappaResult(
        erank=full.entropy_effective_rank,
        participation_ratio=full.participation_ratio,
        stable_rank=full.stable_rank,
        numerical_rank=full.numerical_rank,
        kappa_over_d=full.entropy_effective_rank / d,
        erank_se=float(se[0]),
        participation_ratio_se=float(se[1]),
        erank_jackknife=float(corrected[0]),
        participation_ratio_jackknife=float(corrected[1]),
        erank_ci=[float(corrected[0] - half[0]), float(corrected[0] + half[0])],
        participation_ratio_ci=[float(corrected[1] - half[1]), float(corrected[1] + half[1])],
        ratio_last_doubling=doubling_ratio(g),
        eigenvalues=lam.copy(),
        d=d,
        n_vectors=n,
        ci=ci,
        ci_method="delete-one jackknife, bias-corrected, t interval",
        convention=CONVENTION,
    )


def doubling_ratio(grams: np.ndarray | torch.Tensor | Sequence[np.ndarray]) -> float:
    """``κ(n) / κ(n/2)`` for the last doubling of the number of vectors.

    ``κ(n/2)`` is the mean erank of the two disjoint halves (first ``⌊n/2⌋`` vectors and the
    next ``⌊n/2⌋``), so the ratio is deterministic.  Close to 1 once adding vectors no longer
    raises κ; since the plug-in bias is O(1/n), the ratio − 1 is about the relative bias left
    at ``n/2``.
    """
    g = _stack(grams)
    n = g.shape[0]
    if n < 2:
        raise ValueError(f"a doubling ratio needs at least 2 vectors, got {n}.")
    h = n // 2
    halves = [_ranks(g[:h].mean(0))[0], _ranks(g[h : 2 * h].mean(0))[0]]
    return float(_ranks(g.mean(0))[0] / np.mean(halves))


@dataclasses.dataclass(frozen=True)
class KappaConvergence(Result):
    """Outcome of :func:`kappa_until_converged`: the Grams used, the erank and doubling ratio
    after each doubling (``n_vectors``), and whether the last ratio fell below ``tolerance``."""

    grams: np.ndarray
    n_vectors: list
    erank: list
    ratios: list
    ratio_last_doubling: float
    converged: bool
    tolerance: float


def kappa_until_converged(
    draw: Callable[[int], np.ndarray | torch.Tensor],
    n_start: int,
    *,
    tolerance: float = 1.05,
    max_vectors: int = 4096,
) -> KappaConvergence:
    """Add vectors until ``κ(n) / κ(n/2) < tolerance`` (the convergence rule).

    ``draw(k)`` returns ``k`` new per-vector Grams ``[k, d, d]`` (exact, or sketched ones once
    validated against exact).  Starts with ``n_start`` vectors and doubles ``n`` until the
    ratio of the last doubling is below ``tolerance`` or ``n`` would exceed ``max_vectors``.
    """
    if n_start < 2 or max_vectors < n_start:
        raise ValueError(f"need 2 <= n_start <= max_vectors; got {n_start}, {max_vectors}.")
    if not tolerance > 1:
        raise ValueError(f"tolerance must exceed 1, got {tolerance}.")
    g = _stack(draw(n_start))
    sizes, eranks, ratios = [], [], []
    while True:
        ratio = doubling_ratio(g)
        sizes.append(int(g.shape[0]))
        eranks.append(_ranks(g.mean(0))[0])
        ratios.append(ratio)
        if ratio < tolerance or 2 * g.shape[0] > max_vectors:
            break
        g = np.concatenate([g, _stack(draw(g.shape[0]))])
    return KappaConvergence(
        grams=g,
        n_vectors=sizes,
        erank=eranks,
        ratios=ratios,
        ratio_last_doubling=ratios[-1],
        converged=ratios[-1] < tolerance,
        tolerance=tolerance,
    )


@dataclasses.dataclass(frozen=True)
class KappaCurve(Result):
    """Outcome of :func:`kappa_curve`: for each subset size in ``sizes`` (floats, ascending as
    given), the mean (``erank``, ``pr``) and standard deviation (``erank_sd``, ``pr_sd``) over
    random subsets of κ (erank) and κ_PR of ``Σ̂``."""

    sizes: list
    erank: list
    erank_sd: list
    pr: list
    pr_sd: list


def kappa_curve(
    grams: np.ndarray | torch.Tensor | Sequence[np.ndarray],
    sizes: Sequence[int],
    *,
    n_draws: int = 20,
    seed: int = 0,
) -> KappaCurve:
    """Few-vector bias: κ and κ_PR of ``Σ̂`` from random subsets of ``n'`` vectors.

    For each ``n'`` in ``sizes`` (``1 ≤ n' ≤ n``), ``n_draws`` subsets are drawn without
    replacement (one subset when ``n' = n``).  Returns the mean and standard deviation over
    draws of the erank and the participation ratio per size (:class:`KappaCurve`).
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
    return KappaCurve(sizes=[float(s) for s in sizes], **out)


__all__ = [
    "KappaConvergence",
    "KappaCurve",
    "KappaResult",
    "doubling_ratio",
    "kappa_curve",
    "kappa_from_grams",
    "kappa_until_converged",
]

"""Invariance residual of a dictionary (how far span Ψ is from K-invariant) and its
differentiable penalty for SAE training.

Per feature ``f`` the residual is one minus the *out-of-sample* R² of the one-step EDMDc
regression: ``r_f = E_test (ψ_f(y) − ψ̂_f(y))² / Var_test ψ_f(y)``, with ``ψ̂`` fitted on the
training prompts.  0 = the feature's next-layer value is a linear function of the lifted state
and control (invariant); 1 = no better than the test mean.  Aggregates: ``pooled`` =
Σ SSE / Σ SST (a variance-weighted mean — features that carry more activation variance count
more), plus the plain mean and median over live features.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from structlens.koopman.dictionaries import Dictionary
from structlens.koopman.edmdc import (
    EDMDc,
    EDMDcConfig,
    EDMDcStatistics,
    _moments,
    _solve_operator,
    control_basis,
)
from structlens.results import Result


@dataclass(frozen=True)
class InvarianceResidual(Result):
    """Per-feature out-of-sample ``1 − R²`` and its aggregates (see module docstring).

    ``per_feature`` is NaN for dead features (zero test variance), counted in ``n_dead``.
    """

    per_feature: np.ndarray
    pooled: float
    mean: float
    median: float
    n_dead: int
    n_train: int
    n_test: int


def invariance_residual(
    train: EDMDcStatistics, test: EDMDcStatistics, config: EDMDcConfig
) -> InvarianceResidual:
    """Out-of-sample one-step residual of every dictionary feature, from statistics only."""
    V = control_basis(train, config)[0]
    K, _ = _solve_operator(train, config, V)
    N = train.n_features
    T = np.zeros((N + train.n_controls, N + V.shape[1]))
    T[:N, :N] = np.eye(N)
    T[N:, N:] = V
    czz, czy, mz_te, my_te = _moments(test.zy, config.center)
    _, _, mz_tr, my_tr = _moments(train.zy, config.center)
    G, H = T.T @ czz @ T, T.T @ czy
    if config.center:
        var_raw = test.zy.s_bb_diag / test.n
    else:
        var_raw = test.zy.s_bb_diag / test.n + test.zy.mean_b**2
    delta = (my_te - my_tr) - K @ (T.T @ (mz_te - mz_tr))
    sse = var_raw - 2 * np.einsum("fi,if->f", K, H) + np.einsum("fi,ij,fj->f", K, G, K)
    sse = np.maximum(sse, 0.0) + delta**2
    sst = test.zy.s_bb_diag / test.n
    live = sst > 1e-12 * max(float(sst.max()), 1e-300)
    r = np.full(N, np.nan)
    r[live] = sse[live] / sst[live]
    return InvarianceResidual(
        per_feature=r,
        pooled=float(sse[live].sum() / sst[live].sum()),
        mean=float(np.mean(r[live])),
        median=float(np.median(r[live])),
        n_dead=int((~live).sum()),
        n_train=train.n,
        n_test=test.n,
    )


def invariance_residual_split(
    dictionary: Dictionary,
    X: Any,
    U: Any,
    Y: Any,
    prompt_ids: Any,
    config: EDMDcConfig | None = None,
    *,
    seed: int = 0,
) -> InvarianceResidual:
    """Invariance residual with a random 50/50 split *by prompt* (train on one half)."""
    config = config or EDMDcConfig()
    train, test = EDMDc(dictionary, config).statistics(X, U, Y, prompt_ids, n_blocks=2, seed=seed)
    if train.n == 0 or test.n == 0:
        raise ValueError("the prompt split left one half empty; pass more than one prompt.")
    return invariance_residual(train, test, config)


def invariance_penalty(
    psi_x: Any, psi_y: Any, u: Any, alpha: float = 1e-3, reduction: str = "pooled"
) -> Any:
    """Differentiable in-batch invariance residual for training a dictionary (e.g. an SAE).

    Fits the centred ridge regression ``ψ(y) ≈ A ψ(x) + B u`` on the batch in closed form
    (``torch.linalg.solve``; α relative to the mean variance of ``[ψ(x), u]``) and returns
    ``Σ_f SSE_f / Σ_f SST_f`` (``reduction="pooled"``) or the mean of per-feature ratios
    (``"mean"``).  Gradients flow through the solve into ``psi_x`` and ``psi_y``; add
    ``λ · invariance_penalty(...)`` to the SAE loss.  Rows are samples; needs more rows than
    ``n_features + n_controls``.  It is an in-sample residual, so it is biased low for small
    batches; report :func:`invariance_residual` on held-out prompts.
    """
    import torch

    if reduction not in ("pooled", "mean"):
        raise ValueError(f"reduction must be 'pooled' or 'mean', got {reduction!r}.")
    if psi_x.shape != psi_y.shape or psi_x.shape[0] != u.shape[0] or psi_x.ndim != 2:
        raise ValueError(
            f"need psi_x, psi_y of equal shape (m, N) and u of shape (m, r); got "
            f"{tuple(psi_x.shape)}, {tuple(psi_y.shape)}, {tuple(u.shape)}."
        )
    m = psi_x.shape[0]
    z = torch.cat([psi_x, u.to(psi_x.dtype)], dim=1)
    if m <= z.shape[1]:
        raise ValueError(f"batch of {m} rows is too small for {z.shape[1]} regressors.")
    zc = z - z.mean(0, keepdim=True)
    yc = psi_y - psi_y.mean(0, keepdim=True)
    G = zc.T @ zc / m
    G = G + alpha * torch.trace(G) / G.shape[0] * torch.eye(G.shape[0], dtype=G.dtype)
    K = torch.linalg.solve(G, zc.T @ yc / m)
    sse = ((yc - zc @ K) ** 2).sum(0)
    sst = (yc**2).sum(0)
    if reduction == "pooled":
        return sse.sum() / sst.sum().clamp_min(1e-12)
    return (sse / sst.clamp_min(1e-12)).mean()

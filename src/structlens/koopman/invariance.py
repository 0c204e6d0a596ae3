"""Invariance residual of a dictionary (how far span Ψ is from K-invariant) and its
differentiable penalty for SAE training.

Per feature ``f`` the residual is one minus the *out-of-sample* R² of the one-step EDMDc
regression: ``r_f = E_test (ψ_f(y) − ψ̂_f(y))² / Var_test ψ_f(y)``, with ``ψ̂`` fitted on the
training prompts.  0 = the feature's next-layer value is a linear function of the lifted state
and control (invariant); 1 = no better than the test mean.  Aggregates: ``pooled`` =
Σ SSE / Σ SST (a variance-weighted mean — features that carry more activation variance count
more), plus the plain mean and median over live features.

No held-out row reaches a fit: :func:`invariance_residual_split` splits the rows by prompt
*first*, fits (a copy of) the dictionary on the training prompts only — PCA directions, RFF
bandwidths and the spectral dictionary's eigenfunctions are all data-dependent — and scores the
held-out prompts.  The result records ``dictionary_fit_split = "train"``.
"""

from __future__ import annotations

import copy
import dataclasses
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
from structlens.stats.robust import block_assignment


@dataclass(frozen=True)
class InvarianceResidual(Result):
    """Per-feature out-of-sample ``1 − R²`` and its aggregates (see module docstring).

    ``per_feature`` is NaN for dead features (zero test variance), counted in ``n_dead``.
    ``dictionary_fit_split`` says which rows fitted the dictionary (``"train"``: the training
    prompts only; ``"given"``: statistics were passed in, so the caller decided).
    """

    per_feature: np.ndarray
    pooled: float
    mean: float
    median: float
    n_dead: int
    n_train: int
    n_test: int
    dictionary_fit_split: str = "given"
    n_train_prompts: int = 0
    n_test_prompts: int = 0


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
        var_raw = test.zy.s_yy / test.n
    else:
        var_raw = test.zy.s_yy / test.n + test.zy.mean_y**2
    delta = (my_te - my_tr) - K @ (T.T @ (mz_te - mz_tr))
    # diag(K G Kᵀ) through one GEMM: a three-operand einsum loops in C without BLAS, which
    # took minutes at N ≈ 2,000 lifted features.
    sse = var_raw - 2 * np.einsum("fi,if->f", K, H) + np.einsum("fi,fi->f", K @ G, K)
    sse = np.maximum(sse, 0.0) + delta**2
    sst = test.zy.s_yy / test.n
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


def prompt_split(prompt_ids: Any, seed: int = 0) -> np.ndarray:
    """Boolean mask of the *held-out* rows of a seeded 50/50 split by prompt.

    Every row of a prompt falls on the same side (a seeded hash of the prompt id, the same
    assignment as ``accumulate(..., n_blocks=2, seed=seed)``: block 1 is held out).
    """
    ids = np.asarray(prompt_ids)
    if ids.ndim != 1:
        raise ValueError(f"prompt_ids must be 1-D (one id per row); got shape {ids.shape}.")
    return block_assignment(ids, 2, seed) == 1


def fit_on_rows(dictionary: Dictionary, X: Any, U: Any, Y: Any, rows: np.ndarray) -> Dictionary:
    """A copy of ``dictionary`` fitted on ``X[rows]`` (and ``U``, ``Y``) only; the argument is
    left unchanged.  A pre-trained SAE dictionary is returned as is (its fit is a no-op), so it
    must have been trained on training prompts (:func:`prompt_split`)."""
    rows = np.asarray(rows)
    fresh = copy.deepcopy(dictionary)
    return fresh.fit(np.asarray(X)[rows], np.asarray(U)[rows], np.asarray(Y)[rows])


def select_sae_features(dictionary: Any, X: Any, n: int, rule: str = "variance") -> Any:
    """A copy of an SAE dictionary restricted to ``n`` of its latents, for comparing
    dictionaries at equal size N (the invariance gap depends on how they are chosen).

    ``rule``: ``"variance"`` (largest variance of the code over the rows of ``X``) or
    ``"frequency"`` (fires on the most rows).  Ties go to the lower index.  Each kept latent
    is still computed by the whole SAE (TopK competition included).  Choose on training
    prompts (:func:`prompt_split`) so the held-out score stays held out.
    """
    from structlens.koopman.dictionaries import SAEDictionary

    if not isinstance(dictionary, SAEDictionary) or dictionary.include_state:
        raise ValueError("select_sae_features needs an SAEDictionary without include_state.")
    if rule not in ("variance", "frequency"):
        raise ValueError(f"rule must be 'variance' or 'frequency', got {rule!r}.")
    full = copy.deepcopy(dictionary)
    full.features = None
    codes = full.transform(X)
    if not 1 <= n <= codes.shape[1]:
        raise ValueError(f"n must be in [1, {codes.shape[1]}], got {n}.")
    score = codes.var(axis=0) if rule == "variance" else (codes > 0).mean(axis=0)
    full.features = np.sort(np.argsort(-score, kind="stable")[:n])
    return full


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
    """Invariance residual with a random 50/50 split *by prompt*.

    The dictionary is (re)fitted on the training prompts only (:func:`fit_on_rows`; the
    ``dictionary`` passed in, fitted or not, is not modified), the operator is fitted on the
    training prompts, and the residual is measured on the held-out prompts.
    """
    config = config or EDMDcConfig()
    ids = np.asarray(prompt_ids)
    if ids.shape != (len(X),):
        raise ValueError(f"prompt_ids must have shape ({len(X)},); got {ids.shape}.")
    test = prompt_split(ids, seed)
    if test.all() or not test.any():
        raise ValueError("the prompt split left one half empty; pass more than one prompt.")
    fitted = fit_on_rows(dictionary, X, U, Y, ~test)
    est = EDMDc(fitted, config)
    X, U, Y = np.asarray(X), np.asarray(U), np.asarray(Y)
    train_stats = est.statistics(X[~test], U[~test], Y[~test])[0]
    test_stats = est.statistics(X[test], U[test], Y[test])[0]
    res = invariance_residual(train_stats, test_stats, config)
    return dataclasses.replace(
        res,
        dictionary_fit_split="train",
        n_train_prompts=int(np.unique(ids[~test]).size),
        n_test_prompts=int(np.unique(ids[test]).size),
    )


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


def train_sae_dictionary(
    X: np.ndarray,
    U: np.ndarray | None = None,
    Y: np.ndarray | None = None,
    *,
    d_sae: int,
    k: int,
    invariance_weight: float = 0.0,
    control_rank: int = 16,
    epochs: int = 3,
    batch_size: int = 256,
    lr: float = 1e-3,
    seed: int = 0,
) -> tuple[Any, dict[str, Any]]:
    """Train a TopK SAE on states ``X`` and return it as a frozen :class:`SAEDictionary`.

    With ``invariance_weight = λ > 0`` every step adds ``λ · invariance_penalty(f(x), f(y),
    ũ)`` for the batch's paired next states ``Y`` and controls ``U`` (``ũ``: ``U`` projected on
    its top ``control_rank`` principal components, so that a batch has more rows than
    regressors), which pushes the span of the codes towards one the depth map keeps invariant.
    States are divided by their RMS scale for training and the scale is folded back into the
    encoder, so the dictionary acts on raw states.  Rows are samples; deterministic under
    ``seed``.

    Returns the dictionary and ``{"d_sae", "k", "invariance_weight", "final_fvu", "dead",
    "decoder"}``; ``decoder`` is the ``(d_sae, d)`` array of unit decoder directions, for
    comparing runs (:func:`decoder_agreement`).
    """
    import torch

    from structlens.koopman.dictionaries import SAEDictionary
    from structlens.sae import SAETrainConfig
    from structlens.sae.train import SAETrainer

    X = np.asarray(X, dtype=np.float64)
    if invariance_weight < 0:
        raise ValueError(f"invariance_weight must be >= 0, got {invariance_weight}.")
    if invariance_weight > 0:
        if U is None or Y is None:
            raise ValueError("an invariance penalty needs the paired controls U and next states Y.")
        if batch_size <= d_sae + control_rank:
            raise ValueError(
                f"batch_size={batch_size} must exceed d_sae + control_rank = "
                f"{d_sae + control_rank} for the in-batch regression of the penalty."
            )
    if X.ndim != 2 or len(X) < batch_size:
        raise ValueError(f"X must be (n, d) with n >= batch_size={batch_size}; got {X.shape}.")
    scale = float(np.sqrt(np.mean(np.sum((X - X.mean(0)) ** 2, axis=1)) / X.shape[1]))
    xs = torch.as_tensor(X / scale, dtype=torch.float32)
    if invariance_weight > 0:
        assert U is not None  # checked above
        Uc = np.asarray(U, dtype=np.float64) - np.mean(U, axis=0)
        basis = np.linalg.svd(Uc[:: max(1, len(Uc) // 20_000)], full_matrices=False)[2]
        us = torch.as_tensor(Uc @ basis[:control_rank].T / scale, dtype=torch.float32)
        ys = torch.as_tensor(np.asarray(Y, dtype=np.float64) / scale, dtype=torch.float32)
    cfg = SAETrainConfig(architecture="topk", d_sae=d_sae, k=k, seed=seed, lr=lr)
    torch.manual_seed(seed)
    trainer = SAETrainer(cfg, X.shape[1])
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(xs), generator=gen)
        for s in range(0, len(xs) - batch_size + 1, batch_size):
            idx = perm[s : s + batch_size]
            extra = None
            if invariance_weight > 0:

                def extra(sae, idx=idx):
                    fx, fy = sae.encode(xs[idx]), sae.encode(ys[idx])
                    return invariance_weight * invariance_penalty(fx, fy, us[idx])

            trainer.step(xs[idx], extra_loss=extra)
    tr = trainer.result()
    sae = tr.sae
    dictionary = SAEDictionary(
        sae.W_enc.detach().double().numpy() / scale,
        sae.b_enc.detach().double().numpy(),
        sae.b_dec.detach().double().numpy() * scale,
        activation="topk",
        k=k,
    )
    dec = sae.W_dec.detach().double().numpy()
    info = {
        "d_sae": d_sae,
        "k": k,
        "invariance_weight": invariance_weight,
        "final_fvu": tr.final_fvu,
        "dead": tr.dead_fraction,
        "decoder": dec / np.linalg.norm(dec, axis=1, keepdims=True).clip(1e-12),
    }
    return dictionary, info


def decoder_agreement(a: np.ndarray, b: np.ndarray, threshold: float = 0.9) -> dict[str, float]:
    """How well two SAEs' decoder directions match one to one (run-to-run variability).

    ``a``, ``b``: ``(m, d)`` decoder directions (rows).  Features are paired by the assignment
    that maximises the total ``|cos|`` (Hungarian), so sign flips and order do not matter.
    Returns the mean and median matched ``|cos|`` and the share of pairs above ``threshold``.
    """
    from scipy.optimize import linear_sum_assignment

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(f"need two (m, d) arrays of equal shape; got {a.shape} and {b.shape}.")
    na = a / np.linalg.norm(a, axis=1, keepdims=True).clip(1e-12)
    nb = b / np.linalg.norm(b, axis=1, keepdims=True).clip(1e-12)
    cos = np.abs(na @ nb.T)
    rows, cols = linear_sum_assignment(cos, maximize=True)
    matched = cos[rows, cols]
    return {
        "mean_cos": float(matched.mean()),
        "median_cos": float(np.median(matched)),
        "share_above": float(np.mean(matched > threshold)),
        "threshold": threshold,
    }

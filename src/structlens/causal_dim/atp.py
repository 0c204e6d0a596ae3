"""Attribution patching (AtP) over SAE features, with the SAE spliced in with its error term.

Splice: ``h' = f(h) @ W_dec + b_dec + ε``, ``ε = (h − x̂(h))`` detached, so ``h' = h`` and every
gradient downstream is unchanged, while ``∂L/∂f_i = ⟨W_dec[i], ∇_h L⟩`` (the SAELens
``use_error_term`` identity).  Hence one backward pass to the residual gives ``g = ∇_h L`` and
AtP for **every** SAE of a width sweep at that site.

Sign convention
---------------
AtP estimates the change of the metric when feature ``i`` is zero-ablated at one token:
``Δ_i ≈ (0 − f_i)·∂L/∂f_i = −f_i ⟨W_dec[i], g⟩`` (positive = ablation increases the metric).
Per-feature scores are ``AtP_i = mean over tokens of |Δ_i|`` (tokens where the feature does
not fire contribute 0), the paper's ``E[|∂L/∂f_i · f_i|]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import torch

from structlens.results import Result
from structlens.sae.models import SparseAutoencoder


def _check_pair(sae: SparseAutoencoder, acts: torch.Tensor, grads: torch.Tensor) -> None:
    if acts.ndim != 2 or acts.shape != grads.shape:
        raise ValueError(
            f"acts and grads must both be [n_tokens, d_in] with the same shape; got "
            f"{tuple(acts.shape)} and {tuple(grads.shape)}."
        )
    if acts.shape[1] != sae.d_in:
        raise ValueError(f"activations have d = {acts.shape[1]}, the SAE has d_in = {sae.d_in}.")
    if not (torch.isfinite(acts).all() and torch.isfinite(grads).all()):
        raise ValueError("acts or grads contain NaN or inf.")


def splice_with_error(sae: SparseAutoencoder, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(h', f)`` with ``h' = f @ W_dec + b_dec + stop_grad(h − x̂)`` and ``f`` a leaf.

    ``h'`` equals ``h`` (to round-off) and backpropagating a loss of ``h'`` fills ``f.grad`` with
    ``∂L/∂f = ∇_{h'} L @ W_decᵀ``.  Gradients also flow to ``h`` through nothing: use ``h'`` as
    the replacement activation in the model hook.
    """
    with torch.no_grad():
        f = sae.encode(h)
        err = h - sae.decode(f)
    f = f.detach().requires_grad_(True)
    return sae.decode(f) + err, f


@torch.no_grad()
def sparse_feature_atp(
    sae: SparseAutoencoder, acts: torch.Tensor, grads: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-(token, active feature) zero-ablation AtP ``−f_i ⟨W_dec[i], g⟩``.

    Returns ``(tokens, features, atp)``: only entries with ``f_i > 0`` (others are exactly 0),
    computed with a gather instead of the dense ``[n, d_sae]`` product.
    """
    _check_pair(sae, acts, grads)
    acts = acts.to(sae.W_dec.dtype)
    grads = grads.to(sae.W_dec.dtype)
    f = sae.encode(acts)
    tok, feat = torch.nonzero(f > 0, as_tuple=True)
    dots = (sae.W_dec[feat] * grads[tok]).sum(-1)
    return tok, feat, -f[tok, feat] * dots


@torch.no_grad()
def feature_atp(sae: SparseAutoencoder, acts: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    """Dense ``[n_tokens, d_sae]`` zero-ablation AtP ``−f_i ⟨W_dec[i], g⟩`` (see module doc)."""
    tok, feat, atp = sparse_feature_atp(sae, acts, grads)
    out = torch.zeros(acts.shape[0], sae.d_sae, dtype=atp.dtype)
    out[tok, feat] = atp
    return out


@torch.no_grad()
def exact_zero_ablation(
    sae: SparseAutoencoder,
    acts: torch.Tensor,
    metric: Callable[[torch.Tensor], torch.Tensor],
    features: Sequence[int],
) -> torch.Tensor:
    """Exact effect of zero-ablating each feature in ``features``, SAE spliced with error.

    ``metric(h)`` maps residuals ``[n, d_in]`` to a per-token metric ``[n]`` (the lead builds it
    by patching the site and running the model).  With the error term, ablating ``i`` means
    ``h − f_i W_dec[i]``; returns ``[n, len(features)]`` of ``metric(h_ablated) − metric(h)``.
    """
    if acts.ndim != 2 or acts.shape[1] != sae.d_in:
        raise ValueError(f"acts must be [n, {sae.d_in}], got {tuple(acts.shape)}.")
    feats = torch.as_tensor(list(features), dtype=torch.long)
    if feats.numel() == 0 or feats.min() < 0 or feats.max() >= sae.d_sae:
        raise ValueError(f"features must be a non-empty list of indices in [0, {sae.d_sae}).")
    acts = acts.to(sae.W_dec.dtype)
    f = sae.encode(acts)
    base = metric(acts)
    if base.shape != (acts.shape[0],):
        raise ValueError(f"metric must return one value per token, got {tuple(base.shape)}.")
    out = torch.empty(acts.shape[0], feats.numel(), dtype=base.dtype)
    for j, i in enumerate(feats.tolist()):
        out[:, j] = metric(acts - f[:, i : i + 1] * sae.W_dec[i]) - base
    return out


@dataclasses.dataclass(frozen=True)
class AtPVerification(Result):
    """AtP against exact zero-ablation on a subset of features.

    ``spearman`` / ``pearson`` compare the per-feature scores ``mean_t |Δ|``;
    ``spearman_signed`` compares the per-(token, feature) signed effects.
    """

    features: np.ndarray
    atp_scores: np.ndarray
    exact_scores: np.ndarray
    spearman: float
    pearson: float
    spearman_signed: float
    n_tokens: int


def verify_atp(
    sae: SparseAutoencoder,
    acts: torch.Tensor,
    grads: torch.Tensor,
    metric: Callable[[torch.Tensor], torch.Tensor],
    features: Sequence[int],
) -> AtPVerification:
    """Rank-correlate AtP with exact zero-ablation on ``features`` (``grads = ∇_h metric``)."""
    from scipy.stats import pearsonr, spearmanr

    feats = list(features)
    if len(feats) < 3:
        raise ValueError("need at least 3 features for a rank correlation.")
    approx = feature_atp(sae, acts, grads)[:, feats].double()
    exact = exact_zero_ablation(sae, acts, metric, feats).double()
    a, e = approx.abs().mean(0).numpy(), exact.abs().mean(0).numpy()
    return AtPVerification(
        features=np.asarray(feats),
        atp_scores=a,
        exact_scores=e,
        spearman=float(spearmanr(a, e).statistic),
        pearson=float(pearsonr(a, e).statistic),
        spearman_signed=float(spearmanr(approx.reshape(-1), exact.reshape(-1)).statistic),
        n_tokens=int(acts.shape[0]),
    )

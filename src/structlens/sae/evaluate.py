"""SAE evaluation: FVU / explained variance, L0, dead fraction, CE loss recovered.

Conventions
-----------
* ``FVU = Σ_t ‖x_t − x̂_t‖² / Σ_t ‖x_t − x̄‖²`` with ``x̄`` the per-dimension mean over all
  evaluation tokens (SAELens ``explained_variance = 1 − FVU``).  Sums are float64 and use
  Chan's mergeable mean/variance update, so shards merge exactly.
* ``L0`` = mean number of features with ``f_i > 0`` per token.
* A feature is *dead* on the evaluation set if it fires on fewer than ``min_count`` tokens
  (``min_count = 1``: never fires); the per-feature counts are kept for N_repr.
* CE loss recovered (SAELens ``ce_loss_score``):
  ``(CE_ablated − CE_sae) / (CE_ablated − CE_clean)``; 1 = as good as the clean model,
  0 = as bad as zero-ablating the site.  When ablating the site does not change the loss
  (``|CE_ablated − CE_clean|`` within :data:`CE_TIE_TOLERANCE` of the losses' size) the
  ratio is undefined: it is NaN and ``undefined_reason`` says why, rather than an error,
  because width sweeps compute it for every SAE after the expensive part is done and the
  other metrics remain valid.
* Constant evaluation data (zero variance in every column) has no variance to explain, so
  FVU is undefined: :meth:`SAEEvalAccumulator.result` raises
  :class:`~structlens.errors.DegenerateInputError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np
import torch

from structlens.errors import DegenerateInputError
from structlens.results import Result
from structlens.sae.models import SparseAutoencoder
from structlens.sae.train import CONSTANT_SPREAD
from structlens.stats.moments import ColumnMoments


@dataclasses.dataclass(frozen=True)
class SAEEvalResult(Result):
    """Reconstruction and sparsity metrics on an evaluation stream.

    Attributes
    ----------
    fvu, explained_variance, mse : float
        ``mse`` is ``mean_t ‖x − x̂‖²`` (summed over dimensions).
    l0 : float
    dead_fraction : float
        Fraction of features firing on fewer than ``min_count`` tokens.
    feature_counts : np.ndarray
        ``[d_sae]`` number of tokens on which each feature fired.
    n_tokens, min_count : int
    """

    fvu: float
    explained_variance: float
    mse: float
    l0: float
    dead_fraction: float
    feature_counts: np.ndarray
    n_tokens: int
    min_count: int


class SAEEvalAccumulator:
    """Streaming, mergeable evaluation of one SAE."""

    def __init__(self, sae: SparseAutoencoder) -> None:
        self.sae = sae
        self.inputs = ColumnMoments(sae.d_in, order=2)  # Σ‖x − x̄‖² = inputs.m2.sum()
        self.sse = 0.0
        self.active = 0.0
        self.counts = torch.zeros(sae.d_sae, dtype=torch.int64)

    @property
    def n(self) -> int:
        return self.inputs.n

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> SAEEvalAccumulator:
        """Fold a batch of inputs in; returns ``self``."""
        if x.ndim != 2 or x.shape[1] != self.sae.d_in:
            raise ValueError(f"evaluation batches must be [n, {self.sae.d_in}], got {x.shape}.")
        if not torch.isfinite(x).all():
            raise ValueError("evaluation batch contains NaN or inf.")
        xd = x.to(self.sae.W_dec.dtype)
        f = self.sae.encode(xd)
        recon = self.sae.decode(f)
        fired = f > 0
        self.sse += float((recon - xd).double().pow(2).sum())
        self.active += float(fired.sum())
        self.counts += fired.sum(0)
        self.inputs.update(x)
        return self

    def merge(self, other: SAEEvalAccumulator) -> SAEEvalAccumulator:
        """Fold ``other`` into ``self`` in place and return ``self``."""
        self.inputs.merge(other.inputs)
        self.sse += other.sse
        self.active += other.active
        self.counts = self.counts + other.counts
        return self

    def result(self, min_count: int = 1) -> SAEEvalResult:
        if self.n < 2:
            raise ValueError("need at least 2 evaluation tokens.")
        if min_count < 1:
            raise ValueError("min_count must be ≥ 1.")
        m2 = float(self.inputs.m2.sum())
        size = m2 + self.n * float(np.square(self.inputs.mean).sum())  # Σ‖x‖²
        if not m2 > CONSTANT_SPREAD**2 * size:  # rows identical up to float64 rounding
            raise DegenerateInputError(
                f"the {self.n} evaluation tokens are constant (every column has zero "
                "variance), so the fraction of variance unexplained is undefined: evaluate on "
                "more varied prompts or another site."
            )
        fvu = self.sse / m2
        return SAEEvalResult(
            fvu=fvu,
            explained_variance=1 - fvu,
            mse=self.sse / self.n,
            l0=self.active / self.n,
            dead_fraction=float((self.counts < min_count).double().mean()),
            feature_counts=self.counts.numpy(),
            n_tokens=self.n,
            min_count=min_count,
        )


def evaluate_sae(
    sae: SparseAutoencoder, batches: Iterable[torch.Tensor] | torch.Tensor, *, min_count: int = 1
) -> SAEEvalResult:
    """FVU, L0 and dead fraction of ``sae`` on ``[n, d_in]`` batches."""
    acc = SAEEvalAccumulator(sae)
    for x in [batches] if isinstance(batches, torch.Tensor) else batches:
        acc.update(x)
    return acc.result(min_count)


#: Relative size (of ``max(|CE_clean|, |CE_ablated|, 1)``) below which the clean and ablated
#: losses count as equal and CE loss recovered as undefined: float32 means over a few
#: thousand tokens differ by ~1e-7 relative from rounding alone.
CE_TIE_TOLERANCE = 1e-6


@dataclasses.dataclass(frozen=True)
class CELossResult(Result):
    """Cross-entropy with the site clean, replaced by the SAE, and zero-ablated.

    ``ce_loss_recovered`` is NaN exactly when ``undefined_reason`` is set: the ablation did
    not change the loss, so there is no gap for the SAE to recover.
    """

    ce_clean: float
    ce_sae: float
    ce_ablated: float
    ce_loss_recovered: float
    ablation: str
    undefined_reason: str | None = None


def ce_loss_recovered(
    sae: SparseAutoencoder,
    run_with_replacement: Callable[[Callable[[torch.Tensor], torch.Tensor] | None], float],
    *,
    ablation: str = "zero",
    mean_activation: torch.Tensor | None = None,
) -> CELossResult:
    """CE loss recovered when ``sae`` is spliced into a model.

    ``run_with_replacement(fn)`` must run the model on the evaluation tokens with the site's
    activation ``a`` [..., d_in] replaced by ``fn(a)`` (``fn = None``: clean run) and return the
    mean next-token cross-entropy in nats.  The lead builds it from the model hooks.
    ``ablation`` is ``"zero"`` or ``"mean"`` (needs ``mean_activation`` [d_in]).
    """
    if ablation == "zero":

        def ablate(a: torch.Tensor) -> torch.Tensor:
            return torch.zeros_like(a)
    elif ablation == "mean":
        if mean_activation is None or mean_activation.shape != (sae.d_in,):
            raise ValueError(f"mean ablation needs mean_activation of shape [{sae.d_in}].")

        def ablate(a: torch.Tensor) -> torch.Tensor:
            return mean_activation.to(a).expand_as(a)
    else:
        raise ValueError(f"ablation must be 'zero' or 'mean', got {ablation!r}.")

    def through_sae(a: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return sae(a.to(sae.W_dec.dtype)).to(a.dtype)

    clean = float(run_with_replacement(None))
    with_sae = float(run_with_replacement(through_sae))
    ablated = float(run_with_replacement(ablate))
    if not all(np.isfinite([clean, with_sae, ablated])):
        raise ValueError("run_with_replacement returned a non-finite loss.")
    denom = ablated - clean
    reason = None
    if abs(denom) <= CE_TIE_TOLERANCE * max(abs(clean), abs(ablated), 1.0):
        reason = (
            f"{ablation}-ablating the site leaves the loss unchanged (clean {clean:.6g}, "
            f"ablated {ablated:.6g} nats), so there is no loss gap for the SAE to recover; "
            "the site does not affect these tokens' predictions: evaluate on other tokens "
            "or another site."
        )
    return CELossResult(
        ce_clean=clean,
        ce_sae=with_sae,
        ce_ablated=ablated,
        ce_loss_recovered=float("nan") if reason else (ablated - with_sae) / denom,
        ablation=ablation,
        undefined_reason=reason,
    )


if TYPE_CHECKING:  # the roles of structlens.estimator, checked by mypy
    from structlens.estimator import Statistics

    _SAEEvalAccumulator: type[Statistics] = SAEEvalAccumulator

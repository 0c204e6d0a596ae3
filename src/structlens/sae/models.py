"""Sparse autoencoder architectures as ``torch.nn.Module``.

Conventions (shared with SAELens so weights move both ways without transposes in user code):

* inputs are rows: ``x`` has shape ``[..., d_in]``; codes ``f`` have shape ``[..., d_sae]``;
* ``W_enc`` is ``[d_in, d_sae]``, ``W_dec`` is ``[d_sae, d_in]`` (row ``i`` = decoder direction
  of feature ``i``), ``b_enc`` is ``[d_sae]``, ``b_dec`` is ``[d_in]``;
* ``pre = (x − b_dec·apply_b_dec_to_input) @ W_enc + b_enc``; ``x̂ = f @ W_dec + b_dec``.

The encoder is stored as ``W_enc_t`` (``[d_sae, d_in]``, contiguous) and exposed as the view
``W_enc``: the sparse backward kernels read encoder rows, and this layout makes them contiguous.

Architectures (``architecture`` is the SAELens name written to ``cfg.json``):

* :class:`ReLUSAE` (``"standard"``): ``f = relu(pre)``, L1 penalty ``λ Σ_i f_i ‖W_dec[i]‖``.
* :class:`TopKSAE` (``"topk"``): keep the ``k`` largest pre-activations per row, then ReLU;
  AuxK loss (Gao et al. 2024) on dead features.
* :class:`BatchTopKSAE` (saved as ``"jumprelu"``): keep the ``k·B`` largest over the batch in
  training; at inference ``f = relu(pre)·[pre > θ]`` with one global threshold ``θ`` (an EMA of
  the smallest kept activation), which is exactly a JumpReLU with a constant threshold.
* :class:`JumpReLUSAE` (``"jumprelu"``): ``f = pre·[pre > θ_i]``, trained with the
  straight-through pseudo-gradient of Rajamanoharan et al. (2024) and an L0 penalty.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from structlens.sae.sparse import (
    GatherPreacts,
    batch_topk_pattern,
    masked_topk_pattern,
    sparse_decode,
    topk_pattern,
)


@dataclass
class TrainingOutput:
    """What one training forward pass produces.

    ``loss`` is the differentiable total; ``mse`` is ``mean_b Σ_d (x̂ − x)²`` (SAELens's
    reconstruction loss); ``l0`` is the mean number of active features per row (a float64
    0-d tensor where computing it needs no host synchronisation, else a float); ``fired``
    counts how often each feature was active in the batch (for dead-feature tracking).
    """

    loss: torch.Tensor
    mse: torch.Tensor
    sparsity_loss: torch.Tensor
    aux_loss: torch.Tensor
    l0: float | torch.Tensor
    fired: torch.Tensor


def _check_input(x: torch.Tensor, d_in: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"SAE input must be a torch.Tensor, got {type(x).__name__}.")
    if x.shape[-1] != d_in:
        raise ValueError(
            f"SAE input has last dimension {x.shape[-1]} but the SAE expects d_in = {d_in}; "
            "check the site the activations came from."
        )


class SparseAutoencoder(nn.Module):
    """Base class: parameters, encode/decode, and the shared dense training pass."""

    architecture: ClassVar[str] = ""

    def __init__(
        self,
        d_in: int,
        d_sae: int,
        *,
        apply_b_dec_to_input: bool = True,
        dtype: torch.dtype = torch.float32,
        seed: int | None = None,
        decoder_init_norm: float = 1.0,
    ) -> None:
        super().__init__()
        if d_in < 1 or d_sae < 1:
            raise ValueError(f"d_in and d_sae must be positive, got {d_in} and {d_sae}.")
        self.d_in = int(d_in)
        self.d_sae = int(d_sae)
        self.apply_b_dec_to_input = bool(apply_b_dec_to_input)
        gen = torch.Generator().manual_seed(0 if seed is None else seed)
        w = torch.randn(d_sae, d_in, generator=gen, dtype=torch.float64)
        w *= decoder_init_norm / w.norm(dim=1, keepdim=True)
        # Tied initialisation (encoder = decoderᵀ) is the TopK/Anthropic recipe and avoids
        # early dead features for every architecture here.
        self.W_dec = nn.Parameter(w.to(dtype).clone())
        self.W_enc_t = nn.Parameter(w.to(dtype).clone())
        self.b_enc = nn.Parameter(torch.zeros(d_sae, dtype=dtype))
        self.b_dec = nn.Parameter(torch.zeros(d_in, dtype=dtype))

    @property
    def W_enc(self) -> torch.Tensor:
        """Encoder in SAELens layout ``[d_in, d_sae]`` (a view of ``W_enc_t``)."""
        return self.W_enc_t.t()

    def sae_in(self, x: torch.Tensor) -> torch.Tensor:
        return x - self.b_dec if self.apply_b_dec_to_input else x

    def preacts(self, x: torch.Tensor) -> torch.Tensor:
        """Encoder pre-activations ``[..., d_sae]``."""
        _check_input(x, self.d_in)
        s = self.sae_in(x.to(self.W_dec.dtype))
        return torch.nn.functional.linear(s, self.W_enc_t, self.b_enc)

    def activation(self, pre: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations ``f`` (dense, ``[..., d_sae]``, nonnegative)."""
        return self.activation(self.preacts(x))

    def decode(self, f: torch.Tensor) -> torch.Tensor:
        """Reconstruction ``f @ W_dec + b_dec``."""
        if f.shape[-1] != self.d_sae:
            raise ValueError(f"codes have {f.shape[-1]} features, the SAE has {self.d_sae}.")
        return torch.nn.functional.linear(f, self.W_dec.t(), self.b_dec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x))

    def active_mask(self, pre: torch.Tensor) -> torch.Tensor:
        """Which features fire for given pre-activations (``f_i > 0``; JumpReLU: ``pre > θ``)."""
        return self.activation(pre) > 0

    def training_output(
        self, x: torch.Tensor, dead_mask: torch.Tensor | None, coefficient: float
    ) -> TrainingOutput:
        """One training forward pass; ``coefficient`` scales the sparsity penalty."""
        raise NotImplementedError

    @torch.no_grad()
    def normalize_decoder(self) -> None:
        """Project decoder rows back onto the unit sphere (the training constraint).

        After :meth:`remove_parallel_decoder_grad` an optimiser step moves the norms only at
        second order, so the encoder is left alone; use :meth:`fold_decoder_norms` to rescale
        an arbitrary decoder while keeping the function.
        """
        self.W_dec.div_(self.W_dec.norm(dim=1, keepdim=True).clamp_min(1e-12))

    @torch.no_grad()
    def fold_decoder_norms(self) -> None:
        """Make decoder rows unit norm and scale encoder rows so ``x̂`` is unchanged."""
        norms = self.W_dec.norm(dim=1, keepdim=True).clamp_min(1e-12)
        self._rescale_thresholds(norms.squeeze(1))
        self.W_dec.div_(norms)
        self.W_enc_t.mul_(norms)
        self.b_enc.mul_(norms.squeeze(1))

    def _rescale_thresholds(self, norms: torch.Tensor) -> None:
        """Hook for architectures with thresholds on pre-activations."""

    @torch.no_grad()
    def remove_parallel_decoder_grad(self) -> None:
        """Project out the radial part of the decoder gradient (unit-norm constraint)."""
        if self.W_dec.grad is None:
            return
        parallel = (self.W_dec.grad * self.W_dec).sum(dim=1, keepdim=True)
        self.W_dec.grad.sub_(parallel * self.W_dec)

    def _gather(
        self,
        s: torch.Tensor,
        pre: torch.Tensor,
        rows: torch.Tensor,
        cols: torch.Tensor,
        offsets: torch.Tensor,
    ) -> torch.Tensor:
        """Differentiable ``pre[rows, cols]`` (w.r.t. encoder weights and ``b_dec``)."""
        return GatherPreacts.apply(
            s.detach(),
            self.W_enc_t,
            self.b_enc,
            self.b_dec if self.apply_b_dec_to_input else None,
            pre,
            rows,
            cols,
            offsets,
        )

    def _sparse_pass(
        self,
        x: torch.Tensor,
        s: torch.Tensor,
        pre: torch.Tensor,
        pattern: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        cols, offsets, rows = pattern
        vals = self._gather(s, pre, rows, cols, offsets).relu()
        recon = sparse_decode(cols, offsets, vals, self.W_dec) + self.b_dec
        fired = torch.bincount(cols[vals.detach() > 0], minlength=self.d_sae)
        return recon, vals, cols, fired


class ReLUSAE(SparseAutoencoder):
    """ReLU SAE with the decoder-norm-weighted L1 penalty ``λ·mean_b Σ_i f_i ‖W_dec[i]‖``.

    Training switches to the sparse kernels once fewer than ``sparse_density`` of the
    pre-activations are positive; the gradient is identical either way.
    """

    architecture: ClassVar[str] = "standard"
    sparse_density: ClassVar[float] = 0.03

    def activation(self, pre: torch.Tensor) -> torch.Tensor:
        return torch.relu(pre)

    def training_output(
        self, x: torch.Tensor, dead_mask: torch.Tensor | None, coefficient: float
    ) -> TrainingOutput:
        s = self.sae_in(x)
        # One encoder GEMM with grad; the sparse path reads it detached and leaves the dense
        # graph unused (no backward runs through it).
        pre = torch.nn.functional.linear(s, self.W_enc_t, self.b_enc)
        positive = pre.detach() > 0
        nnz = int(positive.sum())
        dec_norms = self.W_dec.norm(dim=1)
        if nnz < self.sparse_density * positive.numel():
            rows, cols = torch.nonzero(positive, as_tuple=True)
            counts = torch.bincount(rows, minlength=x.shape[0])
            offsets = torch.cumsum(counts, 0) - counts
            recon, vals, cols, fired = self._sparse_pass(x, s, pre.detach(), (cols, offsets, rows))
            l1 = (vals * dec_norms[cols]).sum() / x.shape[0]
        else:
            f = torch.relu(pre)
            recon = torch.addmm(self.b_dec, f, self.W_dec)
            l1 = (f @ dec_norms).mean()
            fired = positive.sum(0)
        mse = (recon - x).pow(2).sum(-1).mean()
        zero = mse.new_zeros(())
        return TrainingOutput(
            loss=mse + coefficient * l1,
            mse=mse,
            sparsity_loss=l1,
            aux_loss=zero,
            l0=nnz / x.shape[0],
            fired=fired,
        )


class TopKSAE(SparseAutoencoder):
    """TopK SAE: ``f = relu(topk_k(pre))`` (SAELens ``"topk"``, sparsify ``SparseCoder``).

    Parameters
    ----------
    k : int
        Active features per row.
    aux_k : int | None
        Dead features used by the AuxK loss (default ``d_in // 2``, Gao et al.).
    """

    architecture: ClassVar[str] = "topk"

    def __init__(self, d_in: int, d_sae: int, k: int, *, aux_k: int | None = None, **kw) -> None:
        super().__init__(d_in, d_sae, **kw)
        if not 1 <= k <= d_sae:
            raise ValueError(f"k must be in [1, d_sae = {d_sae}], got {k}.")
        self.k = int(k)
        self.aux_k = int(aux_k) if aux_k is not None else max(1, d_in // 2)

    def activation(self, pre: torch.Tensor) -> torch.Tensor:
        top = pre.topk(self.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter_(-1, top.indices, top.values.relu())

    def _pattern(self, pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return topk_pattern(pre, self.k)

    def training_output(
        self, x: torch.Tensor, dead_mask: torch.Tensor | None, coefficient: float
    ) -> TrainingOutput:
        s = self.sae_in(x)
        with torch.no_grad():
            pre = torch.nn.functional.linear(s, self.W_enc_t, self.b_enc)
        recon, vals, _, fired = self._sparse_pass(x, s, pre, self._pattern(pre))
        err = recon - x
        mse = err.pow(2).sum(-1).mean()
        aux = mse.new_zeros(())
        n_dead = int(dead_mask.sum()) if dead_mask is not None else 0
        if dead_mask is not None and n_dead > 0 and coefficient > 0:
            k_aux = min(self.aux_k, n_dead)
            scale = min(n_dead / self.aux_k, 1.0)
            cols, offsets, rows = masked_topk_pattern(pre, dead_mask, k_aux)
            avals = self._gather(s, pre, rows, cols, offsets).relu()
            arecon = sparse_decode(cols, offsets, avals, self.W_dec)
            # Dead features learn to predict what the live ones miss (residual is detached).
            aux = scale * (arecon + err.detach()).pow(2).sum(-1).mean()
        return TrainingOutput(
            loss=mse + coefficient * aux,
            mse=mse,
            sparsity_loss=mse.new_zeros(()),
            aux_loss=aux,
            l0=(vals.detach() > 0).sum().double() / x.shape[0],  # stays on the device
            fired=fired,
        )


class BatchTopKSAE(TopKSAE):
    """BatchTopK SAE (Bussmann et al. 2024): ``k·B`` activations per batch of ``B`` rows.

    At inference (``encode``) it is a JumpReLU with one global threshold ``threshold``, an EMA
    (rate ``threshold_beta``) of the smallest kept positive activation in each training batch.
    """

    architecture: ClassVar[str] = "jumprelu"
    threshold: torch.Tensor  # a buffer

    def __init__(
        self, d_in: int, d_sae: int, k: int, *, threshold_beta: float = 0.99, **kw
    ) -> None:
        super().__init__(d_in, d_sae, k, **kw)
        self.threshold_beta = float(threshold_beta)
        self.register_buffer("threshold", torch.full((), float("nan"), dtype=self.W_dec.dtype))

    def activation(self, pre: torch.Tensor) -> torch.Tensor:
        if torch.isnan(self.threshold):
            raise ValueError(
                "this BatchTopK SAE has no inference threshold yet; train it first "
                "(the threshold is learned during training)."
            )
        return torch.relu(pre) * (pre > self.threshold)

    def _pattern(self, pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cols, offsets, rows = batch_topk_pattern(pre, self.k)
        kept = pre[rows, cols]
        kept = kept[kept > 0]
        if kept.numel():
            low = kept.min().to(self.threshold.dtype)
            if torch.isnan(self.threshold):
                self.threshold.copy_(low)
            else:
                self.threshold.mul_(self.threshold_beta).add_((1 - self.threshold_beta) * low)
        return cols, offsets, rows

    def _rescale_thresholds(self, norms: torch.Tensor) -> None:
        # A single global threshold cannot follow per-feature rescaling; unit-norm training
        # keeps norms ≈ 1, so this only matters for user-modified decoders.
        if not torch.allclose(norms, torch.ones_like(norms), atol=1e-3):
            raise ValueError(
                "cannot fold non-uniform decoder norms into BatchTopK's single global threshold."
            )


def _rectangle(z: torch.Tensor) -> torch.Tensor:
    return ((z > -0.5) & (z < 0.5)).to(z.dtype)


class _JumpReLU(torch.autograd.Function):
    """``pre·[pre > θ]`` with the straight-through pseudo-gradient for ``θ``."""

    @staticmethod
    def forward(ctx, pre, theta, bandwidth):
        ctx.save_for_backward(pre, theta)
        ctx.bandwidth = bandwidth
        return pre * (pre > theta)

    @staticmethod
    def backward(ctx, grad):
        pre, theta = ctx.saved_tensors
        bw = ctx.bandwidth
        grad_pre = grad * (pre > theta)
        grad_theta = (-(theta / bw) * _rectangle((pre - theta) / bw) * grad).reshape(
            -1, theta.shape[-1]
        )
        return grad_pre, grad_theta.sum(0), None


class _Step(torch.autograd.Function):
    """Heaviside ``[pre > θ]`` whose pseudo-gradient reaches only ``θ``."""

    @staticmethod
    def forward(ctx, pre, theta, bandwidth):
        ctx.save_for_backward(pre, theta)
        ctx.bandwidth = bandwidth
        return (pre > theta).to(pre.dtype)

    @staticmethod
    def backward(ctx, grad):
        pre, theta = ctx.saved_tensors
        bw = ctx.bandwidth
        grad_theta = (-(1.0 / bw) * _rectangle((pre - theta) / bw) * grad).reshape(
            -1, theta.shape[-1]
        )
        return None, grad_theta.sum(0), None


class JumpReLUSAE(SparseAutoencoder):
    """JumpReLU SAE: ``f_i = pre_i·[pre_i > θ_i]``, ``θ = exp(log_threshold)``.

    Trained with loss ``mse + λ·mean_b Σ_i [pre_i > θ_i]`` and rectangle-kernel pseudo-gradients
    of width ``bandwidth`` (Rajamanoharan et al. 2024).
    """

    architecture: ClassVar[str] = "jumprelu"

    def __init__(
        self,
        d_in: int,
        d_sae: int,
        *,
        bandwidth: float = 0.05,
        init_threshold: float = 0.01,
        **kw,
    ) -> None:
        super().__init__(d_in, d_sae, **kw)
        if bandwidth <= 0 or init_threshold <= 0:
            raise ValueError("bandwidth and init_threshold must be positive.")
        self.bandwidth = float(bandwidth)
        self.log_threshold = nn.Parameter(
            torch.full((d_sae,), math.log(init_threshold), dtype=self.W_dec.dtype)
        )

    @property
    def threshold(self) -> torch.Tensor:
        return self.log_threshold.exp()

    def activation(self, pre: torch.Tensor) -> torch.Tensor:
        theta = self.threshold
        return torch.relu(pre) * (pre > theta)

    def training_output(
        self, x: torch.Tensor, dead_mask: torch.Tensor | None, coefficient: float
    ) -> TrainingOutput:
        s = self.sae_in(x)
        pre = torch.nn.functional.linear(s, self.W_enc_t, self.b_enc)
        theta = self.threshold
        f = _JumpReLU.apply(pre, theta, self.bandwidth)
        recon = torch.addmm(self.b_dec, f, self.W_dec)
        mse = (recon - x).pow(2).sum(-1).mean()
        l0_loss = _Step.apply(pre, theta, self.bandwidth).sum(-1).mean()
        active = f.detach() != 0
        return TrainingOutput(
            loss=mse + coefficient * l0_loss,
            mse=mse,
            sparsity_loss=l0_loss,
            aux_loss=mse.new_zeros(()),
            l0=float(active.sum()) / x.shape[0],
            fired=active.sum(0),
        )

    def _rescale_thresholds(self, norms: torch.Tensor) -> None:
        self.log_threshold.add_(norms.log())


class Transcoder(nn.Module):
    """A sparse dictionary that reads one site and writes another (a transcoder).

    ``pre = x @ W_enc + b_enc`` (``x`` at ``input_site``, rows), ``f = σ(pre)`` with the
    ``activation`` of the SAE architectures above (``"jumprelu"``: ``relu(pre)·[pre > θ_i]``,
    ``"topk"``: ``relu(topk_k(pre))``, ``"standard"``: ``relu(pre)``), and the prediction of
    the activation at ``output_site``
    ``ŷ = f @ W_dec + b_dec (+ x @ W_skip for a skip transcoder)``.  ``W_enc`` is
    ``[d_in, d_sae]``, ``W_dec`` ``[d_sae, d_out]`` (row ``i`` = feature ``i``'s write
    direction), ``b_dec`` ``[d_out]``, ``W_skip`` ``[d_in, d_out]``.  An input-side bias, where
    a format has one, is folded into ``b_enc`` when it is read.  For inference only: no
    training pass.
    """

    def __init__(
        self,
        d_in: int,
        d_sae: int,
        d_out: int,
        *,
        activation: str = "jumprelu",
        k: int | None = None,
        skip: bool = False,
        input_site: str | None = None,
        output_site: str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if min(d_in, d_sae, d_out) < 1:
            raise ValueError(f"d_in, d_sae and d_out must be positive, got {d_in, d_sae, d_out}.")
        if activation not in ("jumprelu", "topk", "standard"):
            raise ValueError(f"unknown activation {activation!r}; use jumprelu, topk or standard.")
        if activation == "topk" and (k is None or not 1 <= k <= d_sae):
            raise ValueError(f"a TopK transcoder needs k in [1, {d_sae}], got {k}.")
        self.d_in, self.d_sae, self.d_out = int(d_in), int(d_sae), int(d_out)
        self.architecture = activation
        self.k = int(k) if k is not None else None
        self.input_site, self.output_site = input_site, output_site
        self.W_enc = nn.Parameter(torch.zeros(d_in, d_sae, dtype=dtype))
        self.b_enc = nn.Parameter(torch.zeros(d_sae, dtype=dtype))
        self.W_dec = nn.Parameter(torch.zeros(d_sae, d_out, dtype=dtype))
        self.b_dec = nn.Parameter(torch.zeros(d_out, dtype=dtype))
        self.threshold = nn.Parameter(torch.zeros(d_sae, dtype=dtype))
        self.W_skip = nn.Parameter(torch.zeros(d_in, d_out, dtype=dtype)) if skip else None

    def preacts(self, x: torch.Tensor) -> torch.Tensor:
        """Encoder pre-activations ``[..., d_sae]``."""
        _check_input(x, self.d_in)
        return x.to(self.W_enc.dtype) @ self.W_enc + self.b_enc

    def activation(self, pre: torch.Tensor) -> torch.Tensor:
        if self.architecture == "jumprelu":
            return torch.relu(pre) * (pre > self.threshold)
        if self.architecture == "topk":
            top = pre.topk(int(self.k or 0), dim=-1, sorted=False)
            return torch.zeros_like(pre).scatter_(-1, top.indices, top.values.relu())
        return torch.relu(pre)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations ``f`` (dense, ``[..., d_sae]``, nonnegative)."""
        return self.activation(self.preacts(x))

    def decode(self, f: torch.Tensor) -> torch.Tensor:
        """``f @ W_dec + b_dec`` (without the skip term, which needs the input)."""
        if f.shape[-1] != self.d_sae:
            raise ValueError(f"codes have {f.shape[-1]} features, the transcoder has {self.d_sae}.")
        return f @ self.W_dec + self.b_dec

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The predicted output-site activation ``ŷ`` for inputs ``x``."""
        out = self.decode(self.encode(x))
        if self.W_skip is not None:
            out = out + x.to(self.W_skip.dtype) @ self.W_skip
        return out

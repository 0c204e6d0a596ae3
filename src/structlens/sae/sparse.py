"""Sparse kernels for SAE training on the CPU.

A sparse code is held as a *ragged row-major* triple ``(cols, offsets, values)``: row ``b``
owns ``cols[offsets[b]:offsets[b+1]]`` (``offsets`` has one entry per row, the start of each
row, as ``torch.nn.functional.embedding_bag`` expects).  TopK codes have ``k`` entries per row;
BatchTopK codes have a variable number.  Decoding is one ``embedding_bag`` call (``n·d`` work
instead of the dense ``B·m·d``), and :class:`GatherPreacts` gives the selected encoder
pre-activations a backward pass whose cost is ``n·d`` instead of ``B·m·d`` (``n`` = number of
stored entries), which is where the speed over dense autograd comes from.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def topk_pattern(pre: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row top-``k`` of ``pre`` [B, m] → ``(cols, offsets, rows)`` of the ragged pattern."""
    b = pre.shape[0]
    cols = pre.topk(k, dim=1, sorted=False).indices.reshape(-1)
    offsets = torch.arange(0, b * k, k, device=pre.device)
    rows = torch.arange(b, device=pre.device).repeat_interleave(k)
    return cols, offsets, rows


def batch_topk_pattern(
    pre: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top ``k·B`` entries of ``pre`` [B, m] over the whole batch, as a row-sorted pattern."""
    b, m = pre.shape
    flat = pre.reshape(-1).topk(min(k * b, b * m), sorted=False).indices.sort().values
    rows = torch.div(flat, m, rounding_mode="floor")
    cols = flat - rows * m
    counts = torch.bincount(rows, minlength=b)
    offsets = torch.cumsum(counts, 0) - counts
    return cols, offsets, rows


def masked_topk_pattern(
    pre: torch.Tensor, mask: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row top-``k`` of ``pre`` restricted to columns where ``mask`` is true (AuxK)."""
    sub = pre[:, mask]
    cols_sub, offsets, rows = topk_pattern(sub, k)
    cols = torch.nonzero(mask).squeeze(1)[cols_sub]
    return cols, offsets, rows


def sparse_decode(
    cols: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor, W_dec: torch.Tensor
) -> torch.Tensor:
    """``Σ_j values_j · W_dec[cols_j]`` per row, differentiable in ``values`` and ``W_dec``."""
    return F.embedding_bag(cols, W_dec, offsets, mode="sum", per_sample_weights=values)


class GatherPreacts(torch.autograd.Function):
    """Selected entries of ``pre = x @ W_encᵀ + b_enc`` with a sparse backward.

    ``forward(x, W_enc_t, b_enc, pre, rows, cols, offsets)`` returns ``pre[rows, cols]``
    (already computed densely without grad); the backward gives
    ``∂/∂x = Gᵀ-decode`` (one ``embedding_bag``), ``∂/∂W_enc_t = Gᵀ x`` (a sparse-dense
    product) and ``∂/∂b_enc = column sums of G``, where ``G`` is the sparse upstream gradient.
    ``W_enc_t`` is the encoder in ``[d_sae, d_in]`` layout.
    """

    @staticmethod
    def forward(ctx, x, W_enc_t, b_enc, pre, rows, cols, offsets):  # type: ignore[override]
        ctx.save_for_backward(x, W_enc_t, rows, cols, offsets)
        return pre[rows, cols]

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        x, W_enc_t, rows, cols, offsets = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = F.embedding_bag(
                cols, W_enc_t, offsets, mode="sum", per_sample_weights=grad.to(W_enc_t.dtype)
            )
        if ctx.needs_input_grad[1]:
            # COO [d_sae, B] times dense [B, d_in]: the n·d sparse product, never B·m·d.
            g = torch.sparse_coo_tensor(
                torch.stack([cols, rows]),
                grad,
                (W_enc_t.shape[0], x.shape[0]),
                check_invariants=False,
            )
            grad_w = torch.sparse.mm(g, x)
        if ctx.needs_input_grad[2]:
            grad_b = torch.zeros(W_enc_t.shape[0], dtype=grad.dtype, device=grad.device)
            grad_b.index_add_(0, cols, grad)
        return grad_x, grad_w, grad_b, None, None, None, None

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
    """Selected entries of ``pre = s @ W_encᵀ + b_enc``, ``s = x − b_dec``, with a sparse backward.

    ``forward(s, W_enc_t, b_enc, b_dec, pre, rows, cols, offsets)`` returns ``pre[rows, cols]``
    (``pre`` was computed densely without grad; ``s`` is detached data; ``b_dec`` is None when
    it is not subtracted from the input).  With ``G`` the sparse upstream gradient the backward
    gives ``∂/∂W_enc_t = Gᵀ s`` (a sparse-dense product, ``n·d`` work), ``∂/∂b_enc = c``, the
    column sums of ``G``, and ``∂/∂b_dec = −c @ W_enc_t`` (``m·d`` work: the ``[B, d]`` input
    gradient is never formed).  ``W_enc_t`` is the encoder in ``[d_sae, d_in]`` layout.
    """

    @staticmethod
    def forward(ctx, s, W_enc_t, b_enc, b_dec, pre, rows, cols, offsets):
        ctx.save_for_backward(s, W_enc_t, rows, cols)
        return pre[rows, cols]

    @staticmethod
    def backward(ctx, grad):
        s, W_enc_t, rows, cols = ctx.saved_tensors
        grad_w = grad_b = grad_b_dec = None
        if ctx.needs_input_grad[1]:
            # COO [d_sae, B] times dense [B, d_in]: the n·d sparse product, never B·m·d.
            g = torch.sparse_coo_tensor(
                torch.stack([cols, rows]),
                grad,
                (W_enc_t.shape[0], s.shape[0]),
                check_invariants=False,
            )
            grad_w = torch.sparse.mm(g, s)
        colsum = torch.zeros(W_enc_t.shape[0], dtype=grad.dtype, device=grad.device)
        colsum.index_add_(0, cols, grad)
        if ctx.needs_input_grad[2]:
            grad_b = colsum
        if ctx.needs_input_grad[3]:
            grad_b_dec = -(colsum @ W_enc_t)
        return None, grad_w, grad_b, grad_b_dec, None, None, None, None

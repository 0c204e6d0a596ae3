"""Matrix exponential with a gradient computed from ``n x n`` products only.

PyTorch differentiates ``exp(W)`` by exponentiating the ``2n x 2n`` block matrix
``[[W^T, G], [0, W^T]]``, whose upper-right block is the Fréchet derivative ``L(W^T, G)`` (the
gradient for an upstream gradient ``G``).  Each ``2n`` product costs eight ``n`` products, and
the scaling is chosen from the norm of the whole block matrix, so a large ``G`` adds
squarings.  Here the same block-triangular matrix is kept as its two blocks ``(D, U)``: a
product of two costs three ``n x n`` products (``(D1 D2, D1 U2 + U1 D2)``), and the scaling
depends on ``W`` alone, since ``L`` is linear in ``G``.  The forward pass is PyTorch's.
"""

from __future__ import annotations

import math
from typing import Any

import torch

DEGREE = 15
"""Degree of the Taylor approximant of the Fréchet derivative (Paterson–Stockmeyer in powers
of ``X^4``: three products for ``X^2, X^3, X^4`` and three Horner steps)."""

_BLOCK = 4
_COEFFS = [1.0 / math.factorial(k) for k in range(DEGREE + 1)]


def taylor_threshold(dtype: torch.dtype) -> float:
    """Largest ``|X|_1`` at which the Taylor tail of ``L(X, .)`` is below half a unit roundoff
    of ``dtype``: the tail's norm is at most ``sum_{j >= DEGREE} |X|^j / j!``, about its first
    term."""
    eps = torch.finfo(dtype).eps
    return (0.5 * eps * math.factorial(DEGREE)) ** (1.0 / DEGREE)


def _mul(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]):
    """Product of block-triangular ``[[D, U], [0, D]]`` matrices given as ``(D, U)``."""
    return a[0] @ b[0], a[0] @ b[1] + a[1] @ b[0]


def frechet_exp(X: torch.Tensor, E: torch.Tensor) -> torch.Tensor:
    """Fréchet derivative ``L(X, E) = d/dt exp(X + t E)`` at ``t = 0``, in the dtype of ``X``.

    Scaling and squaring of a degree-``DEGREE`` Taylor approximant on the pair
    ``(X, E) / 2^s``, ``s`` chosen from ``|X|_1`` (the largest over a batch) so the truncation
    error is below the dtype's roundoff; each squaring maps ``(D, U)`` to ``(D^2, D U + U D)``.

    Parameters
    ----------
    X, E
        Real matrices ``(..., n, n)`` of one dtype.

    Returns
    -------
    torch.Tensor
        ``L(X, E)``, shape of ``X``.
    """
    norm = float(torch.linalg.matrix_norm(X, 1).max()) if X.numel() else 0.0
    s = max(0, math.ceil(math.log2(norm / taylor_threshold(X.dtype)))) if norm > 0 else 0
    X, E = X / 2**s, E / 2**s
    eye = torch.eye(X.shape[-1], dtype=X.dtype, device=X.device).expand_as(X)
    zero = torch.zeros_like(X)
    powers = [(eye, zero), (X, E)]
    for _ in range(2, _BLOCK + 1):
        powers.append(_mul(powers[-1], powers[1]))
    top = powers.pop()  # X^4, by which the Horner steps multiply

    def chunk(j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``sum_i c_{4j+i} X^i`` (i < 4) and its derivative."""
        c = _COEFFS[_BLOCK * j : _BLOCK * (j + 1)]
        return sum(ci * p[0] for ci, p in zip(c, powers)), sum(  # type: ignore[return-value]
            ci * p[1] for ci, p in zip(c, powers)
        )

    acc = chunk(DEGREE // _BLOCK)
    for j in range(DEGREE // _BLOCK - 1, -1, -1):
        d, u = _mul(acc, top)
        c = chunk(j)
        acc = (d + c[0], u + c[1])
    for _ in range(s):
        acc = _mul(acc, acc)
    return acc[1]


class _MatrixExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, W: torch.Tensor, adjoint_dtype: torch.dtype) -> torch.Tensor:
        ctx.save_for_backward(W)
        ctx.adjoint_dtype = adjoint_dtype
        return torch.linalg.matrix_exp(W)

    @staticmethod
    def backward(ctx: Any, G: torch.Tensor) -> tuple[torch.Tensor, None]:
        (W,) = ctx.saved_tensors
        dtype = ctx.adjoint_dtype
        return frechet_exp(W.mT.to(dtype), G.to(dtype)).to(W.dtype), None


def matrix_exp(W: torch.Tensor, adjoint_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.linalg.matrix_exp(W)`` (same forward), differentiated by :func:`frechet_exp`.

    Parameters
    ----------
    W
        Real matrices ``(..., n, n)``.
    adjoint_dtype
        Precision of the gradient's computation (default: that of ``W``).  A gradient that
        arrives from a float32 loss carries float32 rounding already, so float32 here adds
        error of the same order and halves the cost of the products.

    Returns
    -------
    torch.Tensor
        ``exp(W)``.
    """
    return _MatrixExp.apply(W, adjoint_dtype or W.dtype)

"""Matrix exponential with a gradient computed from ``n x n`` products only.

PyTorch differentiates ``exp(W)`` by exponentiating the ``2n x 2n`` block matrix
``[[W^T, G], [0, W^T]]``, whose upper-right block is the Fréchet derivative ``L(W^T, G)`` (the
gradient for an upstream gradient ``G``).  Each ``2n`` product costs eight ``n`` products, and
the scaling is chosen from the norm of the whole block matrix, so a large ``G`` adds
squarings.  Here the same block-triangular matrix is kept as its two blocks ``(D, U)``: a
product of two costs three ``n x n`` products (``(D1 D2, D1 U2 + U1 D2)``), two where ``D1 D2``
is not needed again, and the scaling depends on ``W`` alone, since ``L`` is linear in ``G``.
For a skew-symmetric ``W`` (every rotation NDM trains) the scaling is chosen from a bound on
``|W|_2`` rather than ``|W|_1``, which for a random skew matrix is about ``sqrt(n)`` times
smaller, so fewer squarings reach the same accuracy.  The forward pass is PyTorch's.
"""

from __future__ import annotations

import math
from typing import Any

import torch

DEGREE = 15
"""Degree of the Taylor approximant of the Fréchet derivative (Paterson–Stockmeyer in powers
of ``X^4``: three products for ``X^2, X^4, X^3`` and three Horner steps)."""

_BLOCK = 4
_COEFFS = [1.0 / math.factorial(k) for k in range(DEGREE + 1)]


def taylor_threshold(dtype: torch.dtype) -> float:
    """Largest norm of ``X`` at which the Taylor tail of ``L(X, .)`` is below half a unit
    roundoff of ``dtype``: in any submultiplicative norm the tail is at most
    ``sum_{j >= DEGREE} |X|^j / j!`` times ``|E|``, about its first term."""
    eps = torch.finfo(dtype).eps
    return (0.5 * eps * math.factorial(DEGREE)) ** (1.0 / DEGREE)


def squarings(norm: float, dtype: torch.dtype) -> int:
    """Squarings after which ``|X| / 2^s`` (``norm`` a bound on ``|X|``) is within
    :func:`taylor_threshold`."""
    return max(0, math.ceil(math.log2(norm / taylor_threshold(dtype)))) if norm > 0 else 0


def norm_bound(X: torch.Tensor, X4: torch.Tensor) -> float:
    """A bound on the norm of ``X`` (the largest over a batch) for choosing the scaling, given
    the computed ``X4 = (X^2)^2``.

    ``|X|_1`` in general.  For a skew-symmetric ``X`` (normal, with ``X^4`` symmetric)
    ``|X|_2 = |X^4|_2^{1/4} <= |X^4|_1^{1/4}``, and ``|X^k|_2 = |X|_2^k``, so the tail bound
    holds in the 2-norm with this smaller value; ``X^4``'s rounding error, at most about
    ``2 n u |X|_1^4`` in the 1-norm to first order, is added to keep it a bound.
    """
    if X.numel() == 0:
        return 0.0
    norm1 = float(torch.linalg.matrix_norm(X, 1).max())
    if not torch.equal(X, -X.mT):
        return norm1
    rounding = 2 * X.shape[-1] * torch.finfo(X.dtype).eps * norm1**4
    return min(norm1, (float(torch.linalg.matrix_norm(X4, 1).max()) + rounding) ** 0.25)


def adjoint_products(s: int) -> int:
    """``n x n`` products :func:`frechet_exp` takes after ``s`` squarings: ``X^2, X^4, X^3``
    and their derivatives (3 + 6), three Horner steps (2 each, plus the value where a later
    step needs it) and ``s`` squarings (2 each, plus ``D^2`` for all but the last)."""
    return 9 + 6 + (3 if s > 0 else 2) + 2 * s + max(s - 1, 0)


def _mm_add(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``c + a @ b``, accumulated by the product itself where the shapes allow."""
    return torch.addmm(c, a, b) if a.ndim == 2 else c + a @ b


def _adjoint_pair(
    d1: torch.Tensor, u1: torch.Tensor, d2: torch.Tensor, u2: torch.Tensor
) -> torch.Tensor:
    """Upper block ``D1 U2 + U1 D2`` of the product of ``[[D1, U1], [0, D1]]`` and
    ``[[D2, U2], [0, D2]]``."""
    return _mm_add(d1 @ u2, u1, d2)


def frechet_exp(X: torch.Tensor, E: torch.Tensor) -> torch.Tensor:
    """Fréchet derivative ``L(X, E) = d/dt exp(X + t E)`` at ``t = 0``, in the dtype of ``X``.

    Scaling and squaring of a degree-``DEGREE`` Taylor approximant on the pair
    ``(X, E) / 2^s``, ``s`` chosen from :func:`norm_bound` (the largest over a batch) so the
    truncation error is below the dtype's roundoff; each squaring maps ``(D, U)`` to
    ``(D^2, D U + U D)``.  ``X^2`` and ``X^4`` are formed before scaling (scaling by a power of
    two is exact), since the bound on a skew ``X`` is read from ``X^4``.

    Parameters
    ----------
    X, E
        Real matrices ``(..., n, n)`` of one dtype.

    Returns
    -------
    torch.Tensor
        ``L(X, E)``, shape of ``X``.
    """
    X2 = X @ X
    X4 = X2 @ X2
    s = squarings(norm_bound(X, X4), X.dtype)
    c = 2.0**-s
    X1, E1 = X * c, E * c
    X2, X4 = X2 * c**2, X4 * c**4
    U2 = _adjoint_pair(X1, E1, X1, E1)
    U4 = _adjoint_pair(X2, U2, X2, U2)
    X3 = X2 @ X1
    U3 = _adjoint_pair(X2, U2, X1, E1)
    eye = torch.eye(X.shape[-1], dtype=X.dtype, device=X.device).expand_as(X)
    powers = [eye, X1, X2, X3]
    derivatives = [E1, U2, U3]  # of X^1..X^3; that of the identity is zero

    def chunk(j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``sum_i c_{4j+i} X^i`` (i < 4) and its derivative."""
        coeffs = _COEFFS[_BLOCK * j : _BLOCK * (j + 1)]
        value = sum(ci * p for ci, p in zip(coeffs, powers))
        return value, sum(ci * u for ci, u in zip(coeffs[1:], derivatives))  # type: ignore[return-value]

    d, u = chunk(DEGREE // _BLOCK)
    for j in range(DEGREE // _BLOCK - 1, -1, -1):
        cd, cu = chunk(j)
        # The value is needed again only by a later Horner step or a squaring.
        u = cu + _adjoint_pair(d, u, X4, U4)
        d = _mm_add(cd, d, X4) if (j > 0 or s > 0) else d
    for k in range(s):
        u = _adjoint_pair(d, u, d, u)
        if k < s - 1:
            d = d @ d
    return u


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

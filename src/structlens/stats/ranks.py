"""Effective-rank family of a positive semidefinite spectrum.

All functions take the **eigenvalues** ``λ`` of a symmetric positive semidefinite matrix
(for causal dimensionality: ``Σ = E[JᵀJ]``, so ``λ = σ²`` where ``σ`` are the singular values
of the stacked Jacobian).  With ``p = λ / Σλ`` they are exponentiated Rényi entropies in
nats::

    stable_rank          = Σλ / λ_max          = exp(H_∞(p))
    participation_ratio  = (Σλ)² / Σλ²         = exp(H₂(p))
    entropy_effective_rank (Roy–Vetterli 2007) = exp(H₁(p)),  H₁ = −Σ p log p
    numerical_rank       = #{λ_i > rtol · λ_max}

so ``stable_rank ≤ participation_ratio ≤ entropy_effective_rank ≤ numerical_rank`` with
equality iff the nonzero spectrum is flat.  Applying Roy–Vetterli to ``σ`` instead of ``λ``
gives a different (larger) number; pass squared singular values to stay on this convention.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from structlens.results import Result
from structlens.stats.validation import check_array

#: Stated in every output so a number can never be read on the wrong spectrum.
CONVENTION = "eigenvalues λ of a PSD matrix (λ = σ² of its square-root factor); entropies in nats"


def _spectrum(eigenvalues: Any, psd_rtol: float = 1e-6) -> np.ndarray:
    lam = np.asarray(
        eigenvalues.detach().cpu().numpy() if hasattr(eigenvalues, "detach") else eigenvalues,
        dtype=np.float64,
    )
    if lam.ndim != 1 or lam.size == 0:
        raise ValueError(
            f"expected a non-empty 1-D array of eigenvalues, got shape {lam.shape}; "
            "pass np.linalg.eigvalsh(matrix) or use effective_ranks(matrix=...)."
        )
    if not np.all(np.isfinite(lam)):
        raise ValueError("eigenvalues contain NaN or inf; check the matrix they came from.")
    top = lam.max()
    if top <= 0:
        raise ValueError("all eigenvalues are ≤ 0: the matrix is zero, no rank is defined.")
    if lam.min() < -psd_rtol * top:
        raise ValueError(
            f"eigenvalue {lam.min():.3g} is negative beyond round-off (λ_max = {top:.3g}); "
            "the matrix is not positive semidefinite."
        )
    # Round-off can leave tiny negative eigenvalues on a PSD matrix; they carry no mass.
    return np.clip(lam, 0.0, None)


def entropy_effective_rank(eigenvalues: Any) -> float:
    """Roy–Vetterli effective rank ``exp(−Σ p_i log p_i)``, ``p = λ/Σλ`` (nats, ``0 log 0 = 0``)."""
    lam = _spectrum(eigenvalues)
    p = lam / lam.sum()
    p = p[p > 0]
    return float(np.exp(-np.sum(p * np.log(p))))


def participation_ratio(eigenvalues: Any) -> float:
    """Participation ratio ``(Σλ)² / Σλ²`` = ``(tr Σ)² / ‖Σ‖_F²``."""
    lam = _spectrum(eigenvalues)
    scaled = lam / lam.max()  # scaling first avoids overflow of Σλ² for large spectra
    return float(scaled.sum() ** 2 / np.sum(scaled**2))


def stable_rank(eigenvalues: Any) -> float:
    """Stable rank ``Σλ / λ_max`` = ``‖A‖_F² / ‖A‖₂²`` for ``Σ = AᵀA``."""
    lam = _spectrum(eigenvalues)
    return float(lam.sum() / lam.max())


def default_rank_rtol(dim: int, eps: float = float(np.finfo(np.float32).eps)) -> float:
    """Default tolerance of :func:`numerical_rank`: ``(dim · eps)²``.

    It is NumPy's ``matrix_rank`` rule ``σ_i > σ_max · dim · eps`` applied to the singular
    values ``σ = √λ`` of the square-root factor (the Jacobian), squared because it is applied to
    ``λ``.  ``eps`` defaults to float32 machine epsilon because Jacobians are usually computed in
    float32 even when their outer products are accumulated in float64.
    """
    return float((dim * eps) ** 2)


def numerical_rank(eigenvalues: Any, rtol: float | None = None) -> int:
    """Number of eigenvalues above ``rtol · λ_max`` (default :func:`default_rank_rtol`)."""
    lam = _spectrum(eigenvalues)
    tol = default_rank_rtol(lam.size) if rtol is None else rtol
    if not 0 <= tol < 1:
        raise ValueError(f"rtol must lie in [0, 1), got {tol}.")
    return int(np.sum(lam > tol * lam.max()))


@dataclasses.dataclass(frozen=True)
class EffectiveRanks(Result):
    """All four effective ranks of one spectrum, with the convention they use.

    Attributes
    ----------
    entropy_effective_rank, participation_ratio, stable_rank : float
        See the module docstring.
    numerical_rank : int
        ``#{λ_i > rank_rtol · λ_max}``.
    rank_rtol : float
        Relative eigenvalue tolerance used for ``numerical_rank``.
    dim : int
        Length of the spectrum (matrix dimension).
    convention : str
        Which spectrum the numbers were computed on.
    """

    entropy_effective_rank: float
    participation_ratio: float
    stable_rank: float
    numerical_rank: int
    rank_rtol: float
    dim: int
    convention: str = CONVENTION


def effective_ranks(
    eigenvalues: Any | None = None, *, matrix: Any | None = None, rtol: float | None = None
) -> EffectiveRanks:
    """Compute the whole family from eigenvalues or from a symmetric PSD ``matrix``.

    Exactly one of ``eigenvalues`` and ``matrix`` must be given; a matrix is symmetrised
    (``(M + Mᵀ)/2``) and diagonalised in float64.
    """
    if (eigenvalues is None) == (matrix is None):
        raise ValueError("pass exactly one of `eigenvalues` or `matrix`.")
    if matrix is not None:
        m = check_array(matrix, name="matrix")
        if m.shape[0] != m.shape[1]:
            raise ValueError(f"matrix must be square, got shape {m.shape}.")
        eigenvalues = np.linalg.eigvalsh((m + m.T) / 2)
    lam = _spectrum(eigenvalues)
    tol = default_rank_rtol(lam.size) if rtol is None else rtol
    return EffectiveRanks(
        entropy_effective_rank=entropy_effective_rank(lam),
        participation_ratio=participation_ratio(lam),
        stable_rank=stable_rank(lam),
        numerical_rank=numerical_rank(lam, tol),
        rank_rtol=tol,
        dim=int(lam.size),
    )


def rank_ordering_control(d: int = 16) -> dict[str, Any]:
    """Positive control of the check ``participation ratio <= entropy effective rank``.

    That inequality holds for every spectrum (``exp H₂ ≤ exp H₁``), so finding it on a model
    says nothing unless the estimators are right.  On two planted spectra with closed forms,
    ``r`` equal eigenvalues (both ranks are ``r``) and one eigenvalue 1 with ``d − 1``
    eigenvalues ``ε`` (the ranks differ), :func:`effective_ranks` must return the closed forms
    and order them strictly on the second.  Returns the numbers and ``passed``.
    """
    r, eps = d // 2, 0.01
    flat = effective_ranks(np.r_[np.ones(r), np.zeros(d - r)])
    lam = np.r_[1.0, np.full(d - 1, eps)]
    p = lam / lam.sum()
    want_h1 = float(np.exp(-(p * np.log(p)).sum()))
    want_pr = float(lam.sum() ** 2 / (lam**2).sum())
    skew = effective_ranks(lam)
    ok = (
        abs(flat.entropy_effective_rank - r) < 1e-9 * r
        and abs(flat.participation_ratio - r) < 1e-9 * r
        and abs(skew.entropy_effective_rank - want_h1) < 1e-9 * want_h1
        and abs(skew.participation_ratio - want_pr) < 1e-9 * want_pr
        and skew.participation_ratio < skew.entropy_effective_rank
    )
    return {
        "passed": bool(ok),
        "what": f"closed forms on planted spectra (d = {d}): {r} equal eigenvalues, and 1 with "
        f"{d - 1} eigenvalues {eps}",
        "entropy_effective_rank": [flat.entropy_effective_rank, skew.entropy_effective_rank],
        "participation_ratio": [flat.participation_ratio, skew.participation_ratio],
        "expected": [[float(r), want_h1], [float(r), want_pr]],
    }

"""Certified model reduction of the depth system ``ψ_{k+1} = A ψ_k + B u_k``, ``x_k = C ψ_k``.

The object reduced is the finite-horizon input–output map ``T_L``: inputs ``u_0 … u_{L-1}``
(attention writes of ``L`` consecutive layers, zero initial lifted state) to outputs
``x_1 … x_L``; ``T_L`` is block lower-triangular Toeplitz in the Markov parameters
``C A^k B``.  Errors are 2-norms of ``T_L − T_L^r``.

Gramians (``gramians=``):

* ``"shifted"`` (default, certified): infinite-horizon discrete Lyapunov gramians of the scaled
  system ``A/ρ₀`` with ``ρ₀ = 1`` if ``ρ(A) < 1`` and ``ρ₀ = ρ(A)(1 + margin)`` otherwise (depth
  operators may have ``|λ| ≥ 1``).  Since ``T_L = D₁ T̃_L D₂`` with ``‖D₁‖ = ρ₀^{L−1}``,
  ``‖D₂‖ = 1``, the Enns–Glover theorem for the stable scaled system gives the certificate
  ``‖T_L − T_L^r‖₂ ≤ ρ₀^{L−1} · 2 Σ_{i>r} σ_i``.
* ``"finite"``: finite-horizon gramians ``P_L = Σ_{k<L} A^k B Bᵀ A^{kᵀ}`` and likewise ``Q_L``.
  Balanced truncation on them has no a-priori theorem, so its ``2Σσ_tail`` is reported as an
  uncertified indicator.

Always certified, for either choice: the a-posteriori bound ``Σ_{k<L} ‖C A^k B − C_r A_r^k B_r‖₂``
(triangle inequality over the Toeplitz diagonals).

Instance-dependent bound (inputs shaped like the attention writes): with ``Σ_u`` the control
covariance, balance the *weighted* system ``(A, B Σ_u^{1/2}/‖Σ_u‖^{1/2}, C)``.  Its Hankel
singular values satisfy ``σ_i^w ≤ σ_i`` (Loewner monotonicity, as ``B Σ_u Bᵀ ≼ ‖Σ_u‖ B Bᵀ``),
so ``ρ₀^{L−1}·2Σ_{i>r}σ_i^w`` is never larger than the Enns–Glover bound and is much smaller
when Σ_u has low effective rank.  It certifies the error on inputs in the Σ_u-ellipsoid:
``‖(T_L − T_L^r)(I_L ⊗ Σ_u^{1/2})‖₂ / ‖Σ_u‖^{1/2}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg

from structlens.results import Result


def markov_parameters(A: np.ndarray, B: np.ndarray, C: np.ndarray, L: int) -> list[np.ndarray]:
    """``[C B, C A B, …, C A^{L−1} B]``."""
    out, AkB = [], np.asarray(B, np.float64)
    for _ in range(L):
        out.append(C @ AkB)
        AkB = A @ AkB
    return out


def toeplitz_operator(markov: list[np.ndarray]) -> np.ndarray:
    """Block lower-triangular ``T_L`` (p·L × m·L): block (i, j) = ``M_{i−j}`` for ``i ≥ j``."""
    L = len(markov)
    p, m = markov[0].shape
    T = np.zeros((p * L, m * L))
    for i in range(L):
        for j in range(i + 1):
            T[i * p : (i + 1) * p, j * m : (j + 1) * m] = markov[i - j]
    return T


def operator_distance(
    a: tuple[np.ndarray, np.ndarray, np.ndarray],
    b: tuple[np.ndarray, np.ndarray, np.ndarray],
    horizon: int,
) -> float:
    """``‖T_L(a) − T_L(b)‖₂`` of two realisations ``(A, B, C)`` with equal input and output
    sizes over ``horizon`` layers (the norm ``balanced_truncation``'s ``error`` is in)."""
    diffs = [
        x - y
        for x, y in zip(markov_parameters(*a, horizon), markov_parameters(*b, horizon), strict=True)
    ]
    return _spectral_norm(toeplitz_operator(diffs))


def _spectral_norm(M: np.ndarray) -> float:
    small = M.T @ M if M.shape[0] >= M.shape[1] else M @ M.T
    return float(np.sqrt(max(np.linalg.eigvalsh(small)[-1], 0.0)))


def _psd_sqrt_factor(P: np.ndarray) -> np.ndarray:
    s, U = np.linalg.eigh((P + P.T) / 2)
    return U * np.sqrt(np.clip(s, 0, None))


def _gramians(
    A: np.ndarray, B: np.ndarray, C: np.ndarray, L: int, kind: str, rho0: float
) -> tuple[np.ndarray, np.ndarray]:
    if kind == "shifted":
        At = A / rho0
        return (
            scipy.linalg.solve_discrete_lyapunov(At, B @ B.T),
            scipy.linalg.solve_discrete_lyapunov(At.T, C.T @ C),
        )
    P, Q = np.zeros_like(A), np.zeros_like(A)
    AkB, CAk = B, C
    for _ in range(L):
        P += AkB @ AkB.T
        Q += CAk.T @ CAk
        AkB, CAk = A @ AkB, CAk @ A
    return P, Q


@dataclass(frozen=True)
class ReducedSystem:
    """One balanced truncation: ``(A_r, B_r, C_r)``, Hankel singular values and errors."""

    A_r: np.ndarray
    B_r: np.ndarray
    C_r: np.ndarray
    hsv: np.ndarray
    hsv_bound: float
    hsv_bound_certified: bool
    markov_bound: float
    error: float


@dataclass(frozen=True)
class ReductionResult(Result):
    """Balanced truncation of a depth realisation with certified error bounds.

    Attributes
    ----------
    enns_glover : ``ρ₀^{L−1}·2Σ_{i>r}σ_i`` of the unweighted balancing (certified iff
        ``gramians == "shifted"``); ``error`` the actual ``‖T_L − T_L^r‖₂``;
        ``markov_bound`` the certified a-posteriori bound.
    instance_bound, instance_error, instance_markov_bound : the same for the Σ_u-weighted
        balancing, in the Σ_u-ellipsoid norm (NaN without ``input_cov``).
    effective_rank : ``tr Σ_u / ‖Σ_u‖₂`` (NaN without ``input_cov``).
    """

    A_r: np.ndarray
    B_r: np.ndarray
    C_r: np.ndarray
    hsv: np.ndarray
    order: int
    horizon: int
    gramians: str
    rho0: float
    enns_glover: float
    certified: bool
    markov_bound: float
    error: float
    A_r_instance: np.ndarray | None
    B_r_instance: np.ndarray | None
    C_r_instance: np.ndarray | None
    hsv_instance: np.ndarray | None
    instance_bound: float
    instance_markov_bound: float
    instance_error: float
    effective_rank: float


def _truncate(
    A: np.ndarray,
    B: np.ndarray,
    C: np.ndarray,
    Bw: np.ndarray,
    order: int,
    L: int,
    kind: str,
    rho0: float,
    W_in: np.ndarray,
) -> ReducedSystem:
    P, Q = _gramians(A, Bw, C, L, kind, rho0)
    Lp, Lq = _psd_sqrt_factor(P), _psd_sqrt_factor(Q)
    U, s, Vt = np.linalg.svd(Lq.T @ Lp)
    if s[order - 1] <= 1e-14 * s[0]:
        raise ValueError(
            f"order {order} exceeds the numerical rank of the Hankel operator "
            f"(σ = {s[:order].tolist()}); choose a smaller order."
        )
    scale = 1.0 / np.sqrt(s[:order])
    Tr = Lp @ Vt[:order].T * scale
    Wr = Lq @ U[:, :order] * scale
    Ar, Br, Cr = Wr.T @ A @ Tr, Wr.T @ B, C @ Tr
    full = markov_parameters(A, B @ W_in, C, L)
    red = markov_parameters(Ar, Br @ W_in, Cr, L)
    diffs = [f - r for f, r in zip(full, red, strict=True)]
    factor = rho0 ** (L - 1) if kind == "shifted" else 1.0
    return ReducedSystem(
        A_r=Ar,
        B_r=Br,
        C_r=Cr,
        hsv=s,
        hsv_bound=float(factor * 2.0 * s[order:].sum()),
        hsv_bound_certified=kind == "shifted",
        markov_bound=float(sum(_spectral_norm(D) for D in diffs)),
        error=_spectral_norm(toeplitz_operator(diffs)),
    )


def balanced_truncation(
    A: np.ndarray,
    B: np.ndarray,
    C: np.ndarray,
    order: int,
    horizon: int,
    *,
    input_cov: np.ndarray | None = None,
    gramians: str = "shifted",
    margin: float = 1e-3,
) -> ReductionResult:
    """Balanced truncation to ``order`` states over ``horizon`` layers, with certificates.

    Parameters
    ----------
    A, B, C : realisation (N × N, N × m, p × N), e.g. ``res.A, res.B, res.C`` of an EDMDc fit.
    input_cov : Σ_u (m × m) of the inputs, e.g. ``res.control_cov``; enables the
        instance-dependent bound.
    gramians : ``"shifted"`` (certified) or ``"finite"`` (finite-horizon gramians).
    """
    A, B, C = (np.asarray(M, np.float64) for M in (A, B, C))
    n = A.shape[0]
    if A.shape != (n, n) or B.shape[0] != n or C.shape[1] != n:
        raise ValueError(
            f"shapes do not form a realisation: A {A.shape}, B {B.shape}, C {C.shape}."
        )
    if not all(np.all(np.isfinite(M)) for M in (A, B, C)):
        raise ValueError("A, B or C contain NaN/inf.")
    if not 1 <= order < n:
        raise ValueError(f"order must be in [1, {n - 1}]; got {order}.")
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}.")
    if gramians not in ("shifted", "finite"):
        raise ValueError(f"gramians must be 'shifted' or 'finite', got {gramians!r}.")
    rho = float(np.max(np.abs(np.linalg.eigvals(A))))
    rho0 = 1.0 if rho < 1.0 - margin else max(rho, 1.0) * (1.0 + margin)
    m = B.shape[1]
    plain = _truncate(A, B, C, B, order, horizon, gramians, rho0, np.eye(m))
    inst = None
    eff = float("nan")
    if input_cov is not None:
        S = np.asarray(input_cov, np.float64)
        if S.shape != (m, m):
            raise ValueError(f"input_cov must be ({m}, {m}); got {S.shape}.")
        ev, U = np.linalg.eigh((S + S.T) / 2)
        if ev.min() < -1e-10 * max(ev.max(), 0.0) or ev.max() <= 0:
            raise ValueError("input_cov must be positive semi-definite and non-zero.")
        ev = np.clip(ev, 0, None)
        W_in = (U * np.sqrt(ev)) @ U.T / np.sqrt(ev.max())
        eff = float(ev.sum() / ev.max())
        inst = _truncate(A, B, C, B @ W_in, order, horizon, gramians, rho0, W_in)
    nan = float("nan")
    return ReductionResult(
        A_r=plain.A_r,
        B_r=plain.B_r,
        C_r=plain.C_r,
        hsv=plain.hsv,
        order=order,
        horizon=horizon,
        gramians=gramians,
        rho0=rho0,
        enns_glover=plain.hsv_bound,
        certified=plain.hsv_bound_certified,
        markov_bound=plain.markov_bound,
        error=plain.error,
        A_r_instance=None if inst is None else inst.A_r,
        B_r_instance=None if inst is None else inst.B_r,
        C_r_instance=None if inst is None else inst.C_r,
        hsv_instance=None if inst is None else inst.hsv,
        instance_bound=nan if inst is None else inst.hsv_bound,
        instance_markov_bound=nan if inst is None else inst.markov_bound,
        instance_error=nan if inst is None else inst.error,
        effective_rank=eff,
    )

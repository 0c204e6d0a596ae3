"""Spectral tools for a realisation ``(A, B, C)``: eigenpairs, real modes, projectors,
non-normality, modal–principal dissociation and mode ablation.

Conventions: ``A`` acts on column vectors of lifted coordinates.  Right eigenvectors ``v_i``
(``A v_i = λ_i v_i``, unit 2-norm) are the *modes*; left eigenvectors ``w_i``
(``w_iᴴ A = λ_i w_iᴴ``) are scaled so ``w_iᴴ v_j = δ_ij`` and give the eigenfunctions
``φ_i(x) = w_iᴴ Ψ(x)``.  A conjugate pair is one *real mode* spanning a real 2-D subspace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg

from structlens.koopman.dictionaries import Dictionary
from structlens.koopman.edmdc import EDMDcResult


@dataclass(frozen=True)
class Eigendecomposition:
    """Eigenvalues, modes ``V`` (columns), biorthogonal left vectors ``W`` (``WᴴV = I``) and
    per-eigenvalue condition numbers ``κ(λ_i) = ‖v_i‖‖w_i‖/|w_iᴴv_i|`` (1 for normal A)."""

    eigenvalues: np.ndarray
    right: np.ndarray
    left: np.ndarray
    condition: np.ndarray


def eigendecomposition(A: np.ndarray) -> Eigendecomposition:
    """Eigen-decompose a real square matrix, ordered by decreasing ``|λ|``."""
    A = np.asarray(A, dtype=np.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"A must be square; got shape {A.shape}.")
    if not np.all(np.isfinite(A)):
        raise ValueError("A contains NaN/inf.")
    lam, wl, vr = scipy.linalg.eig(A, left=True, right=True)
    order = np.lexsort((-lam.imag, -np.abs(lam)))
    lam, wl, vr = lam[order], wl[:, order], vr[:, order]
    vr = vr / np.linalg.norm(vr, axis=0)
    dots = np.sum(wl.conj() * vr, axis=0)
    cond = np.linalg.norm(wl, axis=0) / np.maximum(np.abs(dots), 1e-300)
    left = wl / dots.conj()
    return Eigendecomposition(lam, vr, left, cond)


@dataclass(frozen=True)
class RealMode:
    """A real eigenvalue (``size=1``) or a conjugate pair (``size=2``) as a real subspace.

    ``indices`` index into :class:`Eigendecomposition`; ``basis`` (N × size) spans the mode:
    ``[v]`` or ``[Re v, Im v]``; ``eigenvalue`` is the member with ``Im λ ≥ 0``.
    """

    indices: tuple[int, ...]
    eigenvalue: complex
    basis: np.ndarray

    @property
    def size(self) -> int:
        return len(self.indices)


def real_modes(eig: Eigendecomposition, tol: float = 1e-10) -> list[RealMode]:
    """Group eigenvalues into real modes, in the order of ``eig`` (decreasing |λ|)."""
    lam = eig.eigenvalues
    used = np.zeros(lam.size, bool)
    modes: list[RealMode] = []
    scale = max(1.0, float(np.max(np.abs(lam))))
    for i in range(lam.size):
        if used[i]:
            continue
        used[i] = True
        if abs(lam[i].imag) <= tol * scale:
            modes.append(RealMode((i,), complex(lam[i].real, 0.0), eig.right[:, [i]].real))
            continue
        cand = np.where(~used)[0]
        j = int(cand[np.argmin(np.abs(lam[cand] - lam[i].conj()))])
        used[j] = True
        k = i if lam[i].imag > 0 else j
        v = eig.right[:, k]
        modes.append(RealMode((i, j), complex(lam[k]), np.stack([v.real, v.imag], axis=1)))
    return modes


def spectral_projectors(eig: Eigendecomposition, modes: Sequence[RealMode]) -> list[np.ndarray]:
    """Real spectral projectors ``P = Σ_{i∈mode} v_i w_iᴴ`` (a pair's sum is real).

    They satisfy ``P_i P_j = δ_ij P_i``, ``Σ P_i = I`` and ``Σ λ_i P_i = A`` for
    diagonalisable ``A`` (accuracy limited by ``κ(V)``).
    """
    out: list[np.ndarray] = []
    for mode in modes:
        P = sum(np.outer(eig.right[:, i], eig.left[:, i].conj()) for i in mode.indices)
        out.append(np.real(P))
    return out


@dataclass(frozen=True)
class NonNormality:
    """Henrici departure ``dep_F = √(‖A‖_F² − Σ|λ_i|²)`` (absolute and ``/‖A‖_F``), the
    eigenvector condition number ``κ(V) = ‖V‖₂‖V⁻¹‖₂`` (unit columns) and ``κ(λ_i)``.
    All are 0 / 1 / 1 for a normal matrix."""

    henrici: float
    henrici_relative: float
    kappa_V: float
    eig_condition: np.ndarray


def non_normality(A: np.ndarray) -> NonNormality:
    """Non-normality measures of ``A`` (Schur form for the Henrici departure)."""
    A = np.asarray(A, dtype=np.float64)
    T, _ = scipy.linalg.schur(A, output="complex")
    strict = np.triu(T, 1)
    dep = float(np.linalg.norm(strict, "fro"))
    fro = float(np.linalg.norm(A, "fro"))
    eig = eigendecomposition(A)
    s = np.linalg.svd(eig.right, compute_uv=False)
    kappa = float(s[0] / s[-1]) if s[-1] > 0 else float("inf")
    return NonNormality(dep, dep / fro if fro > 0 else 0.0, kappa, eig.condition)


@dataclass(frozen=True)
class Dissociation:
    """Principal angles (radians, ascending) between the top-``k`` PCA directions of the
    state and the span of the dominant Koopman modes mapped to the state by ``C``."""

    angles: np.ndarray
    largest_angle: float
    mean_cos2: float
    dimension: int


def modal_principal_dissociation(result: EDMDcResult, k: int) -> Dissociation:
    """Compare PCA directions of x (from ``result.state_cov``) with ``span{C v_i}``.

    Modes are taken in order of decreasing ``|λ|``, whole conjugate pairs at a time, until at
    least ``k`` real dimensions are collected (so the mode space may have ``k + 1``); the PCA
    space gets the same dimension.  ``mean_cos2 = 1`` means aligned, ``0`` orthogonal.
    """
    d = result.state_cov.shape[0]
    if not 1 <= k < d:
        raise ValueError(f"k must be in [1, {d - 1}] for a {d}-dimensional state; got {k}.")
    eig = eigendecomposition(result.A)
    cols: list[np.ndarray] = []
    for mode in real_modes(eig):
        if len(cols) >= k:
            break
        cols.extend((result.C @ mode.basis).T)
    modal = np.stack(cols, axis=1)
    dim = min(modal.shape[1], d)
    evals, evecs = np.linalg.eigh(result.state_cov)
    pca = evecs[:, np.argsort(evals)[::-1][:dim]]
    angles = np.sort(scipy.linalg.subspace_angles(pca, modal))
    return Dissociation(angles, float(angles.max()), float(np.mean(np.cos(angles) ** 2)), dim)


@dataclass(frozen=True)
class ModeAblation:
    """State map removing the component of the chosen modes.

    ``x ↦ x − C P_S (Ψ(x) − ref)`` with ``ref = μ_Ψ`` (mean ablation: the modes' coordinates are
    set to their mean) or ``ref = 0`` (zero ablation).  For affine dictionaries (identity,
    PCA) this is exactly the affine map ``x ↦ x @ weight + bias`` (rows = samples), ready to
    be applied inside a model as a hook.  For nonlinear dictionaries ``weight``/``bias`` are
    ``None`` and :meth:`__call__` evaluates the formula directly; it then removes the modes
    only to first order: the lift of the ablated state, ``Ψ(x')``, generally still has a
    component in the ablated modes, because ``Ψ`` does not commute with subtraction.
    """

    projector: np.ndarray
    C: np.ndarray
    reference: np.ndarray
    dictionary: Dictionary
    weight: np.ndarray | None
    bias: np.ndarray | None

    def __call__(self, x: Any) -> Any:
        """Apply to states ``x`` (m, d); torch tensors are returned as torch tensors."""
        is_torch = hasattr(x, "detach")
        xa = x.detach().cpu().double().numpy() if is_torch else np.asarray(x, np.float64)
        if self.weight is not None:
            out = xa @ self.weight + self.bias
        else:
            psi = self.dictionary.transform(xa)
            out = xa - (psi - self.reference) @ self.projector.T @ self.C.T
        if is_torch:
            import torch

            return torch.as_tensor(out, dtype=x.dtype, device=x.device)
        return out


def mode_ablation(
    result: EDMDcResult,
    dictionary: Dictionary,
    mode_indices: Sequence[int],
    *,
    mean: bool = True,
) -> ModeAblation:
    """Build the ablation map for the real modes ``mode_indices`` of ``real_modes(eig(A))``."""
    eig = eigendecomposition(result.A)
    modes = real_modes(eig)
    bad = [i for i in mode_indices if not 0 <= i < len(modes)]
    if bad:
        raise ValueError(f"mode indices {bad} out of range; there are {len(modes)} real modes.")
    P = sum(spectral_projectors(eig, [modes[i] for i in mode_indices]))
    P = np.asarray(P, dtype=np.float64)
    ref = result.psi_mean_x if mean else np.zeros_like(result.psi_mean_x)
    aff = dictionary.affine_map()
    weight = bias = None
    if aff is not None:
        L, c = aff
        M = P.T @ result.C.T  # (N, d): row-convention of x ↦ C P ψ
        weight = np.eye(L.shape[0]) - L @ M
        bias = -(c - ref) @ M
    return ModeAblation(P, result.C, ref, dictionary, weight, bias)

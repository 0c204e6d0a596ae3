"""Mergeable float64 moment accumulators (rows = samples).

Every accumulator keeps the sample count, the mean and *centred* scatter matrices, updated
block by block with the pairwise formulas of Chan, Golub and LeVeque (1979) and, for the
per-column third/fourth moments, Pébay (2008).  Because the pairwise formula is also the merge
rule, statistics accumulated by several workers and merged give the same answer as one pass
(up to floating-point rounding), and memory never depends on the number of samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


def _is_tensor(x: object) -> bool:
    return hasattr(x, "detach") and hasattr(x, "device")


def as_float64_block(block: object, name: str, dim: int | None = None) -> np.ndarray:
    """Return ``block`` as a finite 2-D float64 array ``(n_samples, dim)`` or raise ValueError."""
    if hasattr(block, "detach") and hasattr(block, "cpu"):  # torch tensor
        block = block.detach().cpu().double().numpy()
    a = np.asarray(block, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n_samples, n_features); got shape {a.shape}.")
    if dim is not None and a.shape[1] != dim:
        raise ValueError(f"{name} has {a.shape[1]} columns but the accumulator expects {dim}.")
    if not np.all(np.isfinite(a)):
        bad = int(np.count_nonzero(~np.isfinite(a)))
        raise ValueError(
            f"{name} contains {bad} NaN/inf values; drop or repair those rows before "
            f"accumulating (e.g. check the activation capture for overflow)."
        )
    return a


@dataclass
class MomentAccumulator:
    """Count, mean and centred scatter ``S = Σ (x - mean)(x - mean)ᵀ`` of ``dim``-vectors.

    Examples
    --------
    >>> acc = MomentAccumulator(3)
    >>> acc.update(np.ones((4, 3)))
    >>> acc.n
    4
    """

    dim: int
    n: int = 0
    mean: np.ndarray = field(init=False)
    scatter: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}.")
        self.mean = np.zeros(self.dim)
        self.scatter = np.zeros((self.dim, self.dim))

    def update(self, block: object) -> None:
        """Add the rows of ``block`` (shape ``(m, dim)``)."""
        x = as_float64_block(block, "block", self.dim)
        if x.shape[0] == 0:
            return
        other = MomentAccumulator(self.dim)
        other.n = x.shape[0]
        other.mean = x.mean(axis=0)
        xc = x - other.mean
        other.scatter = xc.T @ xc
        self.merge(other)

    def merge(self, other: MomentAccumulator) -> None:
        """Fold ``other`` into ``self`` in place (exact pairwise update)."""
        if other.dim != self.dim:
            raise ValueError(f"cannot merge dim {other.dim} into dim {self.dim}.")
        if other.n == 0:
            return
        n = self.n + other.n
        delta = other.mean - self.mean
        self.scatter = (
            self.scatter + other.scatter + np.outer(delta, delta) * (self.n * other.n / n)
        )
        self.mean = self.mean + delta * (other.n / n)
        self.n = n

    def covariance(self, ddof: int = 0) -> np.ndarray:
        """``scatter / (n - ddof)``."""
        if self.n - ddof <= 0:
            raise ValueError(f"need more than {ddof} samples for a covariance; have {self.n}.")
        return self.scatter / (self.n - ddof)

    def gram(self) -> np.ndarray:
        """Uncentred Gram ``Σ x xᵀ = scatter + n·mean meanᵀ``."""
        return self.scatter + self.n * np.outer(self.mean, self.mean)


@dataclass
class CrossMomentAccumulator:
    """Joint moments of paired blocks ``a`` (dim_a) and ``b`` (dim_b) with the same rows.

    Keeps ``n``, both means, the full centred scatter ``S_aa``, the centred cross-scatter
    ``S_ab = Σ (a - ā)(b - b̄)ᵀ`` and the diagonal of ``S_bb`` (enough for per-column residual
    variances of a regression of ``b`` on ``a``).
    """

    dim_a: int
    dim_b: int
    n: int = 0
    mean_a: np.ndarray = field(init=False)
    mean_b: np.ndarray = field(init=False)
    s_aa: np.ndarray = field(init=False)
    s_ab: np.ndarray = field(init=False)
    s_bb_diag: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        if self.dim_a < 1 or self.dim_b < 1:
            raise ValueError(f"dims must be >= 1, got {self.dim_a}, {self.dim_b}.")
        self.mean_a = np.zeros(self.dim_a)
        self.mean_b = np.zeros(self.dim_b)
        self.s_aa = np.zeros((self.dim_a, self.dim_a))
        self.s_ab = np.zeros((self.dim_a, self.dim_b))
        self.s_bb_diag = np.zeros(self.dim_b)

    def update(self, a: object, b: object) -> None:
        """Add the paired rows of ``a`` (m, dim_a) and ``b`` (m, dim_b).

        Two torch tensors on the same device are reduced there (float64 products on a GPU
        block, only the ``dim × dim`` results cross to the host); anything else goes through
        NumPy.
        """
        if _is_tensor(a) and _is_tensor(b) and a.device == b.device:
            self.merge(self._block_moments_torch(a, b))
            return
        a = as_float64_block(a, "a", self.dim_a)
        b = as_float64_block(b, "b", self.dim_b)
        if a.shape[0] != b.shape[0]:
            raise ValueError(f"a has {a.shape[0]} rows but b has {b.shape[0]}; rows must pair.")
        if a.shape[0] == 0:
            return
        other = CrossMomentAccumulator(self.dim_a, self.dim_b)
        other.n = a.shape[0]
        other.mean_a = a.mean(axis=0)
        other.mean_b = b.mean(axis=0)
        ac = a - other.mean_a
        bc = b - other.mean_b
        other.s_aa = ac.T @ ac
        other.s_ab = ac.T @ bc
        other.s_bb_diag = np.einsum("ij,ij->j", bc, bc)
        self.merge(other)

    def _block_moments_torch(self, a: Any, b: Any) -> CrossMomentAccumulator:
        import torch

        for name, t, dim in (("a", a, self.dim_a), ("b", b, self.dim_b)):
            if t.ndim != 2 or t.shape[1] != dim:
                raise ValueError(
                    f"{name} must be 2-D with {dim} columns; got shape {tuple(t.shape)}."
                )
        if a.shape[0] != b.shape[0]:
            raise ValueError(f"a has {a.shape[0]} rows but b has {b.shape[0]}; rows must pair.")
        other = CrossMomentAccumulator(self.dim_a, self.dim_b)
        if a.shape[0] == 0:
            return other
        a = a.detach().to(torch.float64)
        b = b.detach().to(torch.float64)
        if not bool(torch.isfinite(a).all() & torch.isfinite(b).all()):
            raise ValueError(
                "a or b contains NaN/inf values; drop or repair those rows before accumulating "
                "(e.g. check the activation capture for overflow)."
            )
        mean_a, mean_b = a.mean(0), b.mean(0)
        ac, bc = a - mean_a, b - mean_b
        other.n = a.shape[0]
        other.mean_a, other.mean_b = mean_a.cpu().numpy(), mean_b.cpu().numpy()
        other.s_aa = (ac.T @ ac).cpu().numpy()
        other.s_ab = (ac.T @ bc).cpu().numpy()
        other.s_bb_diag = (bc * bc).sum(0).cpu().numpy()
        return other

    def merge(self, other: CrossMomentAccumulator) -> None:
        """Fold ``other`` into ``self`` in place (exact pairwise update)."""
        if (other.dim_a, other.dim_b) != (self.dim_a, self.dim_b):
            raise ValueError("cannot merge accumulators of different dimensions.")
        if other.n == 0:
            return
        n = self.n + other.n
        w = self.n * other.n / n
        da = other.mean_a - self.mean_a
        db = other.mean_b - self.mean_b
        self.s_aa = self.s_aa + other.s_aa + np.outer(da, da) * w
        self.s_ab = self.s_ab + other.s_ab + np.outer(da, db) * w
        self.s_bb_diag = self.s_bb_diag + other.s_bb_diag + db * db * w
        self.mean_a = self.mean_a + da * (other.n / n)
        self.mean_b = self.mean_b + db * (other.n / n)
        self.n = n

    def copy(self) -> CrossMomentAccumulator:
        out = CrossMomentAccumulator(self.dim_a, self.dim_b)
        out.n = self.n
        out.mean_a, out.mean_b = self.mean_a.copy(), self.mean_b.copy()
        out.s_aa, out.s_ab = self.s_aa.copy(), self.s_ab.copy()
        out.s_bb_diag = self.s_bb_diag.copy()
        return out


@dataclass
class ColumnMomentAccumulator:
    """Per-column count, mean and central moment sums ``M2, M3, M4`` (Pébay 2008).

    Used for the heavy-tail diagnostic: :meth:`excess_kurtosis` is ``n·M4/M2² − 3``
    (0 for a Gaussian, large for heavy tails).
    """

    dim: int
    n: int = 0
    mean: np.ndarray = field(init=False)
    m2: np.ndarray = field(init=False)
    m3: np.ndarray = field(init=False)
    m4: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.mean = np.zeros(self.dim)
        self.m2 = np.zeros(self.dim)
        self.m3 = np.zeros(self.dim)
        self.m4 = np.zeros(self.dim)

    def update(self, block: object) -> None:
        """Add the rows of ``block`` (shape ``(m, dim)``)."""
        x = as_float64_block(block, "block", self.dim)
        if x.shape[0] == 0:
            return
        other = ColumnMomentAccumulator(self.dim)
        other.n = x.shape[0]
        other.mean = x.mean(axis=0)
        xc = x - other.mean
        xc2 = xc * xc
        other.m2 = xc2.sum(axis=0)
        other.m3 = (xc2 * xc).sum(axis=0)
        other.m4 = (xc2 * xc2).sum(axis=0)
        self.merge(other)

    def merge(self, other: ColumnMomentAccumulator) -> None:
        """Fold ``other`` into ``self`` in place."""
        if other.dim != self.dim:
            raise ValueError(f"cannot merge dim {other.dim} into dim {self.dim}.")
        if other.n == 0:
            return
        na, nb = self.n, other.n
        n = na + nb
        d = other.mean - self.mean
        d2 = d * d
        m4 = (
            self.m4
            + other.m4
            + d2 * d2 * na * nb * (na * na - na * nb + nb * nb) / n**3
            + 6.0 * d2 * (na * na * other.m2 + nb * nb * self.m2) / n**2
            + 4.0 * d * (na * other.m3 - nb * self.m3) / n
        )
        m3 = (
            self.m3
            + other.m3
            + d2 * d * na * nb * (na - nb) / n**2
            + 3.0 * d * (na * other.m2 - nb * self.m2) / n
        )
        self.m2 = self.m2 + other.m2 + d2 * na * nb / n
        self.m3, self.m4 = m3, m4
        self.mean = self.mean + d * (nb / n)
        self.n = n

    def excess_kurtosis(self) -> np.ndarray:
        """Per-column excess kurtosis; NaN for constant columns."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.m2 > 0, self.n * self.m4 / (self.m2 * self.m2) - 3.0, np.nan)

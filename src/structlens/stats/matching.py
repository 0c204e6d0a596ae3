"""Optimal matching distances between two equal-size multisets of complex numbers (eigenvalues).

Both distances match every point of ``a`` to exactly one point of ``b`` (a permutation), unlike
persistence-diagram bottleneck distances that may match points to a diagonal:

* bottleneck ``W∞(a, b) = min_π max_i |a_i − b_π(i)|`` — exact, by binary search over the
  sorted distinct pairwise distances with a perfect-matching feasibility test
  (Hopcroft–Karp via :func:`scipy.sparse.csgraph.maximum_bipartite_matching`);
* ``W_p(a, b) = min_π ((1/n) Σ_i |a_i − b_π(i)|^p)^{1/p}`` — the p-Wasserstein distance between
  the uniform empirical measures, by :func:`scipy.optimize.linear_sum_assignment`.

Both are distances (smaller = closer) in the units of the inputs.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching


def _pairwise(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.complex128).ravel()
    b = np.asarray(b, dtype=np.complex128).ravel()
    if a.size != b.size:
        raise ValueError(
            f"matching needs equal-size sets; got {a.size} and {b.size} points. Truncate both "
            f"spectra to the same number of eigenvalues first."
        )
    if a.size == 0:
        raise ValueError("cannot match empty sets.")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("eigenvalues contain NaN/inf; check the operator fit.")
    return np.abs(a[:, None] - b[None, :])


def _perfect_matching(mask: np.ndarray) -> np.ndarray | None:
    match = maximum_bipartite_matching(csr_matrix(mask), perm_type="column")
    return None if np.any(match < 0) else match


def bottleneck_matching(a: np.ndarray, b: np.ndarray) -> tuple[float, np.ndarray]:
    """Exact bottleneck distance and an optimal permutation ``perm`` (``a[i] ↔ b[perm[i]]``)."""
    dist = _pairwise(a, b)
    levels = np.unique(dist)
    lo, hi = 0, levels.size - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _perfect_matching(dist <= levels[mid]) is None:
            lo = mid + 1
        else:
            hi = mid
    return float(levels[lo]), np.asarray(_perfect_matching(dist <= levels[lo]))


def bottleneck_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Exact ``W∞`` between equal-size point sets in the complex plane (a distance)."""
    return bottleneck_matching(a, b)[0]


def wasserstein_matching(a: np.ndarray, b: np.ndarray, p: float = 2.0) -> tuple[float, np.ndarray]:
    """``W_p`` between uniform measures on ``a`` and ``b`` and an optimal permutation."""
    if not p >= 1:
        raise ValueError(f"p must be >= 1, got {p}.")
    dist = _pairwise(a, b)
    rows, cols = linear_sum_assignment(dist**p)
    perm = np.empty_like(cols)
    perm[rows] = cols
    return float(np.mean(dist[rows, cols] ** p) ** (1.0 / p)), perm


def wasserstein_distance(a: np.ndarray, b: np.ndarray, p: float = 2.0) -> float:
    """``W_p`` distance between equal-size point sets in the complex plane."""
    return wasserstein_matching(a, b, p)[0]

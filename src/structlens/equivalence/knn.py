"""Mutual k-nearest-neighbour alignment (Huh et al. 2024, "platonic representations")."""

from __future__ import annotations

import numpy as np

from ._checks import check_pair

__all__ = ["mutual_knn"]


def _knn(a: np.ndarray, k: int, block: int) -> np.ndarray:
    """Indices of the ``k`` largest inner products of each row with the others (self excluded),
    computed in row blocks so memory stays ``O(block * n)``."""
    n = a.shape[0]
    out = np.empty((n, k), dtype=np.int64)
    for start in range(0, n, block):
        sim = a[start : start + block] @ a.T
        rows = np.arange(sim.shape[0])
        sim[rows, start + rows] = -np.inf
        # ties broken by index (stable sort) so results are deterministic
        out[start : start + block] = np.argsort(-sim, axis=1, kind="stable")[:, :k]
    return out


def mutual_knn(
    x: object, y: object, k: int = 10, normalize: bool = True, block_rows: int = 2048
) -> float:
    """Mutual k-NN alignment: mean share of each sample's ``k`` neighbours common to both spaces.

    Parameters
    ----------
    x, y : array_like
        ``[n, d_x]`` and ``[n, d_y]`` representations of the same inputs.
    k : int
        Neighbours per sample (``1 <= k < n``).
    normalize : bool
        L2-normalise rows first, so neighbours are by cosine similarity (platonic-rep's
        ``compute_score(normalize=True)``); otherwise by raw inner product.

    Returns
    -------
    float
        A similarity in ``[0, 1]``; about ``k / (n - 1)`` for unrelated representations.

    Notes
    -----
    Time ``O(n^2 (d_x + d_y))``, memory ``O(block_rows * n)``.
    """
    a, b = check_pair(x, y, min_rows=2)
    n = a.shape[0]
    if not 1 <= k < n:
        raise ValueError(f"k must satisfy 1 <= k < n = {n}, got {k}.")
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    if normalize:
        for m in (a, b):
            norms = np.linalg.norm(m, axis=1, keepdims=True)
            if np.any(norms == 0):
                raise ValueError("a row has zero norm; cosine neighbours are undefined.")
            m /= norms
    na, nb = _knn(a, k, block_rows), _knn(b, k, block_rows)
    # each row's two neighbour lists hold no repeats, so equal neighbours after sorting the
    # concatenation are exactly the shared ones
    both = np.sort(np.concatenate([na, nb], axis=1), axis=1)
    hits = int(np.count_nonzero(both[:, 1:] == both[:, :-1]))
    return float(hits / (n * k))

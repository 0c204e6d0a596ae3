"""Robust location estimates: geometric median (Weiszfeld), median of means, tail diagnostic."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from structlens.stats.moments import ColumnMoments


def geometric_median(points: np.ndarray, *, tol: float = 1e-10, max_iter: int = 1000) -> np.ndarray:
    """Point minimising the sum of Euclidean distances to the rows of ``points``.

    Weiszfeld iteration with the Vardi–Zhang (2000) correction, so an iterate landing on a data
    point neither divides by zero nor sticks there unless that point is the median.  Matrices
    can be passed flattened (Frobenius norm = Euclidean norm of the flattened matrix).

    Parameters
    ----------
    points : (k, p) array
    tol : stop when the step is below ``tol · (1 + ‖y‖)``.
    """
    x = np.asarray(points, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"points must be a non-empty (k, p) array; got shape {x.shape}.")
    if not np.all(np.isfinite(x)):
        raise ValueError("points contain NaN/inf.")
    y = x.mean(axis=0)
    for _ in range(max_iter):
        d = np.linalg.norm(x - y, axis=1)
        at = d <= 1e-300
        w = 1.0 / np.where(at, 1.0, d)
        w[at] = 0.0
        t = (w[:, None] * x).sum(axis=0) / w.sum() if w.sum() > 0 else y
        n_at = int(at.sum())
        if n_at == 0:
            y_new = t
        else:
            r = np.linalg.norm((w[:, None] * (x - y)).sum(axis=0))
            gamma = min(1.0, n_at / r) if r > 0 else 1.0
            y_new = (1.0 - gamma) * t + gamma * y
        if np.linalg.norm(y_new - y) <= tol * (1.0 + np.linalg.norm(y)):
            return y_new
        y = y_new
    return y


def block_assignment(ids: np.ndarray, n_blocks: int, seed: int) -> np.ndarray:
    """Deterministic block index in ``[0, n_blocks)`` for each integer id (a seeded hash).

    The same id always lands in the same block, so blocks are by prompt even when the prompts
    arrive in several streamed chunks.
    """
    if n_blocks < 1:
        raise ValueError(f"n_blocks must be >= 1, got {n_blocks}.")
    z = np.asarray(ids).astype(np.uint64) ^ np.uint64(seed * 0x9E3779B97F4A7C15 % 2**64)
    with np.errstate(over="ignore"):  # splitmix64 finaliser: wrap-around is intended
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(n_blocks)).astype(np.int64)


def median_of_means(x: np.ndarray, block_ids: np.ndarray) -> np.ndarray:
    """Coordinate-wise median over blocks of the per-block means of the rows of ``x``."""
    x = np.asarray(x, dtype=np.float64)
    block_ids = np.asarray(block_ids)
    if x.shape[0] != block_ids.shape[0]:
        raise ValueError(f"x has {x.shape[0]} rows but {block_ids.shape[0]} block ids.")
    means = np.stack([x[block_ids == b].mean(axis=0) for b in np.unique(block_ids)])
    return np.median(means, axis=0)


@dataclass(frozen=True)
class TailDiagnostic:
    """Per-feature excess kurtosis summarised: 0 for Gaussian tails, ≫ 0 for heavy tails.

    A description, not a decision: sample kurtoses of features without a finite eighth moment
    have no finite variance, so their median, 95th percentile or maximum can land far above
    every population value.  Whether a coordinate set is heavy-tailed is decided by
    :func:`structlens.koopman.verdicts.tail_class` on jackknife bounds
    (:func:`structlens.koopman.diagnostics.kurtosis_bounds`), calibrated in
    docs/calibration.md.
    """

    median_kurtosis: float
    p95_kurtosis: float
    max_kurtosis: float


def tail_diagnostic(moments: ColumnMoments | np.ndarray) -> TailDiagnostic:
    """Summarise per-feature excess kurtosis from an accumulator or a (n, p) array."""
    if not isinstance(moments, ColumnMoments):
        a = np.asarray(moments, dtype=np.float64)
        moments = ColumnMoments(a.shape[1]).update(a)
    k = moments.excess_kurtosis()
    k = k[np.isfinite(k)]
    if k.size == 0:
        raise ValueError("every feature is constant; no kurtosis can be computed.")
    return TailDiagnostic(
        median_kurtosis=float(np.median(k)),
        p95_kurtosis=float(np.percentile(k, 95)),
        max_kurtosis=float(k.max()),
    )

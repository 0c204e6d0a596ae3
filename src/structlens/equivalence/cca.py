"""Canonical-correlation similarities (CCA, SVCCA, PWCCA) and orthogonal Procrustes.

Conventions
-----------
* Rows are samples, columns features; widths may differ.
* All functions return **similarities in [0, 1]**; anatome's distances are ``1 - s``
  (SVCCA, PWCCA) and the squared Procrustes distance between unit-norm centred
  representations is ``2 - 2 s``.
* ``chunk_rows`` and ``precision`` are passed to :class:`CrossMoments`.
* Everything is computed from the centred scatter matrices ``C_xx``, ``C_yy``, ``C_xy`` of a
  :class:`~structlens.stats.moments.CrossMoments` accumulator (float64, streamed), so
  ``n`` only costs one pass over the data and memory is ``O(d^2)`` beyond the input.
* CCA is invariant to any invertible linear map of either side, which makes it overstate
  similarity when the width approaches ``n``; Procrustes is invariant to orthogonal maps and
  isotropic scaling only.
"""

from __future__ import annotations

import numpy as np

from structlens.errors import DegenerateInputError
from structlens.stats.moments import DEFAULT_CHUNK_ROWS, CrossMoments

from ._checks import check_pair

__all__ = [
    "cca_correlations",
    "svcca",
    "pwcca",
    "procrustes_similarity",
    "cca_correlations_from_moments",
    "svcca_from_moments",
    "pwcca_from_moments",
    "procrustes_from_moments",
]

RANK_RTOL = 1e-10


def _moments(x: object, y: object, chunk_rows: int, precision: str) -> CrossMoments:
    a, b = check_pair(x, y, min_rows=2, finite=False)
    m = CrossMoments(
        a.shape[1], b.shape[1], chunk_rows=chunk_rows, precision=precision, fourth_order=False
    )
    return m.update(a, b)


def _principal(cov: np.ndarray, keep: float | int | None, keep_by: str) -> tuple[np.ndarray, ...]:
    """Eigen-directions of a scatter matrix, largest first, numerically null ones dropped,
    then truncated by ``keep`` (a fraction of variance / singular-value mass, or a count)."""
    evals, evecs = np.linalg.eigh(cov)
    order = np.argsort(evals)[::-1]
    evals, evecs = evals[order], evecs[:, order]
    if evals[0] <= 0:
        raise ValueError("a representation is constant (zero variance); CCA is undefined.")
    rank = int(np.sum(evals > RANK_RTOL * evals[0]))
    evals, evecs = evals[:rank], evecs[:, :rank]
    if keep is None:
        return evals, evecs
    if isinstance(keep, (int, np.integer)) and not isinstance(keep, bool):
        if keep < 1:
            raise ValueError(f"keep must be a positive count or a fraction in (0, 1], got {keep}.")
        k = min(int(keep), rank)
    else:
        if not 0.0 < float(keep) <= 1.0:
            raise ValueError(f"keep must be a fraction in (0, 1] or a count, got {keep}.")
        if keep_by == "variance":
            mass = evals
        elif keep_by == "singular_value":
            mass = np.sqrt(evals)
        else:
            raise ValueError(f"keep_by must be 'variance' or 'singular_value', got {keep_by!r}.")
        frac = np.cumsum(mass) / mass.sum()
        k = int(np.searchsorted(frac, float(keep) - 1e-12) + 1)
        k = min(k, rank)
    return evals[:k], evecs[:, :k]


def _cca(
    m: CrossMoments, keep_x: float | int | None, keep_y: float | int | None, keep_by: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Canonical correlations and x-side coefficients (``a^T C_xx a = I``)."""
    lx, vx = _principal(m.s_xx, keep_x, keep_by)
    ly, vy = _principal(m.s_yy, keep_y, keep_by)
    wx = vx / np.sqrt(lx)[None, :]
    wy = vy / np.sqrt(ly)[None, :]
    u, rho, vt = np.linalg.svd(wx.T @ m.s_xy @ wy, full_matrices=False)
    rho = np.clip(rho, 0.0, 1.0)
    return rho, wx @ u, wy @ vt.T, lx


def cca_correlations_from_moments(m: CrossMoments) -> np.ndarray:
    """Canonical correlations (descending, in [0, 1]) from accumulated moments."""
    return _cca(m, None, None, "variance")[0]


def cca_correlations(
    x: object, y: object, chunk_rows: int = DEFAULT_CHUNK_ROWS, precision: str = "float64"
) -> np.ndarray:
    """Canonical correlations between ``x`` ``[n, d_x]`` and ``y`` ``[n, d_y]``, descending.

    Numerically null directions (eigenvalue below ``1e-10`` of the largest) are dropped, so
    ``min(rank_x, rank_y)`` correlations are returned. With ``n <= d`` they are all 1.
    """
    return cca_correlations_from_moments(_moments(x, y, chunk_rows, precision))


def svcca_from_moments(
    m: CrossMoments, keep: float | int = 0.99, keep_by: str = "variance"
) -> float:
    """SVCCA similarity from accumulated moments; see :func:`svcca`."""
    rho, _, _, lx = _cca(m, keep, keep, keep_by)
    kx, ky = len(lx), len(_principal(m.s_yy, keep, keep_by)[0])
    if kx + ky > m.n - 1:
        # n centred samples span n - 1 dimensions: two subspaces of kx and ky dimensions
        # then share kx + ky - (n - 1) directions, correlated 1 whatever the data.
        raise DegenerateInputError(
            f"SVCCA on {m.n} samples with {kx} + {ky} kept directions is meaningless: "
            f"{kx + ky - (m.n - 1)} canonical correlations are 1 by construction; give more "
            f"than {kx + ky} samples (many more for an unbiased value) or a smaller keep"
        )
    return float(rho.mean())


def svcca(
    x: object,
    y: object,
    keep: float | int = 0.99,
    keep_by: str = "variance",
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    precision: str = "float64",
) -> float:
    """SVCCA (Raghu et al. 2017): mean canonical correlation after an SVD reduction.

    Parameters
    ----------
    x, y : array_like
        ``[n, d_x]`` and ``[n, d_y]`` activations on the same inputs.
    keep : float or int
        A float in ``(0, 1]`` keeps the fewest leading principal directions of each side whose
        cumulative share reaches ``keep``; an int keeps exactly that many (capped at the rank).
    keep_by : {"variance", "singular_value"}
        What the share in ``keep`` measures: eigenvalues of the covariance (variance, the
        common reading) or singular values of the centred data (anatome's rule).

    Returns
    -------
    float
        Mean of the ``min(k_x, k_y)`` canonical correlations: a similarity in ``[0, 1]``.

    Raises
    ------
    DegenerateInputError
        ``n <= k_x + k_y``, where some correlations are 1 for any data.
    """
    return svcca_from_moments(_moments(x, y, chunk_rows, precision), keep, keep_by)


def pwcca_from_moments(m: CrossMoments) -> float:
    """PWCCA similarity from accumulated moments; see :func:`pwcca`."""
    if m.d_x <= m.d_y:
        rho, a, _, _ = _cca(m, None, None, "variance")
        cov = m.s_xx
    else:
        rho, _, a, _ = _cca(m, None, None, "variance")
        cov = m.s_yy
    # canonical variate h_i = X_c a_i has unit norm; <h_i, x_j> = (C_xx a_i)_j
    weights = np.abs(cov @ a).sum(0)
    return float(weights @ rho / weights.sum())


def pwcca(
    x: object, y: object, chunk_rows: int = DEFAULT_CHUNK_ROWS, precision: str = "float64"
) -> float:
    """Projection-weighted CCA (Morcos et al. 2018): a similarity in ``[0, 1]``.

    Canonical correlations ``rho_i`` weighted by ``alpha_i = sum_j |<h_i, x_j>|``, where
    ``h_i`` are the unit-norm canonical variates of the narrower side and ``x_j`` its centred
    neurons (columns). Morcos et al.'s code takes the inner products with uncentred neurons;
    centring here keeps the measure invariant to translation. The canonical variates of one
    side are orthonormal, so no re-orthonormalisation is needed.
    """
    return pwcca_from_moments(_moments(x, y, chunk_rows, precision))


def procrustes_from_moments(m: CrossMoments) -> float:
    """Orthogonal Procrustes similarity from accumulated moments; see
    :func:`procrustes_similarity`."""
    denom = np.sqrt(np.trace(m.s_xx) * np.trace(m.s_yy))
    if denom <= 0:
        raise ValueError("a representation is constant (zero variance); Procrustes is undefined.")
    return float(np.linalg.svd(m.s_xy, compute_uv=False).sum() / denom)


def procrustes_similarity(
    x: object, y: object, chunk_rows: int = DEFAULT_CHUNK_ROWS, precision: str = "float64"
) -> float:
    """Orthogonal Procrustes similarity ``||X^T Y||_* / (||X||_F ||Y||_F)`` of centred data.

    The maximum over orthogonal (semi-orthogonal when widths differ) ``Q`` of
    ``<X, Y Q>``: a similarity in ``[0, 1]``. The squared Procrustes distance between the
    centred, unit-Frobenius-norm representations is ``2 - 2 s`` (anatome reports ``1 - s``).
    """
    return procrustes_from_moments(_moments(x, y, chunk_rows, precision))

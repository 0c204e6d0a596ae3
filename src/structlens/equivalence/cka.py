"""Centred kernel alignment (CKA): linear (feature space), kernel (Gram), and minibatch.

Conventions
-----------
* Rows are samples (the same probe inputs in ``X`` and ``Y``), columns are features; the
  widths of ``X`` and ``Y`` may differ.
* Every function returns a **similarity**: biased CKA lies in ``[0, 1]`` (1 = identical up to
  an orthogonal transform, isotropic scaling and translation); debiased CKA is an unbiased
  estimate of the population quantity, lies in ``[-1, 1]`` and can be slightly **negative**
  for independent representations.  ``1 - cka`` is the distance anatome reports and
  ``arccos(cka)`` the one netrep reports.
* Linear CKA is computed from ``X^T Y``-type products in float64, streamed in row chunks,
  so memory is linear in ``n`` (for the input) plus ``O(d^2)``; no ``n x n`` Gram is formed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from structlens.stats.moments import DEFAULT_CHUNK_ROWS, CrossMoments

from ._checks import check_finite, check_matrix, check_pair, to_numpy

__all__ = [
    "linear_cka",
    "cka_from_moments",
    "gram_linear",
    "gram_rbf",
    "hsic",
    "kernel_cka",
    "rbf_cka",
    "MinibatchCKA",
]

MAX_GRAM_SAMPLES = 20_000


def _ratio(xy: float, xx: float, yy: float) -> float:
    if xx <= 0.0 or yy <= 0.0:
        raise ValueError(
            "CKA is undefined: a representation has zero (or, debiased, non-positive) "
            f"self-similarity (HSIC(X,X)={xx:.3g}, HSIC(Y,Y)={yy:.3g}); constant features or "
            "too few samples for the debiased estimator."
        )
    return float(xy / np.sqrt(xx * yy))


def cka_from_moments(moments: CrossMoments, debiased: bool = False) -> np.ndarray:
    """Linear CKA between every pair of feature groups of an accumulated :class:`CrossMoments`.

    Returns a ``[groups_x, groups_y]`` similarity array (``[1, 1]`` without groups).
    """
    t_xy, t_xx, t_yy = moments.hsic_terms(debiased)
    if np.any(t_xx <= 0) or np.any(t_yy <= 0):
        _ratio(0.0, float(np.min(t_xx)), float(np.min(t_yy)))
    return t_xy / np.sqrt(np.outer(t_xx, t_yy))


def linear_cka(
    x: object,
    y: object,
    debiased: bool = False,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    precision: str = "float64",
) -> float:
    """Linear CKA between representations ``x`` ``[n, d_x]`` and ``y`` ``[n, d_y]``.

    Parameters
    ----------
    x, y : array_like or torch.Tensor
        Activations on the same ``n`` probe inputs (rows).
    debiased : bool
        Use the unbiased HSIC estimator (Song et al. 2012) in place of the biased one. Use it
        when the width is comparable to or larger than ``n``: biased CKA is inflated there
        (Murphy et al. 2024). Needs ``n >= 4``.
    chunk_rows : int
        Rows converted to float64 at a time.
    precision : {"float64", "float32"}
        Precision of the per-chunk products (see :class:`CrossMoments`); centring and
        accumulation are float64 either way.

    Returns
    -------
    float
        Similarity; ``[0, 1]`` biased, ``[-1, 1]`` debiased.

    Notes
    -----
    Feature-space formula (Kornblith et al. 2019): with centred ``X``, ``Y``,
    ``CKA = ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F)``. Cost ``O(n (d_x + d_y)^2)``.
    """
    a, b = check_pair(x, y, min_rows=4 if debiased else 2, finite=False)
    m = CrossMoments(
        a.shape[1], b.shape[1], chunk_rows=chunk_rows, precision=precision, fourth_order=debiased
    )
    t_xy, t_xx, t_yy = m.update(a, b).hsic_terms(debiased)
    return _ratio(float(t_xy[0, 0]), float(t_xx[0]), float(t_yy[0]))


def gram_linear(x: object) -> np.ndarray:
    """Linear Gram matrix ``X X^T`` ``[n, n]`` in float64."""
    a = check_matrix(x, "X").astype(np.float64, copy=False)
    return a @ a.T


def gram_rbf(x: object, bandwidth: float = 1.0) -> np.ndarray:
    """RBF Gram matrix ``exp(-||x_i - x_j||^2 / (2 s^2))`` with ``s^2 = bandwidth^2 * median``.

    ``median`` is the median squared distance between samples (including the zero diagonal,
    as in Kornblith et al.'s reference), so ``bandwidth`` is relative to the data's scale.
    """
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth}.")
    a = check_matrix(x, "X").astype(np.float64, copy=False)
    dot = a @ a.T
    sq = np.diagonal(dot)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * dot, 0.0)
    med = float(np.median(d2))
    if med <= 0.0:
        raise ValueError("RBF bandwidth is undefined: more than half the samples coincide.")
    return np.exp(-d2 / (2.0 * bandwidth**2 * med))


def hsic(k: np.ndarray, ell: np.ndarray, debiased: bool = False) -> float:
    """HSIC between two ``[n, n]`` Gram matrices.

    Biased: ``tr(K H L H) / (n - 1)^2`` with the centring matrix ``H``. Debiased: the
    U-statistic of Song et al. (2012) on the zero-diagonal Grams,
    ``[tr(K~L~) + 1'K~1 1'L~1 / ((n-1)(n-2)) - 2/(n-2) 1'K~L~1] / (n (n-3))``.
    """
    k = np.asarray(k, dtype=np.float64)
    ell = np.asarray(ell, dtype=np.float64)
    n = k.shape[0]
    if k.shape != (n, n) or ell.shape != (n, n):
        raise ValueError(f"Grams must be square and equal in size, got {k.shape}, {ell.shape}.")
    if not debiased:
        kc = k - k.mean(0, keepdims=True) - k.mean(1, keepdims=True) + k.mean()
        return float(np.sum(kc * ell) / (n - 1) ** 2)
    if n < 4:
        raise ValueError(f"debiased HSIC needs at least 4 samples, got {n}.")
    kt = k.copy()
    lt = ell.copy()
    np.fill_diagonal(kt, 0.0)
    np.fill_diagonal(lt, 0.0)
    k1, l1 = kt.sum(1), lt.sum(1)
    value = np.sum(kt * lt) + k1.sum() * l1.sum() / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * (k1 @ l1)
    return float(value / (n * (n - 3)))


def kernel_cka(k: np.ndarray, ell: np.ndarray, debiased: bool = False) -> float:
    """CKA from two precomputed Gram matrices (any kernel); a similarity."""
    return _ratio(hsic(k, ell, debiased), hsic(k, k, debiased), hsic(ell, ell, debiased))


def rbf_cka(x: object, y: object, bandwidth: float = 1.0, debiased: bool = False) -> float:
    """CKA with RBF kernels (:func:`gram_rbf`); a similarity in ``[0, 1]`` (biased).

    Forms two ``n x n`` Grams, so ``n`` is limited to ``MAX_GRAM_SAMPLES``; for more samples
    use :class:`MinibatchCKA` with ``kernel="rbf"`` or subsample.
    """
    a, b = check_pair(x, y, min_rows=4 if debiased else 2)
    if a.shape[0] > MAX_GRAM_SAMPLES:
        raise ValueError(
            f"rbf_cka forms n x n Grams; n={a.shape[0]} exceeds {MAX_GRAM_SAMPLES}. "
            "Subsample the probe set or use MinibatchCKA(kernel='rbf')."
        )
    return kernel_cka(gram_rbf(a, bandwidth), gram_rbf(b, bandwidth), debiased)


class MinibatchCKA:
    """Minibatch CKA of Nguyen et al. (2021): average unbiased HSIC terms, then take the ratio.

    Each :meth:`update` computes, on one minibatch of ``b >= 4`` paired rows, the unbiased
    HSIC estimates ``HSIC_1(K, L)``, ``HSIC_1(K, K)``, ``HSIC_1(L, L)`` and adds them to running
    sums; :meth:`value` returns ``mean HSIC(K,L) / sqrt(mean HSIC(K,K) * mean HSIC(L,L))``.
    Averaging the terms (not per-batch CKA values) keeps the estimator consistent. Every
    minibatch carries equal weight, as in the paper. Accumulators :meth:`merge` by summing.

    Parameters
    ----------
    kernel : {"linear", "rbf"}
        ``"linear"`` uses the feature-space formula per batch (``O(b d^2)``, no Gram);
        ``"rbf"`` forms ``b x b`` Grams with :func:`gram_rbf`.
    bandwidth : float
        RBF bandwidth relative to the per-batch median distance.

    Notes
    -----
    With a single batch holding all rows the value equals ``linear_cka(x, y, debiased=True)``.
    The result is a similarity (it can be slightly negative for unrelated representations).
    """

    def __init__(self, kernel: str = "linear", bandwidth: float = 1.0) -> None:
        if kernel not in ("linear", "rbf"):
            raise ValueError(f"kernel must be 'linear' or 'rbf', got {kernel!r}.")
        if not bandwidth > 0:
            raise ValueError(f"bandwidth must be positive, got {bandwidth}.")
        self.kernel = kernel
        self.bandwidth = bandwidth
        self.sums = np.zeros(3)  # HSIC(K,L), HSIC(K,K), HSIC(L,L)
        self.batches = 0

    def update(self, x: object, y: object) -> MinibatchCKA:
        """Add one minibatch of paired rows; returns ``self``."""
        a, b = to_numpy(x, "x"), to_numpy(y, "y")
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[0]:
            raise ValueError(
                f"x and y must be [batch, features] with equal batch, got {a.shape}, {b.shape}."
            )
        if a.shape[0] < 4:
            raise ValueError(f"unbiased HSIC needs batches of at least 4 rows, got {a.shape[0]}.")
        check_finite(a, "x")
        check_finite(b, "y")
        if self.kernel == "linear":
            n = a.shape[0]
            m = CrossMoments(a.shape[1], b.shape[1], chunk_rows=max(n, 1)).update(a, b)
            t_xy, t_xx, t_yy = m.hsic_terms(debiased=True)
            terms = np.array([t_xy[0, 0], t_xx[0], t_yy[0]]) / (n * (n - 3))
        else:
            k, ell = gram_rbf(a, self.bandwidth), gram_rbf(b, self.bandwidth)
            terms = np.array([hsic(k, ell, True), hsic(k, k, True), hsic(ell, ell, True)])
        self.sums += terms
        self.batches += 1
        return self

    def merge(self, other: MinibatchCKA) -> MinibatchCKA:
        """Add another accumulator's batches (same kernel settings); returns ``self``."""
        if (self.kernel, self.bandwidth) != (other.kernel, other.bandwidth):
            raise ValueError("cannot merge MinibatchCKA accumulators with different kernels.")
        self.sums += other.sums
        self.batches += other.batches
        return self

    def value(self) -> float:
        """The minibatch CKA similarity over all batches seen."""
        if self.batches == 0:
            raise ValueError("MinibatchCKA has seen no batches; call update() first.")
        xy, xx, yy = self.sums / self.batches
        return _ratio(xy, xx, yy)


if TYPE_CHECKING:  # the roles of structlens.estimator, checked by mypy
    from structlens.estimator import Statistics

    _MinibatchCKA: type[Statistics] = MinibatchCKA

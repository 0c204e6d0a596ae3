"""Gini coefficients of how concentrated an effect is across subspaces.

Following Huang & Hahn (NDM) the effects ``e_s`` of patching each subspace ``s`` are turned
into shares ``x_s = |e_s| / sum_t |e_t|`` (the whole-space effect is not one of them), and

``G(x) = sum_i sum_j |x_i - x_j| / (2 n sum_i x_i)``.

``G`` is 0 when every subspace carries the same share and ``(n - 1) / n`` when one subspace
carries everything.  Two normalised variants first divide each share by the share a subspace
"should" get by its size, so that a large subspace carrying a large effect is not counted as
concentration:

* dimension-normalised: ``x_s / (d_s / d)`` with ``d_s`` the subspace dimension;
* variance-normalised: ``x_s / (v_s / sum_t v_t)`` with ``v_s`` the activation variance in it.

The paper's headline number is the dimension-normalised Gini averaged over its five tests.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def gini(values: Sequence[float] | np.ndarray) -> float:
    """Gini coefficient of ``|values|`` (unnormalised variant).

    Parameters
    ----------
    values
        One number per subspace (e.g. the drop in a metric when that subspace is patched);
        signs are ignored.

    Returns
    -------
    float
        ``sum_i sum_j |x_i - x_j| / (2 n sum_i x_i)`` with ``x = |values|``, in ``[0, (n-1)/n]``.

    Raises
    ------
    ValueError
        If ``values`` is empty, not 1-D, not finite, or all zero.
    """
    x = _abs_vector(values, "values")
    return _gini_of(x)


def gini_dimension_normalized(
    values: Sequence[float] | np.ndarray, dims: Sequence[int] | np.ndarray
) -> float:
    """Gini coefficient of ``x_s / (d_s / d)``, the effect share per share of dimensions.

    ``dims[s]`` is the dimension of subspace ``s`` and ``d = sum(dims)``.
    """
    x = _abs_vector(values, "values")
    w = _weights(dims, "dims", len(x))
    return _gini_of((x / x.sum()) / (w / w.sum()))


def gini_variance_normalized(
    values: Sequence[float] | np.ndarray, variances: Sequence[float] | np.ndarray
) -> float:
    """Gini coefficient of ``x_s / (v_s / sum v)``, the effect share per share of variance.

    ``variances[s]`` is the total activation variance inside subspace ``s`` (sum over its
    coordinates).
    """
    x = _abs_vector(values, "values")
    w = _weights(variances, "variances", len(x))
    return _gini_of((x / x.sum()) / (w / w.sum()))


def gini_all(
    values: Sequence[float] | np.ndarray,
    dims: Sequence[int] | np.ndarray,
    variances: Sequence[float] | np.ndarray | None = None,
) -> dict[str, float]:
    """All variants at once: keys ``"unnormalized"``, ``"dimension"``, and ``"variance"``
    (the last only when ``variances`` is given)."""
    out = {
        "unnormalized": gini(values),
        "dimension": gini_dimension_normalized(values, dims),
    }
    if variances is not None:
        out["variance"] = gini_variance_normalized(values, variances)
    return out


def gini_rows(
    values: np.ndarray, weights: Sequence[float] | np.ndarray | None = None
) -> np.ndarray:
    """The Gini coefficient of every row of ``values`` (``(n_rows, n)``), of ``|values|``
    divided by the share ``weights / sum(weights)`` each entry should get (``None``: the
    unnormalised variant; subspace dimensions or variances: the normalised ones), as
    :func:`gini`, :func:`gini_dimension_normalized` and :func:`gini_variance_normalized` give
    for one row.  A row of zeros has no Gini: NaN."""
    x = np.abs(np.asarray(values, dtype=np.float64))
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"values must be (n_rows, n >= 1), got shape {x.shape}.")
    total = x.sum(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        x = x / total
        if weights is not None:
            w = _weights(weights, "weights", x.shape[1])
            x = x / (w / w.sum())
        n = x.shape[1]
        ranks = np.arange(1, n + 1)
        xs = np.sort(x, axis=1)
        return np.sum((2 * ranks - n - 1) * xs, axis=1) / (n * xs.sum(1))


def _gini_of(x: np.ndarray) -> float:
    n = len(x)
    # sum_i sum_j |x_i - x_j| = 2 sum_i (2i - n - 1) x_(i) over the sorted values (i from 1).
    xs = np.sort(x)
    ranks = np.arange(1, n + 1)
    return float(2.0 * np.sum((2 * ranks - n - 1) * xs) / (2.0 * n * xs.sum()))


def _abs_vector(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    x = np.abs(np.asarray(values, dtype=np.float64))
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {x.shape}.")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or infinite entries.")
    if x.sum() == 0:
        raise ValueError(f"{name} are all zero: the Gini coefficient of no effect is undefined.")
    return x


def _weights(w: Sequence[float] | np.ndarray, name: str, n: int) -> np.ndarray:
    a = np.asarray(w, dtype=np.float64)
    if a.shape != (n,):
        raise ValueError(f"{name} must have one entry per value ({n}), got shape {a.shape}.")
    if not np.isfinite(a).all() or (a <= 0).any():
        raise ValueError(f"{name} must be finite and positive, got {a.tolist()}.")
    return a

"""Input checks shared by every numerical core: one function, one wording of each error.

:func:`check_array` turns a NumPy array, a torch tensor (any device) or a nested sequence into a
NumPy array and checks its rank, row count, width, dtype and finiteness, raising a one-line
``ValueError`` that names the argument and says how to fix it.  :func:`check_shape` is the same
rank/row/width check for objects that must not be converted (device tensors that are reduced
where they live).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from structlens.errors import InputError

__all__ = ["check_array", "check_finite", "check_shape"]


def check_shape(
    shape: Sequence[int],
    *,
    name: str,
    ndim: int | None = 2,
    min_rows: int = 0,
    n_cols: int | None = None,
) -> None:
    """Raise ``ValueError`` unless ``shape`` has ``ndim`` axes, ``>= min_rows`` rows and
    ``n_cols`` columns (rows = samples, columns = features)."""
    shape = tuple(int(s) for s in shape)
    if ndim == 2 and len(shape) != 2:
        raise InputError(
            f"{name} must be 2-D (rows = samples, columns = features), got shape {shape}; "
            f"flatten token/position axes into rows first."
        )
    if ndim is not None and len(shape) != ndim:
        raise InputError(f"{name} must be {ndim}-D, got shape {shape}.")
    if shape and shape[0] < min_rows:
        raise InputError(
            f"{name} has {shape[0]} rows (samples) but at least {min_rows} are needed; "
            f"pass more data."
        )
    if ndim == 2 and len(shape) == 2 and shape[1] < 1:
        raise InputError(f"{name} has no features (shape {shape}).")
    if n_cols is not None and len(shape) >= 2 and shape[1] != n_cols:
        raise InputError(
            f"{name} has {shape[1]} columns but {n_cols} are expected (shape {shape}); "
            f"pass features from the same site/dictionary as before."
        )


def check_finite(a: np.ndarray, name: str) -> None:
    """Raise if ``a`` holds NaN or infinite values, saying how many."""
    if not np.isfinite(a).all():
        bad = int(a.size - np.count_nonzero(np.isfinite(a)))
        raise InputError(
            f"{name} contains {bad} NaN or infinite values; drop those rows or fix the "
            f"capture (fp16 overflow is a common cause)."
        )


def check_array(
    x: Any,
    *,
    name: str,
    ndim: int | None = 2,
    min_rows: int = 0,
    n_cols: int | None = None,
    dtype: npt.DTypeLike | None = np.float64,
    finite: bool = True,
) -> np.ndarray:
    """Return ``x`` as a checked NumPy array.

    Parameters
    ----------
    x
        NumPy array, torch tensor (detached and moved to the host; bfloat16/float16 become
        float32) or nested sequence of numbers.
    name
        The argument's name, used in error messages.
    ndim, min_rows, n_cols
        Required rank, minimum number of rows (axis 0) and number of columns (axis 1); see
        :func:`check_shape`.  ``None`` skips the check.
    dtype
        Convert to this dtype (no copy when it already matches).  ``None`` keeps floating
        dtypes as they are (float32 stays float32, so large inputs are not copied) and converts
        integers and booleans to float64.
    finite
        Scan for NaN/inf (skip it when a later fused reduction checks finiteness anyway).

    Examples
    --------
    >>> check_array([[1, 2], [3, 4]], name="X").dtype
    dtype('float64')
    >>> check_array([1.0, 2.0], name="X")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    structlens.errors.InputError: X must be 2-D (rows = samples, columns = features), got ...
    """
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch tensor
        x = x.detach().cpu()
        if str(x.dtype) in ("torch.bfloat16", "torch.float16"):
            x = x.float()
        x = x.numpy()
    a = np.asarray(x)
    if a.dtype == object or not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_):
        raise InputError(f"{name} must be a numeric array, got dtype {a.dtype}.")
    if np.issubdtype(a.dtype, np.complexfloating):
        raise InputError(f"{name} must be real, got dtype {a.dtype}.")
    if dtype is not None:
        a = a.astype(dtype, copy=False)
    elif not np.issubdtype(a.dtype, np.floating):
        a = a.astype(np.float64)
    check_shape(a.shape, name=name, ndim=ndim, min_rows=min_rows, n_cols=n_cols)
    if finite:
        check_finite(a, name)
    return a

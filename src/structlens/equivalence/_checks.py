"""Input checks of the similarity and matching code, built on :mod:`structlens.stats.validation`."""

from __future__ import annotations

from typing import Any

import numpy as np

from structlens.stats.validation import check_array, check_finite

__all__ = ["check_finite", "check_matrix", "check_pair", "to_numpy"]


def to_numpy(x: Any, name: str) -> np.ndarray:
    """``x`` (array, tensor or nested sequence) as a numeric NumPy array of any rank.

    Floating dtypes are kept (float32 stays float32, so large inputs are not copied here);
    the numerical code converts to float64 chunk by chunk.
    """
    return check_array(x, name=name, ndim=None, dtype=None, finite=False)


def check_matrix(x: Any, name: str, min_rows: int = 2, finite: bool = True) -> np.ndarray:
    """Validate a ``[samples, features]`` matrix: 2-D, enough rows, all finite.

    ``finite=False`` skips the NaN scan for callers that stream the data through
    :class:`~structlens.stats.moments.CrossMoments`, which checks every chunk itself.
    """
    return check_array(x, name=name, min_rows=min_rows, dtype=None, finite=finite)


def check_pair(
    x: Any, y: Any, min_rows: int = 2, finite: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Validate two matrices describing the same probe set (same number of rows)."""
    a = check_matrix(x, "X", min_rows, finite)
    b = check_matrix(y, "Y", min_rows, finite)
    if a.shape[0] != b.shape[0]:
        raise ValueError(
            f"X has {a.shape[0]} samples and Y has {b.shape[0]}: both representations must "
            f"come from the same probe set, row i of X and row i of Y being the same input."
        )
    return a, b

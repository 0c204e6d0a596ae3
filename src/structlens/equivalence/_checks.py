"""Input validation shared by the similarity and matching code."""

from __future__ import annotations

from typing import Any

import numpy as np


def to_numpy(x: Any, name: str) -> np.ndarray:
    """Return ``x`` (numpy array, torch tensor or nested sequence) as a numpy array.

    Floating dtypes are kept (float32 stays float32, so large inputs are not copied here);
    the numerical code converts to float64 chunk by chunk.
    """
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu()
        if str(x.dtype) in ("torch.bfloat16", "torch.float16"):
            x = x.float()
        x = x.numpy()
    a = np.asarray(x)
    if a.dtype == object:
        raise ValueError(f"{name} must be a numeric array, got an object array.")
    if not np.issubdtype(a.dtype, np.number) and a.dtype != np.bool_:
        raise ValueError(f"{name} must be numeric, got dtype {a.dtype}.")
    if not np.issubdtype(a.dtype, np.floating):
        a = a.astype(np.float64)
    return a


def check_matrix(x: Any, name: str, min_rows: int = 2, finite: bool = True) -> np.ndarray:
    """Validate a ``[samples, features]`` matrix: 2-D, enough rows, all finite.

    ``finite=False`` skips the NaN scan for callers that stream the data through
    :class:`CrossMoments`, which checks every chunk itself.
    """
    a = to_numpy(x, name)
    if a.ndim != 2:
        raise ValueError(
            f"{name} must be 2-D with rows = samples and columns = features, got shape "
            f"{a.shape}; flatten token/position axes into rows first (see equivalence.prepare)."
        )
    if a.shape[0] < min_rows:
        raise ValueError(
            f"{name} has {a.shape[0]} samples but this measure needs at least {min_rows}; "
            f"use a larger probe set."
        )
    if a.shape[1] < 1:
        raise ValueError(f"{name} has no features (shape {a.shape}).")
    if finite:
        check_finite(a, name)
    return a


def check_finite(a: np.ndarray, name: str) -> None:
    """Raise if ``a`` holds NaN or infinite values, saying how many."""
    if not np.isfinite(a).all():
        bad = int(a.size - np.count_nonzero(np.isfinite(a)))
        raise ValueError(
            f"{name} contains {bad} NaN or infinite values; drop those samples or fix the "
            f"capture (fp16 overflow is a common cause) before comparing representations."
        )


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

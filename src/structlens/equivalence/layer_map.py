"""Maps that replace a whole layer of one model by its partner's: well-posed fits only.

A layer map sends ``x`` (A's residual, ``d_a`` wide) to B's residual space.  With ``n`` fit
rows and ``n ≤ d_a`` the map is not determined off the span of the fit rows: a ridge map
shrinks every held-out direction outside that span to zero, so even two *identical* layers
fail validation (the bug this module fixes: ~170 rows for ``d = 576``).  A Procrustes map is
no better there (its rotation on the complement is arbitrary).  :func:`fit_layer_map`
therefore requires more fit rows than A's width, and by default uses an orthogonal
Procrustes map when the two widths agree (rotations and permutations of a residual basis are
then recovered exactly) and ridge otherwise.
"""

from __future__ import annotations

import numpy as np

from structlens.errors import InputError

from ._checks import check_pair
from .encoding import LinearMap, fit_linear_map

__all__ = ["fit_layer_map"]


def fit_layer_map(x: object, y: object, method: str = "auto") -> LinearMap:
    """Affine map from A's layer rows ``x`` ``[n, d_a]`` to B's ``y`` ``[n, d_b]``.

    ``method``: ``"auto"`` (Procrustes when ``d_a == d_b``, else ridge), ``"procrustes"`` or
    ``"ridge"`` (see :func:`~structlens.equivalence.fit_linear_map`).  Raises when
    ``n ≤ d_a``: the map would be undetermined off the fit rows' span.
    """
    a, b = check_pair(x, y)
    n, d_a = a.shape
    if method not in ("auto", "procrustes", "ridge"):
        raise ValueError(f"method must be 'auto', 'procrustes' or 'ridge', got {method!r}.")
    if n <= d_a:
        raise InputError(
            f"a layer map from width {d_a} needs more than {d_a} fit rows, got {n}; use more "
            "probe prompts (or longer ones) so the fit set has more tokens than dimensions."
        )
    if method == "auto":
        method = "procrustes" if b.shape[1] == d_a else "ridge"
    return fit_linear_map(np.asarray(a, np.float64), np.asarray(b, np.float64), method)

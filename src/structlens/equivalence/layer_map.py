"""Maps that replace a whole layer of one model by its partner's: well-posed fits only.

A layer map sends ``x`` (A's residual, ``d_a`` wide) to B's residual space.  With ``n`` fit
rows and ``n ≤ d_a`` the map is not determined off the span of the fit rows: a ridge map
shrinks every held-out direction outside that span to zero, so even two *identical* layers
fail validation (~170 rows for ``d = 576`` did).  A Procrustes map is no better there (its
rotation on the complement is arbitrary).  Every map therefore needs more fit rows than A's
width.

Which map is a statement about how the two models relate (:func:`choose_layer_map`):

* a **copy** of A (a rotated, head-permuted copy; a fine-tune, which starts from A's weights
  and keeps its residual basis) is A's layer up to an orthogonal map, which an orthogonal
  Procrustes map recovers exactly from a little more than ``d_a`` rows;
* **independently** trained models (other seeds, depths, architectures) give no reason for an
  orthogonal relation: their layers are related, if at all, by some affine map, which a ridge
  map with intercept estimates.  An affine map of ``d_a`` inputs is fitted well only on many
  rows per dimension (ordinary least squares inflates the held-out error by about
  ``d_a / (n - d_a)`` of the noise), so ``rows_per_dim`` rows per dimension are required, and
  with fewer the layers are not validated, with the reason recorded.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from structlens.errors import InputError
from structlens.results import Result

from ._checks import check_pair
from .encoding import LinearMap, fit_linear_map

__all__ = ["LayerMapChoice", "choose_layer_map", "fit_layer_map", "RELATIONS"]

#: How model B may relate to model A: a copy (one residual basis up to an orthogonal map) or
#: independently trained.
RELATIONS = ("independent", "copy")
_METHODS = ("auto", "procrustes", "ridge")


@dataclasses.dataclass(frozen=True)
class LayerMapChoice(Result):
    """The whole-layer map a comparison uses and why.

    ``method`` is ``"procrustes"``, ``"ridge"`` or ``None`` (the layers are not validated);
    ``requested`` the protocol's ``layer_map``; ``relation`` how B relates to A; ``rows`` the
    fit rows, ``width_a``/``width_b`` the layer widths, ``min_rows`` the rows the chosen (or
    refused) map needs; ``reason`` one sentence.
    """

    method: str | None
    requested: str
    relation: str
    rows: int
    width_a: int
    width_b: int
    min_rows: int
    reason: str


def choose_layer_map(
    rows: int,
    width_a: int,
    width_b: int,
    method: str = "auto",
    relation: str = "independent",
    rows_per_dim: float = 10.0,
) -> LayerMapChoice:
    """The layer map for ``rows`` fit rows from width ``width_a`` to ``width_b``.

    ``method="auto"`` follows ``relation`` (module docstring): Procrustes for a ``"copy"``
    (equal widths required) on more rows than ``width_a``; ridge for ``"independent"`` models
    on at least ``rows_per_dim × width_a`` rows; with fewer rows, no map (``method`` ``None``)
    and the reason.  An explicit ``"procrustes"`` or ``"ridge"`` is used as asked (it still
    needs more rows than ``width_a``, see :func:`fit_layer_map`).
    """
    if method not in _METHODS:
        raise InputError(f"layer_map must be one of {', '.join(_METHODS)}; got {method!r}.")
    if relation not in RELATIONS:
        raise InputError(f"relation must be one of {', '.join(RELATIONS)}; got {relation!r}.")
    if not rows_per_dim >= 1:
        raise InputError(f"rows_per_dim must be >= 1; got {rows_per_dim}.")
    if min(rows, width_a, width_b) < 1:
        raise InputError(f"need rows and widths >= 1; got {rows} rows, {width_a} → {width_b}.")
    method_, min_rows, reason = _decide(rows, width_a, width_b, method, relation, rows_per_dim)
    return LayerMapChoice(
        method=method_, requested=method, relation=relation, rows=rows, width_a=width_a,
        width_b=width_b, min_rows=min_rows, reason=reason,
    )  # fmt: skip


def _decide(
    rows: int, width_a: int, width_b: int, method: str, relation: str, rows_per_dim: float
) -> tuple[str | None, int, str]:
    """``(method or None, rows it needs, reason)`` of :func:`choose_layer_map`."""
    determined = width_a + 1
    if method != "auto":
        return method, determined, f"layer_map {method!r} asked for"
    if relation == "copy":
        if width_a != width_b:
            raise InputError(
                f"relation 'copy' needs layers of equal width, got {width_a} and {width_b}: a "
                "copy shares A's residual basis; use relation 'independent'."
            )
        if rows < determined:
            return (
                None,
                determined,
                (
                    f"B is a copy of A, but {rows} fit rows do not determine a map of width "
                    f"{width_a}; the layers are not validated (use more or longer probe prompts)"
                ),
            )
        return (
            "procrustes",
            determined,
            (
                "B is a copy of A (one residual basis up to an orthogonal map): orthogonal "
                f"Procrustes on {rows} fit rows"
            ),
        )
    needed = max(determined, math.ceil(rows_per_dim * width_a))
    if rows < needed:
        return (
            None,
            needed,
            (
                "independently trained models share no basis, so their layers need an affine "
                f"(ridge) map, fitted well only on >= {rows_per_dim:g} rows per dimension "
                f"({needed} for width {width_a}); {rows} fit rows: the layers are not validated"
            ),
        )
    return (
        "ridge",
        needed,
        (
            "independently trained models share no basis (no orthogonal relation is assumed): "
            f"an affine ridge map with intercept on {rows} fit rows (>= {rows_per_dim:g} per "
            "dimension)"
        ),
    )


def fit_layer_map(
    x: object,
    y: object,
    method: str = "auto",
    relation: str = "independent",
    rows_per_dim: float = 10.0,
) -> LinearMap:
    """Affine map from A's layer rows ``x`` ``[n, d_a]`` to B's ``y`` ``[n, d_b]``.

    ``method``: ``"auto"`` (the map :func:`choose_layer_map` picks for ``relation``),
    ``"procrustes"`` or ``"ridge"`` (see :func:`~structlens.equivalence.fit_linear_map`; ridge
    chooses its penalty by cross-validation on the rows and fits an intercept).  Raises when
    ``n ≤ d_a`` (the map would be undetermined off the fit rows' span) and when the auto
    choice refuses, with its reason.
    """
    a, b = check_pair(x, y)
    n, d_a = a.shape
    if method not in _METHODS:
        raise ValueError(f"method must be 'auto', 'procrustes' or 'ridge', got {method!r}.")
    if n <= d_a:
        raise InputError(
            f"a layer map from width {d_a} needs more than {d_a} fit rows, got {n}; use more "
            "probe prompts (or longer ones) so the fit set has more tokens than dimensions."
        )
    choice = choose_layer_map(n, d_a, b.shape[1], method, relation, rows_per_dim)
    if choice.method is None:
        raise InputError(f"no layer map: {choice.reason}.")
    return fit_linear_map(np.asarray(a, np.float64), np.asarray(b, np.float64), choice.method)

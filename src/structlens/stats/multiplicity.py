"""Multiple comparisons: one analysis, many decisions.

When a verdict rests on several tests at once (every seed pair of a universality check,
every cell of a CONGRUITY grid, every comparison of an equivalence table), testing each at
level α lets the family say "different" somewhere far more often than α.  Two adjustments:

* :func:`holm` controls the **family-wise error rate** (the chance of any false rejection)
  at α under any dependence between the tests: Holm's step-down version of Bonferroni,
  uniformly more powerful than it.  Use it where one false rejection changes the verdict
  (a universality claim fails on one differing pair).
* :func:`benjamini_hochberg` controls the **false-discovery rate** (the expected share of
  false rejections among the rejections) at α for independent or positively dependent
  tests.  Use it where the verdict counts rejections (how many heads, cells, comparisons).

Both return adjusted p-values: a test is rejected at level α exactly when its adjusted
p-value is ≤ α, so one adjustment serves every level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Adjusted", "holm", "benjamini_hochberg", "adjust", "METHODS"]


@dataclass(frozen=True)
class Adjusted:
    """The tests of one family after an adjustment.

    ``p_values`` are the raw p-values in the caller's order, ``adjusted`` the adjusted ones
    (same order), ``rejected`` whether each is rejected at ``alpha`` (``adjusted <= alpha``),
    ``method`` the adjustment (``"holm"``, ``"bh"``) and ``controls`` what it controls.
    """

    method: str
    controls: str
    alpha: float
    p_values: tuple[float, ...]
    adjusted: tuple[float, ...]
    rejected: tuple[bool, ...]

    @property
    def n_rejected(self) -> int:
        return sum(self.rejected)

    @property
    def any_rejected(self) -> bool:
        return any(self.rejected)


def _checked(p_values: Sequence[float] | np.ndarray, alpha: float) -> np.ndarray:
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError(f"p_values must be one-dimensional; got shape {p.shape}.")
    if np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        raise ValueError("p_values must lie in [0, 1] (no NaN); drop the tests that did not run.")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1); got {alpha}.")
    return p


def _result(method: str, controls: str, alpha: float, p: np.ndarray, adj: np.ndarray) -> Adjusted:
    adj = np.minimum(adj, 1.0)
    return Adjusted(
        method=method, controls=controls, alpha=float(alpha),
        p_values=tuple(float(v) for v in p), adjusted=tuple(float(v) for v in adj),
        rejected=tuple(bool(v <= alpha) for v in adj),
    )  # fmt: skip


def holm(p_values: Sequence[float] | np.ndarray, alpha: float = 0.05) -> Adjusted:
    """Holm's step-down adjustment (family-wise error rate ≤ ``alpha``, any dependence).

    With the p-values sorted ascending, ``p_(1) ≤ … ≤ p_(m)``, the adjusted value of the
    i-th is ``max_{j ≤ i} min(1, (m − j + 1) p_(j))``.

    Examples
    --------
    >>> holm([0.01, 0.04, 0.03], alpha=0.05).adjusted
    (0.03, 0.06, 0.06)
    """
    p = _checked(p_values, alpha)
    m = len(p)
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])
    adj = np.empty(m)
    adj[order] = stepped
    return _result("holm", "family-wise error rate", alpha, p, adj)


def benjamini_hochberg(p_values: Sequence[float] | np.ndarray, alpha: float = 0.05) -> Adjusted:
    """The Benjamini–Hochberg step-up adjustment (false-discovery rate ≤ ``alpha`` for
    independent or positively dependent tests).

    With the p-values sorted ascending, the adjusted value of the i-th is
    ``min_{j ≥ i} min(1, m p_(j) / j)``.

    Examples
    --------
    >>> benjamini_hochberg([0.01, 0.04, 0.03], alpha=0.05).adjusted
    (0.03, 0.04, 0.04)
    """
    p = _checked(p_values, alpha)
    m = len(p)
    order = np.argsort(p, kind="stable")
    scaled = m * p[order] / np.arange(1, m + 1)
    stepped = np.minimum.accumulate(scaled[::-1])[::-1]
    adj = np.empty(m)
    adj[order] = stepped
    return _result("bh", "false-discovery rate", alpha, p, adj)


#: The adjustments by name.
METHODS = {"holm": holm, "bh": benjamini_hochberg}


def adjust(p_values: Sequence[float] | np.ndarray, method: str, alpha: float = 0.05) -> Adjusted:
    """The adjustment ``method`` (a name of :data:`METHODS`) of ``p_values`` at ``alpha``."""
    if method not in METHODS:
        raise ValueError(f"unknown adjustment {method!r}; use one of {', '.join(METHODS)}.")
    return METHODS[method](p_values, alpha)

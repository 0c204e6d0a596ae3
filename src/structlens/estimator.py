"""The estimator protocol of docs/architecture.md as types that mypy checks.

Two roles, one verb each:

* :class:`Statistics`: running sufficient statistics. ``update(...)`` folds one chunk of rows
  in, ``merge(other)`` folds another worker's statistics in; both work in place and return
  ``self``, so partial results combine in any order (:func:`structlens.execution.reduce.merge_all`).
* :class:`StreamingEstimator`: ``partial_fit(chunk)`` folds a chunk into the estimator's
  statistics and returns ``self``; ``fit_from_statistics(stats)`` solves from statistics alone
  (merged from several workers, or loaded) and returns a frozen :class:`~structlens.results.Result`.

Every class that plays a role is listed in a ``TYPE_CHECKING`` block of its own module
(``_role: type[Statistics] = ...``), so that ``make check`` fails when one drifts from it.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

__all__ = ["Statistics", "StreamingEstimator"]

S_contra = TypeVar("S_contra", contravariant=True)
R_co = TypeVar("R_co", covariant=True)
T = TypeVar("T")  # the implementing class (``Self``, which Python 3.10 lacks)


class Statistics(Protocol):
    """Mergeable running statistics: ``update`` and ``merge`` fold in place, return ``self``."""

    def update(self: T, *chunk: Any) -> T: ...

    def merge(self: T, other: T) -> T: ...


class StreamingEstimator(Protocol[S_contra, R_co]):
    """An estimator fitted chunk by chunk (``partial_fit``) or from merged statistics."""

    def partial_fit(self: T, chunk: Any) -> T: ...

    def fit_from_statistics(self, stats: S_contra) -> R_co: ...

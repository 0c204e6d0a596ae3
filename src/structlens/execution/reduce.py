"""Mergeable statistics computed per item on workers, then merged.

Every streaming statistic in structlens (:class:`~structlens.stats.moments.CrossMoments`,
:class:`~structlens.stats.moments.ColumnMoments`,
:class:`~structlens.koopman.edmdc.EDMDcStatistics`,
:class:`~structlens.causal_dim.jacobian.EJOPAccumulator`,
:class:`~structlens.causal_dim.sweep.FeatureStats`) has a ``merge`` that combines two partial
results into what one pass over both would give.  :func:`map_reduce` maps a function producing
such a partial result over items with any executor and merges the parts *in item order*, so
the answer does not depend on which worker finished first; it equals the single pass up to
float64 round-off (the pairwise updates associate differently).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from structlens.execution.base import Executor, get_executor

T = TypeVar("T")
A = TypeVar("A")


def merge_all(parts: Iterable[A], merge: Callable[[A, A], A | None] | None = None) -> A:
    """Left fold of ``parts`` with ``merge`` (default: the parts' own ``.merge``).

    ``merge(a, b)`` may fold ``b`` into ``a`` in place and return ``None`` (as
    older accumulators do) or return the merged value (the estimator protocol's statistics,
    such as :class:`~structlens.causal_dim.jacobian.EJOPAccumulator`, fold in place and return
    ``a`` itself); both styles work.
    """
    it = iter(parts)
    try:
        acc = next(it)
    except StopIteration:
        raise ValueError("nothing to merge: no partial results were produced") from None
    for part in it:
        out = acc.merge(part) if merge is None else merge(acc, part)  # type: ignore[attr-defined]
        acc = acc if out is None else out
    return acc


def map_reduce(
    fn: Callable[[T], A],
    items: Sequence[T],
    *,
    merge: Callable[[A, A], A | None] | None = None,
    executor: str | Executor | None = None,
    desc: str = "",
    progress: bool = True,
) -> A:
    """Compute ``fn(item)`` for every item with ``executor`` and merge the results in order.

    ``fn`` returns a mergeable partial statistic; results travel back to this process, so they
    should be sufficient statistics (moment matrices), not raw data.
    """
    if not items:
        raise ValueError("map_reduce needs at least one item")
    parts = get_executor(executor).map(fn, items, desc=desc, progress=progress)
    return merge_all(parts, merge)

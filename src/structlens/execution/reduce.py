"""Mergeable statistics computed per item (or per store shard) on workers, then merged.

Every streaming statistic in structlens (:class:`~structlens.stats.streaming.MomentAccumulator`
and its cross/column variants, :class:`~structlens.koopman.edmdc.EDMDcStatistics`,
:class:`~structlens.equivalence.moments.CrossMoments`,
:class:`~structlens.causal_dim.jacobian.EJOPAccumulator`,
:class:`~structlens.causal_dim.sweep.FeatureStats`) has a ``merge`` that combines two partial
results into what one pass over both would give.  :func:`map_reduce` maps a function producing
such a partial result over items with any executor and merges the parts *in item order*, so
the answer does not depend on which worker finished first; it equals the single pass up to
float64 round-off (the pairwise updates associate differently).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from structlens.execution.base import Executor, get_executor

T = TypeVar("T")
A = TypeVar("A")


def merge_all(parts: Iterable[A], merge: Callable[[A, A], A | None] | None = None) -> A:
    """Left fold of ``parts`` with ``merge`` (default: the parts' own ``.merge``).

    ``merge(a, b)`` may fold ``b`` into ``a`` in place and return ``None`` (as
    :class:`~structlens.stats.streaming.MomentAccumulator` does) or return the merged value
    (as :class:`~structlens.causal_dim.jacobian.EJOPAccumulator` does); both styles work.
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


@dataclass
class _ShardStatistic:
    """Loads one shard of a store (on the worker, from shared storage) and applies ``fn``."""

    path: str
    shards: list[dict[str, Any]]
    sites: list[str]
    fn: Callable[[dict[str, Any]], Any]

    def __call__(self, index: int) -> Any:
        from structlens.capture.store import INDEX_KEYS, read_shard

        data = read_shard(self.path, self.shards[index])
        return self.fn({k: data[k] for k in (*self.sites, *INDEX_KEYS)})


def store_statistic(
    store: Any,
    fn: Callable[[dict[str, Any]], A],
    *,
    sites: Sequence[str] | None = None,
    merge: Callable[[A, A], A | None] | None = None,
    executor: str | Executor | None = None,
    progress: bool = True,
) -> A:
    """A mergeable statistic of a finished activation store, one worker task per shard.

    Parameters
    ----------
    store
        A complete :class:`~structlens.capture.store.ActivationStore` on storage the workers
        can read (the same path on every node).
    fn
        Maps one shard, a dict ``site -> [n_tokens, *shape]`` plus ``prompt_index``,
        ``position`` and ``token_id``, to a partial statistic.  Must be picklable (a
        module-level function or a dataclass instance, not a lambda, for Ray).
    sites
        Sites to load per shard (default: all).
    """
    from structlens.capture.store import StoreError

    if not store.complete:
        raise StoreError(
            f"{store.path} is incomplete ({len(store.missing_shards())} shards missing); "
            f"re-run the capture to resume it"
        )
    wanted = store.sites if sites is None else list(sites)
    unknown = [s for s in wanted if s not in store.sites]
    if unknown:
        raise StoreError(
            f"sites {unknown} were not captured in {store.path}; it holds {store.sites}"
        )
    shards = list(store.metadata["shards"])
    job = _ShardStatistic(str(Path(store.path).resolve()), shards, wanted, fn)
    return map_reduce(
        job,
        list(range(len(shards))),
        merge=merge,
        executor=executor,
        desc="shard statistics",
        progress=progress,
    )

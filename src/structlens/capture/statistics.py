"""Mergeable statistics of a finished activation store, one worker task per shard.

This is the store-aware half of :func:`structlens.execution.map_reduce` (the execution layer
knows nothing about stores): each task loads one shard on the worker and maps it to a
mergeable partial statistic, and the parts are merged in shard order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from structlens.capture.store import INDEX_KEYS, StoreError, read_shard
from structlens.execution import Executor, map_reduce

A = TypeVar("A")

__all__ = ["store_statistic"]


@dataclass
class _ShardStatistic:
    """Loads one shard of a store (on the worker, from shared storage) and applies ``fn``."""

    path: str
    shards: list[dict[str, Any]]
    sites: list[str]
    fn: Callable[[dict[str, Any]], Any]

    def __call__(self, index: int) -> Any:
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

"""Where work runs.

Long jobs (capture shards, sweep points, per-shard statistics) are expressed as a function
mapped over independent items.  :class:`LocalExecutor` runs them in this process;
:class:`~structlens.execution.ray.RayExecutor` (``get_executor("ray", ...)``, optional extra
``structlens[ray]``) runs the same jobs on a Ray cluster.  :func:`map_reduce` and
:func:`store_statistic` compute mergeable statistics per item or per store shard and merge
them in item order.
"""

from structlens.execution.base import EXECUTORS, Executor, LocalExecutor, get_executor
from structlens.execution.reduce import map_reduce, merge_all, store_statistic

__all__ = [
    "EXECUTORS",
    "Executor",
    "LocalExecutor",
    "get_executor",
    "map_reduce",
    "merge_all",
    "store_statistic",
]

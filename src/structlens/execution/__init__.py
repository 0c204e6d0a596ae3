"""Where work runs.

Long jobs (capture shards, sweep points, per-shard statistics) are expressed as a function
mapped over independent items.  :class:`LocalExecutor` runs them in this process;
:class:`~structlens.execution.ray.RayExecutor` (``get_executor("ray", ...)``, optional extra
``structlens[ray]``) runs the same jobs on a Ray cluster.  :func:`map_reduce` computes
mergeable statistics per item and merges them in item order
(:func:`structlens.capture.statistics.store_statistic` does so per store shard).  This layer
imports nothing else from structlens.
"""

from structlens.execution.base import EXECUTORS, Executor, LocalExecutor, get_executor
from structlens.execution.reduce import map_reduce, merge_all

__all__ = [
    "EXECUTORS",
    "Executor",
    "LocalExecutor",
    "get_executor",
    "map_reduce",
    "merge_all",
]

"""Where work runs.

Long jobs (capture shards, sweep points) are expressed as a function mapped over independent
items.  :class:`LocalExecutor` runs them in this process; a distributed engine implements the
same :class:`Executor` protocol, so the jobs do not change when they move.
"""

from structlens.execution.base import Executor, LocalExecutor, get_executor

__all__ = ["Executor", "LocalExecutor", "get_executor"]

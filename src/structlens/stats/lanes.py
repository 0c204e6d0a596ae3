"""Row lanes for the CPU statistics: one thread per core, each with single-threaded BLAS.

A statistics pass on the CPU alternates memory-bound NumPy passes (writing the shifted
working buffers, the tails' powers), which run on one core, with BLAS products, which run on
all of them -- and between products the BLAS library's own threads spin idle.  Splitting a
chunk's rows into one contiguous part per core and reducing each part in its own thread,
with BLAS limited to one thread meanwhile, keeps every core busy through both kinds of work
(see benchmarks/koopman).  Each lane keeps its own sums and the caller adds them in lane
order, so a result never depends on thread timing.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

__all__ = ["MIN_LANE_ROWS", "lane_budget", "lane_count", "run_in_lanes", "serial_blas"]

# Below this many rows per lane a product is too thin to run near the BLAS rate.
MIN_LANE_ROWS = 2048

_POOL_LOCK = threading.Lock()
_POOL: tuple[ThreadPoolExecutor, int] | None = None  # (pool, its number of threads)
# One lane run at a time per process: BLAS's thread count is process-wide, and threadpoolctl
# lets only the thread that set a limit restore it (a concurrent caller waits its turn).
_RUN_LOCK = threading.RLock()  # re-entrant: a serial_blas block may run lanes
_IN_LANE = threading.local()
_BLAS: bool | None = None  # whether threadpoolctl finds a BLAS library to limit


def lane_count(rows: int, device: Any) -> int:
    """How many lanes reduce ``rows`` rows on ``device``: 1 off the CPU, for a small chunk,
    inside a lane, or where the BLAS library's threads cannot be limited; else torch's
    intra-op thread budget (``torch.get_num_threads()``, which follows ``OMP_NUM_THREADS``:
    one per Ray worker)."""
    if device.type != "cpu" or rows < 2 * MIN_LANE_ROWS:
        return 1
    return min(lane_budget(), rows // MIN_LANE_ROWS)


def lane_budget() -> int:
    """How many lanes may run now: torch's intra-op thread budget (``torch.get_num_threads()``,
    which follows ``OMP_NUM_THREADS``: one per Ray worker), or 1 inside a lane or where the
    BLAS library's threads cannot be limited."""
    if getattr(_IN_LANE, "active", False):
        return 1
    import torch

    lanes = torch.get_num_threads()
    return lanes if lanes > 1 and _blas() else 1


def run_in_lanes(tasks: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run ``tasks`` concurrently, one thread each, with BLAS single-threaded meanwhile.

    Returns their results in order; a task's exception is raised once every task has
    finished (no lane is left writing into sums its caller has given up on).  Where the
    BLAS threads could not be limited (another thread holds a threadpoolctl limit), the
    tasks run one after another in the caller instead of oversubscribing the cores.
    """
    from threadpoolctl import ThreadpoolController

    with _RUN_LOCK:
        blas = ThreadpoolController().select(user_api="blas")
        with blas.limit(limits=1):
            if any(info["num_threads"] != 1 for info in blas.info()):
                return [task() for task in tasks]
            futures = [_pool(len(tasks)).submit(_in_lane, task) for task in tasks]
            wait(futures)
    return [f.result() for f in futures]


@contextlib.contextmanager
def serial_blas() -> Iterator[None]:
    """BLAS and LAPACK on one thread inside the block (also usable as a decorator).

    For the many small dense problems of a fit's second half (``N × N`` Cholesky solves and
    eigendecompositions with N ≲ 1,000, pooling block moments): on this 2-core machine one
    thread does them as fast as two when the machine is idle (0.28 s against 0.39 s for a
    Cholesky solve and ``eig`` at N = 520, 1.03 s against 0.98 s at N = 1,032) and 2.3–2.6x
    faster when another process holds a core, because the library's second thread then
    spin-waits on a busy core.  A fixed count, unlike one that follows the load, gives
    results that do not depend on the machine's load.  Lanes started inside the block still
    run (each with one BLAS thread, as always); blocks in other threads wait their turn, as
    lane runs do (the thread count is process-wide).
    """
    # A lane already runs on one BLAS thread, and its caller holds the lock: taking it in
    # the lane's thread would wait forever.
    if getattr(_IN_LANE, "active", False):
        yield
        return
    with _RUN_LOCK, _blas_controller().limit(limits=1):
        yield


@functools.cache
def _blas_controller() -> Any:
    """threadpoolctl's controller of the BLAS libraries loaded now (built once: building one
    scans every loaded library, ~8 ms, while a limit costs ~25 µs)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(user_api="blas")


def _in_lane(task: Callable[[], Any]) -> Any:
    _IN_LANE.active = True  # a lane's own statistics take no lanes (no nested lock)
    try:
        return task()
    finally:
        _IN_LANE.active = False


def _pool(workers: int) -> ThreadPoolExecutor:
    """The process's lane threads (started on demand)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[1] < workers:
            _POOL = (ThreadPoolExecutor(workers, thread_name_prefix="structlens-lane"), workers)
        return _POOL[0]


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's threads: fresh locks and a fresh pool."""
    global _POOL, _POOL_LOCK, _RUN_LOCK
    _POOL, _POOL_LOCK, _RUN_LOCK = None, threading.Lock(), threading.RLock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _blas() -> bool:
    """Whether threadpoolctl can limit the threads of NumPy's BLAS (OpenBLAS, MKL, BLIS)."""
    global _BLAS
    if _BLAS is None:
        from threadpoolctl import ThreadpoolController

        _BLAS = bool(ThreadpoolController().select(user_api="blas").lib_controllers)
    return _BLAS

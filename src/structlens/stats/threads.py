"""BLAS threads matched to the cores other processes leave free.

An OpenBLAS or MKL thread that finds its core taken by another process does not yield: it
spin-waits at the next barrier until the kernel deschedules it, so a factorisation with
two threads on a machine whose second core is busy runs several times slower than with one
(benchmarks/koopman times EDMDc fits beside a busy process).  :func:`free_cores`
measures how many cores were idle over a short window and :func:`matched_blas_threads`
limits the BLAS library to that many threads for a block of dense linear algebra; the
result does not depend on the count beyond floating-point round-off.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["free_cores", "idle_cores", "matched_blas_threads"]

#: How long :func:`free_cores` watches the machine, and how long a measurement is reused.
WINDOW_S = 0.05
REUSE_S = 2.0

_LOCK = threading.Lock()
_LIMIT = threading.Lock()  # held while a block runs under a limit (one at a time)
_LAST: tuple[float, int] | None = None  # (monotonic time, free cores)


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _cpu_times() -> tuple[float, float] | None:
    """(idle, total) jiffies of all cores from ``/proc/stat``; None off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [float(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return ticks[3] + ticks[4], sum(ticks)


def idle_cores(before: tuple[float, float], after: tuple[float, float], cores: int) -> float:
    """Cores idle between two :func:`_cpu_times` readings: the idle share of the elapsed
    ticks times the number of cores (``cores`` when no tick elapsed).

    Examples
    --------
    >>> idle_cores((100.0, 1000.0), (110.0, 1020.0), cores=2)  # half of 2 cores idle
    1.0
    """
    elapsed = after[1] - before[1]
    if elapsed <= 0:
        return float(cores)
    return cores * min(max((after[0] - before[0]) / elapsed, 0.0), 1.0)


def free_cores(
    *,
    read: Callable[[], tuple[float, float] | None] = _cpu_times,
    sleep: Callable[[float], None] = time.sleep,
    reuse: bool = True,
) -> int:
    """How many of this process's cores no other process is using: the cores idle over
    :data:`WINDOW_S` while this thread sleeps, rounded, between 1 and the cores this
    process may run on.  A measurement is reused for :data:`REUSE_S` unless ``reuse`` is
    false (a fit solves many small systems).  Off Linux, every usable core."""
    global _LAST
    cores = _usable_cores()
    with _LOCK:
        now = time.monotonic()
        if reuse and _LAST is not None and now - _LAST[0] < REUSE_S:
            return _LAST[1]
        before = read()
        if before is None:
            return cores
        sleep(WINDOW_S)
        after = read()
        if after is None:
            return cores
        free = min(max(round(idle_cores(before, after, cores)), 1), cores)
        _LAST = (time.monotonic(), free)
        return free


@functools.cache
def _blas_controller() -> Any:
    """NumPy's and SciPy's BLAS libraries (found once: the search costs milliseconds).
    SciPy's wheels bring their own OpenBLAS, loaded with ``scipy.linalg``: import it first
    so that the search finds both."""
    import scipy.linalg  # noqa: F401
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(user_api="blas")


@contextlib.contextmanager
def matched_blas_threads(free: Callable[[], int] | None = None) -> Iterator[int]:
    """Inside the block, NumPy's and SciPy's BLAS use at most ``free()`` threads (default
    :func:`free_cores`; never more than they had); yields the count.  While another block
    holds a limit (the limit is process-wide and each must be restored by the thread that
    set it), or without a BLAS library that can be limited, nothing changes."""
    blas = _blas_controller()
    current = max((info["num_threads"] for info in blas.info()), default=1)
    if current <= 1 or not _LIMIT.acquire(blocking=False):
        yield current
        return
    try:
        wanted = min((free or free_cores)(), current)
        if wanted >= current:
            yield current
            return
        with blas.limit(limits=wanted):
            yield wanted
    finally:
        _LIMIT.release()

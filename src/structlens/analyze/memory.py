"""Peak resident memory of this process, per stage and overall (Linux ``/proc``)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["PeakMemory"]


def _hwm_gib() -> float | None:
    """``VmHWM`` (peak resident memory since start or the last ``clear_refs`` reset) in GiB,
    or ``None`` off Linux."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    kib = next(
        (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM")), None
    )
    return None if kib is None else kib / 2**20


class PeakMemory:
    """Peak resident memory of windows of this process (one per stage) and of all of it.

    :meth:`start` resets the kernel's high-water mark (``/proc/self/clear_refs``) so that
    :meth:`stop` reads the window's own peak.  That reset also lowers what ``ru_maxrss``
    reports for the process when it exits (the kernel keeps one mark), so :attr:`overall`
    keeps the largest mark read before every reset: the whole process's peak, model loading
    included.  Where the reset is refused, a window's peak is the process's so far; off
    Linux every reading is ``None``.  Work an executor sends to other processes is not
    counted.
    """

    def __init__(self) -> None:
        self._overall: float | None = None

    def _read(self) -> float | None:
        now = _hwm_gib()
        if now is not None:
            self._overall = max(now, self._overall or 0.0)
        return now

    def start(self) -> None:
        """Open a window: fold the mark so far into :attr:`overall`, then reset it."""
        self._read()
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass

    def stop(self) -> float | None:
        """The peak (GiB, two decimals) since :meth:`start`."""
        now = self._read()
        return None if now is None else round(now, 2)

    @property
    def overall(self) -> float | None:
        """The process's peak (GiB, two decimals) over every reading so far."""
        self._read()
        return None if self._overall is None else round(self._overall, 2)

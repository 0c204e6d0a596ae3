"""Fault injection for the Ray tests: a worker that kills its own process once."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structlens.execution.ray import RayExecutor


@dataclass
class KillOnce:
    """Calls ``fn``, except that the first attempt at ``victim`` SIGKILLs its own process.

    The marker file (on storage shared with the workers) records that the kill happened, so
    the retried attempt runs normally and the test can check that the kill really occurred.
    """

    fn: Callable[[Any], Any]
    victim: Any
    marker: str

    def __call__(self, item: Any) -> Any:
        if item == self.victim:
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
        return self.fn(item)


class KillingRayExecutor(RayExecutor):
    """A :class:`RayExecutor` whose worker dies on the first attempt at one item."""

    def __init__(self, victim: Any, marker: Path, **options: Any) -> None:
        super().__init__(**options)
        self.victim = victim
        self.marker = str(marker)

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], **kw: Any) -> Iterator[Any]:
        return super().map(KillOnce(fn, self.victim, self.marker), items, **kw)

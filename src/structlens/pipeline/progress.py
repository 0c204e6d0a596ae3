"""Progress bars with an ETA for a pipeline's stages, and the executor seen through them."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def log(msg: str) -> None:
    """One line of a long run's log, stamped with the wall-clock time."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class ProgressBars:
    """One bar per stage with an ETA (rich); silent when disabled."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: Any = None

    @contextmanager
    def session(self) -> Iterator[ProgressBars]:
        if not self.enabled:
            yield self
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        with Progress(
            TextColumn("{task.description:<34}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        ) as bar:
            self._bar = bar
            try:
                yield self
            finally:
                self._bar = None

    @contextmanager
    def stage(self, name: str, total: int) -> Iterator[StageProgress]:
        """A bar of ``total`` steps, advanced by calling the yielded :class:`StageProgress`."""
        task = None if self._bar is None else self._bar.add_task(name, total=total)
        yield StageProgress(self._bar, task, name)
        if task is not None:
            self._bar.update(task, completed=total, description=name)


class StageProgress:
    """Advances one stage's bar (``step(what)``) and opens bars for long loops inside it
    (``with step.loop(name, total) as done: done(n)``); does nothing without a bar."""

    def __init__(self, bar: Any, task: Any, name: str) -> None:
        self._bar, self._task, self._name = bar, task, name

    def __call__(self, what: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=f"{self._name}: {what}"[:34])

    @contextmanager
    def loop(self, name: str, total: int) -> Iterator[Callable[[int], None]]:
        if self._bar is None:
            yield lambda done: None
            return
        task = self._bar.add_task(f"  {name}"[:34], total=total)
        yield lambda done: self._bar.update(task, completed=done)
        self._bar.remove_task(task)


@dataclasses.dataclass
class ExecutorView:
    """The configured executor with the library's own progress bars on or off."""

    inner: Any
    progress: bool

    @property
    def name(self) -> str:
        return self.inner.name

    def map(
        self,
        fn: Any,
        items: Any,
        *,
        desc: str = "",
        progress: bool = True,
        resident: bool = False,
        cost: Any = None,
    ) -> Any:
        return self.inner.map(
            fn, items, desc=desc, progress=progress and self.progress, resident=resident, cost=cost
        )

"""Stage machinery: the content-keyed cache, progress bars with an ETA, the executor view."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from structlens.analyze.config import CACHE_VERSION
from structlens.results import atomic_write_json, to_jsonable


def model_fingerprint(model: Any) -> str:
    fp = model.fingerprint
    return str(fp() if callable(fp) else fp)


class StageCache:
    """JSON results of stages under content keys in ``root``."""

    def __init__(self, root: Path, fingerprint: str) -> None:
        self.root = root
        self.fingerprint = fingerprint

    def path(self, stage: str, settings: dict[str, Any]) -> Path:
        doc = {"v": CACHE_VERSION, "model": self.fingerprint, "stage": stage, **settings}
        key = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
        return self.root / f"{stage}-{key[:16]}.json"

    def get(self, stage: str, settings: dict[str, Any]) -> dict[str, Any] | None:
        path = self.path(stage, settings)
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:  # a torn write cannot happen (atomic), a hand edit can
            return None

    def put(self, stage: str, settings: dict[str, Any], value: dict[str, Any]) -> None:
        atomic_write_json(self.path(stage, settings), to_jsonable(value))


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

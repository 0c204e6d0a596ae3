"""The executor protocol and the in-process executor."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, TypeVar, runtime_checkable

T = TypeVar("T")
R = TypeVar("R")


@runtime_checkable
class Executor(Protocol):
    """Runs ``fn`` over independent items.

    ``map`` yields results in the order of ``items``.  Functions and items must be picklable
    for executors that run elsewhere; results should be small (write bulk data to shared
    storage and return where it is).
    """

    name: str

    def map(
        self, fn: Callable[[T], R], items: Sequence[T], *, desc: str = "", progress: bool = True
    ) -> Iterator[R]: ...


class LocalExecutor:
    """Runs every item in this process, in order, with a progress bar."""

    name = "local"

    def map(
        self, fn: Callable[[T], R], items: Sequence[T], *, desc: str = "", progress: bool = True
    ) -> Iterator[R]:
        from tqdm.auto import tqdm

        for item in tqdm(
            items, desc=desc or None, disable=not progress or len(items) < 2, leave=False
        ):
            yield fn(item)


def get_executor(name: str | Executor | None = None) -> Executor:
    """The executor called ``name`` (``"local"``), or ``name`` itself if it is one."""
    if name is None or name == "local":
        return LocalExecutor()
    if isinstance(name, Executor):
        return name
    raise ValueError(
        f"unknown executor {name!r}; available: 'local' (distributed execution is planned "
        f"behind the same interface)"
    )

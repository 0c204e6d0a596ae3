"""The executor protocol, the in-process executor and :func:`get_executor`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")
R = TypeVar("R")

EXECUTORS = ("local", "ray")


@runtime_checkable
class Executor(Protocol):
    """Runs ``fn`` over independent items.

    ``map`` yields results in the order of ``items``.  Functions and items must be picklable
    for executors that run elsewhere; results should be small (write bulk data to shared
    storage and return where it is).  ``resident=True`` says that ``fn`` carries heavy state
    that it loads lazily on first use (a model): a distributed executor then keeps one copy of
    ``fn`` per worker for the whole map instead of one per item.  ``cost`` (one relative
    estimate per item, e.g. an SAE's width) lets an executor that runs items concurrently
    start the costliest first, which shortens the wall time of uneven items; it never changes
    the results or their order.
    """

    @property
    def name(self) -> str: ...

    def map(
        self,
        fn: Callable[[T], R],
        items: Sequence[T],
        *,
        desc: str = "",
        progress: bool = True,
        resident: bool = False,
        cost: Sequence[float] | None = None,
    ) -> Iterator[R]: ...


class LocalExecutor:
    """Runs every item in this process, in order, with a progress bar."""

    name = "local"

    def map(
        self,
        fn: Callable[[T], R],
        items: Sequence[T],
        *,
        desc: str = "",
        progress: bool = True,
        resident: bool = False,
        cost: Sequence[float] | None = None,
    ) -> Iterator[R]:
        from tqdm.auto import tqdm

        # ``resident`` and ``cost`` need nothing here: one item at a time, in one process.
        for item in tqdm(
            items, desc=desc or None, disable=not progress or len(items) < 2, leave=False
        ):
            yield fn(item)


def get_executor(name: str | Executor | None = None, **options: Any) -> Executor:
    """The executor called ``name``, or ``name`` itself if it already is one.

    Parameters
    ----------
    name
        ``"local"`` (default; this process) or ``"ray"`` (a Ray cluster, see
        :class:`structlens.execution.ray.RayExecutor`; needs ``pip install "structlens[ray]"``).
    **options
        Passed to the executor's constructor, e.g. ``address``, ``num_cpus``,
        ``num_gpus_per_task`` and ``max_retries`` for Ray.  The local executor takes none.
    """
    if name is None or name == "local":
        if options:
            raise ValueError(
                f"the local executor takes no options; got {sorted(options)} "
                f"(did you mean executor='ray'?)"
            )
        return LocalExecutor()
    if name == "ray":
        from structlens.execution.ray import RayExecutor

        return RayExecutor(**options)
    if isinstance(name, Executor):
        return name
    raise ValueError(f"unknown executor {name!r}; choose one of {EXECUTORS}")

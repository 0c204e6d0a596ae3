"""Running work items on a Ray cluster.

:class:`RayExecutor` implements the :class:`~structlens.execution.base.Executor` protocol on
Ray (https://docs.ray.io).  Plain items become Ray tasks with declared CPU/GPU resources;
``resident`` work (capture shards, which need a loaded model) goes to a pool of Ray actors,
each holding one copy of the function, so a model is loaded once per actor, not once per
item.

Fault tolerance
---------------
A task whose worker process dies is resubmitted by Ray up to ``max_retries`` times; an actor
whose process dies is restarted (``max_restarts``) and its in-flight call retried
(``max_task_retries``).  Exceptions raised by the function itself are *not* retried: they
are bugs or bad input and reach the caller as the original exception type.  Items must
therefore be idempotent: a capture shard is written atomically to a name fixed by the shard
plan, so a retried shard replaces nothing but a partial temporary file, and every shard ends
up on disk exactly once.

Ray is imported lazily: without it, nothing here is loaded and everything runs locally.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

INSTALL_HINT = 'pip install "structlens[ray]"'


def import_ray() -> Any:
    """Import Ray or raise an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as err:
        raise ImportError(
            f"the 'ray' executor needs Ray, which is not installed; run `{INSTALL_HINT}` "
            f"(or use the default local executor)"
        ) from err
    return ray


def _apply(fn: Callable[[Any], Any], item: Any) -> Any:
    return fn(item)


def start_order(n_items: int, cost: Sequence[float] | None) -> list[int]:
    """Item indices in the order to start them: costliest first when ``cost`` is given
    (longest-processing-time first: the short items fill in behind the long ones), else as
    listed; ties keep their listed order."""
    if cost is None:
        return list(range(n_items))
    cost = list(cost)
    if len(cost) != n_items or not all(math.isfinite(c) for c in cost):
        raise ValueError(
            f"cost must hold one finite estimate per item ({n_items}); got {len(cost)} "
            f"values, {sum(not math.isfinite(c) for c in cost)} of them NaN or infinite."
        )
    return sorted(range(n_items), key=lambda i: -cost[i])


def _in_item_order(
    ray: Any,
    submit: Callable[[int, Any], Any],
    n_slots: int,
    items: list[Any],
    order: list[int],
    bar: Any,
) -> Iterator[Any]:
    """Keep one call in flight per slot, start items in ``order``, yield in item order.

    Results that finish ahead of their turn wait in memory (results are small by the
    executor protocol).  On an error, or when the caller stops reading, the calls still in
    flight are cancelled.
    """
    pending: dict[Any, tuple[int, int]] = {}
    done: dict[int, Any] = {}
    queue = iter(order)
    try:
        for slot in range(n_slots):
            i = next(queue, None)
            if i is None:
                break
            pending[submit(slot, items[i])] = (i, slot)
        emitted = 0
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            i, slot = pending.pop(ready[0])
            done[i] = ray.get(ready[0])
            bar.update()
            nxt = next(queue, None)
            if nxt is not None:
                pending[submit(slot, items[nxt])] = (nxt, slot)
            while emitted in done:
                yield done.pop(emitted)
                emitted += 1
    finally:
        for ref in pending:
            ray.cancel(ref)


class _Resident:
    """Actor body: keeps ``fn`` (and whatever it loads lazily, e.g. a model) across calls."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def call(self, item: Any) -> Any:
        return self.fn(item)


class RayExecutor:
    """Runs items as Ray tasks (or on model-holding actors) of a Ray cluster.

    Parameters
    ----------
    address
        Address of a running cluster (``"auto"``, ``"ray://head:10001"``, ``"10.0.0.1:6379"``).
        ``None`` joins the Ray session already initialised in this process, else starts a
        local one-machine cluster.
    num_cpus
        CPUs of the local cluster when one is started here (``None``: all cores).  Ignored when
        joining an existing cluster.
    num_cpus_per_task
        CPUs each task or actor reserves; Ray sets ``OMP_NUM_THREADS`` to match, so torch uses
        that many threads per worker.
    num_gpus_per_task
        GPUs each task or actor reserves.  ``None``: resident actors take one GPU each when
        the cluster has GPUs and plain tasks take none.  A model actor runs the model on the
        device the driver named (``device="cuda"``), which Ray maps to the reserved GPU.
    max_retries
        How often a task (or actor call) is resubmitted after its worker process died.
    max_workers
        At most this many tasks in flight, or actors for resident work (default: as many as
        the cluster's resources allow).
    runtime_env
        Ray runtime environment for the workers (e.g. ``{"pip": ["structlens[ray]"]}`` on a
        cluster whose image lacks structlens); passed to ``ray.init``.
    connect_timeout_s
        How long to wait for the cluster at ``address`` to accept a connection before failing
        with :class:`ConnectionError` (Ray itself retries for minutes, silently); default
        ``$STRUCTLENS_RAY_CONNECT_TIMEOUT`` or 30.

    Notes
    -----
    Functions and items travel pickled: a function is put into the object store once per
    :meth:`map` and shared by every task.  Results come back through the object store, so they
    should be small; bulk output (activation shards) goes to storage every worker and the driver
    can reach (a shared filesystem on a multi-node cluster).
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: int | None = None,
        num_cpus_per_task: float = 1.0,
        num_gpus_per_task: float | None = None,
        max_retries: int = 3,
        max_workers: int | None = None,
        runtime_env: dict[str, Any] | None = None,
        connect_timeout_s: float | None = None,
    ) -> None:
        if num_cpus is not None and num_cpus < 1:
            raise ValueError(f"num_cpus must be >= 1, got {num_cpus}")
        if not num_cpus_per_task > 0:
            raise ValueError(f"num_cpus_per_task must be > 0, got {num_cpus_per_task}")
        if num_gpus_per_task is not None and num_gpus_per_task < 0:
            raise ValueError(f"num_gpus_per_task must be >= 0, got {num_gpus_per_task}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if max_workers is not None and max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.address = address
        self.num_cpus = num_cpus
        self.num_cpus_per_task = float(num_cpus_per_task)
        self.num_gpus_per_task = num_gpus_per_task
        self.max_retries = int(max_retries)
        self.max_workers = max_workers
        self.runtime_env = runtime_env
        if connect_timeout_s is None:
            connect_timeout_s = float(os.environ.get("STRUCTLENS_RAY_CONNECT_TIMEOUT", 30))
        if not connect_timeout_s > 0:
            raise ValueError(f"connect_timeout_s must be > 0, got {connect_timeout_s}")
        self.connect_timeout_s = connect_timeout_s
        self._ray = import_ray()

    def __repr__(self) -> str:
        return (
            f"RayExecutor(address={self.address!r}, num_cpus_per_task={self.num_cpus_per_task}, "
            f"num_gpus_per_task={self.num_gpus_per_task}, max_retries={self.max_retries})"
        )

    def connect(self) -> Any:
        """Join (or start) the cluster; returns the ``ray`` module."""
        ray = self._ray
        if ray.is_initialized():
            # Already connected in this process: an explicit address must still be reachable,
            # so work never runs silently on another cluster than the one asked for.
            if self.address is not None:
                self._probe(self.address)
            return ray
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
        if self.runtime_env is not None:
            kwargs["runtime_env"] = self.runtime_env
        if self.address is not None:
            self._probe(self.address)
            # Ray retries the GCS about once a second, this many times, before giving up.
            wait = os.environ.get("RAY_gcs_server_port_wait_time_s")
            os.environ["RAY_gcs_server_port_wait_time_s"] = str(max(1, int(self.connect_timeout_s)))
            try:
                ray.init(address=self.address, **kwargs)
            except ConnectionError as err:
                raise ConnectionError(self._unreachable(str(err))) from err
            finally:
                if wait is None:
                    del os.environ["RAY_gcs_server_port_wait_time_s"]
                else:
                    os.environ["RAY_gcs_server_port_wait_time_s"] = wait
        else:
            ray.init(num_cpus=self.num_cpus, **kwargs)
        return ray

    def _probe(self, address: str) -> None:
        # A TCP connect answers at once (refused) or within the timeout (unreachable host);
        # "auto" names no socket, so Ray's own lookup is left to report it.
        hostport = address.removeprefix("ray://")
        if address == "auto" or ":" not in hostport:
            return
        host, _, port = hostport.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=self.connect_timeout_s).close()
        except (OSError, ValueError) as err:
            raise ConnectionError(self._unreachable(str(err))) from err

    def _unreachable(self, why: str) -> str:
        return (
            f"no Ray cluster answers at --address {self.address} within "
            f"{self.connect_timeout_s:g} s ({why}); start one there with `ray start --head`, "
            f"fix the address, or run without --executor ray "
            f"(STRUCTLENS_RAY_CONNECT_TIMEOUT sets the wait)"
        )

    def _gpus(self, resident: bool) -> float:
        if self.num_gpus_per_task is not None:
            return float(self.num_gpus_per_task)
        if not resident:
            return 0.0
        return 1.0 if self._ray.cluster_resources().get("GPU", 0) > 0 else 0.0

    def _n_actors(self, n_items: int, gpus: float) -> int:
        res = self._ray.cluster_resources()
        fit = math.floor(res.get("CPU", 1) / self.num_cpus_per_task + 1e-9)
        if gpus > 0:
            fit = min(fit, math.floor(res.get("GPU", 0) / gpus + 1e-9))
        if fit < 1:
            raise RuntimeError(
                f"the Ray cluster ({res}) cannot fit one worker with "
                f"{self.num_cpus_per_task} CPU(s) and {gpus} GPU(s)"
            )
        return max(1, min(n_items, fit, self.max_workers or n_items))

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
        """Run ``fn`` on every item on the cluster; yield the results in item order.

        Each worker slot has one call in flight and gets the next item when it finishes (so
        one slow item never holds back the others), costliest first when ``cost`` is given.
        """
        items = list(items)
        if not items:
            return
        order = start_order(len(items), cost)
        ray = self.connect()
        gpus = self._gpus(resident)
        fn_ref = ray.put(fn)
        from tqdm.auto import tqdm

        bar = tqdm(
            total=len(items), desc=desc or None, disable=not progress or len(items) < 2, leave=False
        )
        actors: list[Any] = []
        try:
            if resident:
                actor_cls = ray.remote(_Resident).options(
                    num_cpus=self.num_cpus_per_task,
                    num_gpus=gpus,
                    max_restarts=self.max_retries,
                    max_task_retries=self.max_retries,
                )
                n_slots = self._n_actors(len(items), gpus)
                actors = [actor_cls.remote(fn_ref) for _ in range(n_slots)]

                def submit(slot: int, item: Any) -> Any:
                    return actors[slot].call.remote(item)
            else:
                remote = ray.remote(_apply).options(
                    num_cpus=self.num_cpus_per_task,
                    num_gpus=gpus,
                    max_retries=self.max_retries,
                    retry_exceptions=False,
                )
                n_slots = self.max_workers or len(items)

                def submit(slot: int, item: Any) -> Any:
                    return remote.remote(fn_ref, item)

            yield from _in_item_order(ray, submit, n_slots, items, order, bar)
        finally:
            bar.close()
            for actor in actors:
                ray.kill(actor, no_restart=True)

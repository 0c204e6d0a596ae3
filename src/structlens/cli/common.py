"""The options every command shares, declared once: :func:`common_options` adds them to a
command as one :class:`Common`, and :func:`shared_settings` adds a group's shared options."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import re
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from typer.models import OptionInfo

from structlens.cli.checks import check_arguments, check_executor
from structlens.cli.loading import executor_or_fail, load_model_or_fail
from structlens.cli.options import (
    Address,
    Device,
    DeviceMap,
    Dtype,
    ExecutorName,
    MaxMemory,
    Out,
    Quiet,
    Revision,
    Seed,
    parse_device_map,
    parse_max_memory,
)
from structlens.cli.output import console, fail
from structlens.errors import is_user_error
from structlens.results import write_results


@dataclasses.dataclass(frozen=True)
class Common:
    """The options every command shares (declared once, added by :func:`common_options`)."""

    out: Path
    device: str
    dtype: str
    seed: int
    quiet: bool
    executor: str = "local"
    address: str | None = None
    device_map: str | None = None
    max_memory: str | None = None
    revision: str | None = None

    def load_model(self, name: str, *, seed: int | None = None) -> Any:
        """The model ``name`` on ``--device`` (or spread by ``--device-map``), in ``--dtype``,
        at ``--revision``; exits 2 if it cannot load."""
        seed = self.seed if seed is None else seed
        placement: dict[str, Any] = {"revision": self.revision}
        if self.device_map is not None:
            if self.device != "cpu":
                fail("pass --device (the whole model on one device) or --device-map, not both.")
            placement["device_map"] = parse_device_map(self.device_map)
        if self.max_memory is not None:
            placement["max_memory"] = parse_max_memory(self.max_memory)
        return load_model_or_fail(name, self.device, self.dtype, seed, **placement)

    def runner(self, *, num_gpus_per_task: float | None = None) -> Any:
        """The ``--executor`` (with ``--address``); exits 2 on bad input."""
        return executor_or_fail(self.executor, self.address, num_gpus_per_task=num_gpus_per_task)

    def write(self, name: str, payload: dict[str, Any], *, command: str) -> Path:
        """Write ``--out/name.json`` (see :func:`write_results`)."""
        return write_results(self.out, name, payload, command=command)

    def say(self, message: str, **kw: Any) -> None:
        """Print ``message`` unless ``--quiet``."""
        if not self.quiet:
            console.print(message, **kw)

    @contextlib.contextmanager
    def foreign_uses(self) -> Iterator[list[str]]:
        """Record the uses of foreign results (``--allow-foreign``) inside the block into the
        yielded list (for the results JSON) and print each as a warning, even with --quiet."""
        from rich.markup import escape

        from structlens.provenance import recording_foreign_uses

        with recording_foreign_uses() as uses:
            yield uses
        for use in uses:
            console.print(f"[bold yellow]warning:[/] {escape(use)}", soft_wrap=True)


#: The parameter names of commands that load a model (they get the placement options).
_MODEL_PARAMETERS = frozenset({"model", "model_a", "model_b", "model_name"})


def _shared_parameters(out: Path | None, executor: bool, model: bool) -> list[inspect.Parameter]:
    kw = inspect.Parameter.KEYWORD_ONLY
    empty = inspect.Parameter.empty
    spec: list[tuple[str, Any, Any]] = [
        ("out", Out, empty if out is None else out),
        ("device", Device, "cpu"),
        ("dtype", Dtype, "float32"),
        ("seed", Seed, 0),
        ("quiet", Quiet, False),
    ]
    if model:
        spec += [("device_map", DeviceMap, None), ("max_memory", MaxMemory, None)]
        spec += [("revision", Revision, None)]
    if executor:
        spec += [("executor", ExecutorName, "local"), ("address", Address, None)]
    return [inspect.Parameter(n, kw, annotation=a, default=d) for n, a, d in spec]


def common_options(
    *, out: Path | None = None, executor: bool = False, flags: dict[str, str] | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add ``--out`` (default ``out``; required if None), ``--device``, ``--dtype``,
    ``--seed``, ``--quiet``, for a command with a model argument (a parameter named ``model``,
    ``model_a``, ``model_b`` or ``model_name``) ``--device-map``/``--max-memory``/``--revision``,
    and, with ``executor``, ``--executor``/``--address`` to a command.

    The command receives them as ``common: Common``.  The checks declared in the options'
    types (:mod:`structlens.cli.checks`) and the executor's run first, before the command's
    body imports anything heavy or loads a model.  A ``ValueError`` that means bad input
    (:func:`structlens.errors.is_user_error`: found by a config or an experiment) exits with
    status 2 and its message, in which every config field named in ``flags`` reads as its
    option (``flags={"n_blocks": "--n-blocks"}``); any other goes on to the top-level handler
    as a bug.
    """

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(f, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "common"]
        model = any(p.name in _MODEL_PARAMETERS for p in own)
        params = own + _shared_parameters(out, executor, model)

        @functools.wraps(f)
        def command(**kwargs: Any) -> Any:
            try:
                check_arguments(params, kwargs)
                if executor:
                    check_executor(kwargs["executor"], kwargs["address"])
                names = [fld.name for fld in dataclasses.fields(Common)]
                shared = {n: kwargs.pop(n) for n in names if n in kwargs}
                return f(common=Common(**shared), **kwargs)
            except ValueError as err:
                if not is_user_error(err):
                    raise  # a bug: the top-level handler shows its traceback
                message = str(err)
                for name, flag in (flags or {}).items():
                    message = re.sub(rf"(?<![-\w]){name}\b", flag, message)
                fail(message)

        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


def _is_option(p: inspect.Parameter) -> bool:
    return any(isinstance(m, OptionInfo) for m in typing.get_args(p.annotation)[1:])


def shared_settings(
    spec: dict[str, tuple[Any, Any]], *, first: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the options ``spec[name] = (Annotated type, default)`` to a command whose
    ``**settings`` receives them, so options shared by several commands are declared once.

    They follow the command's own options in its ``--help``, or precede them with ``first``
    (after its arguments and ``common``).  A default of ``inspect.Parameter.empty`` makes the
    option required.
    """

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(f, eval_str=True)
        kw = inspect.Parameter.KEYWORD_ONLY
        # keyword-only, so that options with and without defaults may mix in any order
        own = [p.replace(kind=kw) for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        extra = [inspect.Parameter(n, kw, annotation=a, default=d) for n, (a, d) in spec.items()]
        if first:
            options = [p for p in own if _is_option(p)]
            params = [p for p in own if not _is_option(p)] + extra + options
        else:
            params = own + extra

        @functools.wraps(f)
        def command(**kwargs: Any) -> Any:
            return f(**kwargs)

        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate

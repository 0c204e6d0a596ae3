"""Checks of option values that need neither a model nor a heavy import, declared in the
options' ``Annotated`` types and run before a command's body.

A command's body imports torch and loads the model (seconds) before the method's config or
loader would reject a bad value; so every check that needs only the values themselves is
declared next to its option, as a :class:`Check` after the ``typer.Option``::

    Batch = Annotated[int, typer.Option("--batch-size"), at_least(1, "batch_size must be ...")]

(typer ignores metadata not its own); :func:`check_arguments` runs them before the body.  The
messages are those of the config or loader that would reject the value later.  The registries'
names are copied here (importing them imports torch or SciPy); ``tests/cli/test_option_checks``
keeps the copies equal to the registries.
"""

from __future__ import annotations

import dataclasses
import difflib
import errno
import functools
import inspect
import os
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from structlens.cli.output import fail
from structlens.equivalence.protocol import PROBE_TASKS
from structlens.errors import InputError

# copies of: MAX_PROMPTS of structlens.data.tasks, resolve_dtype's names (models.loading),
# sae.SAE_ARCHITECTURES, analyze.config.PROFILES (the protocols hold the task, dictionary and
# metric names and the fewest probe prompts, copies themselves, light to import)
MAX_TASK_PROMPTS = 10_000
DTYPES = ("float32", "fp32", "float64", "bfloat16", "bf16", "float16", "fp16")
SAE_ARCHITECTURE_NAMES = ("relu", "topk", "batchtopk", "jumprelu")
PROFILE_NAMES = ("smoke", "cpu", "full")


class Check:
    """A condition on one option's value (declared after its ``typer.Option``); calling it
    raises the error that rejects the value, or returns."""

    def __call__(self, value: Any, arguments: Mapping[str, Any]) -> None:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Holds(Check):
    """``test(value, *(arguments[u] for u in uses))`` must be true, else an
    :class:`~structlens.errors.InputError` with ``message`` formatted with ``value`` and the
    command's arguments (or ``message(value)``).  ``None`` (an option's "not given") passes."""

    test: Callable[..., bool]
    message: str | Callable[[Any], str]  # a callable: the message of the value
    uses: tuple[str, ...] = ()

    def __call__(self, value: Any, arguments: Mapping[str, Any]) -> None:
        if value is None or self.test(value, *(arguments[u] for u in self.uses)):
            return
        if callable(self.message):
            raise InputError(self.message(value))
        raise InputError(self.message.format(value=value, **arguments))


@dataclasses.dataclass(frozen=True)
class Calls(Check):
    """``check(value)``, which raises the value's error itself (``None`` passes)."""

    check: Callable[[Any], None]

    def __call__(self, value: Any, arguments: Mapping[str, Any]) -> None:
        if value is not None:
            self.check(value)


def at_least(bound: float, message: str) -> Holds:
    """``value >= bound``."""
    return Holds(lambda v: v >= bound, message)


def above(bound: float, message: str) -> Holds:
    """``value > bound``."""
    return Holds(lambda v: v > bound, message)


def between(lo: float, hi: float, message: str) -> Holds:
    """``lo <= value <= hi``."""
    return Holds(lambda v: lo <= v <= hi, message)


def one_of(names: Iterable[str], message: str) -> Holds:
    """``value`` is one of ``names``; ``message`` may use ``{choices}`` (the names, quoted)."""
    names = tuple(names)
    text = ", ".join(map(repr, names))
    return Holds(lambda v: v in names, message.replace("{choices}", text))


def choice(field: str, names: Iterable[str]) -> Holds:
    """A ``Literal`` config field's choice, in the words of :func:`structlens.config.check_choices`
    (``field`` names the config field; a command's flags map it to its option)."""
    return one_of(names, field + " must be one of {choices}; got {value!r}.")


@dataclasses.dataclass(frozen=True)
class Parsed(Check):
    """``parse(value)`` (which exits 2 on text it cannot read) must satisfy ``test``, else an
    :class:`~structlens.errors.InputError` with ``message`` formatted with ``parsed``."""

    parse: Callable[[Any], Any]
    test: Callable[[Any], bool]
    message: str

    def __call__(self, value: Any, arguments: Mapping[str, Any]) -> None:
        parsed = self.parse(value)
        if not self.test(parsed):
            raise InputError(self.message.format(value=value, parsed=parsed, **arguments))


@dataclasses.dataclass(frozen=True)
class OutputDirectory(Check):
    """``--out`` can be created: no existing file is in its place or above it.

    Raises the ``OSError`` that creating it later would (a user error, whose traceback
    ``--debug`` shows); permissions and free space are left to the writes themselves."""

    def __call__(self, value: Any, arguments: Mapping[str, Any]) -> None:
        path = Path(value)
        if path.exists() and not path.is_dir():
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
        parent = path.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if parent.exists() and not parent.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))


def unknown_task(name: str, *, corpus: bool = False) -> str:
    """The message of an unknown task ``name`` (as :func:`structlens.data.tasks.make_task`
    says it, or as the equivalence probes do with ``corpus``)."""
    if corpus:
        return f"unknown probe task {name!r}; use 'corpus' or one of {', '.join(PROBE_TASKS)}."
    close = difflib.get_close_matches(name, PROBE_TASKS, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return f"Unknown task {name!r}; available: {', '.join(PROBE_TASKS)}.{hint}"


def check_task(name: str, *, also: tuple[str, ...] = ()) -> None:
    """Raise the error of an unknown task ``name`` (``also``: other accepted words)."""
    if name not in PROBE_TASKS and name not in also:
        raise InputError(unknown_task(name, corpus="corpus" in also))


def check_executor(name: str, address: str | None) -> None:
    """The ``--executor`` and ``--address`` errors of
    :func:`structlens.cli.loading.executor_or_fail`, without starting anything."""
    from structlens.execution import EXECUTORS  # no torch: execution imports no method

    if name not in EXECUTORS:
        raise InputError(f"--executor must be one of {', '.join(EXECUTORS)}; got {name!r}.")
    if name == "local" and address is not None:
        raise InputError("--address names a Ray cluster; add --executor ray to use it.")


def _checks(annotation: Any) -> list[Check]:
    if typing.get_origin(annotation) is not typing.Annotated:
        return []
    return [m for m in typing.get_args(annotation)[1:] if isinstance(m, Check)]


def check_arguments(parameters: Iterable[inspect.Parameter], arguments: Mapping[str, Any]) -> None:
    """Run the :class:`Check` of every parameter on its value in ``arguments``."""
    for p in parameters:
        for check in _checks(p.annotation):
            if p.name in arguments:
                check(arguments[p.name], arguments)


def checked(f: Callable[..., Any]) -> Callable[..., Any]:
    """Run the checks declared in ``f``'s options before ``f`` (for commands without
    :func:`structlens.cli.common.common_options`, which runs them itself)."""
    sig = inspect.signature(f, eval_str=True)

    @functools.wraps(f)
    def command(**kwargs: Any) -> Any:
        try:
            check_arguments(sig.parameters.values(), kwargs)
        except InputError as err:  # exits here, as common_options does, also under CliRunner
            fail(str(err))
        return f(**kwargs)

    command.__signature__ = sig  # type: ignore[attr-defined]
    return command

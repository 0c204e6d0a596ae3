"""What every experiment config and report shares: Literal-checked frozen configs, the
:class:`Protocol` base of every method's protocol, and the report whose ``payload()`` is the
JSON document a command writes.

Configs are frozen dataclasses validated in ``__post_init__``; :func:`check_choices` checks
every ``Literal``-typed field (also inside ``tuple[Literal[...], ...]``) so that a bad string
fails at construction with the allowed values in the message.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

from structlens.errors import InputError
from structlens.results import Result, content_key

__all__ = ["check_choices", "choices", "ExperimentReport", "Protocol", "Settings", "described"]

P = TypeVar("P", bound="Protocol")
S = TypeVar("S", bound="Settings")


def choices(tp: Any) -> tuple[Any, ...] | None:
    """The allowed values of a ``Literal`` type (or of the elements of a tuple of one)."""
    if get_origin(tp) is Literal:
        return get_args(tp)
    if get_origin(tp) is tuple:
        args = [a for a in get_args(tp) if a is not Ellipsis]
        if len(args) == 1:
            return choices(args[0])
    return None


def check_choices(obj: Any) -> None:
    """Raise ``ValueError`` if a ``Literal``-typed field of dataclass ``obj`` holds another value.

    Tuple fields typed ``tuple[Literal[...], ...]`` are checked element by element.
    """
    module = sys.modules[type(obj).__module__]
    hints = typing.get_type_hints(type(obj), vars(module))
    for f in dataclasses.fields(obj):
        allowed = choices(hints[f.name])
        if allowed is None:
            continue
        value = getattr(obj, f.name)
        values = value if get_origin(hints[f.name]) is tuple else (value,)
        bad = [v for v in values if v not in allowed]
        if bad:
            raise InputError(
                f"{f.name} must be one of {', '.join(map(repr, allowed))}; got {bad[0]!r}."
            )


@dataclasses.dataclass(frozen=True)
class ExperimentReport(Result):
    """What an experiment's ``run`` returns: the command's JSON document, savable and loadable.

    ``results`` holds the per-layer (or per-width, per-test) numbers; ``meta`` the other
    top-level keys of the document (settings, model name, provenance).
    """

    analysis: str
    model: str
    results: dict[str, Any]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        """The document written to ``<out>/<analysis>.json`` (without provenance fields)."""
        return {"model": self.model, **self.meta, "results": self.results}


def described(default: Any, help: str) -> Any:
    """A protocol field with its help text in its metadata (the CLI's option help)."""
    return dataclasses.field(default=default, metadata={"help": help})


class Protocol:
    """Base of a method's protocol: a frozen dataclass holding every scientific choice.

    A subclass is a ``@dataclass(frozen=True)`` whose fields are declared with
    :func:`described`; its ``__post_init__`` calls :meth:`check_types` first (a protocol read
    from JSON may hold any type) and then checks the values.  :meth:`key` is the part of a
    stage's cache key the protocol contributes; two drivers given equal protocols run the same
    science.
    """

    def check_types(self) -> None:
        """Each field holds its default's type: a one-line :class:`InputError` otherwise
        (``None`` defaults admit an integer, or numbers where the field is declared a tuple;
        tuples are also read from lists)."""
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value, default = getattr(self, f.name), f.default
            numbers = default is None and str(f.type).startswith("tuple")
            if numbers and isinstance(value, (tuple, list)):
                ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
                if ok:
                    object.__setattr__(self, f.name, tuple(value))
            elif default is None:
                ok = value is None or (isinstance(value, int) and not isinstance(value, bool))
            elif isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, int):
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif isinstance(default, float):
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            elif isinstance(default, tuple):
                # the items' type is the default's (strings unless it holds integers)
                item = int if default and isinstance(default[0], int) else str
                ok = isinstance(value, (tuple, list)) and all(
                    isinstance(v, item) and not isinstance(v, bool) for v in value
                )
                if ok:
                    object.__setattr__(self, f.name, tuple(value))
            else:
                ok = isinstance(value, type(default))
            if not ok:
                want = (
                    f"a list of {'integers' if item is int else 'strings'}"
                    if isinstance(default, tuple)
                    else "a list of numbers or null"
                    if numbers
                    else ("an integer or null" if default is None else type(default).__name__)
                )
                raise InputError(f"{f.name} must be {want}; got {value!r}.")

    def check_counts(self, least: Mapping[str, int]) -> None:
        """Each named field is an integer of at least its bound (a one-line error)."""
        for name, bound in least.items():
            value = getattr(self, name)
            if int(value) != value or value < bound:
                raise InputError(f"{name} must be an integer >= {bound}; got {value}.")

    def to_json(self) -> dict[str, Any]:
        """The protocol as JSON (tuples as lists), as written beside every result."""
        return {
            f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
        }

    def key(self) -> str:
        """SHA-256 of the canonical JSON of :meth:`to_json`
        (:func:`~structlens.results.content_key`)."""
        return content_key(self.to_json())

    def replace(self: P, **changes: Any) -> P:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    @classmethod
    def field_help(cls, name: str) -> str:
        """The help text of field ``name`` with its default."""
        (f,) = [f for f in dataclasses.fields(cls) if f.name == name]  # type: ignore[arg-type]
        return f"{f.metadata['help']} (default: the protocol's, {f.default})"

    @classmethod
    def load(cls: type[P], spec: str, profiles: Mapping[str, P], what: str) -> P:
        """A protocol by profile name or from a JSON file of its fields (as every result
        records it under ``protocol``); unknown fields are refused by name."""
        from structlens.results import read_json_object

        if spec in profiles:
            return profiles[spec]
        if not Path(spec).is_file():
            raise InputError(
                f"--protocol {spec!r} is neither a protocol name ({', '.join(profiles)}) nor a "
                "JSON file; pass one of those."
            )
        fields = read_json_object(spec, f"{what} protocol (JSON)")
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(fields) - known)
        if unknown:
            raise InputError(
                f"{spec}: {unknown} are not {what} protocol fields; known: {sorted(known)}."
            )
        return cls(**fields)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (Protocol, Settings)):
        return value.to_json()
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


class Settings:
    """Base of a replication profile: a frozen dataclass of a method's protocol and the
    sizes of the sections only the replication runs (validated in ``__post_init__``)."""

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON (tuples as lists, a protocol as its :meth:`Protocol.to_json`),
        as the claims JSON records them under ``settings``."""
        return {
            f.name: _jsonable(getattr(self, f.name))
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
        }

    def replace(self: S, **changes: Any) -> S:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

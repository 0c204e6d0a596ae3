"""What every experiment config and report shares: Literal-checked frozen configs, and the
report whose ``payload()`` is the JSON document a command writes.

Configs are frozen dataclasses validated in ``__post_init__``; :func:`check_choices` checks
every ``Literal``-typed field (also inside ``tuple[Literal[...], ...]``) so that a bad string
fails at construction with the allowed values in the message.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from typing import Any, Literal, get_args, get_origin

from structlens.errors import InputError
from structlens.results import Result

__all__ = ["check_choices", "choices", "ExperimentReport"]


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

"""Command-line options generated from a method's protocol (:class:`structlens.config.Protocol`).

:func:`protocol_options` turns protocol fields into ``--field-name`` options whose help is the
field's metadata and whose default, ``None``, means "the protocol's"; :func:`protocol_from`
builds the protocol a command runs from ``--protocol`` and the options that were given.  The
protocol validates itself before any model is loaded, so a bad value exits 2 with the
protocol's one-line message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, TypeVar

import typer

from structlens.cli.options import parse_names
from structlens.config import Protocol

P = TypeVar("P", bound=Protocol)


def _option_type(default: Any) -> Any:
    if isinstance(default, bool):
        return bool | None
    if isinstance(default, tuple):  # a comma list on the command line
        return str | None
    return type(default) | None


def protocol_options(
    cls: type[Protocol],
    fields: Sequence[str],
    profiles: Mapping[str, Protocol],
    *,
    what: str,
    default: str = "paper",
    default_help: str = "",
) -> dict[str, tuple[Any, Any]]:
    """``--protocol`` (default ``default``, described by ``default_help``) and one option per
    field, as ``name: (Annotated type, default)`` for
    :func:`structlens.cli.common.shared_settings`."""
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    out: dict[str, tuple[Any, Any]] = {
        "protocol": (
            Annotated[
                str,
                typer.Option(
                    "--protocol",
                    help=f"The {what} protocol: a name ({', '.join(profiles)}) or a JSON file "
                    "of its fields (a result's 'protocol'); the options below override fields."
                    + default_help,
                ),
            ],
            default,
        )
    }
    for name in fields:
        f = known[name]
        flag = "--" + name.replace("_", "-")
        kind = _option_type(f.default)
        help_text = f.metadata["help"] + (" Comma list." if isinstance(f.default, tuple) else "")
        out[name] = (Annotated[kind, typer.Option(flag, help=help_text)], None)
    return out


def protocol_from(
    settings: dict[str, Any],
    cls: type[P],
    profiles: Mapping[str, P],
    *,
    what: str,
    seed: int,
) -> P:
    """The protocol a command runs: ``--protocol`` with the protocol options that were given
    (popped from ``settings``) and ``seed``."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    given: dict[str, Any] = {}
    for name in [n for n in settings if n in fields]:
        value = settings.pop(name)
        if value is None:
            continue
        given[name] = parse_names(value) if isinstance(fields[name].default, tuple) else value
    base = cls.load(settings.pop("protocol"), profiles, what)
    return base.replace(seed=seed, **given)

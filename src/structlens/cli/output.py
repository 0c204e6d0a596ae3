"""Printing and failing: the console every command writes to, and the one-line exit for bad
input."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

from structlens.errors import is_user_error

console = Console(stderr=True)


def fail(message: str) -> NoReturn:
    """Print a clear error and exit with status 2 (bad input); ``message`` is plain text."""
    from rich.markup import escape

    console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(2)


def fail_user_error(err: BaseException) -> NoReturn:
    """:func:`fail` with ``err``'s message if it is bad input
    (:func:`structlens.errors.is_user_error`); otherwise re-raise it, as the bug it is."""
    if not is_user_error(err):
        raise err
    fail(str(err))

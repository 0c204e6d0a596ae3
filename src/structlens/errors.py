"""Errors a user can cause and fix, as opposed to bugs in structlens.

The ``structlens`` command prints an error for which :func:`is_user_error` holds as one line
``error: ...`` and exits with status 2; anything else is reported as a bug, with its
traceback.  Library callers can catch :class:`UserError` to tell the two apart.
"""

from __future__ import annotations

import dis
import json
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_RAISE_VARARGS = dis.opmap["RAISE_VARARGS"]


class UserError(Exception):
    """Bad input, a missing or damaged file, or an environment that lacks something; the
    message says which input and how to fix it."""


class InputError(UserError, ValueError):
    """A bad value: an option, a config field, a site name, an array or a file's content.
    A ``ValueError`` too, so ``except ValueError`` callers keep working."""


class ForeignResultError(UserError, ValueError):
    """A saved result (SAE, fit, rotation, store) that was made from another model or site
    than the one it is being used with."""


class DegenerateInputError(UserError, ValueError):
    """Input on which the requested statistic is undefined or meaningless (too few rows for
    the dimension, a single sample, constant data)."""


def is_user_error(err: BaseException) -> bool:
    """Whether ``err`` means bad input or environment rather than a bug in structlens.

    True for a :class:`UserError`, an ``OSError`` (missing, unreadable or unwritable
    paths, a full disk), a damaged file (JSON, UTF-8 or safetensors decoding errors), and a
    plain ``ValueError`` that a ``raise`` statement in structlens's own code raised on
    purpose (a validation written before :class:`InputError` existed) and that does not pass
    on a bug's ``ValueError`` (its ``__cause__``; other causes are library errors it
    translates).  Any other exception, such as a
    ``ValueError`` from a format string or inside a library, or a ``TypeError``, is a bug.
    """
    from safetensors import SafetensorError

    if isinstance(err, (UserError, OSError, SafetensorError, UnicodeDecodeError)):
        return True
    if isinstance(err, json.JSONDecodeError):
        return True
    if type(err) is not ValueError or not _raised_by_structlens(err):
        return False
    cause = err.__cause__
    # ``raise ValueError(f"layer {l}: {err}") from err`` passes a bug's ValueError on as is
    return not isinstance(cause, ValueError) or is_user_error(cause)


def _raised_by_structlens(err: BaseException) -> bool:
    """Whether the innermost frame of ``err``'s traceback is a ``raise`` statement in
    structlens (judged from the bytecode, so edited or absent sources cannot mislead it)."""
    tb = err.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    if not Path(code.co_filename).resolve().is_relative_to(_PACKAGE):
        return False
    return code.co_code[tb.tb_lasti] == _RAISE_VARARGS

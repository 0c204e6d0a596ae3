"""Errors a user can cause and fix, as opposed to bugs in structlens.

The ``structlens`` command prints an error for which :func:`is_user_error` holds as one line
``error: ...`` and exits with status 2; anything else is reported as a bug, with its
traceback.  Library callers can catch :class:`UserError` to tell the two apart.
"""

from __future__ import annotations

import dis
import json
import os
import pickle
import struct
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors import SafetensorError

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


class DamagedFileError(InputError):
    """A file structlens was asked to read is truncated, garbage or another kind of file than
    the one expected, or a pickle it refuses to unpickle; the message names the file and the
    kind of file it should have been."""


#: What parsers raise on a truncated or garbage file, besides ``ValueError`` (which the
#: GGUF readers, JSON and UTF-8 decoding and ``np.load`` raise too): ``struct`` and
#: ``zipfile`` errors, ``pickle``'s (``torch.load``), the GGUF readers' ``KeyError`` and
#: ``IndexError``, ``EOFError`` and safetensors' own.
FILE_FORMAT_ERRORS: tuple[type[BaseException], ...] = (
    struct.error,
    KeyError,
    IndexError,
    EOFError,
    zipfile.BadZipFile,
    pickle.UnpicklingError,
    SafetensorError,
)

PICKLE_HINT = (
    "convert it to safetensors in a Python session you trust: load it there (e.g. "
    "torch.load(..., weights_only=False) or from_pretrained) and save it with "
    "save_pretrained(DIR, safe_serialization=True) or safetensors.torch.save_file"
)


@contextmanager
def reading(
    path: str | os.PathLike[str],
    what: str,
    *,
    also: tuple[type[BaseException], ...] = (),
) -> Iterator[None]:
    """Within the block, a parser's error on the file ``path`` becomes a
    :class:`DamagedFileError` that names ``path`` and says it is not a readable ``what``
    (``raise ... from err``, so ``--debug`` shows the parser's traceback).

    Use it at the boundary where structlens opens a user's file, around the parser call only:
    every ``ValueError`` and :data:`FILE_FORMAT_ERRORS` raised inside is blamed on the file
    (``also`` adds more, e.g. ``RuntimeError`` for ``torch.load``'s zip reader).  A
    :class:`UserError` raised inside (already a clear message) and an ``OSError`` (a missing
    or unreadable path, which :func:`is_user_error` reports with its name) pass unchanged, as
    does anything else, such as a ``TypeError``: that is a bug, and keeps its traceback.
    """
    try:
        yield
    except (UserError, OSError):
        raise
    except BaseException as err:
        if not isinstance(err, (ValueError, *FILE_FORMAT_ERRORS, *also)):
            raise
        raise damaged(path, what, err) from err


def damaged(path: str | os.PathLike[str], what: str, err: BaseException) -> DamagedFileError:
    """The :class:`DamagedFileError` for parser error ``err`` on ``path`` (see
    :func:`reading`); a pickle that torch's weights-only loader refuses gets the way to
    convert it to safetensors instead."""
    detail = " ".join(str(err).split())
    if isinstance(err, pickle.UnpicklingError) and "weights only" in detail.lower():
        # torch cannot tell a pickle of Python objects from garbage: both fail the same way
        return DamagedFileError(
            f"{path} is refused: pickled weights are loaded only by torch's weights-only "
            f"loader, which found Python objects besides tensors in it (or damage), and "
            f"structlens never unpickles anything else, as unpickling can run any code; "
            f"{PICKLE_HINT}."
        )
    if len(detail) > 300:
        detail = detail[:297] + "..."
    kind = type(err).__name__
    if isinstance(err, struct.error):
        kind = "struct.error"  # its own name is just "error"
    return DamagedFileError(
        f"{path} is not a readable {what}: it is truncated, damaged or another kind of file "
        f"({kind}: {detail or 'no detail'})."
    )


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

"""Errors a user can cause and fix, as opposed to bugs in structlens.

The ``structlens`` command prints any :class:`UserError` (and the standard errors that bad
input raises: ``ValueError``, ``OSError``, JSON decoding errors) as one line ``error: ...``
and exits with status 2; anything else is reported as a bug, with its traceback.  Library
callers can catch :class:`UserError` to tell the two apart.
"""

from __future__ import annotations


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

"""Which model and site a saved result was made from, and the check before it is reused.

Every saved artefact (SAE ``cfg.json``, Koopman fit, NDM rotation, activation store) records
:func:`provenance` of the model it was made from: the model's name, its full-content digest
(:meth:`structlens.models.Model.fingerprint`) and the site.  Before a saved result is used
with a model, :func:`check_provenance` compares the record with that model and site: a
mismatch is a :class:`~structlens.errors.ForeignResultError` unless the caller passes
``allow_foreign=True``, in which case a :class:`ForeignResultWarning` is issued and the
mismatches are returned so the caller can record them with its own results.

Keys follow SAELens's ``cfg.json`` metadata (``model_name``, ``hook_name``) plus
``model_digest``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from structlens.errors import ForeignResultError


class ForeignResultWarning(UserWarning):
    """A saved result is used with another model or site than it was made from, on request."""


def provenance(model: Any, site: str | None = None) -> dict[str, str]:
    """The record to save with a result made from ``model`` (a loaded ``Model``) at ``site``."""
    out = {"model_name": str(model.name), "model_digest": model.fingerprint()}
    if site is not None:
        out["hook_name"] = str(site)
    return out


def check_provenance(
    recorded: Mapping[str, Any],
    *,
    what: str,
    model: Any = None,
    site: str | None = None,
    allow_foreign: bool = False,
) -> list[str]:
    """Compare a saved result's provenance record with the model and site it is used with.

    Parameters
    ----------
    recorded
        The saved record (keys ``model_name``, ``model_digest``, ``hook_name``; missing keys
        are not checked).  The model is compared by digest where one was recorded, else by
        name.
    what
        How to name the result in messages, e.g. ``"the SAE in runs/sae"``.
    model
        The loaded model it is used with (``None``: not checked).
    site
        The site it is used at (``None``: not checked).
    allow_foreign
        Warn instead of raising on a mismatch.

    Returns
    -------
    list of str
        The mismatches (empty when the result is the model's and site's own).

    Raises
    ------
    ForeignResultError
        On a mismatch, unless ``allow_foreign``.
    """
    mismatches = []
    if model is not None:
        digest = recorded.get("model_digest")
        name = recorded.get("model_name")
        if digest is not None and digest != model.fingerprint():
            mismatches.append(
                f"it was made from model {name or '?'} with digest {str(digest)[:12]}…, "
                f"not from {model.name} (digest {model.fingerprint()[:12]}…)"
            )
        elif digest is None and name is not None and str(name) != str(model.name):
            mismatches.append(f"it was made from model {name}, not {model.name}")
    hook = recorded.get("hook_name")
    if site is not None and hook is not None and str(hook) != str(site):
        mismatches.append(f"it was made at site {hook}, not {site}")
    if mismatches and not allow_foreign:
        raise ForeignResultError(
            f"{what} is foreign: {'; '.join(mismatches)}; use it with the model and site it "
            f"was made from, or pass allow_foreign=True (--allow-foreign) to use it anyway"
        )
    if mismatches:
        warnings.warn(
            f"using foreign {what}: {'; '.join(mismatches)}", ForeignResultWarning, stacklevel=2
        )
    return mismatches


@contextlib.contextmanager
def recording_foreign_uses() -> Iterator[list[str]]:
    """Collect the :class:`ForeignResultWarning` messages issued inside the block (each once,
    in order) into the yielded list, filled when the block ends; other warnings pass on."""
    uses: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ForeignResultWarning)
        yield uses
    for w in caught:
        if issubclass(w.category, ForeignResultWarning):
            if str(w.message) not in uses:
                uses.append(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

"""Published SAE releases by name, and where their files are found.

``pretrained.json`` (beside this module; data, not code) maps ``release`` → ``sae_id`` → the
Hugging Face repository and the folder inside it, the model the dictionary was trained on
(its hub id), the site it reads (and writes, for transcoders) and the layout
(:data:`structlens.sae.formats.FORMATS`), in the style of SAELens's ``pretrained_saes.yaml``.
A dictionary is named ``RELEASE/SAE_ID`` (``gemma-scope-2b-pt-res/layer_20/width_16k/
average_l0_71``: the release is the part before the first ``/``).

Where the files are looked for, in order (:func:`locate`):

1. a local directory (``local_dir``, else ``$STRUCTLENS_SAE_DIR``) holding
   ``<release>/<sae_id>/`` or ``<repo>/<path>/`` (a copy made with
   ``huggingface-cli download <repo> --include '<path>/*' --local-dir <dir>/<repo>``);
2. the Hugging Face cache (``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or ``~/.cache/huggingface/hub``),
   without network;
3. a download of just that folder with ``huggingface_hub``, unless ``$HF_HUB_OFFLINE`` is set
   or ``download=False``.

When none has it, a :class:`PretrainedUnavailableError` says where to put the files.  The
registry's model and site are the dictionary's provenance (the files' own names for them
are kept as ``published_model_name``/``published_hook_name``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
from pathlib import Path
from typing import Any

from structlens.errors import InputError, UserError

DATA_FILE = Path(__file__).with_name("pretrained.json")
LOCAL_DIR_ENV = "STRUCTLENS_SAE_DIR"


class PretrainedUnavailableError(UserError, RuntimeError):
    """A published dictionary whose files are neither local nor cached, and cannot be
    downloaded here (offline, or the hub refused)."""


@dataclasses.dataclass(frozen=True)
class PretrainedRelease:
    """One registry entry: ``release``/``sae_id``, the hub ``repo`` and ``path`` in it, the
    ``model`` (hub id), the ``hook`` it reads, ``hook_out`` (transcoders) and ``format``."""

    release: str
    sae_id: str
    repo: str
    path: str
    model: str
    hook: str | None
    hook_out: str | None
    format: str

    @property
    def name(self) -> str:
        return f"{self.release}/{self.sae_id}"

    def metadata(self) -> dict[str, Any]:
        """The provenance this entry gives the dictionary read from its files."""
        meta: dict[str, Any] = {"model_name": self.model, "registry": self.name, "repo": self.repo}
        if self.hook is not None:
            meta["hook_name"] = self.hook
        if self.hook_out is not None:
            meta["hook_name_out"] = self.hook_out
        return meta


@functools.cache
def pretrained_releases() -> dict[str, dict[str, Any]]:
    """The registry's releases as stored (``release`` → its repo, model, format and saes)."""
    doc = json.loads(DATA_FILE.read_text(encoding="utf-8"))
    return dict(doc["releases"])


def is_registry_name(spec: str) -> bool:
    """Whether ``spec`` names a release of the registry (``RELEASE/…``)."""
    return spec.split("/", 1)[0] in pretrained_releases()


def resolve(spec: str) -> PretrainedRelease:
    """The registry entry ``RELEASE/SAE_ID``; an :class:`InputError` with the closest names
    when there is none."""
    releases = pretrained_releases()
    release, _, sae_id = spec.partition("/")
    if release not in releases:
        near = difflib.get_close_matches(release, releases, n=3)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise InputError(
            f"{spec!r} is neither a directory nor a published release{hint}; known "
            f"releases: {', '.join(sorted(releases))} (give RELEASE/SAE_ID or a directory)."
        )
    entry = releases[release]
    if sae_id not in entry["saes"]:
        near = difflib.get_close_matches(sae_id, entry["saes"], n=3)
        known = near or sorted(entry["saes"])[:6]
        raise InputError(
            f"release {release} has no SAE {sae_id!r}; e.g. {', '.join(known)} "
            f"(give RELEASE/SAE_ID)."
        )
    sae = entry["saes"][sae_id]
    return PretrainedRelease(
        release=release, sae_id=sae_id, repo=entry["repo"], path=sae["path"],
        model=entry["model"], hook=sae.get("hook"), hook_out=sae.get("hook_out"),
        format=entry["format"],
    )  # fmt: skip


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, read at call time (``huggingface_hub`` reads it once at
    import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def locate(
    entry: PretrainedRelease, *, local_dir: str | Path | None = None, download: bool = True
) -> Path:
    """The local folder holding ``entry``'s files (see the module docstring for the order);
    :class:`PretrainedUnavailableError` when it cannot be had."""
    root = local_dir or os.environ.get(LOCAL_DIR_ENV)
    if root:
        for candidate in (
            Path(root) / entry.release / entry.sae_id,
            Path(root) / entry.repo / entry.path,
        ):
            if candidate.is_dir():
                return candidate
    cached = _from_hub(entry, local_only=True)
    if cached is not None:
        return cached
    reason = "offline (HF_HUB_OFFLINE is set)" if _offline() else "downloads are off"
    if download and not _offline():
        try:
            got = _from_hub(entry, local_only=False)
        except Exception as err:  # huggingface_hub's network, auth and not-found errors alike
            reason = (
                f"the download failed ({type(err).__name__}: {' '.join(str(err).split())[:200]})"
            )
        else:
            if got is not None:
                return got
            reason = f"the hub repository {entry.repo} has no folder {entry.path}"
    where = Path(root) if root else Path(f"${LOCAL_DIR_ENV}")
    raise PretrainedUnavailableError(
        f"{entry.name} is not available: {reason}. Put its files ({entry.repo}, folder "
        f"{entry.path}) in {where / entry.release / entry.sae_id} (set {LOCAL_DIR_ENV}), or "
        f"in the Hugging Face cache with `huggingface-cli download {entry.repo} --include "
        f"'{entry.path}/*'` where there is network."
    )


def _from_hub(entry: PretrainedRelease, *, local_only: bool) -> Path | None:
    """``entry``'s folder in a snapshot of its repository, from the cache only or with a
    download of that folder (``None`` when the snapshot lacks it)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as err:
        if local_only:
            return None
        raise PretrainedUnavailableError(
            "downloading a published SAE needs huggingface_hub (pip install huggingface_hub)."
        ) from err
    patterns = [f"{entry.path}/*"]
    if entry.format == "sparsify":  # the run's config.json names the model
        patterns.append("config.json")
    try:
        snapshot = snapshot_download(
            entry.repo, allow_patterns=patterns, cache_dir=str(hf_cache_dir()),
            local_files_only=local_only,
        )  # fmt: skip
    except Exception:
        if local_only:  # not cached (LocalEntryNotFoundError and its kin)
            return None
        raise
    folder = Path(snapshot) / entry.path
    return folder if folder.is_dir() and any(folder.iterdir()) else None


def read_pretrained(
    spec: str,
    *,
    dtype: Any = None,
    local_dir: str | Path | None = None,
    download: bool = True,
) -> Any:
    """The :class:`~structlens.sae.formats.PretrainedDictionary` named ``spec``: a registry
    name ``RELEASE/SAE_ID`` or a path to a folder in any published layout."""
    from structlens.sae.formats import read_dictionary, with_metadata

    if Path(spec).exists() or not is_registry_name(spec):
        if not Path(spec).exists():
            resolve(spec)  # the registry's error, with the known releases
        return read_dictionary(spec, dtype=dtype)
    entry = resolve(spec)
    folder = locate(entry, local_dir=local_dir, download=download)
    d = read_dictionary(folder, dtype=dtype)
    own = {f"published_{k}": d.metadata[k] for k in ("model_name", "hook_name") if k in d.metadata}
    return with_metadata(d, {**own, **entry.metadata()})


def load_pretrained(
    spec: str,
    *,
    dtype: Any = None,
    model: Any = None,
    site: str | None = None,
    allow_foreign: bool = False,
    local_dir: str | Path | None = None,
    download: bool = True,
) -> Any:
    """The SAE or transcoder named ``spec`` (:func:`read_pretrained`), refused as foreign
    unless it was made from ``model`` at ``site``
    (:func:`structlens.sae.formats.check_dictionary`; ``allow_foreign`` warns instead)."""
    from structlens.sae.formats import check_dictionary

    d = read_pretrained(spec, dtype=dtype, local_dir=local_dir, download=download)
    check_dictionary(d, model=model, site=site, allow_foreign=allow_foreign)
    return d.module

"""The on-disk activation store: safetensors shards plus ``metadata.json``.

A store is a directory ``<root>/<key>``, ``key`` a content hash of everything that produced it
(model weights and config, sites, token data, positions, dtype, shard plan, store format).
Layout::

    metadata.json            model, sites and shapes, data fingerprint, positions, dtype,
                             prompt ids, the shard plan, ``complete`` flag, code version
    shard-00000.safetensors  one tensor per site ``[n_tokens, *site_shape]`` plus
                             ``prompt_index`` (int64, index into ``prompt_ids``),
                             ``position`` (token position in its prompt) and ``token_id``

Each shard covers a fixed, contiguous range of prompts and is written atomically, so an
interrupted capture resumes by writing only the shards that are missing, and a finished
capture is a cache hit.

Integrity: each shard's size and SHA-256 are recorded in the metadata as soon as the shard is
written, and the metadata carries the SHA-256 of its own canonical JSON.  Opening a store
checks the metadata digest, the shard file names (plain names inside the store, no symlinks)
and the shard sizes; ``verify=True`` also checks every shard's SHA-256; reading a shard
always checks its SHA-256.  A capture run into an existing store verifies it in full and
rewrites bad or missing shards.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from structlens.errors import UserError
from structlens.results import atomic_write_bytes, atomic_write_json, to_jsonable

STORE_FORMAT = 2
INDEX_KEYS = ("prompt_index", "position", "token_id")
REPAIR_HINT = (
    "re-run the capture that wrote it (same model, data, sites, positions and dtype): "
    "`structlens capture` verifies the store and rewrites bad shards"
)


class StoreError(UserError, RuntimeError):
    """A store that is missing, incomplete, damaged or inconsistent."""


def metadata_digest(metadata: dict[str, Any]) -> str:
    """SHA-256 of the metadata's canonical JSON, without its own ``metadata_sha256`` entry.

    Not :func:`~structlens.results.content_key`: stores on disk were verified against this
    byte form, and must keep verifying.
    """
    body = to_jsonable({k: v for k, v in metadata.items() if k != "metadata_sha256"})
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(2**24):
            h.update(chunk)
    return h.hexdigest()


def _check_shard_name(store: Path, name: Any) -> str:
    # A name from metadata.json must not lead outside the store: one store (or any file)
    # could otherwise serve another's activations.
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "/" in name
        or "\\" in name
        or Path(name).name != name
    ):
        raise StoreError(
            f"{store}: metadata.json names shard file {name!r}, which is not a plain file "
            f"name inside the store (the metadata was edited); {REPAIR_HINT}"
        )
    return name


class ActivationStore:
    """Read access to a captured store (see the module docstring for the layout).

    Parameters
    ----------
    path
        The store directory.
    verify
        ``False`` (default): check the metadata digest, the shard names and, for a complete
        store, that every shard exists with its recorded size.  ``True``: also check every
        shard's SHA-256 (reads the whole store).  ``None``: no check beyond the metadata
        digest, for code that repairs the store.

    Raises
    ------
    StoreError
        The directory is no store, or a check failed; the message names the bad file.
    """

    def __init__(self, path: str | Path, *, verify: bool | None = False) -> None:
        self.path = Path(path)
        meta_file = self.path / "metadata.json"
        if meta_file.is_symlink():
            raise StoreError(f"{meta_file} is a symlink (refused); {REPAIR_HINT}")
        if not meta_file.is_file():
            raise StoreError(f"{self.path} is not an activation store (no metadata.json)")
        try:
            self.metadata: dict[str, Any] = json.loads(meta_file.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise StoreError(f"{meta_file} is not valid JSON ({err}); {REPAIR_HINT}") from err
        if not isinstance(self.metadata, dict) or (
            self.metadata.get("store_format") != STORE_FORMAT
        ):
            fmt = self.metadata.get("store_format") if isinstance(self.metadata, dict) else None
            raise StoreError(
                f"{self.path}: store format {fmt} is not supported (expected {STORE_FORMAT}); "
                f"capture it again"
            )
        if self.metadata.get("metadata_sha256") != metadata_digest(self.metadata):
            raise StoreError(
                f"{meta_file} was modified after it was written (its SHA-256 does not match); "
                f"{REPAIR_HINT}"
            )
        for entry in self.metadata["shards"]:
            _check_shard_name(self.path, entry["file"])
        if verify is not None and self.complete:
            self.verify(full=verify)

    def __repr__(self) -> str:
        return (
            f"ActivationStore({str(self.path)!r}, sites={len(self.sites)}, "
            f"tokens={self.n_tokens}, complete={self.complete})"
        )

    @property
    def sites(self) -> list[str]:
        return list(self.metadata["sites"])

    @property
    def prompt_ids(self) -> list[str]:
        return list(self.metadata["prompt_ids"])

    @property
    def complete(self) -> bool:
        return bool(self.metadata.get("complete"))

    @property
    def n_tokens(self) -> int:
        return int(sum(s["n_tokens"] for s in self.metadata["shards"]))

    def shard_path(self, index: int) -> Path:
        return self.path / self.metadata["shards"][index]["file"]

    def missing_shards(self) -> list[int]:
        """Shards whose file does not exist (an interrupted capture writes these)."""
        return [i for i in range(len(self.metadata["shards"])) if not self.shard_path(i).exists()]

    def shard_problems(self, *, full: bool = True) -> dict[int, str]:
        """What is wrong with each bad shard: missing, a symlink, unrecorded, wrong size or
        (``full``) wrong SHA-256.  Empty for a sound store."""
        problems = {}
        for i, entry in enumerate(self.metadata["shards"]):
            p = self.shard_path(i)
            if p.is_symlink():
                problems[i] = "is a symlink (refused: it could serve another store's data)"
            elif not p.exists():
                problems[i] = "is missing"
            elif not p.is_file():
                problems[i] = "is not a regular file"
            elif "sha256" not in entry:
                problems[i] = "has no recorded SHA-256 (written by an interrupted capture)"
            elif p.stat().st_size != entry["bytes"]:
                problems[i] = f"has {p.stat().st_size} bytes, {entry['bytes']} were written"
            elif full and file_sha256(p) != entry["sha256"]:
                problems[i] = "does not match the SHA-256 recorded when it was written"
        return problems

    def verify(self, *, full: bool = True) -> None:
        """Raise :class:`StoreError` naming the first bad shard (see :meth:`shard_problems`)."""
        problems = self.shard_problems(full=full)
        if problems:
            i, what = next(iter(problems.items()))
            more = f" (and {len(problems) - 1} more bad shards)" if len(problems) > 1 else ""
            raise StoreError(self._shard_message(i, what) + more)

    def _shard_message(self, index: int, what: str) -> str:
        return _shard_message(self.path, self.metadata["shards"][index]["file"], what)

    def _check_sites(self, sites: Sequence[str] | None) -> list[str]:
        if sites is None:
            return self.sites
        unknown = [s for s in sites if s not in self.metadata["sites"]]
        if unknown:
            raise StoreError(
                f"sites {unknown} were not captured in {self.path}; it holds {self.sites}"
            )
        return list(sites)

    def iter_shards(
        self, sites: Sequence[str] | None = None, *, device: str = "cpu"
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Yield each shard as a dict of the requested sites plus the index tensors."""

        if not self.complete:
            raise StoreError(
                f"{self.path} is incomplete ({len(self.missing_shards())} shards "
                f"missing); re-run the capture to resume it"
            )
        sites = self._check_sites(sites)
        for entry in self.metadata["shards"]:
            data = read_shard(self.path, entry)
            yield {k: data[k].to(device) for k in (*sites, *INDEX_KEYS)}

    def iter_batches(
        self, sites: Sequence[str] | None = None, batch_size: int = 4096
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Yield batches of at most ``batch_size`` tokens (memory: one shard at a time)."""
        for shard in self.iter_shards(sites):
            n = len(shard["prompt_index"])
            for start in range(0, n, batch_size):
                yield {k: v[start : start + batch_size] for k, v in shard.items()}

    def load(self, site: str) -> torch.Tensor:
        """The whole of one site, ``[n_tokens, *shape]`` (loads every shard into memory)."""
        return torch.cat([s[site] for s in self.iter_shards([site])])

    def load_index(self) -> dict[str, torch.Tensor]:
        """``prompt_index``, ``position`` and ``token_id`` for every stored token."""
        parts = list(self.iter_shards([]))
        return {k: torch.cat([p[k] for p in parts]) for k in INDEX_KEYS}


def _shard_message(store: Path, name: str, what: str) -> str:
    return f"store {store}: shard {name} {what}; {REPAIR_HINT}"


def read_shard(store: str | Path, entry: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Read the shard that metadata ``entry`` describes, checking its name and SHA-256.

    Raises :class:`StoreError` naming the shard and the command that repairs it.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load

    store = Path(store)
    name = _check_shard_name(store, entry["file"])
    path = store / name
    if path.is_symlink() or not path.is_file():
        what = "is a symlink (refused)" if path.is_symlink() else "is missing"
        raise StoreError(_shard_message(store, name, what))
    blob = path.read_bytes()
    if hashlib.sha256(blob).hexdigest() != entry.get("sha256"):
        what = "does not match the SHA-256 recorded when it was written"
        raise StoreError(_shard_message(store, name, what))
    try:
        return load(blob)
    except SafetensorError as err:
        raise StoreError(_shard_message(store, name, f"cannot be read ({err})")) from err


def write_shard(path: Path, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Write one shard atomically; returns its ``bytes`` and ``sha256`` for the metadata."""
    from safetensors.torch import save

    blob = save({k: v.contiguous() for k, v in tensors.items()})
    atomic_write_bytes(path, blob)
    return {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}


def write_metadata(path: Path, metadata: dict[str, Any]) -> None:
    """Write ``metadata.json`` atomically, with the SHA-256 of its content."""
    atomic_write_json(
        path / "metadata.json", {**metadata, "metadata_sha256": metadata_digest(metadata)}
    )


def plan_shards(
    lengths: Sequence[int], bytes_per_token: int, shard_bytes: int
) -> list[tuple[int, int, int]]:
    """Split prompts (with ``lengths`` captured tokens each) into contiguous shards.

    Returns ``(prompt_start, prompt_stop, n_tokens)`` per shard; a shard closes once it holds
    at least ``shard_bytes`` of activations.  Deterministic in its inputs.
    """
    per_shard = max(1, shard_bytes // max(1, bytes_per_token))
    plan, start, tokens = [], 0, 0
    for i, n in enumerate(lengths):
        tokens += n
        if tokens >= per_shard:
            plan.append((start, i + 1, tokens))
            start, tokens = i + 1, 0
    if start < len(lengths):
        plan.append((start, len(lengths), tokens))
    return plan


def content_key(parts: dict[str, Any]) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:20]

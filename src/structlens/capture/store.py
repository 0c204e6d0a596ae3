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
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from structlens.results import atomic_write_bytes, atomic_write_json

STORE_FORMAT = 1
INDEX_KEYS = ("prompt_index", "position", "token_id")


class StoreError(RuntimeError):
    """A store that is missing, incomplete or inconsistent."""


class ActivationStore:
    """Read access to a captured store (see the module docstring for the layout)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        meta_file = self.path / "metadata.json"
        if not meta_file.exists():
            raise StoreError(f"{self.path} is not an activation store (no metadata.json)")
        self.metadata: dict[str, Any] = json.loads(meta_file.read_text())
        if self.metadata.get("store_format") != STORE_FORMAT:
            raise StoreError(
                f"{self.path}: store format {self.metadata.get('store_format')} "
                f"is not supported (expected {STORE_FORMAT}); capture it again"
            )

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
        return [i for i in range(len(self.metadata["shards"])) if not self.shard_path(i).exists()]

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
        from safetensors.torch import load_file

        if not self.complete:
            raise StoreError(
                f"{self.path} is incomplete ({len(self.missing_shards())} shards "
                f"missing); re-run the capture to resume it"
            )
        sites = self._check_sites(sites)
        for i in range(len(self.metadata["shards"])):
            data = load_file(str(self.shard_path(i)), device=device)
            yield {k: data[k] for k in (*sites, *INDEX_KEYS)}

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


def write_shard(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write one shard atomically."""
    from safetensors.torch import save

    atomic_write_bytes(path, save({k: v.contiguous() for k, v in tensors.items()}))


def write_metadata(path: Path, metadata: dict[str, Any]) -> None:
    atomic_write_json(path / "metadata.json", metadata)


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
    import hashlib

    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:20]

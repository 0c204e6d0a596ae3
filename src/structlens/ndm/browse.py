"""Preimage browsing: which stored contexts look alike inside one learned subspace.

A :class:`PreimageBrowser` wraps a :class:`structlens.ndm.SubspaceIndex` (exact cosine
similarity per subspace) with the provenance of every stored activation (prompt, position)
and the prompts' tokens, so a hit can be shown as its context with the token highlighted —
the practical version of the authors' browser (they use faiss ``IndexFlatIP`` on
L2-normalised projections and show hits above cosine 0.85).  :meth:`PreimageBrowser.save`
writes the normalised projections with the rows' prompt indices, positions and token ids to
one safetensors file, so the index is built once and reloaded for every later query.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch

from structlens.ndm.preimage import SubspaceIndex

HIGHLIGHT = ("[[", "]]")


def context_parts(
    tokenizer: Any, token_ids: Sequence[int], position: int, left: int = 12, right: int = 4
) -> tuple[str, str, str]:
    """``(before, token, after)``: the decoded ``left`` tokens before ``position``, the token
    at it and the ``right`` tokens after, kept apart (for escaping and highlighting), line
    breaks shown as ``↵`` so that a context stays on one line."""
    if not 0 <= position < len(token_ids):
        raise ValueError(f"position {position} outside a prompt of {len(token_ids)} tokens.")

    def text(ids: Sequence[int]) -> str:
        out: str = tokenizer.decode(list(ids))
        return out.replace("\r\n", "↵").replace("\n", "↵").replace("\r", "↵")

    return (
        text(token_ids[max(0, position - left) : position]),
        text([token_ids[position]]),
        text(token_ids[position + 1 : position + 1 + right]),
    )


def highlight_context(
    tokenizer: Any, token_ids: Sequence[int], position: int, left: int = 12, right: int = 4
) -> str:
    """:func:`context_parts` as one string, the token at ``position`` wrapped in ``[[ ]]``."""
    before, token, after = context_parts(tokenizer, token_ids, position, left, right)
    return f"{before}{HIGHLIGHT[0]}{token}{HIGHLIGHT[1]}{after}"


class PreimageBrowser:
    """Nearest stored contexts of a query activation inside each subspace.

    Parameters
    ----------
    rotation, partition
        The decomposition (``(d, d)`` orthogonal, sizes summing to ``d``).
    prompts
        ``(id, token_ids)`` of every prompt the stored activations come from.
    """

    def __init__(
        self,
        rotation: np.ndarray,
        partition: Sequence[int],
        prompts: Sequence[tuple[str, Sequence[int]]],
    ) -> None:
        self.index = SubspaceIndex(rotation, partition)
        self.prompts = list(prompts)
        self._prompt_index: list[np.ndarray] = []
        self._position: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(self.index)

    def save(self, path: str | Path, metadata: dict[str, str]) -> None:
        """Write the index to ``path`` (safetensors, atomic): ``z{s}`` the normalised
        projections of subspace ``s``, and per row ``prompt_index``, ``position`` and
        ``token`` (the token id); ``metadata`` (strings) goes into the header."""
        from safetensors.numpy import save

        from structlens.results import atomic_write_bytes

        pis, poss = self._rows()
        arrays = {f"z{s}": b.numpy() for s, b in enumerate(self.index.normalised())}
        arrays |= {
            "prompt_index": pis,
            "position": poss,
            "token": np.asarray(
                [self.prompts[i][1][p] for i, p in zip(pis, poss, strict=True)], dtype=np.int64
            ),
        }
        atomic_write_bytes(Path(path), save(arrays, metadata=dict(metadata)))

    @classmethod
    def load(
        cls,
        path: str | Path,
        rotation: np.ndarray,
        partition: Sequence[int],
        prompts: Sequence[tuple[str, Sequence[int]]],
    ) -> tuple[PreimageBrowser, dict[str, str]]:
        """The browser saved at ``path`` for this decomposition and ``prompts`` (the ones it
        was built from), and the saved metadata; ``ValueError`` if the file does not fit."""
        from safetensors import safe_open
        from safetensors.numpy import load_file

        with safe_open(str(path), framework="numpy") as f:
            metadata = f.metadata() or {}
        arrays = load_file(str(path))
        browser = cls(rotation, partition, prompts)
        blocks = [arrays.get(f"z{s}") for s in range(len(browser.index.partition))]
        if any(b is None for b in blocks):
            raise ValueError(f"{path} lacks a subspace block; it was built for another partition.")
        # cast: no block is None after the check above
        browser.index = SubspaceIndex.from_normalised(
            rotation, partition, cast("list[np.ndarray]", blocks)
        )
        pis, poss = arrays["prompt_index"], arrays["position"]
        if len(pis) != len(browser.index):
            raise ValueError(f"{path}: {len(pis)} rows of ids for {len(browser.index)} vectors.")
        browser._check_rows(pis, poss)
        tokens = [browser.prompts[i][1][p] for i, p in zip(pis, poss, strict=True)]
        if not np.array_equal(np.asarray(tokens, dtype=np.int64), arrays["token"]):
            raise ValueError(f"{path} was built from other prompts (its token ids differ).")
        browser._prompt_index, browser._position = [pis], [poss]
        return browser, metadata

    def _rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Prompt index and position of every stored row."""
        if not self._prompt_index:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(self._prompt_index), np.concatenate(self._position)

    def _check_rows(self, pi: np.ndarray, pos: np.ndarray) -> None:
        if len(pi) and (pi.min() < 0 or pi.max() >= len(self.prompts)):
            raise ValueError(f"prompt_index must lie in [0, {len(self.prompts)}).")
        lengths = np.asarray([len(self.prompts[i][1]) for i in pi], dtype=np.int64)
        if len(pos) and ((pos < 0).any() or (pos >= lengths).any()):
            raise ValueError("a position lies outside its prompt.")

    def add(
        self,
        chunks: Iterable[tuple[torch.Tensor | np.ndarray, npt.ArrayLike, npt.ArrayLike]],
    ) -> None:
        """Add ``(activations (n, d), prompt_index (n,), position (n,))`` chunks; prompt
        indices refer to ``prompts``."""
        for h, prompt_index, position in chunks:
            pi = np.asarray(prompt_index, dtype=np.int64)
            pos = np.asarray(position, dtype=np.int64)
            if not (len(pi) == len(pos) == len(h)):
                raise ValueError("activations, prompt_index and position must have one row each.")
            self._check_rows(pi, pos)
            self.index.add(h)
            self._prompt_index.append(pi)
            self._position.append(pos)

    def query(
        self,
        tokenizer: Any,
        activation: torch.Tensor | np.ndarray,
        subspace: int,
        *,
        k: int = 10,
        min_similarity: float | None = None,
    ) -> list[dict[str, Any]]:
        """The ``k`` most similar stored activations in ``subspace`` (cosine, best first), as
        dicts with ``row``, ``prompt_id``, ``position``, ``token``, ``similarity`` and
        ``context`` (the token highlighted)."""
        rows, sims = self.index.query(activation, subspace, k=k, min_similarity=min_similarity)
        pis, poss = self._rows()
        hits = []
        for r, s in zip(rows[0].tolist(), sims[0].tolist(), strict=True):
            if r < 0:
                continue
            pid, toks = self.prompts[int(pis[r])]
            p = int(poss[r])
            hits.append(
                {
                    "row": int(r),
                    "prompt_id": pid,
                    "position": p,
                    "token": tokenizer.decode([toks[p]]),
                    "similarity": float(s),
                    "context": highlight_context(tokenizer, toks, p),
                }
            )
        return hits

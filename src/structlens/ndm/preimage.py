"""Per-subspace cosine nearest-neighbour index over stored activations (preimage browsing).

For every subspace ``s`` of a rotation ``R`` the index keeps the L2-normalised projections
``z_s = h R_s / |h R_s|`` of all added activations (float32, rows = samples) and answers
queries by exact brute-force cosine **similarity** (higher is closer) with chunked matrix
products, so memory stays at ``n * d`` floats plus one ``(queries, chunk)`` score block.
Row numbers are the order in which activations were added; callers keep their own metadata
(prompt, position, token) in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

from structlens.stats.mutual_info import _check_partition


class SubspaceIndex:
    """Exact cosine index per subspace.

    Parameters
    ----------
    rotation
        Orthogonal ``(d, d)`` matrix ``R`` (columns = new basis).
    partition
        Subspace sizes summing to ``d``.
    chunk_size
        Stored rows scored per matrix product.
    """

    def __init__(self, rotation: np.ndarray, partition: Sequence[int], chunk_size: int = 65_536):
        self.rotation = torch.as_tensor(np.asarray(rotation), dtype=torch.float32)
        self.partition = _check_partition(partition, self.rotation.shape[0])
        self.bounds = np.concatenate([[0], np.cumsum(self.partition)])
        self.chunk_size = chunk_size
        self._parts: list[list[torch.Tensor]] = [[] for _ in self.partition]
        self._blocks: list[torch.Tensor] | None = None

    def __len__(self) -> int:
        return (
            sum(p.shape[0] for p in self._parts[0])
            if self._blocks is None
            else int(self._blocks[0].shape[0])
        )

    @classmethod
    def from_normalised(
        cls,
        rotation: np.ndarray,
        partition: Sequence[int],
        blocks: Sequence[np.ndarray | torch.Tensor],
        chunk_size: int = 65_536,
    ) -> SubspaceIndex:
        """An index holding ``blocks[s]``, the ``(n, partition[s])`` L2-normalised projections
        of subspace ``s`` (as :meth:`normalised` returns them, e.g. read back from disk)."""
        index = cls(rotation, partition, chunk_size)
        stored = [torch.as_tensor(np.asarray(b), dtype=torch.float32) for b in blocks]
        if len(stored) != len(index.partition):
            raise ValueError(f"{len(stored)} blocks for {len(index.partition)} subspaces.")
        for s, (b, dim) in enumerate(zip(stored, index.partition, strict=True)):
            if b.ndim != 2 or b.shape[1] != dim or b.shape[0] != stored[0].shape[0]:
                raise ValueError(
                    f"block {s} has shape {tuple(b.shape)}; expected ({stored[0].shape[0]}, {dim})."
                )
            if not bool(torch.isfinite(b).all()):
                raise ValueError(f"block {s} contains NaN or infinite values.")
        index._blocks = stored
        return index

    def normalised(self) -> list[torch.Tensor]:
        """The stored L2-normalised projections, one ``(n, partition[s])`` block per subspace."""
        return list(self._stored())

    def _project(self, h: np.ndarray | torch.Tensor, s: int) -> torch.Tensor:
        z = (
            torch.as_tensor(h, dtype=torch.float32)
            @ self.rotation[:, self.bounds[s] : self.bounds[s + 1]]
        )
        return torch.nn.functional.normalize(z, dim=1)

    def add(
        self, activations: np.ndarray | torch.Tensor | Iterable[np.ndarray | torch.Tensor]
    ) -> None:
        """Append activations: one ``(n, d)`` array or an iterable of such chunks."""
        chunks = (
            [activations] if isinstance(activations, (np.ndarray, torch.Tensor)) else activations
        )
        for chunk in chunks:
            h = torch.as_tensor(chunk, dtype=torch.float32)
            if h.ndim != 2 or h.shape[1] != self.rotation.shape[0]:
                raise ValueError(
                    f"activations must be (n, {self.rotation.shape[0]}), got {tuple(h.shape)}."
                )
            if not bool(torch.isfinite(h).all()):
                raise ValueError("activations contain NaN or infinite values.")
            if self._blocks is not None:
                self._parts = [[b] for b in self._blocks]
                self._blocks = None
            for s in range(len(self.partition)):
                self._parts[s].append(self._project(h, s))

    def _stored(self) -> list[torch.Tensor]:
        if self._blocks is None:
            self._blocks = [torch.cat(p) if p else torch.empty(0) for p in self._parts]
            self._parts = [[] for _ in self.partition]
        return self._blocks

    def query(
        self,
        queries: np.ndarray | torch.Tensor,
        subspace: int,
        k: int = 20,
        min_similarity: float | None = None,
        exclude: Sequence[int] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Nearest stored activations to each query inside one subspace.

        Parameters
        ----------
        queries
            Raw activations ``(q, d)`` (or ``(d,)``), projected and normalised here.
        subspace
            Index into ``partition``.
        k
            Neighbours per query.
        min_similarity
            If given, neighbours below this cosine get index ``-1`` and similarity ``nan``
            (the authors' browser uses 0.85).
        exclude
            Stored row per query to skip (e.g. the query's own row), or ``None``.

        Returns
        -------
        (indices, similarities)
            ``(q, k)`` int64 rows and float32 cosine similarities, best first.
        """
        if not 0 <= subspace < len(self.partition):
            raise ValueError(f"subspace must be in [0, {len(self.partition)}), got {subspace}.")
        stored = self._stored()[subspace]
        n = stored.shape[0]
        if n == 0:
            raise ValueError("the index is empty; add activations first.")
        q = torch.as_tensor(queries, dtype=torch.float32)
        q = q[None] if q.ndim == 1 else q
        zq = self._project(q, subspace)
        k = min(k, n)
        best_s = torch.full((zq.shape[0], k), -torch.inf)
        best_i = torch.full((zq.shape[0], k), -1, dtype=torch.long)
        excl = None if exclude is None else torch.as_tensor(list(exclude), dtype=torch.long)
        for c0 in range(0, n, self.chunk_size):
            sims = zq @ stored[c0 : c0 + self.chunk_size].T
            if excl is not None:
                local = excl - c0
                hit = (local >= 0) & (local < sims.shape[1])
                sims[torch.nonzero(hit).squeeze(1), local[hit]] = -torch.inf
            val, idx = sims.topk(min(k, sims.shape[1]), dim=1)
            allv = torch.cat([best_s, val], 1)
            alli = torch.cat([best_i, idx + c0], 1)
            best_s, pos = allv.topk(k, dim=1)
            best_i = alli.gather(1, pos)
        sims_np = best_s.numpy()
        idx_np = best_i.numpy()
        if min_similarity is not None:
            low = sims_np < min_similarity
            idx_np[low] = -1
            sims_np[low] = np.nan
        return idx_np, sims_np

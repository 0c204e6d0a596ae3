"""Exact nearest-neighbour search inside the subspaces of a rotation, for the NDM loss.

Distances are Euclidean inside each subspace: ``|(q - k) R_s|_2`` for a query row ``q``, key
row ``k`` and column block ``R_s`` of the orthogonal matrix ``R`` (rows = samples, ``z = h R``).

The search ranks all keys with the matrix-product expansion ``|k|^2 - 2 q.k`` on pre-rotated,
centred keys (fast, but subject to cancellation when activations have large norms, and possibly
computed with a slightly older ``R``), keeps ``rerank`` candidates per query, and picks the
neighbour among them by the distance recomputed directly from the raw difference ``q - k`` and
the current ``R``.  The returned neighbour is therefore exact unless the true one fell outside
the candidate list, which needs a ranking error larger than the gap to the ``rerank``-th key.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class RotatedKeys:
    """A key bank projected once onto each subspace of a rotation, ready for searching.

    Parameters
    ----------
    keys
        Raw key activations, shape ``(m, d)`` (rows = samples).
    rotation
        Orthogonal ``(d, d)`` matrix ``R``; block ``s`` is the column range of ``partition``.
    partition
        Subspace sizes summing to ``d``.
    chunk_size
        Keys per matrix product; bounds memory at ``batch * chunk_size`` scores.
    """

    def __init__(
        self,
        keys: torch.Tensor,
        rotation: torch.Tensor,
        partition: Sequence[int],
        chunk_size: int = 65_536,
    ) -> None:
        self.keys = keys
        self.center = keys.mean(0)
        self.partition = [int(s) for s in partition]
        self.chunk_size = chunk_size
        rot = rotation.to(keys.dtype)
        self.rotation = rot
        self.blocks: list[torch.Tensor] = []
        self.sq_norms: list[torch.Tensor] = []
        start = 0
        for size in self.partition:
            block = torch.empty(keys.shape[0], size, dtype=keys.dtype, device=keys.device)
            cols = rot[:, start : start + size]
            for c0 in range(0, keys.shape[0], chunk_size):
                block[c0 : c0 + chunk_size] = (keys[c0 : c0 + chunk_size] - self.center) @ cols
            self.blocks.append(block)
            self.sq_norms.append((block * block).sum(1))
            start += size

    @torch.no_grad()
    def nearest(
        self, queries: torch.Tensor, rotation: torch.Tensor, rerank: int = 8
    ) -> torch.Tensor:
        """Index of each query's nearest key in every subspace.

        Parameters
        ----------
        queries
            Raw query activations ``(b, d)``; they must not be rows of the key bank.
        rotation
            The current ``R`` (may differ slightly from the one used to rotate the keys).
        rerank
            Candidates per query and subspace re-scored with the exact distance.

        Returns
        -------
        torch.Tensor
            Long tensor ``(S, b)``: entry ``[s, i]`` indexes the key nearest to query ``i``
            inside subspace ``s`` under ``rotation``.
        """
        current = rotation.to(self.keys.dtype)
        r = min(rerank, self.keys.shape[0])
        centred = queries - self.center
        out = torch.empty(len(self.partition), queries.shape[0], dtype=torch.long)
        start = 0
        for s, size in enumerate(self.partition):
            # Rank with the rotation the keys were projected with, re-score with the current one.
            zq = centred @ self.rotation[:, start : start + size]
            cols = current[:, start : start + size]
            best_val: torch.Tensor | None = None
            best_idx: torch.Tensor | None = None
            for c0 in range(0, self.keys.shape[0], self.chunk_size):
                kb = self.blocks[s][c0 : c0 + self.chunk_size]
                # |k|^2 - 2 q.k ranks keys like the squared distance (|q|^2 is constant per row).
                scores = torch.addmm(
                    self.sq_norms[s][c0 : c0 + self.chunk_size], zq, kb.T, alpha=-2
                )
                val, idx = scores.topk(min(r, kb.shape[0]), dim=1, largest=False)
                idx = idx + c0
                if best_val is None or best_idx is None:
                    best_val, best_idx = val, idx
                else:
                    val = torch.cat([best_val, val], 1)
                    idx = torch.cat([best_idx, idx], 1)
                    best_val, pos = val.topk(r, dim=1, largest=False)
                    best_idx = idx.gather(1, pos)
            assert best_idx is not None
            diff = queries[:, None, :] - self.keys[best_idx]
            exact = torch.linalg.vector_norm(diff @ cols, dim=-1)
            out[s] = best_idx.gather(1, exact.argmin(1, keepdim=True)).squeeze(1).cpu()
            start += size
        return out


def neighbor_distance_loss(
    queries: torch.Tensor,
    keys: torch.Tensor,
    neighbors: torch.Tensor,
    rotation: torch.Tensor,
    partition: Sequence[int],
) -> torch.Tensor:
    """NDM loss: mean over subspaces of the mean distance from each query to its neighbour.

    ``L = (1/S) sum_s (1/b) sum_i |(q_i - k_{n_s(i)}) R_s|_2`` — plain Euclidean, not squared,
    subspaces weighted equally whatever their size.  Computed from the raw difference, so
    gradients reach ``rotation`` without cancellation error; a zero distance (an exact duplicate)
    contributes a zero gradient.

    ``neighbors`` is the ``(S, b)`` output of :meth:`RotatedKeys.nearest`.
    """
    rot = rotation.to(queries.dtype)
    total = queries.new_zeros(())
    start = 0
    for s, size in enumerate(partition):
        diff = queries - keys[neighbors[s].to(keys.device)]
        total = total + torch.linalg.vector_norm(diff @ rot[:, start : start + size], dim=1).mean()
        start += size
    return total / len(partition)

"""Exact nearest-neighbour search inside the subspaces of a rotation, for the NDM loss.

Distances are Euclidean inside each subspace: ``|(q - k) R_s|_2`` for a query row ``q``, key
row ``k`` and column block ``R_s`` of the orthogonal matrix ``R`` (rows = samples, ``z = h R``).

The search ranks all keys with the matrix-product expansion ``|k|^2 - 2 q.k`` on pre-rotated,
centred keys (fast, but subject to cancellation when activations have large norms, and possibly
computed with a slightly older ``R``), keeps ``rerank`` candidates per query, and picks the
neighbour among them by the distance recomputed directly from the raw difference ``q - k`` and
the current ``R``.  The returned neighbour is therefore exact unless the true one fell outside
the candidate list, which needs a ranking error larger than the gap to the ``rerank``-th key.

The ranking is arranged so that its cost is about that of the score products (one batched
float32 matrix product per tile of keys, all subspaces of one size at once).  Each key's
coordinates carry ``|k|^2`` as one more column and each query ``-2 q`` and a 1, so one product
gives the scores with nothing added after.  A top-``r`` selection over every score would cost
more than the products, so each tile's keys are cut into groups of ``GROUP`` and only a
group's minimum score is kept (an elementwise minimum over ``GROUP`` slices of the tile, so a
group's keys are strided).  The ``r`` best keys lie in the ``r`` groups of smallest minimum
(a key among the ``r`` best has at most ``r - 1`` better keys, hence at most ``r - 1`` groups
with a smaller minimum), so the top ``r`` of the group minima, then of the scores of those
groups' keys (recomputed, one matrix-vector product per subspace and query), are the exact
top ``r`` of all keys.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

GROUP = 16
"""Keys per group whose minimum score stands for them in the top-``r`` selection."""

TILE = 1024
"""Keys per score product (a multiple of ``GROUP``): the ``(subspaces, batch, TILE)`` scores
of one product stay in cache for the group minimum that reads them."""

PROJECT_ROWS = 8192
"""Keys per matrix product when the bank is projected."""


def size_runs(partition: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """Runs of equal consecutive sizes of ``partition``: ``(first subspace, first column,
    number of subspaces, size)``; the subspaces of a run are searched as one batch."""
    runs: list[tuple[int, int, int, int]] = []
    subspace = column = 0
    for size in partition:
        if runs and runs[-1][3] == size and runs[-1][0] + runs[-1][2] == subspace:
            first, col, count, _ = runs[-1]
            runs[-1] = (first, col, count + 1, size)
        else:
            runs.append((subspace, column, 1, size))
        subspace += 1
        column += size
    return runs


def _run_columns(matrix: torch.Tensor, column: int, count: int, size: int) -> torch.Tensor:
    """The ``count`` column blocks of width ``size`` from ``column`` on, as ``(count, d, size)``."""
    d = matrix.shape[0]
    return matrix[:, column : column + count * size].reshape(d, count, size).transpose(0, 1)


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
        Keys per top-``r`` selection over group minima; bounds the search's memory at about
        ``subspaces * batch * chunk_size / GROUP`` scores besides the projected bank.
    """

    def __init__(
        self,
        keys: torch.Tensor,
        rotation: torch.Tensor,
        partition: Sequence[int],
        chunk_size: int = 65_536,
    ) -> None:
        self.keys = keys
        self._buffers: dict[str, torch.Tensor] = {}
        self.center = keys.mean(0)
        self.partition = [int(s) for s in partition]
        self.runs = size_runs(self.partition)
        m = keys.shape[0]
        self.tile = min(TILE, GROUP * math.ceil(m / GROUP))
        self.padded = self.tile * math.ceil(m / self.tile)
        self.chunk_size = self.tile * max(1, chunk_size // self.tile)
        rot = rotation.to(keys.dtype)
        self.rotation = rot
        # Per run, the keys' coordinates as (subspaces, padded, size + 1), the last column
        # |k|^2, so a tile of keys is contiguous in every subspace; padding rows score the
        # largest finite value and are never chosen.  Every row is written once (no zero fill
        # of the whole bank first), and the chunks' temporaries are reused: fresh ones this
        # large are page-faulted in at every use.
        self.blocks = [keys.new_empty(n, self.padded, size + 1) for _, _, n, size in self.runs]
        for block in self.blocks:
            block[:, m:, :-1] = 0
            block[:, m:, -1] = torch.finfo(keys.dtype).max
        rows_in = min(PROJECT_ROWS, m)
        centred = self._workspace("centred", (rows_in, keys.shape[1]))
        z = self._workspace("projected", (rows_in, keys.shape[1]))
        for r0 in range(0, m, PROJECT_ROWS):
            n = min(PROJECT_ROWS, m - r0)
            torch.sub(keys[r0 : r0 + n], self.center, out=centred[:n])
            torch.mm(centred[:n], rot, out=z[:n])
            for block, (_, column, count, size) in zip(self.blocks, self.runs, strict=True):
                rows = z[:n, column : column + count * size].reshape(n, count, size)
                part = block[:, r0 : r0 + n]
                part[..., :-1] = rows.transpose(0, 1)
                coords = part[..., :-1]
                squares = self._workspace(f"squares{size}", coords.shape)
                torch.sum(torch.mul(coords, coords, out=squares), 2, out=part[..., -1])
        self._buffers.clear()  # the searches' buffers have other shapes

    def _workspace(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """A buffer of ``shape`` named ``name``, kept between uses: the scores, group minima and
        gathered candidate rows are tens of MB, and a fresh allocation that large is mapped
        from the operating system and page-faulted in at every use, which costs more than
        the arithmetic done in it."""
        n = math.prod(shape)
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < n:
            buf = self._buffers[name] = self.keys.new_empty(n)
        return buf[:n].view(shape)

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
        for i, (first, column, count, size) in enumerate(self.runs):
            # Rank with the rotation the keys were projected with, re-score with the current one.
            zq = torch.bmm(
                centred.expand(count, -1, -1), _run_columns(self.rotation, column, count, size)
            )
            cand = self._candidates(i, zq, r)  # (count, b, r)
            # k - q in place of a gathered copy of the candidates' rows (same norm as q - k).
            diff = self._workspace("rows", (cand.numel(), self.keys.shape[1]))
            torch.index_select(self.keys, 0, cand.flatten(), out=diff)
            diff = diff.view(*cand.shape, -1).sub_(queries[:, None, :])
            proj = torch.bmm(diff.flatten(1, 2), _run_columns(current, column, count, size))
            exact = torch.linalg.vector_norm(proj, dim=2).view(cand.shape)
            pick = cand.gather(2, exact.argmin(2, keepdim=True)).squeeze(2)
            out[first : first + count] = pick.cpu()
        return out

    def _candidates(self, run: int, zq: torch.Tensor, r: int) -> torch.Tensor:
        """The ``r`` keys of smallest ``|k|^2 - 2 q.k`` for every subspace of ``run`` and query
        (``zq`` is ``(count, b, size)``, centred queries in the projection's rotation)."""
        block = self.blocks[run]
        count, b, _ = zq.shape
        per_tile = self.tile // GROUP
        # |k|^2 - 2 q.k ranks keys like the squared distance (|q|^2 is constant per row).
        weights = torch.cat([-2 * zq, zq.new_ones(count, b, 1)], 2)
        scores = self._workspace("scores", (count, b, self.tile))
        best_val: torch.Tensor | None = None
        best_grp: torch.Tensor | None = None
        for c0 in range(0, self.padded, self.chunk_size):
            c1 = min(c0 + self.chunk_size, self.padded)
            minima = self._workspace("minima", (count, b, (c1 - c0) // GROUP))
            for t0 in range(c0, c1, self.tile):
                torch.bmm(weights, block[:, t0 : t0 + self.tile].transpose(1, 2), out=scores)
                g0 = (t0 - c0) // GROUP
                # Group j of a tile holds its keys j, j + per_tile, j + 2 per_tile, ...
                torch.amin(
                    scores.view(count, b, GROUP, per_tile), 2, out=minima[:, :, g0 : g0 + per_tile]
                )
            val, grp = minima.topk(min(r, minima.shape[2]), dim=2, largest=False)
            grp = grp + c0 // GROUP
            if best_val is not None and best_grp is not None:
                val, pos = torch.cat([best_val, val], 2).topk(r, dim=2, largest=False)
                grp = torch.cat([best_grp, grp], 2).gather(2, pos)
            best_val, best_grp = val, grp
        assert best_grp is not None
        # Keys of the chosen groups, then their scores, then the r best of those.
        tile0 = (best_grp // per_tile) * self.tile + best_grp % per_tile
        offsets = torch.arange(GROUP, device=zq.device) * per_tile
        keys = (tile0[..., None] + offsets).flatten(2)  # (count, b, groups * GROUP)
        # Row indices into the run's flattened (count * padded, size + 1) coordinates.
        rows = (keys + torch.arange(count, device=zq.device)[:, None, None] * self.padded).flatten()
        coords = self._workspace("coords", (rows.numel(), block.shape[2]))
        torch.index_select(block.view(-1, block.shape[2]), 0, rows, out=coords)
        # one matrix-vector product per (subspace, query)
        score = torch.bmm(
            coords.view(count * b, -1, block.shape[2]), weights.view(count * b, -1, 1)
        )
        pos = score.view(keys.shape).topk(r, dim=2, largest=False).indices
        return keys.gather(2, pos)


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
    for first, column, count, size in size_runs(partition):
        nb = neighbors[first : first + count].to(keys.device)
        diff = queries - keys[nb]  # (count, b, d)
        proj = torch.bmm(diff, _run_columns(rot, column, count, size))
        total = total + torch.linalg.vector_norm(proj, dim=2).mean(1).sum()
    return total / len(partition)

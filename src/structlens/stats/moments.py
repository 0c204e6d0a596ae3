"""Mergeable float64 moment accumulators (rows = samples).

:class:`CrossMoments` is the one streaming second-moment statistic of the project: the count,
the means and the *centred* scatter blocks of one representation ``X`` or of a pair ``(X, Y)``
with the same rows, optionally with the grouped fourth-order terms that debiased linear CKA
needs.  Koopman EDMDc, the similarity measures (CKA, SVCCA, PWCCA, Procrustes) and the
execution layer's shard statistics all accumulate through it.  :class:`ColumnMoments` keeps
per-column third and fourth central moments (the heavy-tail diagnostic).

Every update is reduced to moments about its own mean and folded in with the pairwise update
of Chan, Golub and LeVeque (1979) -- extended to the fourth-order terms for CKA and, per
column, to the third and fourth moments by Pébay (2008).  Within an update, chunks with
fourth-order terms are centred on their own means; second-order chunks are summed about a
shift near the mean (the running mean), from which the own-mean moments follow exactly with a
correction of the size of the small shift error.  Because the pairwise formula is also the
merge rule, accumulators filled by several workers and merged (in any order) give the
one-pass answer up to float64 rounding, no raw moment is differenced against a large mean
(large activation means cost no precision), and memory never depends on the number of
samples.
"""

from __future__ import annotations

import copy
import functools
import threading
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from structlens.stats.lanes import MIN_LANE_ROWS, lane_count, run_in_lanes, serial_blas
from structlens.stats.validation import check_array, check_finite, check_shape

__all__ = ["DEFAULT_CHUNK_ROWS", "PRECISIONS", "ColumnMoments", "CrossMoments", "symmetric_gram"]

DEFAULT_CHUNK_ROWS = 16384
PRECISIONS = ("float64", "float32")
# Column tile of the blocked symmetric product: wide enough for an efficient GEMM panel.
_TILE = 256
# CrossMoments.pool_many: bytes of one chunk of pooled rows (the working product), the row
# band of a packed symmetric matrix, and the largest ratio of a diagonal entry's sum about the
# common reference to the entry itself before a row is pooled about its own mean instead.
POOL_CHUNK_BYTES = 1 << 28
_BAND = 64
_POOL_RATIO = 1e3


def _is_tensor(x: object) -> bool:
    return hasattr(x, "detach") and hasattr(x, "device")


def symmetric_gram(c: Any) -> Any:
    """``cᵀc`` for a torch matrix ``c`` ``[n, d]``, exactly symmetric.

    On the CPU one BLAS ``syrk`` (NumPy dispatches ``a.T @ a`` to it and mirrors the
    triangle).  Elsewhere wide inputs take :func:`_tiled_gram` and narrow ones a GEMM.
    """
    import torch

    if _in_numpy(c):
        a = _numpy(c)
        return torch.from_numpy(a.T @ a)
    if c.shape[1] <= 2 * _TILE:
        g = c.T @ c
        return 0.5 * (g + g.T)  # a GEMM need not round (i, j) and (j, i) alike
    return _tiled_gram(c, _TILE)


def _tiled_gram(c: Any, tile: int) -> Any:
    """A blocked symmetric rank-k update in GEMMs: each row of column tiles against the
    columns from the tile onwards (about half the flops of ``cᵀc``), the lower triangle
    mirrored from the upper one."""
    d = c.shape[1]
    out = c.new_empty((d, d))
    for s in range(0, d, tile):
        e = min(s + tile, d)
        row = c[:, s:e].T @ c[:, s:]
        out[s:e, s:] = row
        out[s:, s:e] = row.T
        diag = row[:, : e - s]
        out[s:e, s:e] = 0.5 * (diag + diag.T)
    return out


# Working buffers per thread, by (purpose, width, dtype, device); they grow to the largest
# chunk seen.  A fresh multi-megabyte CPU allocation per block costs page faults comparable
# to the block's own arithmetic, and sharing them across accumulators keeps the memory of
# many live accumulators (prompt blocks, shards) at that of one chunk.
_SCRATCH = threading.local()


def _scratch(purpose: str, rows: int, cols: int, dtype: Any, device: Any) -> Any:
    """A reusable ``[rows, cols]`` working buffer (contents undefined)."""
    import torch

    pool = _SCRATCH.__dict__.setdefault("buffers", {})
    key = (purpose, cols, dtype, str(device))
    buf = pool.get(key)
    if buf is None or buf.shape[0] < rows:
        buf = pool[key] = torch.empty((rows, cols), dtype=dtype, device=device)
    return buf[:rows]


def _numpy(t: Any) -> np.ndarray:
    """A CPU tensor as a NumPy array (a view; a float32 copy for dtypes NumPy lacks)."""
    import torch

    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def _in_numpy(t: Any) -> bool:
    """Whether work on ``t`` goes through NumPy: everything on the CPU.

    NumPy's BLAS has the symmetric rank-k update (``syrk``, half a GEMM's flops; torch has
    none), and doing the elementwise passes between BLAS calls in NumPy too leaves no OpenMP
    pool of torch's spinning against OpenBLAS's threads, which slowed the products on two
    cores (see benchmarks/koopman).
    """
    return bool(t.device.type == "cpu")


def _centred(purpose: str, blocks: list[Any], dtype: Any) -> tuple[Any, Any]:
    """Column ``blocks`` written side by side into a working buffer, centred: (buffer, mean).

    Through NumPy (see :func:`_in_numpy`) each block's mean is read from the input and the
    block is written centred in one pass; otherwise the blocks are copied and centred in
    place.
    """
    n, cols = blocks[0].shape[0], sum(b.shape[1] for b in blocks)
    buf = _scratch(purpose, n, cols, dtype, blocks[0].device)
    if _in_numpy(buf):
        import torch

        out, means, start = buf.numpy(), [], 0
        for b in blocks:
            a = _numpy(b)
            mean = a.mean(0, dtype=out.dtype)
            np.subtract(a, mean, out=out[:, start : start + b.shape[1]], casting="unsafe")
            means.append(mean)
            start += b.shape[1]
        return buf, torch.from_numpy(np.concatenate(means))
    start = 0
    for b in blocks:
        buf[:, start : start + b.shape[1]].copy_(b)
        start += b.shape[1]
    mean = buf.mean(0)
    buf -= mean
    return buf, mean


def _tn(a: Any, b: Any) -> Any:
    """``aᵀ b`` for torch matrices with the same rows (see :func:`_in_numpy`)."""
    import torch

    if _in_numpy(a):
        return torch.from_numpy(_numpy(a).T @ _numpy(b))
    return a.T @ b


def _column_dots(a: Any, b: Any) -> Any:
    """``Σ_i a_ij b_ij`` per column without a temporary (NumPy's einsum loop on the CPU)."""
    import torch

    if _in_numpy(a):
        return torch.from_numpy(np.einsum("ij,ij->j", _numpy(a), _numpy(b)))
    return (a * b).sum(0)


def _mul_into(out: Any, a: Any, b: Any) -> None:
    """``out = a * b`` elementwise (see :func:`_in_numpy`)."""
    import torch

    if _in_numpy(out):
        np.multiply(_numpy(a), _numpy(b), out=out.numpy())
    else:
        torch.mul(a, b, out=out)


def _shifted_into(out: Any, blocks: list[Any], shift: Any) -> None:
    """``out = [b₁, b₂, …] − shift``: column blocks written side by side, shifted."""
    import torch

    start = 0
    for b in blocks:
        cols = slice(start, start + b.shape[1])
        if _in_numpy(out):
            o = out.numpy()[:, cols]
            np.subtract(_numpy(b), shift.numpy()[cols], out=o, casting="unsafe")
        else:
            torch.sub(b, shift[cols], out=out[:, cols])
        start += b.shape[1]


def _add_into(acc: Any, part: Any) -> None:
    """``acc += part`` (float64 accumulators, see :func:`_in_numpy`)."""
    if _in_numpy(acc):
        np.add(acc.numpy(), _numpy(part), out=acc.numpy())
    else:
        acc += part


def _accumulate(acc: Any, part: Any) -> Any:
    """``acc + part`` in float64, in place once ``acc`` exists (``None``: start from part)."""
    if acc is None:
        return part.double()
    _add_into(acc, part)
    return acc


def _block_means(blocks: list[Any]) -> np.ndarray:
    """Column means of column ``blocks`` side by side, float64 on the host."""
    means = [
        _numpy(b).mean(0, dtype=np.float64) if _in_numpy(b) else _host(b.mean(0)) for b in blocks
    ]
    return np.concatenate(means)


def _row_tile(cols: int, rows: int, device: Any) -> int:
    """Rows per tile of the elementwise passes: about 1 MiB of float64 on the CPU, so a tile
    written is read again from cache; the whole chunk elsewhere."""
    return max(64, (1 << 17) // cols) if device.type == "cpu" else rows


def _group_square_norms(c: Any, groups: int) -> Any:
    """Squared row norms per contiguous column group ``[n, groups]``, in float64."""
    import torch

    g = c.reshape(c.shape[0], groups, -1)
    if _in_numpy(c):
        a = _numpy(g)
        return torch.from_numpy(np.einsum("ngk,ngk->ng", a, a).astype(np.float64, copy=False))
    return torch.linalg.vector_norm(g, dim=-1).double().square()


class _Pair:
    """Centred moments of a pair of feature blocks ``a`` (rows c_i) and ``b`` (rows e_i).

    ``cross = Σ c_i e_iᵀ``; with group row norms ``P_ig = ||c_ig||²``, ``Q_ih = ||e_ih||²``:
    ``pq = Σ P_i Q_iᵀ`` ``[ga, gb]``, ``pb = Σ P_i e_iᵀ`` ``[ga, d_b]``,
    ``qa = Σ Q_i c_iᵀ`` ``[gb, d_a]``, all about the accumulator's own mean.  Without
    fourth-order terms ``pq``, ``pb`` and ``qa`` are ``None``.
    """

    __slots__ = ("cross", "pq", "pb", "qa")

    def __init__(
        self,
        cross: np.ndarray,
        pq: np.ndarray | None = None,
        pb: np.ndarray | None = None,
        qa: np.ndarray | None = None,
    ) -> None:
        self.cross, self.pq, self.pb, self.qa = cross, pq, pb, qa

    def recentred(
        self,
        n: int,
        da: np.ndarray,
        db: np.ndarray,
        tra: np.ndarray | None,
        trb: np.ndarray | None,
    ) -> _Pair:
        """The same sums taken about ``mean + d`` instead of the own mean (``Σ c_i = 0``).

        ``tra``/``trb`` are the per-group traces of the own-mean auto-scatters.
        """
        cross = self.cross + n * np.outer(da, db)
        if self.pq is None or self.pb is None or self.qa is None or tra is None or trb is None:
            return _Pair(cross)
        ga, gb = self.pq.shape
        d_a, d_b = self.cross.shape
        dag = da.reshape(ga, -1)
        dbg = db.reshape(gb, -1)
        norm_a = np.einsum("gk,gk->g", dag, dag)
        norm_b = np.einsum("hk,hk->h", dbg, dbg)
        # Σ_{l in block h} cross[k, l] db[l]   -> [d_a, gb]
        cross_db = (self.cross * db[None, :]).reshape(d_a, gb, -1).sum(-1)
        # Σ_{k in block g} da[k] cross[k, :]   -> [ga, d_b]
        da_cross = (da[:, None] * self.cross).reshape(ga, -1, d_b).sum(1)
        t_pb = np.einsum("ghk,hk->gh", self.pb.reshape(ga, gb, -1), dbg)
        t_qa = np.einsum("hgk,gk->gh", self.qa.reshape(gb, ga, -1), dag)
        t_dd = (da[:, None] * cross_db).reshape(ga, -1, gb).sum(1)
        pq = (
            self.pq
            + 2.0 * t_pb
            + np.outer(tra, norm_b)
            + 2.0 * t_qa
            + 4.0 * t_dd
            + np.outer(norm_a, trb)
            + n * np.outer(norm_a, norm_b)
        )
        pb = self.pb + np.outer(tra + n * norm_a, db) + 2.0 * da_cross
        qa = self.qa + np.outer(trb + n * norm_b, da) + 2.0 * cross_db.T
        return _Pair(cross, pq, pb, qa)

    def __add__(self, other: _Pair) -> _Pair:
        if self.pq is None or other.pq is None:
            return _Pair(self.cross + other.cross)
        return _Pair(
            self.cross + other.cross,
            self.pq + other.pq,
            self.pb + other.pb,  # type: ignore[operator]
            self.qa + other.qa,  # type: ignore[operator]
        )


def _to_host(a: Any) -> np.ndarray:
    return _host(a) if _is_tensor(a) else np.asarray(a, dtype=np.float64)


def _group_trace(scatter: np.ndarray, groups: int) -> np.ndarray:
    return np.diagonal(scatter).reshape(groups, -1).sum(1)


def _host(t: Any) -> np.ndarray:
    """A float64 NumPy copy of a (small, ``d × d`` or smaller) torch result."""
    return t.detach().double().cpu().numpy()


def _weighted_sum(items: Sequence[Any], keep: Sequence[tuple[Any, int]]) -> np.ndarray:
    """``Σ k_i a_i`` over the parts' matrices (a ``_Pair``'s ``cross`` or a plain array)."""
    out: np.ndarray | None = None
    for item, (_, k) in zip(items, keep):
        a = item.cross if isinstance(item, _Pair) else item
        out = k * a if out is None else out + (a if k == 1 else k * a)
    assert out is not None
    return out


def _gram(d: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``Σ_i w_i d_i d_iᵀ``, exactly symmetric (a GEMM need not round (i, j) and (j, i) alike)."""
    return _symmetric((d * weights[:, None]).T @ d)


def _symmetric(g: np.ndarray) -> np.ndarray:
    return 0.5 * (g + g.T)


def _bands(d: int) -> list[tuple[int, int, int]]:
    """``(start, stop, offset)`` of the row bands of a packed symmetric ``d × d`` matrix: the
    band ``[start:stop, start:]`` (a diagonal tile and the rows to its right) at ``offset``."""
    out, offset = [], 0
    for s in range(0, d, _BAND):
        e = min(s + _BAND, d)
        out.append((s, e, offset))
        offset += (e - s) * (d - s)
    return out


def _packed_width(d: int) -> int:
    """Values of a packed symmetric ``d × d`` matrix (about ``d²/2``, see :func:`_bands`)."""
    s, e, offset = _bands(d)[-1]
    return offset + (e - s) * (d - s)


def _pack(m: np.ndarray, out: np.ndarray) -> None:
    """Write the row bands of the symmetric ``m`` into the vector ``out``."""
    d = m.shape[0]
    for s, e, o in _bands(d):
        out[o : o + (e - s) * (d - s)].reshape(e - s, d - s)[...] = m[s:e, s:]


def _packed_diagonal(d: int) -> np.ndarray:
    """Positions of the diagonal entries of a packed ``d × d`` matrix."""
    idx = np.empty(d, dtype=np.intp)
    for s, e, o in _bands(d):
        r = np.arange(e - s)
        idx[s:e] = o + r * (d - s) + r
    return idx


def _unpack_recentred(v: np.ndarray, f: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``T − f gᵀ`` as a new ``d × d`` matrix from the packed symmetric ``T`` (``v``) and a
    symmetric rank-1 term (``g ∝ f``): computed on the upper triangle band by band, the lower
    triangle mirrored, so the result is exactly symmetric."""
    d = f.shape[0]
    out = np.empty((d, d))
    for s, e, o in _bands(d):
        blk = out[s:e, s:]
        np.multiply(f[s:e, None], g[None, s:], out=blk)
        np.subtract(v[o : o + (e - s) * (d - s)].reshape(e - s, d - s), blk, out=blk)
        out[e:, s:e] = blk[:, e - s :].T
        tile = out[s:e, s:e]
        np.copyto(tile, tile.T.copy(), where=_strictly_lower(e - s))
    return out


@functools.cache
def _strictly_lower(k: int) -> np.ndarray:
    """Boolean mask of the strictly lower triangle of a ``k × k`` tile."""
    return np.tri(k, k, -1, dtype=bool)


def _reference_mean(pairs: list[tuple[int, np.ndarray]], d: int) -> np.ndarray:
    """The mean of parts given as ``(count, mean)`` (zeros without any)."""
    total = sum(n for n, _ in pairs)
    if not total:
        return np.zeros(d)
    return np.asarray(sum(n * m for n, m in pairs), dtype=np.float64) / total


def _well_centred(about_ref: np.ndarray, own: np.ndarray, n: float, ref: np.ndarray) -> bool:
    """Whether diagonal sums about the reference exceed the recentred ones by at most
    ``_POOL_RATIO`` (so at most about three digits go in the rank-1 correction).  Entries
    below ``n (64 ε |ref|)²`` -- a constant column whose mean the reference misses by an
    ulp -- are rounding in any pooling and pass."""
    floor = n * (64.0 * np.finfo(np.float64).eps * np.abs(ref)) ** 2
    return bool(np.all(about_ref <= _POOL_RATIO * own + floor))


class _PoolStack:
    """The moments of K parts about common reference means, one row per part, so that the
    moments of any pooling are a weighted sum of rows (see :meth:`CrossMoments.pool_many`).

    Columns: the count; the packed ``S_xx + n δδᵀ`` and ``n δ`` (``δ`` the part's mean
    minus the reference); with ``Y`` the cross block, ``S_yy`` (packed, or its diagonal) and
    ``n δ_y``; with tails their count, ``n δ`` and the power sums ``Σ (x − c)^p``, p = 2..4.
    """

    def __init__(self, parts: list[CrossMoments]) -> None:
        first = self.template = parts[0]
        dx, dy, k = first.d_x, first._d_y, first.tails_x
        self.full_y = dy is not None and first.second_y == "full"
        widths = {"n": 1, "xx": _packed_width(dx), "mx": dx}
        if dy is not None:
            widths |= {"xy": dx * dy, "yy": _packed_width(dy) if self.full_y else dy, "my": dy}
        if k:
            widths |= {"tn": 1, "tm": k, "t2": k, "t3": k, "t4": k}
        self.at: dict[str, slice] = {}
        start = 0
        for name, width in widths.items():
            self.at[name] = slice(start, start + width)
            start += width
        self.width = start
        self.diag_x = _packed_diagonal(dx)
        self.diag_y = _packed_diagonal(dy) if dy is not None and self.full_y else None
        live = [p for p in parts if p.n > 0]
        self.cx = _reference_mean([(p.n, p.mean_x) for p in live], dx)
        self.cy = None if dy is None else _reference_mean([(p.n, p.mean_y) for p in live], dy)
        tails = [p.tails for p in live if p.tails is not None and p.tails.n > 0]
        self.ct = _reference_mean([(t.n, t.mean) for t in tails], k) if k else None
        self.stacked = np.zeros((len(parts), self.width))
        for row, p in zip(self.stacked, parts):
            if p.n > 0:
                self._write(row, p)

    def _write(self, row: np.ndarray, p: CrossMoments) -> None:
        at, n = self.at, float(p.n)
        assert p._xx is not None
        ex = p.mean_x - self.cx
        row[at["n"]] = n
        row[at["mx"]] = n * ex
        _pack(p._xx.cross + n * np.outer(ex, ex), row[at["xx"]])
        if self.cy is not None:
            assert p._xy is not None and p._yy is not None
            ey = p.mean_y - self.cy
            row[at["my"]] = n * ey
            row[at["xy"]] = (p._xy.cross + n * np.outer(ex, ey)).ravel()
            if isinstance(p._yy, _Pair):
                _pack(p._yy.cross + n * np.outer(ey, ey), row[at["yy"]])
            else:
                row[at["yy"]] = p._yy + n * ey * ey
        t = p.tails
        if self.ct is not None and t is not None and t.n > 0:
            nt, d = float(t.n), t.mean - self.ct
            row[at["tn"]] = nt
            row[at["tm"]] = nt * d
            row[at["t2"]] = t.m2 + nt * d**2
            row[at["t3"]] = t.m3 + 3.0 * d * t.m2 + nt * d**3
            row[at["t4"]] = t.m4 + 4.0 * d * t.m3 + 6.0 * d**2 * t.m2 + nt * d**4

    def moments(self, v: np.ndarray) -> CrossMoments | None:
        """The accumulator of one pooled row ``v`` (a weighted sum of rows), recentred on its
        own means; ``None`` when the reference is too far from them (see
        :func:`_well_centred`)."""
        at, out = self.at, CrossMoments._like(self.template)
        n = float(v[at["n"]][0])
        if n == 0:
            return out
        ex = v[at["mx"]] / n
        xx = v[at["xx"]]
        s_xx = _unpack_recentred(xx, n * ex, ex)
        if not _well_centred(xx[self.diag_x], np.diagonal(s_xx), n, self.cx):
            return None
        out.n, out.mean_x, out._xx = int(round(n)), self.cx + ex, _Pair(s_xx)
        if self.cy is not None:
            ey, yy = v[at["my"]] / n, v[at["yy"]]
            s_yy: _Pair | np.ndarray
            if self.full_y:
                s_yy = _Pair(_unpack_recentred(yy, n * ey, ey))
                about_ref, own = yy[self.diag_y], np.diagonal(s_yy.cross)
            else:
                s_yy = yy - n * ey * ey
                about_ref, own = yy, s_yy
            if not _well_centred(about_ref, own, n, self.cy):
                return None
            out._mean_y, out._yy = self.cy + ey, s_yy
            xy = v[at["xy"]].reshape(self.template.d_x, -1)
            out._xy = _Pair(xy - np.outer(n * ex, ey))
        if self.ct is not None:
            nt = float(v[at["tn"]][0])
            if nt > 0:
                out.tails = ColumnMoments._from_shifted_sums(
                    int(round(nt)), self.ct, v[at["tm"]] / nt, v[at["t2"]], v[at["t3"]],
                    v[at["t4"]],
                )  # fmt: skip
        return out


class _LaneSums:
    """One lane's float64 sums of :class:`_ShiftedSums` (``None`` until its first rows)."""

    __slots__ = ("rows", "gxx", "gxy", "gyy", "syy", "s3", "s4")

    def __init__(self) -> None:
        self.rows = 0
        self.gxx: Any = None
        self.gxy: Any = None
        self.gyy: Any = None
        self.syy: Any = None
        self.s3: Any = None
        self.s4: Any = None


def _total(lanes: list[_LaneSums], name: str) -> np.ndarray:
    """A sum over the lanes, in lane order, as float64 on the host."""
    parts = [_host(v) for v in (getattr(lane, name) for lane in lanes) if v is not None]
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


class _ShiftedSums:
    """Float64 sums of a stream of chunks about fixed shifts, on the chunks' device (the
    second-order path of :class:`CrossMoments`; see ``_update_second_order``).

    ``gxx = Σ [x − s, 1][x − s, 1]ᵀ``, ``gxy = Σ [x − s, 1](y − s_y)ᵀ``, and
    ``syy = Σ (y − s_y)²`` per column or ``gyy = Σ [y − s_y, 1][y − s_y, 1]ᵀ`` (a full
    ``S_yy``); ``s3``/``s4`` the third and fourth powers of the first ``tails_x`` columns of
    ``x − s``.  Both sides are shifted (a ``y`` with a large mean would cost digits in a
    product taken as given).  On the CPU a large chunk's rows are split into one contiguous
    part per core, each reduced into its own lane of sums (:mod:`structlens.stats.lanes`).
    """

    def __init__(self, acc: CrossMoments, xs: list[Any], ys: list[Any] | None) -> None:
        import torch

        self.device, self.chunk_rows = xs[0].device, acc.chunk_rows
        self.dtype = torch.float64 if acc.precision == "float64" else torch.float32
        self.d, self.k, self.d_y = acc.d_x, acc.tails_x, acc._d_y or 0
        self.full_y = acc.second_y == "full"
        self.sx, self.shift_x = self._shift(acc.mean_x if acc.n else self._head_mean(xs, "x"))
        if ys is not None:
            self.sy, self.shift_y = self._shift(acc.mean_y if acc.n else self._head_mean(ys, "y"))
        self.lanes = [_LaneSums()]

    def _head_mean(self, blocks: list[Any], name: str) -> np.ndarray:
        """The mean of the first chunk's rows (the shift of an empty accumulator), checked:
        a NaN there would make every row's sums non-finite, wherever the NaN sits."""
        import torch

        head = [t[: self.chunk_rows] for t in blocks]
        mean = _block_means(head)
        CrossMoments._check_finite(torch.from_numpy(mean), head, name)
        return mean

    def _shift(self, mean: np.ndarray) -> tuple[Any, np.ndarray]:
        """The shift in the working precision and as float64 (the value applied)."""
        import torch

        t = torch.as_tensor(mean, dtype=self.dtype, device=self.device)
        return t, _host(t)

    def add(self, xs: list[Any], ys: list[Any] | None) -> None:
        """Add one chunk of column blocks: lane ``i`` of ``L`` takes the ``i``-th contiguous
        part of its rows (``L = 1`` off the CPU and for small chunks)."""
        if xs[0].device != self.device:
            raise ValueError(
                f"a chunk on {xs[0].device} follows chunks on {self.device}; keep a stream on "
                "one device."
            )
        n = xs[0].shape[0]
        lanes = lane_count(n, self.device)
        if lanes == 1:
            self._reduce(self.lanes[0], xs, ys, 0, n, self.chunk_rows)
            return
        self.lanes += [_LaneSums() for _ in range(lanes - len(self.lanes))]
        # the lanes' working buffers together stay at about one chunk
        step = max(MIN_LANE_ROWS, self.chunk_rows // lanes)
        bounds = [n * i // lanes for i in range(lanes + 1)]
        run_in_lanes(
            [
                functools.partial(self._reduce, lane, xs, ys, a, b, step)
                for lane, a, b in zip(self.lanes, bounds, bounds[1:])
            ]
        )

    def _reduce(
        self,
        sums: _LaneSums,
        xs: list[Any],
        ys: list[Any] | None,
        start: int,
        stop: int,
        step: int,
    ) -> None:
        """Add rows ``start:stop`` into ``sums``, ``step`` rows at a time."""
        import torch

        d, k = self.d, self.k
        for lo in range(start, stop, step):
            sl = slice(lo, min(lo + step, stop))
            n = sl.stop - lo
            tile = _row_tile(d + 1, n, self.device)
            c = _scratch("shifted x", n, d + 1, self.dtype, self.device)
            sq = _scratch("square", tile, k, self.dtype, self.device) if k else None
            for r in range(0, n, tile):
                rs = slice(lo + r, lo + min(r + tile, n))
                cr = c[r : r + tile]
                _shifted_into(cr[:, :d], [t[rs] for t in xs], self.sx)
                if sq is not None:  # the tails' powers while the tile is in cache
                    cb, q = cr[:, :k], sq[: cr.shape[0]]
                    _mul_into(q, cb, cb)
                    sums.s3 = _accumulate(sums.s3, _column_dots(q, cb))
                    sums.s4 = _accumulate(sums.s4, _column_dots(q, q))
            c[:, d] = 1.0
            g = symmetric_gram(c)
            CrossMoments._check_finite(torch.diagonal(g)[:d], [t[sl] for t in xs], "x")
            sums.gxx = _accumulate(sums.gxx, g)
            sums.rows += n
            if ys is not None:
                self._add_y(sums, c, [t[sl] for t in ys])

    def _add_y(self, sums: _LaneSums, c: Any, ys: list[Any]) -> None:
        import torch

        n, dy = c.shape[0], self.d_y
        e = _scratch("shifted y", n, dy + self.full_y, self.dtype, self.device)
        if self.full_y:  # [y − s_y, 1]: its rank-k update holds S_yy's sums
            _shifted_into(e[:, :dy], ys, self.sy)
            e[:, dy] = 1.0
            gy = symmetric_gram(e)
            CrossMoments._check_finite(torch.diagonal(gy)[:dy], ys, "y")
            sums.gyy = _accumulate(sums.gyy, gy)
            e = e[:, :dy]
        else:  # the squares of each row tile while it is in cache
            tile = _row_tile(dy, n, self.device)
            syy = None
            for r in range(0, n, tile):
                er = e[r : r + tile]
                _shifted_into(er, [t[r : r + tile] for t in ys], self.sy)
                syy = _accumulate(syy, _column_dots(er, er))
            CrossMoments._check_finite(syy, ys, "y")
            sums.syy = _accumulate(sums.syy, syy)
        sums.gxy = _accumulate(sums.gxy, _tn(c, e))

    def moments(self) -> tuple[Any, ...]:
        """``(n, mean_x, mean_y, s_xx, s_yy, s_xy, tails)`` about the stream's own means."""
        lanes = [lane for lane in self.lanes if lane.rows]
        d, k, n = self.d, self.k, sum(lane.rows for lane in lanes)
        G = _total(lanes, "gxx")
        da = G[d, :d] / n
        mean_x = self.shift_x + da
        s_xx = G[:d, :d] - n * np.outer(da, da)
        tails = None
        if k:
            tails = ColumnMoments._from_shifted_sums(
                n, self.shift_x[:k], da[:k], np.diagonal(G)[:k], _total(lanes, "s3"),
                _total(lanes, "s4"),
            )  # fmt: skip
        if lanes[0].gxy is None:  # no y
            return n, mean_x, None, s_xx, None, None, tails
        H = _total(lanes, "gxy")
        db = H[d] / n
        s_xy = H[:d] - n * np.outer(da, db)
        if self.full_y:
            s_yy = _total(lanes, "gyy")[: self.d_y, : self.d_y] - n * np.outer(db, db)
        else:
            s_yy = _total(lanes, "syy") - n * db**2
        return n, mean_x, self.shift_y + db, s_xx, s_yy, s_xy, tails


class CrossMoments:
    """Streaming, mergeable centred moments of ``X`` ``[n, d_x]`` and optionally ``Y`` ``[n, d_y]``.

    Keeps the count ``n``, the means, the centred scatter ``S_xx = Σ (x_i − x̄)(x_i − x̄)ᵀ``
    and, with ``Y``, ``S_xy`` ``[d_x, d_y]`` and ``S_yy`` (the full matrix, or only its
    diagonal with ``second_y="diag"`` -- enough for per-column residual variances of a
    regression of ``Y`` on ``X``).  Scatters are sums, not divided by ``n``.

    Parameters
    ----------
    d_x, d_y : int
        Feature widths (``d_y=None``: moments of ``X`` alone).
    groups_x, groups_y : int
        Split the features into this many equal contiguous groups (attention heads of a
        flattened ``hook_z``: ``d_x = n_heads * d_head``).  With a full ``S_yy`` (and
        ``fourth_order``) the grouped fourth-order terms of the debiased HSIC
        (``Σ P_i Q_iᵀ`` etc. with group row norms ``P_ig = ||x_ig − x̄_g||²``) are kept,
        so :meth:`hsic_terms` gives the CKA of every group pair.  They cost
        ``O(n (g_x + g_y)(d_x + d_y))`` per block, small against the ``O(n (d_x + d_y)²)``
        second block.
    second_y : {"full", "diag"}
        Keep all of ``S_yy`` or only its diagonal (no fourth-order terms then).
    fourth_order : bool
        With a full ``S_yy``, also keep the grouped fourth-order terms (default), which only
        the debiased HSIC needs.  Without them the rows take the second-order path: one
        shifted write per chunk and side, one merge per :meth:`update` -- biased CKA, the
        CCA family and regressions need no more.
    chunk_rows : int
        Rows reduced at once; bounds the working memory to about ``chunk_rows * (d_x + d_y)``
        values (on the CPU the lanes of a large chunk split these rows between them).
    precision : {"float64", "float32"}
        Arithmetic within a chunk (mean, centring, products).  Accumulation across chunks is
        always float64; ``"float32"`` has relative error about 1e-6 and is roughly twice as
        fast.  Keep ``"float64"`` for debiased CKA of nearly independent wide representations,
        where its terms cancel.
    tails_x : int
        Also keep per-column third and fourth central moments of the first ``tails_x``
        columns of ``X`` (:attr:`tails`, a :class:`ColumnMoments`; the heavy-tail
        diagnostic), read from the working buffer, so they cost no copy of their own
        (accumulators without fourth-order terms).

    Notes
    -----
    One block path for every input: NumPy arrays are wrapped as (CPU) torch tensors without a
    copy, torch tensors are reduced on their own device; only the ``d × d`` results cross to
    the host, once per :meth:`update`.  Per chunk the only copy is into one float64 (or
    float32) working buffer per side -- ``[x − s, 1]`` about a shift near the mean, so that
    one symmetric rank-k update (BLAS ``syrk`` on the CPU, a blocked one on other devices)
    also yields the column sums, and likewise for ``Y`` (fourth-order accumulators centre each
    side on the chunk's own mean instead).  Finiteness is checked on the
    diagonal of the scatter (a NaN/inf anywhere in a column makes its diagonal entry
    non-finite), so valid data costs no extra pass.  On the CPU a chunk of at least
    ``2 * MIN_LANE_ROWS`` rows is split into one contiguous part per core, reduced in
    threads with one BLAS thread each (:mod:`structlens.stats.lanes`); the lanes' sums are
    added in lane order, so the result does not depend on timing.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x, y = rng.normal(size=(1000, 8)), rng.normal(size=(1000, 5))
    >>> a, b = CrossMoments(8, 5), CrossMoments(8, 5)
    >>> merged = a.update(x[:400], y[:400]).merge(b.update(x[400:], y[400:]))
    >>> merged.n, bool(np.allclose(merged.s_xy, (x - x.mean(0)).T @ (y - y.mean(0))))
    (1000, True)
    """

    def __init__(
        self,
        d_x: int,
        d_y: int | None = None,
        groups_x: int = 1,
        groups_y: int = 1,
        *,
        second_y: Literal["full", "diag"] = "full",
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        precision: str = "float64",
        tails_x: int = 0,
        fourth_order: bool = True,
    ) -> None:
        if d_x < 1 or (d_y is not None and d_y < 1):
            raise ValueError(f"feature widths must be positive, got d_x={d_x}, d_y={d_y}.")
        for g, d, name in ((groups_x, d_x, "groups_x"), (groups_y, d_y or 1, "groups_y")):
            if g < 1 or d % g:
                raise ValueError(f"{name}={g} must be a positive divisor of the width {d}.")
        if second_y not in ("full", "diag"):
            raise ValueError(f"second_y must be 'full' or 'diag', got {second_y!r}.")
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be positive, got {chunk_rows}.")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}.")
        if not 0 <= tails_x <= d_x:
            raise ValueError(f"tails_x must be between 0 and d_x={d_x}, got {tails_x}.")
        self.d_x, self._d_y = int(d_x), None if d_y is None else int(d_y)
        self.groups_x, self.groups_y = int(groups_x), int(groups_y)
        self.second_y = second_y
        self.fourth_order = d_y is not None and second_y == "full" and bool(fourth_order)
        if tails_x and self.fourth_order:
            raise ValueError(
                "tails_x is kept by the second-order path: pass second_y='diag' or "
                "fourth_order=False with it."
            )
        self.chunk_rows = int(chunk_rows)
        self.precision = precision
        self.n = 0
        self.mean_x = np.zeros(self.d_x)
        self._mean_y = None if d_y is None else np.zeros(d_y)
        self._xx: _Pair | None = None
        self._yy: _Pair | np.ndarray | None = None  # full pair, or the diagonal of S_yy
        self._xy: _Pair | None = None
        self.tails = ColumnMoments(tails_x) if tails_x else None

    @property
    def _key(self) -> tuple[Any, ...]:
        return (
            self.d_x, self._d_y, self.groups_x, self.groups_y, self.second_y, self.tails_x,
            self.fourth_order,
        )  # fmt: skip

    @property
    def tails_x(self) -> int:
        """Number of leading columns of ``X`` whose :attr:`tails` are kept (0: none)."""
        return 0 if self.tails is None else self.tails.dim

    # -- accumulation -------------------------------------------------------------------
    def update(self, x: object, y: object = None) -> CrossMoments:
        """Add the rows of ``x`` ``[m, d_x]`` (and the paired rows of ``y`` ``[m, d_y]``).

        ``x`` may also be a tuple of arrays with the same rows whose columns make up ``d_x``
        (e.g. ``(Ψ(x), u)``): they are written side by side straight into the working buffer,
        never concatenated.  Returns ``self``.
        """
        return self.update_chunks([(x, y)])

    def update_chunks(self, chunks: Iterable[tuple[object, object]]) -> CrossMoments:
        """Add a stream of ``(x, y)`` row chunks (``y = None`` without ``Y``); returns ``self``.

        The same moments as :meth:`update` on each chunk, but without fourth-order terms the
        sums stay in one set of float64 accumulators on the data's device for the whole
        stream and are merged into ``self`` once at the end: on a GPU nothing crosses to the
        host per chunk.
        """
        items = (self._checked(x, y) for x, y in chunks)
        # NaN/inf surface in the fused checks, which name the input that holds them
        with np.errstate(invalid="ignore", over="ignore"):
            if not self.fourth_order:
                self._update_second_order(items)
                return self
            for tx, ty in items:
                self._update_fourth_order(tx, ty)  # type: ignore[arg-type]
        return self

    def _update_fourth_order(self, xs: list[Any], ys: list[Any]) -> None:
        """Add one chunk with fourth-order terms: own-mean moments of ``chunk_rows`` rows at a
        time, merged in row order (on the CPU, a run of parts is reduced in lanes)."""
        n = xs[0].shape[0]
        lanes = lane_count(n, xs[0].device)
        step = self.chunk_rows if lanes == 1 else max(MIN_LANE_ROWS, self.chunk_rows // lanes)
        parts = [slice(a, a + step) for a in range(0, n, step)]
        for i in range(0, len(parts), lanes):
            tasks = [
                functools.partial(self._chunk, [t[sl] for t in xs], [t[sl] for t in ys])
                for sl in parts[i : i + lanes]
            ]
            for moments in run_in_lanes(tasks) if len(tasks) > 1 else [tasks[0]()]:
                self._merge_state(*moments)

    def _checked(self, x: object, y: object) -> tuple[list[Any], list[Any] | None]:
        """The column blocks of one chunk, validated: (x blocks, y blocks or None)."""
        if (y is None) != (self._d_y is None):
            raise ValueError(
                "pass y exactly when the accumulator was built with d_y "
                f"(d_y={self._d_y}, y {'missing' if y is None else 'given'})."
            )
        tx = self._as_blocks(x, "x", self.d_x)
        ty = None if y is None else self._as_blocks(y, "y", self._d_y)
        for t in [*tx, *(ty or ())]:
            if t.shape[0] != tx[0].shape[0] or t.device != tx[0].device:
                raise ValueError(
                    f"x has {tx[0].shape[0]} rows on {tx[0].device} and y or another block "
                    f"{t.shape[0]} rows on {t.device}; rows must pair (same inputs, same device)."
                )
        return tx, ty

    def _update_second_order(self, items: Iterable[tuple[list[Any], list[Any] | None]]) -> None:
        """Add chunks of column blocks ``(xs, ys)``: moments up to the second order.

        The rows are reduced about a fixed shift ``s`` -- the running mean, or the first
        chunk's mean in an empty accumulator -- and summed in float64 on the data's device.
        Per chunk ``[x − s, 1]`` is written once into the working buffer; its symmetric
        rank-k update holds ``Σ (x − s)(x − s)ᵀ``, ``Σ (x − s)`` and ``n``, and its product
        with ``y − s_y`` (shifted into a buffer too) holds ``Σ (x − s)(y − s_y)ᵀ`` and
        ``Σ (y − s_y)``.  The own-mean scatters follow exactly, e.g.
        ``S_xx = Σ (x − s)(x − s)ᵀ − n d dᵀ`` with ``d = x̄ − s`` small, and one pairwise
        merge folds the whole stream in.  The squares of ``y`` and the tails' powers are
        taken in cache-sized row tiles right after the tile is written.
        """
        sums: _ShiftedSums | None = None
        for xs, ys in items:
            if xs[0].shape[0] == 0:
                continue
            if sums is None:
                sums = _ShiftedSums(self, xs, ys)
            sums.add(xs, ys)
        if sums is None:
            return
        n, mean_x, mean_y, s_xx, s_yy, s_xy, tails = sums.moments()
        if tails is not None:
            self.tails.merge(tails)  # type: ignore[union-attr]
        yy = _Pair(s_yy) if s_yy is not None and s_yy.ndim == 2 else s_yy
        self._merge_state(n, mean_x, mean_y, _Pair(s_xx), yy, None if s_xy is None else _Pair(s_xy))

    @classmethod
    def _as_blocks(cls, a: object, name: str, dim: int | None) -> list[Any]:
        """``a`` (or the column blocks of a tuple ``a``) as tensors; widths must sum to dim."""
        if not isinstance(a, tuple):
            return [cls._as_tensor(a, name, dim)]
        blocks = [cls._as_tensor(b, f"{name}[{i}]", None) for i, b in enumerate(a)]
        width = sum(b.shape[1] for b in blocks)
        if not blocks or (dim is not None and width != dim):
            raise ValueError(f"the column blocks of {name} have {width} columns, expected {dim}.")
        return blocks

    @staticmethod
    def _as_tensor(a: object, name: str, dim: int | None) -> Any:
        import torch

        if _is_tensor(a):
            check_shape(a.shape, name=name, n_cols=dim)  # type: ignore[attr-defined]
            t = a.detach()  # type: ignore[attr-defined]
            if not t.is_floating_point():
                t = t.double()
            return t
        arr = check_array(a, name=name, n_cols=dim, dtype=None, finite=False)
        with warnings.catch_warnings():
            # read-only inputs (memory maps) are fine: they are only read
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return torch.from_numpy(np.ascontiguousarray(arr))

    def _chunk(self, xs: list[Any], ys: list[Any]) -> tuple[Any, ...]:
        """Own-mean moments with fourth-order terms of one chunk (column blocks ``xs``,
        ``ys``): ``(n, mean_x, mean_y, xx, yy, xy)`` in float64."""
        import torch

        dtype = torch.float64 if self.precision == "float64" else torch.float32
        n = xs[0].shape[0]
        # the one centring buffer per side, reused across chunks; the caller's data is only read
        c, mx = _centred("x", xs, dtype)
        s_xx = symmetric_gram(c)
        self._check_finite(torch.diagonal(s_xx), xs, "x")
        e, my = _centred("y", ys, dtype)
        s_xy = _tn(c, e)
        s_yy = symmetric_gram(e)
        self._check_finite(torch.diagonal(s_yy), ys, "y")
        # group row norms, reduced without materialising c * c
        p, q = _group_square_norms(c, self.groups_x), _group_square_norms(e, self.groups_y)
        pc, qc = p.to(dtype), q.to(dtype)
        xx = _Pair(_host(s_xx), _host(_tn(p, p)), *(2 * (_host(_tn(pc, c)),)))
        yy = _Pair(_host(s_yy), _host(_tn(q, q)), *(2 * (_host(_tn(qc, e)),)))
        xy = _Pair(_host(s_xy), _host(_tn(p, q)), _host(_tn(pc, e)), _host(_tn(qc, c)))
        return n, _host(mx), _host(my), xx, yy, xy

    @staticmethod
    def _check_finite(diag: Any, blocks: list[Any], name: str) -> None:
        """Raise when ``diag`` (sums of squares of ``blocks``) is not finite, naming NaN/inf."""
        if bool(diag.isfinite().all()):
            return
        for b in blocks:
            check_finite(b.detach().cpu().double().numpy(), name)
        raise ValueError(
            f"{name} overflows float arithmetic (its scatter is infinite); rescale it."
        )

    def merge(self, other: CrossMoments) -> CrossMoments:
        """Fold ``other``'s samples into ``self`` (exact pairwise update); returns ``self``."""
        if not isinstance(other, CrossMoments) or other._key != self._key:
            got = other._key if isinstance(other, CrossMoments) else type(other).__name__
            raise ValueError(
                "cannot merge CrossMoments with different widths, groups, second_y, tails_x or "
                f"fourth_order: {self._key} vs {got}."
            )
        if self.tails is not None and other.tails is not None:  # equal keys: both or neither
            self.tails.merge(other.tails)
        if other.n:
            assert other._xx is not None
            self._merge_state(
                other.n,
                other.mean_x,
                other._mean_y,
                copy.deepcopy(other._xx),
                copy.deepcopy(other._yy),
                copy.deepcopy(other._xy),
            )
        return self

    def _merge_state(
        self,
        n: int,
        mx: np.ndarray,
        my: np.ndarray | None,
        xx: _Pair,
        yy: _Pair | np.ndarray | None,
        xy: _Pair | None,
    ) -> None:
        if n == 0:
            return
        if self.n == 0:
            self.n, self.mean_x = n, mx.copy()
            self._mean_y = None if my is None else my.copy()
            self._xx, self._yy, self._xy = xx, yy, xy
            return
        assert self._xx is not None
        total = self.n + n
        new_mx = (self.n * self.mean_x + n * mx) / total
        gx, gy = self.groups_x, self.groups_y
        own = (self.n, self.mean_x, self._mean_y, self._xx, self._yy, self._xy)
        # recentre both parts about the pooled mean, then add (Chan et al.'s pairwise update)
        sides = [(cnt, ox, pxx) for cnt, ox, _, pxx, _, _ in (own, (n, mx, my, xx, yy, xy))]
        traces = [_group_trace(p.cross, gx) if self.fourth_order else None for _, _, p in sides]
        rxx = [p.recentred(c, o - new_mx, o - new_mx, t, t) for (c, o, p), t in zip(sides, traces)]
        self._xx = rxx[0] + rxx[1]
        if my is not None:
            assert self._mean_y is not None
            new_my = (self.n * self._mean_y + n * my) / total
            yparts: list[tuple[_Pair | np.ndarray, _Pair]] = []
            for (cnt, ox, _), trx, oy, pyy, pxy in zip(
                sides, traces, (self._mean_y, my), (self._yy, yy), (self._xy, xy)
            ):
                assert pyy is not None and pxy is not None
                dx, dy = ox - new_mx, oy - new_my
                if isinstance(pyy, _Pair):
                    try_ = _group_trace(pyy.cross, gy)
                    yparts.append(
                        (
                            pyy.recentred(cnt, dy, dy, try_, try_),
                            pxy.recentred(cnt, dx, dy, trx, try_),
                        )
                    )
                else:
                    yparts.append((pyy + cnt * dy * dy, pxy.recentred(cnt, dx, dy, None, None)))
            (ayy, axy), (byy, bxy) = yparts
            self._yy = ayy + byy  # both _Pair or both arrays
            self._xy = axy + bxy
            self._mean_y = new_my
        self.n, self.mean_x = total, new_mx

    @classmethod
    def pool(cls, parts: Sequence[CrossMoments], weights: Any = None) -> CrossMoments:
        """A new accumulator holding the samples of ``parts[i]`` ``weights[i]`` times.

        ``weights`` are non-negative integer multiplicities (default: each part once), e.g.
        a bootstrap resample of prompt blocks as counts.  Without fourth-order terms this is
        the K-part form of the pairwise update in one pass,
        ``S = Σ w_i S_i + Σ w_i n_i d_i d_iᵀ`` with ``d_i`` the part's mean minus the pooled
        mean, which reads each part's matrices once where K pairwise merges copy and recentre
        the running sum K times; equal to merging the copies up to float64 rounding.
        Accumulators with fourth-order terms are merged pairwise.  Many weightings of the
        same parts pool faster together: :meth:`pool_many`.

        >>> rng = np.random.default_rng(0)
        >>> x, y = rng.normal(size=(30, 3)), rng.normal(size=(30, 2))
        >>> a = CrossMoments(3, 2, second_y="diag").update(x[:10], y[:10])
        >>> b = CrossMoments(3, 2, second_y="diag").update(x[10:], y[10:])
        >>> both = CrossMoments(3, 2, second_y="diag").update(np.vstack([x, x[10:]]),
        ...                                                  np.vstack([y, y[10:]]))
        >>> pooled = CrossMoments.pool([a, b], weights=[1, 2])
        >>> pooled.n, bool(np.allclose(pooled.s_xy, both.s_xy))
        (50, True)
        """
        parts = list(parts)
        if not parts:
            raise ValueError("nothing to pool: pass at least one accumulator.")
        w = np.ones(len(parts), dtype=np.int64) if weights is None else np.asarray(weights)
        if w.shape != (len(parts),) or np.any(w < 0) or np.any(w != np.round(w)):
            raise ValueError(
                f"weights must be {len(parts)} non-negative integers (one per part); got {w}."
            )
        cls._check_poolable(parts)
        out = cls._like(parts[0])
        keep = [(p, int(k)) for p, k in zip(parts, w) if k > 0 and p.n > 0]
        if not keep:
            return out
        if out.fourth_order:
            for p, k in keep:
                for _ in range(k):
                    out.merge(p)
            return out
        if out.tails is not None:
            for p, k in keep:
                for _ in range(k):
                    out.tails.merge(p.tails)  # type: ignore[arg-type]
        cnt = np.array([k * p.n for p, k in keep], dtype=np.float64)
        total = float(cnt.sum())
        mx = np.stack([p.mean_x for p, _ in keep])
        out.mean_x = cnt @ mx / total
        dx = mx - out.mean_x
        out._xx = _Pair(_weighted_sum([p._xx for p, _ in keep], keep) + _gram(dx, cnt))
        if out._d_y is not None:
            my = np.stack([p.mean_y for p, _ in keep])
            out._mean_y = cnt @ my / total
            dy = my - out._mean_y
            yy = _weighted_sum([p._yy for p, _ in keep], keep)
            out._yy = _Pair(yy + _gram(dy, cnt)) if yy.ndim == 2 else yy + cnt @ (dy * dy)
            out._xy = _Pair(
                _weighted_sum([p._xy for p, _ in keep], keep) + (dx * cnt[:, None]).T @ dy
            )
        out.n = int(round(total))
        return out

    @classmethod
    def pool_many(
        cls,
        parts: Sequence[CrossMoments],
        weights: Any,
        *,
        chunk_bytes: int = POOL_CHUNK_BYTES,
    ) -> Iterator[CrossMoments]:
        """:meth:`pool` of the same ``parts`` for every row of ``weights`` ``[B, K]``.

        Yields ``B`` new accumulators in row order, the ``b``-th equal to
        ``CrossMoments.pool(parts, weights[b])`` up to float64 rounding (relative ~1e-13 on
        well-conditioned data; a row without weight on a non-empty part gives an empty
        accumulator, as there).  Every part's moments are written once about one reference
        point ``c``, the mean of all parts: ``S_i + n_i δ_i δ_iᵀ`` with ``δ_i = x̄_i − c``
        (likewise the cross and ``Y`` blocks, the first moments ``n_i δ_i`` and the
        :attr:`tails`' power sums ``Σ (x − c)^p``, p = 2, 3, 4), which are linear in the
        multiplicities.  Stacked as ``[K, p]`` (symmetric matrices by their upper triangle),
        one matrix product ``weights @ stacked`` gives every pooling's sums about ``c``, and a
        rank-1 correction ``S = T − N e eᵀ`` (``e`` the pooled mean minus ``c``) recentres
        each on its own mean -- one product for all rows where :meth:`pool` reads every part's
        matrices again per row.  The reference is a mean, not zero: raw sums would difference
        ``N x̄ x̄ᵀ`` against a scatter many orders smaller when features have large means.

        Parameters
        ----------
        parts : accumulators of the same kind (widths, groups, ``second_y``, tails).
        weights : non-negative integer multiplicities, one row per pooling and one column
            per part (e.g. 0/1 halves, or bootstrap counts).
        chunk_bytes : size of the rows pooled at once (the working product); the stacked
            parts take about as much memory as the parts themselves.

        Notes
        -----
        Rows are pooled lazily, a chunk at a time (consume the iterator to keep memory at one
        chunk; ``list(...)`` keeps them all).  A row whose means lie so far from ``c`` that a
        diagonal sum about ``c`` exceeds the recentred one by more than 1e3 is pooled by
        :meth:`pool` instead, so no pooling loses more than about three digits to the
        reference (never on data whose parts' means are close against the spread).
        Accumulators with fourth-order terms have no linear form here and are pooled row by
        row with :meth:`pool`.  The product runs on one BLAS thread (see
        :func:`structlens.stats.lanes.serial_blas`).

        >>> rng = np.random.default_rng(0)
        >>> x = rng.normal(size=(30, 3)) + 1e3
        >>> parts = [CrossMoments(3).update(x[i : i + 10]) for i in (0, 10, 20)]
        >>> many = list(CrossMoments.pool_many(parts, [[1, 0, 2], [0, 1, 1]]))
        >>> [acc.n for acc in many]
        [30, 20]
        >>> bool(np.allclose(many[1].s_xx, CrossMoments.pool(parts, [0, 1, 1]).s_xx))
        True
        """
        parts = list(parts)
        if not parts:
            raise ValueError("nothing to pool: pass at least one accumulator.")
        w = np.asarray(weights)
        if (
            w.ndim != 2
            or w.shape[1] != len(parts)
            or not np.issubdtype(w.dtype, np.number)
            or np.any(w < 0)
            or np.any(w != np.round(w))
        ):
            raise ValueError(
                f"weights must be a [B, {len(parts)}] matrix of non-negative integers (a row "
                f"per pooling, a column per part); got shape {w.shape}."
            )
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}.")
        cls._check_poolable(parts)
        if parts[0].fourth_order:
            return (cls.pool(parts, row) for row in w)
        return cls._pool_rows(parts, w, chunk_bytes)

    @classmethod
    def _pool_rows(
        cls, parts: list[CrossMoments], w: np.ndarray, chunk_bytes: int
    ) -> Iterator[CrossMoments]:
        """The rows of :meth:`pool_many` (validated), a chunk of rows per product."""
        if not len(w):
            return
        stack = _PoolStack(parts)
        weights = w.astype(np.float64)
        rows = max(1, min(len(w), chunk_bytes // (8 * stack.width)))
        buf = np.empty((rows, stack.width))
        for lo in range(0, len(w), rows):
            chunk = weights[lo : lo + rows]
            with serial_blas():
                sums = np.matmul(chunk, stack.stacked, out=buf[: len(chunk)])
            for row, v in zip(w[lo : lo + rows], sums):
                pooled = stack.moments(v)
                yield cls.pool(parts, row) if pooled is None else pooled

    @staticmethod
    def _check_poolable(parts: Sequence[CrossMoments]) -> None:
        first = parts[0]
        for p in parts[1:]:
            if p._key != first._key:
                raise ValueError(
                    "cannot pool CrossMoments with different widths, groups, second_y, tails_x "
                    f"or fourth_order: {first._key} vs {p._key}."
                )

    @classmethod
    def _like(cls, first: CrossMoments) -> CrossMoments:
        """A new, empty accumulator of the same kind and settings as ``first``."""
        return cls(
            first.d_x, first._d_y, first.groups_x, first.groups_y, second_y=first.second_y,
            chunk_rows=first.chunk_rows, precision=first.precision, tails_x=first.tails_x,
            fourth_order=first.fourth_order,
        )  # fmt: skip

    def project_x(self, T: np.ndarray) -> CrossMoments:
        """A new accumulator of the features ``x T`` (``T`` ``[d_x, k]``), from the moments
        alone: ``x̄ T``, ``Tᵀ S_xx T`` and ``Tᵀ S_xy`` (Y unchanged).  Exact, since centred
        moments transform linearly; pooling projected parts equals projecting the pool.
        Not defined for accumulators with fourth-order terms or groups of ``x``.  The
        :attr:`tails` are kept when ``T`` leaves their columns as they are (the first
        ``tails_x`` columns of ``x T`` are those of ``x``), else dropped.
        """
        T = np.asarray(T, dtype=np.float64)
        if T.ndim != 2 or T.shape[0] != self.d_x:
            raise ValueError(f"T must be [{self.d_x}, k]; got shape {T.shape}.")
        if self.fourth_order or self.groups_x != 1:
            raise ValueError("project_x needs an accumulator without fourth-order terms/groups.")
        out = CrossMoments(
            T.shape[1], self._d_y, second_y=self.second_y, chunk_rows=self.chunk_rows,
            precision=self.precision, fourth_order=False,
        )  # fmt: skip
        k = self.tails_x
        if k and T.shape[1] >= k and np.array_equal(T[:, :k], np.eye(self.d_x, k)):
            out.tails = copy.deepcopy(self.tails)
        out.n, out.mean_x = self.n, self.mean_x @ T
        if self.n == 0:
            return out
        assert self._xx is not None
        out._xx = _Pair(_symmetric(T.T @ self._xx.cross @ T))
        if self._d_y is not None:
            assert self._xy is not None and self._mean_y is not None
            out._mean_y = self._mean_y.copy()
            out._yy = copy.deepcopy(self._yy)
            out._xy = _Pair(T.T @ self._xy.cross)
        return out

    def copy(self) -> CrossMoments:
        """An independent deep copy."""
        return copy.deepcopy(self)

    # -- read-out ------------------------------------------------------------------------
    def _require(self, min_n: int, what: str) -> None:
        if self.n < min_n:
            raise ValueError(
                f"{what} needs at least {min_n} samples, the accumulator has {self.n}."
            )

    def _require_y(self, what: str) -> None:
        if self._d_y is None:
            raise ValueError(f"{what} needs Y: build the accumulator with d_y.")
        self._require(1, what)

    @property
    def d_y(self) -> int:
        """Width of ``Y``."""
        if self._d_y is None:
            raise ValueError("this accumulator holds X only: build it with d_y.")
        return self._d_y

    @property
    def mean_y(self) -> np.ndarray:
        """Mean of ``Y`` ``[d_y]``."""
        if self._mean_y is None:
            raise ValueError("mean_y needs Y: build the accumulator with d_y.")
        return self._mean_y

    @property
    def s_xx(self) -> np.ndarray:
        """Centred scatter ``Σ (x_i − x̄)(x_i − x̄)ᵀ`` ``[d_x, d_x]`` (not divided by n)."""
        self._require(1, "s_xx")
        assert self._xx is not None
        return self._xx.cross

    @property
    def s_xy(self) -> np.ndarray:
        """Centred cross scatter ``Σ (x_i − x̄)(y_i − ȳ)ᵀ`` ``[d_x, d_y]``."""
        self._require_y("s_xy")
        assert self._xy is not None
        return self._xy.cross

    @property
    def s_yy(self) -> np.ndarray:
        """Centred scatter of ``Y``: ``[d_y, d_y]``, or its diagonal ``[d_y]`` (second_y="diag")."""
        self._require_y("s_yy")
        return self._yy.cross if isinstance(self._yy, _Pair) else self._yy  # type: ignore[return-value]

    def covariance(self, ddof: int = 0) -> np.ndarray:
        """Covariance of ``X``: ``s_xx / (n − ddof)``."""
        if self.n - ddof <= 0:
            raise ValueError(f"need more than {ddof} samples for a covariance; have {self.n}.")
        return self.s_xx / (self.n - ddof)

    def gram(self) -> np.ndarray:
        """Uncentred Gram ``Σ x_i x_iᵀ = s_xx + n x̄ x̄ᵀ``."""
        return self.s_xx + self.n * np.outer(self.mean_x, self.mean_x)

    def hsic_terms(self, debiased: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Linear-kernel HSIC numerators ``(xy [gx, gy], xx [gx], yy [gy])`` per group pair.

        Biased: squared Frobenius norms of the centred scatter blocks (``||X_cᵀ Y_c||_F²``).
        Debiased: the U-statistic of Song et al. (2012) in feature space (Kornblith et al.
        2019), times ``n (n − 3)``; can be negative.  The common factors cancel in CKA.
        """
        if self._d_y is None or self.second_y != "full":
            raise ValueError("HSIC needs Y with a full second block (second_y='full').")
        if debiased and not self.fourth_order:
            raise ValueError("the debiased HSIC needs the fourth-order terms: fourth_order=True.")
        self._require(4 if debiased else 2, "linear CKA")
        xx, yy, xy = self._xx, self._yy, self._xy
        assert isinstance(xx, _Pair) and isinstance(yy, _Pair) and isinstance(xy, _Pair)
        gx, gy = self.groups_x, self.groups_y
        sx, sy = self.d_x // gx, self.d_y // gy
        cxy = xy.cross.reshape(gx, sx, gy, sy)
        t_xy = np.einsum("gkhl,gkhl->gh", cxy, cxy)
        t_xx = np.array(
            [np.sum(xx.cross[g * sx : (g + 1) * sx, g * sx : (g + 1) * sx] ** 2) for g in range(gx)]
        )
        t_yy = np.array(
            [np.sum(yy.cross[h * sy : (h + 1) * sy, h * sy : (h + 1) * sy] ** 2) for h in range(gy)]
        )
        if not debiased:
            return t_xy, t_xx, t_yy
        assert xx.pq is not None and yy.pq is not None and xy.pq is not None
        n = self.n
        trx, try_ = _group_trace(xx.cross, gx), _group_trace(yy.cross, gy)

        def helper(dot: np.ndarray, rows: np.ndarray, na: np.ndarray, nb: np.ndarray) -> Any:
            return dot - n / (n - 2.0) * rows + na * nb / ((n - 1.0) * (n - 2.0))

        return (
            helper(t_xy, xy.pq, trx[:, None], try_[None, :]),
            helper(t_xx, np.diagonal(xx.pq), trx, trx),
            helper(t_yy, np.diagonal(yy.pq), try_, try_),
        )


class ColumnMoments:
    """Per-column count, mean and central moment sums ``M2`` (and ``M3, M4``; Pébay 2008).

    Used for the heavy-tail diagnostic: :meth:`excess_kurtosis` is ``n·M4/M2² − 3``
    (0 for a Gaussian, large for heavy tails).  With ``order=2`` only ``M2`` is kept (the
    total centred sum of squares ``M2.sum()`` is the denominator of a fraction of variance
    unexplained).  Torch tensors are reduced in float64 on their own device; only the
    per-column sums cross to the host.

    Examples
    --------
    >>> acc = ColumnMoments(2).update(np.array([[0.0, 1.0], [2.0, 1.0]]))
    >>> acc.n, acc.mean.tolist(), acc.m2.tolist()
    (2, [1.0, 1.0], [2.0, 0.0])
    """

    def __init__(self, dim: int, order: Literal[2, 4] = 4) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}.")
        if order not in (2, 4):
            raise ValueError(f"order must be 2 or 4, got {order!r}.")
        self.dim = int(dim)
        self.order = order
        self.n = 0
        self.mean = np.zeros(self.dim)
        self.m2 = np.zeros(self.dim)
        self.m3 = np.zeros(self.dim)
        self.m4 = np.zeros(self.dim)

    def update(self, block: object) -> ColumnMoments:
        """Add the rows of ``block`` ``[m, dim]`` (array or tensor); returns ``self``."""
        import torch

        x = CrossMoments._as_tensor(block, "block", self.dim)
        if x.shape[0] == 0:
            return self
        other = ColumnMoments(self.dim, self.order)
        other.n = int(x.shape[0])
        # reused working buffers and column dot products: no temporary per power
        with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf: the check below
            xc, mean = _centred("column", [x], torch.float64)
            m2 = _column_dots(xc, xc)
            last = m2
            if self.order == 4:
                sq = _scratch("square", x.shape[0], self.dim, xc.dtype, x.device)
                _mul_into(sq, xc, xc)
                other.m3 = _to_host(_column_dots(sq, xc))
                last = _column_dots(sq, sq)
                other.m4 = _to_host(last)
        # fused finiteness check: a NaN/inf anywhere in a column makes its top moment non-finite
        if not bool(last.isfinite().all()):
            check_finite(x.cpu().double().numpy(), "block")
            raise ValueError(
                "block overflows float64 moments (a column sum is infinite); rescale it."
            )
        other.mean, other.m2 = _to_host(mean), _to_host(m2)
        return self.merge(other)

    @classmethod
    def _from_shifted_sums(
        cls,
        n: int,
        shift: np.ndarray,
        d: np.ndarray,
        s2: np.ndarray,
        s3: np.ndarray,
        s4: np.ndarray,
    ) -> ColumnMoments:
        """The moments of ``n`` rows from power sums ``s_p = Σ (x − shift)^p`` and
        ``d = mean(x) − shift`` (binomial expansion about the mean; ``d`` is small)."""
        part = cls(len(shift))
        part.n, part.mean = n, shift + d
        part.m2 = s2 - n * d**2
        part.m3 = s3 - 3.0 * d * s2 + 2.0 * n * d**3
        part.m4 = s4 - 4.0 * d * s3 + 6.0 * d**2 * s2 - 3.0 * n * d**4
        return part

    def merge(self, other: ColumnMoments) -> ColumnMoments:
        """Fold ``other`` into ``self`` in place; returns ``self``."""
        if (other.dim, other.order) != (self.dim, self.order):
            raise ValueError(
                f"cannot merge (dim, order) = {(other.dim, other.order)} "
                f"into {(self.dim, self.order)}."
            )
        if other.n == 0:
            return self
        if self.order == 2:
            d = other.mean - self.mean
            n = self.n + other.n
            self.m2 = self.m2 + other.m2 + d * d * (self.n * other.n / n)
            self.mean = self.mean + d * (other.n / n)
            self.n = n
            return self
        na, nb = self.n, other.n
        n = na + nb
        d = other.mean - self.mean
        d2 = d * d
        m4 = (
            self.m4
            + other.m4
            + d2 * d2 * na * nb * (na * na - na * nb + nb * nb) / n**3
            + 6.0 * d2 * (na * na * other.m2 + nb * nb * self.m2) / n**2
            + 4.0 * d * (na * other.m3 - nb * self.m3) / n
        )
        m3 = (
            self.m3
            + other.m3
            + d2 * d * na * nb * (na - nb) / n**2
            + 3.0 * d * (na * other.m2 - nb * self.m2) / n
        )
        self.m2 = self.m2 + other.m2 + d2 * na * nb / n
        self.m3, self.m4 = m3, m4
        self.mean = self.mean + d * (nb / n)
        self.n = n
        return self

    def excess_kurtosis(self) -> np.ndarray:
        """Per-column excess kurtosis; NaN for constant columns (needs ``order=4``)."""
        if self.order != 4:
            raise ValueError("excess kurtosis needs fourth moments: build with order=4.")
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.m2 > 0, self.n * self.m4 / (self.m2 * self.m2) - 3.0, np.nan)


if TYPE_CHECKING:  # the roles of structlens.estimator, checked by mypy
    from structlens.estimator import Statistics

    _CrossMoments: type[Statistics] = CrossMoments
    _ColumnMoments: type[Statistics] = ColumnMoments

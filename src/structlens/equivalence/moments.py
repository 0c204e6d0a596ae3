"""Mergeable centred cross moments of two representations, in float64.

Linear CKA (biased and debiased), SVCCA, PWCCA and orthogonal Procrustes all depend on the data
only through a handful of centred moments of the paired features ``x_i`` and ``y_i``:
the covariance blocks ``C_xx``, ``C_yy``, ``C_xy`` and, for the debiased (U-statistic) HSIC,
the fourth-order terms built from the centred squared row norms ``P_i = ||x_i - mean_x||^2``.
:class:`CrossMoments` accumulates all of them in one pass over batches, with memory
``O(d_x^2 + d_y^2 + d_x d_y)`` independent of the number of samples, and merges partial
results exactly (Chan et al. pairwise update generalised to the fourth-order terms), so
several workers' accumulators combine to the one-pass answer.

Features may be split into equal *groups* (attention heads: ``[n, H * d_head]``); the
fourth-order terms are then kept per group so the CKA of every head pair comes out of one
accumulator.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from ._checks import check_finite, to_numpy

DEFAULT_CHUNK_ROWS = 16384
PRECISIONS = ("float64", "float32")


def _chunk_moments(
    x: np.ndarray, y: np.ndarray, gx: int, gy: int, precision: str
) -> tuple[np.ndarray, ...]:
    """Own-mean moments of one chunk, computed with torch.

    torch's elementwise kernels use every core (numpy's run on one) and its CPU matmul is
    markedly faster than numpy's bundled OpenBLAS for these tall-skinny products. With
    ``precision="float64"`` everything is float64; with ``"float32"`` the chunk mean, the
    centred chunk, its row norms and products are float32 (then accumulated in float64).
    Returns ``(mean_x, mean_y, c^T c, e^T e, c^T e,
    P^T P, Q^T Q, P^T Q, P^T c, Q^T e, P^T e, Q^T c)`` as float64 numpy arrays, where
    ``c``/``e`` are the centred chunks and ``P``/``Q`` their group row norms.
    """
    with warnings.catch_warnings():
        # read-only inputs (memory maps) are fine: they are only read
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tx = torch.from_numpy(np.ascontiguousarray(x))
        ty = torch.from_numpy(np.ascontiguousarray(y))
    n = tx.shape[0]
    if precision == "float64":
        c, e = tx.to(torch.float64, copy=True), ty.to(torch.float64, copy=True)
        mx, my = c.mean(0), e.mean(0)
        c -= mx
        e -= my
    else:
        # float32 mean: its rounding (~1e-7 of |mean|) is within this mode's tolerance
        c, e = tx.to(torch.float32), ty.to(torch.float32)
        mx32, my32 = c.mean(0), e.mean(0)
        c, e = c - mx32, e - my32  # new tensors: the caller's data is never modified
        mx, my = mx32.double(), my32.double()
    # vector_norm reduces without materialising c * c
    p = torch.linalg.vector_norm(c.reshape(n, gx, -1), dim=-1).double().square()
    q = torch.linalg.vector_norm(e.reshape(n, gy, -1), dim=-1).double().square()
    # a NaN or inf anywhere in a row makes its norm non-finite: one cheap test on [n, g]
    if not bool(torch.isfinite(p).all()):
        check_finite(np.asarray(x), "x")
        raise ValueError("x overflows float arithmetic (row norms are infinite); rescale it.")
    if not bool(torch.isfinite(q).all()):
        check_finite(np.asarray(y), "y")
        raise ValueError("y overflows float arithmetic (row norms are infinite); rescale it.")
    pc, qc = p.to(c.dtype), q.to(c.dtype)
    out = (
        mx,
        my,
        c.T @ c,
        e.T @ e,
        c.T @ e,
        p.T @ p,
        q.T @ q,
        p.T @ q,
        pc.T @ c,
        qc.T @ e,
        pc.T @ e,
        qc.T @ c,
    )
    return tuple(o.double().numpy() for o in out)


class _Pair:
    """Centred moments of a pair of feature blocks ``a`` (rows c_i) and ``b`` (rows e_i).

    ``cross = sum c_i e_i^T``; with group row norms ``P_ig = ||c_ig||^2``, ``Q_ih = ||e_ih||^2``:
    ``pq = sum P_i Q_i^T`` ``[ga, gb]``, ``pb = sum P_i e_i^T`` ``[ga, d_b]``,
    ``qa = sum Q_i c_i^T`` ``[gb, d_a]``.  All about the accumulator's own mean.
    """

    __slots__ = ("cross", "pq", "pb", "qa")

    def __init__(self, cross: np.ndarray, pq: np.ndarray, pb: np.ndarray, qa: np.ndarray):
        self.cross, self.pq, self.pb, self.qa = cross, pq, pb, qa

    def recentred(
        self,
        n: int,
        da: np.ndarray,
        db: np.ndarray,
        tra: np.ndarray,
        trb: np.ndarray,
    ) -> _Pair:
        """The same sums taken about ``mean + d`` instead of the own mean (``sum c_i = 0``).

        ``tra``/``trb`` are the per-group traces of the own-mean auto-covariances.
        """
        ga, gb = self.pq.shape
        d_a, d_b = self.cross.shape
        dag = da.reshape(ga, -1)
        dbg = db.reshape(gb, -1)
        norm_a = np.einsum("gk,gk->g", dag, dag)
        norm_b = np.einsum("hk,hk->h", dbg, dbg)
        # sum_{l in block h} cross[k, l] db[l]   -> [d_a, gb]
        cross_db = (self.cross * db[None, :]).reshape(d_a, gb, -1).sum(-1)
        # sum_{k in block g} da[k] cross[k, :]   -> [ga, d_b]
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
        cross = self.cross + n * np.outer(da, db)
        return _Pair(cross, pq, pb, qa)

    def __add__(self, other: _Pair) -> _Pair:
        return _Pair(
            self.cross + other.cross, self.pq + other.pq, self.pb + other.pb, self.qa + other.qa
        )


def _group_trace(cov: np.ndarray, groups: int) -> np.ndarray:
    return np.diagonal(cov).reshape(groups, -1).sum(1)


class CrossMoments:
    """Streaming, mergeable centred moments of paired representations ``X`` and ``Y``.

    Parameters
    ----------
    d_x, d_y : int
        Feature widths of ``X`` and ``Y``.
    groups_x, groups_y : int
        Split the features into this many equal contiguous groups (e.g. attention heads of a
        flattened ``hook_z``: ``d_x = n_heads * d_head``, ``groups_x = n_heads``). Per-group
        fourth-order terms are kept so debiased CKA between every pair of groups is available.
    chunk_rows : int
        Rows processed at once inside :meth:`update`; bounds the float64 working memory to
        ``chunk_rows * (d_x + d_y)`` values whatever the batch size.
    precision : {"float64", "float32"}
        Arithmetic within a chunk. Accumulation across chunks is always float64;
        ``"float32"`` computes each chunk's mean, centring, row norms and products in float32
        (relative error about 1e-6; roughly twice as fast). Keep ``"float64"`` for debiased
        CKA on nearly independent wide representations, where its terms cancel.

    Notes
    -----
    Rows are samples. Every batch is centred on its own mean in float64 and merged with the
    pairwise update of Chan, Golub & LeVeque (1979), extended to the fourth-order terms, so
    no raw (uncentred) moments are ever differenced and large activation means (massive
    residual-stream dimensions) cost no precision. ``a.merge(b)`` gives the same moments as a
    single accumulator fed the rows of ``a`` then ``b`` (to rounding).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> x, y = rng.normal(size=(1000, 8)), rng.normal(size=(1000, 5))
    >>> a, b = CrossMoments(8, 5), CrossMoments(8, 5)
    >>> _ = a.update(x[:400], y[:400]).merge(b.update(x[400:], y[400:]))
    >>> a.n
    1000
    """

    def __init__(
        self,
        d_x: int,
        d_y: int,
        groups_x: int = 1,
        groups_y: int = 1,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        precision: str = "float64",
    ) -> None:
        if d_x < 1 or d_y < 1:
            raise ValueError(f"feature widths must be positive, got d_x={d_x}, d_y={d_y}.")
        for g, d, name in ((groups_x, d_x, "groups_x"), (groups_y, d_y, "groups_y")):
            if g < 1 or d % g:
                raise ValueError(f"{name}={g} must be a positive divisor of the width {d}.")
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be positive, got {chunk_rows}.")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}.")
        self.precision = precision
        self.d_x, self.d_y = d_x, d_y
        self.groups_x, self.groups_y = groups_x, groups_y
        self.chunk_rows = chunk_rows
        self.n = 0
        self.mean_x = np.zeros(d_x)
        self.mean_y = np.zeros(d_y)
        self._xx: _Pair | None = None
        self._yy: _Pair | None = None
        self._xy: _Pair | None = None

    # -- accumulation -------------------------------------------------------------------
    def update(self, x: object, y: object) -> CrossMoments:
        """Add paired rows ``x`` ``[b, d_x]`` and ``y`` ``[b, d_y]``; returns ``self``."""
        a = to_numpy(x, "x")
        b = to_numpy(y, "y")
        if a.ndim != 2 or a.shape[1] != self.d_x:
            raise ValueError(f"x must have shape [batch, {self.d_x}], got {a.shape}.")
        if b.ndim != 2 or b.shape[1] != self.d_y:
            raise ValueError(f"y must have shape [batch, {self.d_y}], got {b.shape}.")
        if a.shape[0] != b.shape[0]:
            raise ValueError(
                f"x has {a.shape[0]} rows and y has {b.shape[0]}; rows must be the same inputs."
            )
        for start in range(0, a.shape[0], self.chunk_rows):
            stop = start + self.chunk_rows
            mx, my, cxx, cyy, cxy, pp, qq, pq, pc, qe, pe, qc = _chunk_moments(
                a[start:stop], b[start:stop], self.groups_x, self.groups_y, self.precision
            )
            self._merge_state(
                min(stop, a.shape[0]) - start,
                mx,
                my,
                _Pair(cxx, pp, pc, pc),
                _Pair(cyy, qq, qe, qe),
                _Pair(cxy, pq, pe, qc),
            )
        return self

    def merge(self, other: CrossMoments) -> CrossMoments:
        """Fold ``other``'s samples into ``self`` (exactly); returns ``self``."""
        if (self.d_x, self.d_y, self.groups_x, self.groups_y) != (
            other.d_x,
            other.d_y,
            other.groups_x,
            other.groups_y,
        ):
            raise ValueError(
                "cannot merge CrossMoments with different widths or groups: "
                f"{(self.d_x, self.d_y, self.groups_x, self.groups_y)} vs "
                f"{(other.d_x, other.d_y, other.groups_x, other.groups_y)}."
            )
        if other.n:
            assert other._xx is not None and other._yy is not None and other._xy is not None
            self._merge_state(other.n, other.mean_x, other.mean_y, other._xx, other._yy, other._xy)
        return self

    def _merge_state(
        self, n: int, mx: np.ndarray, my: np.ndarray, xx: _Pair, yy: _Pair, xy: _Pair
    ) -> None:
        if self.n == 0:
            self.n, self.mean_x, self.mean_y = n, mx.copy(), my.copy()
            self._xx, self._yy, self._xy = xx, yy, xy
            return
        assert self._xx is not None and self._yy is not None and self._xy is not None
        total = self.n + n
        new_mx = (self.n * self.mean_x + n * mx) / total
        new_my = (self.n * self.mean_y + n * my) / total
        gx, gy = self.groups_x, self.groups_y
        parts = []
        for cnt, ox, oy, pxx, pyy, pxy in (
            (self.n, self.mean_x, self.mean_y, self._xx, self._yy, self._xy),
            (n, mx, my, xx, yy, xy),
        ):
            dx, dy = ox - new_mx, oy - new_my
            trx, try_ = _group_trace(pxx.cross, gx), _group_trace(pyy.cross, gy)
            parts.append(
                (
                    pxx.recentred(cnt, dx, dx, trx, trx),
                    pyy.recentred(cnt, dy, dy, try_, try_),
                    pxy.recentred(cnt, dx, dy, trx, try_),
                )
            )
        self._xx = parts[0][0] + parts[1][0]
        self._yy = parts[0][1] + parts[1][1]
        self._xy = parts[0][2] + parts[1][2]
        self.n, self.mean_x, self.mean_y = total, new_mx, new_my

    # -- read-out ------------------------------------------------------------------------
    def _require(self, min_n: int, what: str) -> tuple[_Pair, _Pair, _Pair]:
        if self.n < min_n:
            raise ValueError(
                f"{what} needs at least {min_n} samples, the accumulator has {self.n}."
            )
        assert self._xx is not None and self._yy is not None and self._xy is not None
        return self._xx, self._yy, self._xy

    @property
    def cov_xx(self) -> np.ndarray:
        """Centred scatter ``sum (x_i - mean)(x_i - mean)^T`` (not divided by n)."""
        return self._require(1, "cov_xx")[0].cross

    @property
    def cov_yy(self) -> np.ndarray:
        """Centred scatter of ``Y`` (not divided by n)."""
        return self._require(1, "cov_yy")[1].cross

    @property
    def cov_xy(self) -> np.ndarray:
        """Centred cross scatter ``sum (x_i - mean_x)(y_i - mean_y)^T`` ``[d_x, d_y]``."""
        return self._require(1, "cov_xy")[2].cross

    def hsic_terms(self, debiased: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Linear-kernel HSIC numerators ``(xy [gx, gy], xx [gx], yy [gy])`` per group pair.

        Biased: squared Frobenius norms of the centred scatter blocks (``||X_c^T Y_c||_F^2``).
        Debiased: the U-statistic of Song et al. (2012) in feature space (Kornblith et al.
        2019), times ``n (n - 3)``; can be negative.  The common factors cancel in CKA.
        """
        xx, yy, xy = self._require(4 if debiased else 2, "linear CKA")
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
        n = self.n
        trx, try_ = _group_trace(xx.cross, gx), _group_trace(yy.cross, gy)

        def helper(dot: np.ndarray, rows: np.ndarray, na: np.ndarray, nb: np.ndarray):
            return dot - n / (n - 2.0) * rows + na * nb / ((n - 1.0) * (n - 2.0))

        return (
            helper(t_xy, xy.pq, trx[:, None], try_[None, :]),
            helper(t_xx, np.diagonal(xx.pq), trx, trx),
            helper(t_yy, np.diagonal(yy.pq), try_, try_),
        )

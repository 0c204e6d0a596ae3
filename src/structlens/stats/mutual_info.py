"""Kraskov–Stögbauer–Grassberger (KSG) estimators of mutual information between vectors.

All estimators here implement KSG *algorithm 1* (Kraskov et al. 2004, Phys. Rev. E 69, 066138)
and return **nats**.  For a sample of ``n`` points ``(x_i, y_i)``:

* ``eps_i`` is the distance from point ``i`` to its ``k``-th nearest neighbour (itself excluded)
  under the joint norm ``max(|x_i - x_j|_X, |y_i - y_j|_Y)``;
* ``n_x(i) = #{j != i : |x_i - x_j|_X < eps_i}`` (strict), and likewise ``n_y(i)``;
* ``I = psi(k) + psi(n) - mean_i[psi(n_x(i) + 1) + psi(n_y(i) + 1)]``.

Two choices of the marginal norms ``|.|_X``, ``|.|_Y`` are offered:

``metric="chebyshev"``
    the max-norm over every coordinate, as in Kraskov et al., NPEET and scikit-learn;
``metric="block"``
    the Euclidean norm inside ``x`` and inside ``y`` and the maximum of the two, as in the
    neighbour-distance-minimisation (NDM) code of Huang & Hahn, where ``x`` and ``y`` are two
    subspaces of a representation.

For one-dimensional ``x`` and ``y`` both metrics coincide.  The estimate is not invariant to
rescaling ``x`` relative to ``y``; ``standardize`` removes that dependence ("block" divides each
variable by the square root of its total variance, "coordinate" divides each coordinate by its
standard deviation, as scikit-learn does).  KSG is biased downwards for strongly dependent or
high-dimensional variables (it cannot exceed about ``psi(n) - psi(k)``) and can be slightly
negative near independence.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Literal

import numpy as np
import torch
from scipy.special import digamma

Metric = Literal["chebyshev", "block"]
Standardize = Literal["none", "block", "coordinate"]
Algorithm = Literal["auto", "kdtree", "numba", "torch"]

# Past this many joint dimensions a k-d tree visits most of its nodes and brute force wins.
_KDTREE_MAX_DIM = 8
# Tile sizes of the numba kernel, tuned on a 2-core AVX-512 machine (n = 20,000, 32 + 32 dims).
_TILE = 8
_KEY_BLOCK = 1024


def mutual_information(
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    k: int = 3,
    *,
    metric: Metric = "chebyshev",
    standardize: Standardize = "none",
    algorithm: Algorithm = "auto",
) -> float:
    """KSG (algorithm 1) estimate of the mutual information ``I(x; y)`` in nats.

    Parameters
    ----------
    x, y
        Samples as arrays of shape ``(n, d_x)`` and ``(n, d_y)`` (rows = samples); 1-D arrays
        are read as ``(n, 1)``.  Row ``i`` of ``x`` and row ``i`` of ``y`` form one joint sample.
    k
        Number of neighbours, ``1 <= k < n``.  Larger ``k`` lowers variance and raises bias.
    metric
        ``"chebyshev"`` (max-norm over all coordinates; the textbook estimator, equal to NPEET's
        ``mi`` divided by ``log 2`` and, for 1-D inputs, to scikit-learn's ``_compute_mi_cc``)
        or ``"block"`` (Euclidean inside ``x`` and inside ``y``, maximum of the two).
    standardize
        ``"none"``, ``"block"`` (divide ``x`` and ``y`` each by the square root of its total
        variance, i.e. the sum of per-coordinate variances) or ``"coordinate"`` (divide every
        coordinate by its standard deviation).
    algorithm
        ``"kdtree"`` (scipy ``cKDTree``; Chebyshev only, fast for few dimensions), ``"numba"``
        (exact brute force, compiled, Chebyshev only; needs the optional ``numba`` package),
        ``"torch"`` (exact chunked brute force in float64) or ``"auto"`` (k-d tree up to
        8 joint dimensions, then numba if installed, else torch).

    Returns
    -------
    float
        The estimate in nats (divide by ``log 2`` for bits).  Not clipped at zero.

    Raises
    ------
    ValueError
        On NaN or infinite values, mismatched sample counts, ``k`` outside ``[1, n)``, an
        unknown option, a constant variable under ``standardize``, or duplicate points that make
        a ``k``-th-neighbour distance zero.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x = rng.standard_normal((2000, 2))
    >>> y = x + rng.standard_normal((2000, 2))
    >>> round(mutual_information(x, y, k=3), 1)   # closed form: log 2 = 0.69
    0.7
    """
    xs, ys = _prepare_pair(x, y, k, metric, standardize)
    if algorithm not in ("auto", "kdtree", "numba", "torch"):
        raise ValueError(
            f"algorithm must be 'auto', 'kdtree', 'numba' or 'torch', got {algorithm!r}."
        )
    chebyshev_like = metric == "chebyshev" or (xs.shape[1] == 1 and ys.shape[1] == 1)
    if algorithm == "auto":
        if chebyshev_like and xs.shape[1] + ys.shape[1] <= _KDTREE_MAX_DIM:
            algorithm = "kdtree"
        elif chebyshev_like and _numba_available():
            algorithm = "numba"
        else:
            algorithm = "torch"
    if algorithm in ("kdtree", "numba") and not chebyshev_like:
        raise ValueError(
            f"algorithm={algorithm!r} supports only the Chebyshev metric; use algorithm='torch' "
            "or 'auto' for metric='block' with multi-dimensional x or y."
        )
    if algorithm == "kdtree":
        eps, nx, ny = _counts_kdtree(xs, ys, k)
    elif algorithm == "numba":
        if not _numba_available():
            raise ValueError("algorithm='numba' needs the numba package: pip install numba.")
        with _torch_thread_budget():
            eps, nx, ny = _numba_kernel()(np.ascontiguousarray(xs.T), np.ascontiguousarray(ys.T), k)
    else:
        p = float("inf") if metric == "chebyshev" else 2.0
        eps, nx, ny = _counts_torch(torch.from_numpy(xs), torch.from_numpy(ys), k, p)
    _check_positive_radius(eps)
    n = xs.shape[0]
    return float(digamma(k) + digamma(n) - np.mean(digamma(nx) + digamma(ny)))


def normalized_mutual_information(
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    k: int = 3,
    **kwargs: object,
) -> float:
    """KSG mutual information divided by the dimension sum, ``I(x; y) / (d_x + d_y)``, in nats.

    This is the merge criterion of NDM (Huang & Hahn): it makes a threshold comparable between
    subspace pairs of different sizes.  ``kwargs`` go to :func:`mutual_information`.
    """
    xs = _as_2d(x, "x")
    ys = _as_2d(y, "y")
    return mutual_information(xs, ys, k, **kwargs) / (xs.shape[1] + ys.shape[1])  # type: ignore[arg-type]


def subspace_mutual_information(
    z: np.ndarray | torch.Tensor,
    partition: Sequence[int],
    k: int = 1,
    *,
    standardize: bool = True,
    normalize: bool = True,
    chunk_size: int = 256,
    dtype: torch.dtype = torch.float64,
) -> np.ndarray:
    """KSG mutual information between every pair of contiguous column blocks of ``z``.

    ``z`` has shape ``(n, d)`` (rows = samples, already rotated); ``partition`` lists block sizes
    summing to ``d``, block ``s`` being columns ``[sum(partition[:s]), sum(partition[:s+1]))``.
    Each pair uses the block metric (Euclidean inside a block, maximum over the two blocks) and
    KSG algorithm 1 over all ``n`` points (self excluded).  Exact duplicate rows are removed
    first, since they would give zero neighbour distances; distances are the Gram expansion
    ``‖x‖² + ‖y‖² − 2x·y`` (one matrix product), recomputed as differences for query rows
    whose neighbour is closer than its rounding error (rows equal up to float noise).

    Parameters
    ----------
    standardize
        Divide each block by the square root of its total variance (NDM's per-subspace scale).
    normalize
        Divide pair ``(a, b)`` by ``d_a + d_b`` (NDM's merge criterion).
    chunk_size
        Query rows per chunk; memory is about ``len(partition) * chunk_size * n`` elements.
    dtype
        Precision of the distance computation.

    Returns
    -------
    numpy.ndarray
        Symmetric ``(S, S)`` matrix in nats (per dimension if ``normalize``), zero diagonal.
    """
    zt = _as_tensor_2d(z, "z").to(dtype)
    sizes = _check_partition(partition, zt.shape[1])
    zt = torch.unique(zt, dim=0)
    n = zt.shape[0]
    _check_k(k, n)
    zt = zt - zt.mean(0)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    blocks = [zt[:, bounds[s] : bounds[s + 1]] for s in range(len(sizes))]
    if standardize:
        blocks = [b / _total_std(b, f"block {s}") for s, b in enumerate(blocks)]
    n_blocks = len(blocks)
    pairs = [(a, b) for a in range(n_blocks) for b in range(a + 1, n_blocks)]
    psi_sum = {p: 0.0 for p in pairs}
    sq_norms = [(b * b).sum(1) for b in blocks]
    # below this a squared distance from the Gram expansion is rounding error
    tol = 1e3 * torch.finfo(dtype).eps * max(float(sq.max()) for sq in sq_norms)
    for start in range(0, n, chunk_size):
        stop = min(n, start + chunk_size)
        rows = torch.arange(stop - start)
        dists = []
        for b, sq in zip(blocks, sq_norms, strict=True):
            d2 = sq[start:stop, None] + sq[None, :] - 2.0 * (b[start:stop] @ b.T)
            d2.clamp_(min=0.0)
            dists.append(d2)  # squared distances order the same way as distances
        # one compiled pass for all pairs where it applies (k = 1 on the CPU, numba installed)
        fused = k == 1 and zt.device.type == "cpu" and _numba_available()
        counts = _pair_counts(dists, pairs, start) if fused else None
        for p, (a, b) in enumerate(pairs):
            da, db = dists[a], dists[b]
            if counts is None:
                joint = torch.maximum(da, db)
                joint[rows, rows + start] = torch.inf
                eps = _kth_smallest(joint, k)
            else:
                eps = torch.from_numpy(counts[0][p])
            near = torch.nonzero(eps < tol).flatten()
            if near.numel():
                # ‖x‖² + ‖y‖² − 2x·y loses every digit for near-duplicate rows (activations
                # equal up to float noise): their distances again, as differences
                da, db = da.clone(), db.clone()
                for d2, blk in ((da, blocks[a]), (db, blocks[b])):
                    d2[near] = ((blk[start + near, None, :] - blk[None, :, :]) ** 2).sum(-1)
                joint = torch.maximum(da, db)
                joint[rows, rows + start] = torch.inf
                eps = _kth_smallest(joint, k)
            if bool((eps <= 0).any()):
                raise ValueError(
                    f"blocks {a} and {b}: some points have a zero {k}-th-neighbour distance "
                    "(duplicates within the pair's coordinates); add tiny noise or raise k."
                )
            if counts is not None and not near.numel():
                na, nb = counts[1][p], counts[2][p]
            else:
                na = (da < eps[:, None]).sum(1).cpu().numpy()
                nb = (db < eps[:, None]).sum(1).cpu().numpy()
            psi_sum[(a, b)] += float((digamma(na) + digamma(nb)).sum())
    out = np.zeros((n_blocks, n_blocks))
    for a, b in pairs:
        mi = digamma(k) + digamma(n) - psi_sum[(a, b)] / n
        if normalize:
            mi /= sizes[a] + sizes[b]
        out[a, b] = out[b, a] = mi
    return out


def _pair_counts(
    dists: list[torch.Tensor], pairs: list[tuple[int, int]], start: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every pair ``(a, b)`` and query row ``i`` of one chunk (rows ``start + i``), with
    ``k = 1``: ``eps`` the smallest ``max(da[i, j], db[i, j])`` over ``j != start + i``, and
    the counts of ``da[i, j] < eps`` and ``db[i, j] < eps`` over all ``j`` (the row itself
    included).  The values :func:`subspace_mutual_information` computes with tensor
    operations, in one pass over each pair's distances instead of five, query rows in
    parallel."""
    stack = np.stack([d.numpy() for d in dists])
    with _torch_thread_budget():
        eps, na, nb = _pair_counts_kernel()(stack, np.asarray(pairs, dtype=np.int64), start)
    return eps, na, nb


@contextlib.contextmanager
def _torch_thread_budget() -> Iterator[None]:
    """Run a compiled kernel's parallel loops on torch's thread budget and leave the budget
    as it was.  Numba's OpenMP layer shares the OpenMP runtime with torch and sets its thread
    count to numba's own pool size (one per core) at each parallel launch, so a process
    limited to one torch thread (NDM's per-layer training processes, Ray workers) went on
    after its first merge round with two, oversubscribing the cores it shares."""
    import numba

    budget = torch.get_num_threads()
    pool = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]
    numba.set_num_threads(max(1, min(budget, pool)))
    try:
        yield
    finally:
        torch.set_num_threads(budget)


@functools.cache
def _pair_counts_kernel() -> Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Compile the fused KSG pass of :func:`_pair_counts` (once per process).  No fastmath:
    the comparisons must order the same float64 values as the tensor operations do."""
    from numba import njit, prange

    @njit(parallel=True, cache=False)
    def kernel(dists, pairs, start):
        n_pairs, rows, n = pairs.shape[0], dists.shape[1], dists.shape[2]
        eps = np.empty((n_pairs, rows))
        na = np.empty((n_pairs, rows), dtype=np.int64)
        nb = np.empty((n_pairs, rows), dtype=np.int64)
        # a query row's distances in every block stay in cache for all the pairs
        for i in prange(rows):
            for p in range(n_pairs):
                da, db = dists[pairs[p, 0], i], dists[pairs[p, 1], i]
                e = np.inf
                for j in range(n):
                    if j != start + i:  # not the query row itself
                        e = min(e, max(da[j], db[j]))
                ca = 0
                cb = 0
                for j in range(n):
                    ca += da[j] < e
                    cb += db[j] < e
                eps[p, i], na[p, i], nb[p, i] = e, ca, cb
        return eps, na, nb

    return kernel


def _numba_available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _numba_kernel() -> Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, ...]]:
    """Compile the exact brute-force Chebyshev KSG counter (once per process).

    Inputs are transposed, ``(d, n)``, so the innermost loop runs over contiguous points and
    vectorises; queries are processed in tiles of ``_TILE`` whose distance rows to all points
    are kept, so every distance is computed once and serves both the neighbour search and
    the two marginal counts.
    """
    from numba import njit, prange

    @njit(cache=False, fastmath=True)
    def max_abs_rows(xt, q0, q1, out, j0, j1):  # pragma: no cover - compiled
        for t in range(q1 - q0):
            row_out = out[t, j0:j1]
            row_out[:] = 0.0
            for c in range(xt.shape[0]):
                qc = xt[c, q0 + t]
                keys = xt[c, j0:j1]
                for j in range(j1 - j0):
                    v = abs(qc - keys[j])
                    o = row_out[j]
                    row_out[j] = v if v > o else o

    @njit(parallel=True, cache=False, fastmath=True)
    def counts(xt, yt, k):  # pragma: no cover - compiled
        n = xt.shape[1]
        eps = np.empty(n)
        nx = np.empty(n, np.int64)
        ny = np.empty(n, np.int64)
        for tile in prange((n + _TILE - 1) // _TILE):
            q0 = tile * _TILE
            q1 = min(n, q0 + _TILE)
            dx = np.empty((q1 - q0, n))
            dy = np.empty((q1 - q0, n))
            for j0 in range(0, n, _KEY_BLOCK):
                j1 = min(n, j0 + _KEY_BLOCK)
                max_abs_rows(xt, q0, q1, dx, j0, j1)
                max_abs_rows(yt, q0, q1, dy, j0, j1)
            best = np.empty(k)
            for t in range(q1 - q0):
                i = q0 + t
                best[:] = np.inf
                for j in range(n):
                    if j == i:
                        continue
                    a = dx[t, j]
                    b = dy[t, j]
                    m = a if a > b else b
                    if m < best[k - 1]:
                        p = k - 1
                        while p > 0 and best[p - 1] > m:
                            best[p] = best[p - 1]
                            p -= 1
                        best[p] = m
                e = best[k - 1]
                cx = 0
                cy = 0
                for j in range(n):  # the point itself counts: the "+1" of psi(n_x + 1)
                    cx += dx[t, j] < e
                    cy += dy[t, j] < e
                eps[i] = e
                nx[i] = cx
                ny[i] = cy
        return eps, nx, ny

    return counts


def _as_tensor_2d(a: np.ndarray | torch.Tensor, name: str) -> torch.Tensor:
    t = a.detach() if isinstance(a, torch.Tensor) else torch.as_tensor(np.asarray(a))
    if t.ndim == 1:
        t = t[:, None]
    if t.ndim != 2:
        raise ValueError(f"{name} must have shape (n_samples, n_features); got {tuple(t.shape)}.")
    if not torch.is_floating_point(t):
        t = t.to(torch.float64)
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or infinite values; remove or impute those rows.")
    return t


def _as_2d(a: np.ndarray | torch.Tensor, name: str) -> np.ndarray:
    return _as_tensor_2d(a, name).cpu().to(torch.float64).numpy()


def _check_k(k: int, n: int) -> None:
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}.")
    if k >= n:
        raise ValueError(
            f"k={k} needs at least k+1={k + 1} samples, got n={n}; lower k or add samples."
        )


def _check_partition(partition: Sequence[int], d: int) -> list[int]:
    sizes = [int(s) for s in partition]
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"partition must be a non-empty list of positive sizes, got {sizes}.")
    if sum(sizes) != d:
        raise ValueError(
            f"partition {sizes} sums to {sum(sizes)} but the data has d={d} columns; "
            "the block sizes must add up to the dimension."
        )
    return sizes


def _total_std(a: torch.Tensor | np.ndarray, name: str) -> float:
    total_var = float(a.var(0).sum()) if isinstance(a, torch.Tensor) else float(a.var(0).sum())
    if total_var <= 0:
        raise ValueError(f"{name} is constant (zero variance), so it cannot be standardised.")
    return total_var**0.5


def _prepare_pair(
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    k: int,
    metric: str,
    standardize: str,
) -> tuple[np.ndarray, np.ndarray]:
    xs = _as_2d(x, "x")
    ys = _as_2d(y, "y")
    if xs.shape[0] != ys.shape[0]:
        raise ValueError(
            f"x has {xs.shape[0]} samples but y has {ys.shape[0]}; rows must be paired samples."
        )
    _check_k(k, xs.shape[0])
    if metric not in ("chebyshev", "block"):
        raise ValueError(f"metric must be 'chebyshev' or 'block', got {metric!r}.")
    if standardize == "block":
        xs = xs / _total_std(xs, "x")
        ys = ys / _total_std(ys, "y")
    elif standardize == "coordinate":
        sx, sy = xs.std(0), ys.std(0)
        if (sx <= 0).any() or (sy <= 0).any():
            raise ValueError("a coordinate of x or y is constant, so it cannot be standardised.")
        xs, ys = xs / sx, ys / sy
    elif standardize != "none":
        raise ValueError(
            f"standardize must be 'none', 'block' or 'coordinate', got {standardize!r}."
        )
    return xs, ys


def _check_positive_radius(eps: np.ndarray) -> None:
    zero = int((np.asarray(eps) <= 0).sum())
    if zero:
        raise ValueError(
            f"{zero} points have a zero k-th-neighbour distance (duplicate samples); "
            "KSG needs continuous data: deduplicate, add tiny noise, or raise k."
        )


def _counts_kdtree(xs: np.ndarray, ys: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
    from scipy.spatial import cKDTree

    joint = np.hstack([xs, ys])
    dist, _ = cKDTree(joint).query(joint, k=k + 1, p=np.inf, workers=-1)
    eps = dist[:, k]
    # query_ball_point counts distance <= r; nextafter turns that into the strict "< eps".
    # The counts include the point itself, which supplies the "+1" of psi(n_x + 1).
    radius = np.nextafter(eps, 0)
    nx = cKDTree(xs).query_ball_point(xs, radius, p=np.inf, return_length=True, workers=-1)
    ny = cKDTree(ys).query_ball_point(ys, radius, p=np.inf, return_length=True, workers=-1)
    return eps, np.asarray(nx), np.asarray(ny)


def _kth_smallest(d: torch.Tensor, k: int) -> torch.Tensor:
    if k == 1:
        return d.min(1).values
    return d.topk(k, dim=1, largest=False).values[:, k - 1]


def _counts_torch(
    x: torch.Tensor, y: torch.Tensor, k: int, p: float, chunk_size: int = 512
) -> tuple[np.ndarray, ...]:
    n = x.shape[0]
    eps = np.empty(n)
    nx = np.empty(n, dtype=np.int64)
    ny = np.empty(n, dtype=np.int64)
    # Centring leaves distances unchanged and keeps the matmul expansion of the Euclidean
    # distance (used by cdist for p=2) free of cancellation from a large common offset.
    x = x - x.mean(0)
    y = y - y.mean(0)
    for start in range(0, n, chunk_size):
        stop = min(n, start + chunk_size)
        rows = torch.arange(stop - start)
        dx = torch.cdist(x[start:stop], x, p=p)
        dy = torch.cdist(y[start:stop], y, p=p)
        joint = torch.maximum(dx, dy)
        joint[rows, rows + start] = torch.inf
        e = _kth_smallest(joint, k)
        eps[start:stop] = e.numpy()
        # The diagonal of dx, dy is zero < eps: the self count gives the "+1" of psi(n_x + 1).
        nx[start:stop] = (dx < e[:, None]).sum(1).numpy()
        ny[start:stop] = (dy < e[:, None]).sum(1).numpy()
    return eps, nx, ny

"""EDMDc over depth from streamed, mergeable float64 moments.

Model (columns act on column vectors; samples are rows of the input arrays)::

    Ψ(y) − μ_y ≈ A (Ψ(x) − μ_x) + B Vᵣᵀ (u − μ_u),      x ≈ μ_state + C (Ψ(x) − μ_x)

with ``x = resid_pre(l)``, ``u = attn_out(l)``, ``y = resid_pre(l+1)``.  ``Vᵣ`` (d_u × r) holds
the top-``r`` principal directions of the control, so ``B`` is N × r.  With ``center=False`` the
means are dropped (an uncentred model; a constant feature in Ψ then shows up as an eigenvalue
1).  ``[A B]`` is the ridge solution ``Cov(Ψy, Z) (Cov(Z, Z) + α·tr(Cov(Z,Z))/(N+r)·I)⁻¹`` with
``Z = [Ψ(x); Vᵣᵀu]``: α is *relative* to the mean variance of ``Z``, so it does not depend on the
scale of the activations.

Everything is computed from :class:`EDMDcStatistics`, whose memory is ``O((N + d_u)²)``
whatever the number of samples, and which merge exactly: statistics accumulated by several
workers (or per prompt block) and merged equal one pass.  The control compression is applied to
the accumulated moments, so ``r`` can change without re-streaming.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.linalg

from structlens.koopman.dictionaries import Dictionary
from structlens.results import Result
from structlens.stats.lanes import serial_blas
from structlens.stats.moments import POOL_CHUNK_BYTES, ColumnMoments, CrossMoments
from structlens.stats.robust import block_assignment, geometric_median
from structlens.stats.validation import check_array


@dataclass(frozen=True)
class EDMDcConfig:
    """Settings of the EDMDc solve.

    Attributes
    ----------
    alpha : ridge, relative to the mean variance of Z (0 = ordinary least squares).
    control_rank : keep this many principal components of u (``None``: see control_energy).
    control_energy : keep the fewest components holding this fraction of Var(u), in (0, 1].
        With both ``None`` every component is kept.
    center : fit the centred (affine) model; recommended, see module docstring.
    block_size : rows lifted at a time when arrays are passed.
    """

    alpha: float = 1e-8
    control_rank: int | None = None
    control_energy: float | None = None
    center: bool = True
    block_size: int = 16384

    def __post_init__(self) -> None:
        if not self.alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}.")
        if self.control_rank is not None and self.control_rank < 1:
            raise ValueError(f"control_rank must be >= 1, got {self.control_rank}.")
        if self.control_energy is not None and not 0 < self.control_energy <= 1:
            raise ValueError(f"control_energy must be in (0, 1], got {self.control_energy}.")
        if self.control_rank is not None and self.control_energy is not None:
            raise ValueError("give control_rank or control_energy, not both.")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}.")


@dataclass
class EDMDcStatistics:
    """Mergeable sufficient statistics of one (X, U, Y) stream under one dictionary.

    ``zy`` holds moments of ``Z = [Ψ(x), u]`` against ``Ψ(y)``; ``state`` holds moments of ``x``
    against ``Ψ(x)`` (for the least-squares read-out and the state covariance) and is ``None``
    when Ψ contains the state at columns ``state_start:state_start + state_dim`` (then those
    moments are a block of ``zy``, or when they were left out of a pooling
    (:func:`merge_statistics_many` with ``with_state=False``: the operator's solve reads only
    ``zy``); :attr:`tails` holds per-feature 4th moments of ``Ψ(x)`` for the heavy-tail
    diagnostic (kept by ``zy`` from its working buffer).
    """

    n_features: int
    n_controls: int
    state_dim: int
    state_start: int | None = None
    zy: CrossMoments = field(init=False)
    state: CrossMoments | None = field(init=False)

    def __post_init__(self) -> None:
        n_z = self.n_features + self.n_controls
        self.zy = CrossMoments(n_z, self.n_features, second_y="diag", tails_x=self.n_features)
        self.state = (
            CrossMoments(self.state_dim, self.n_features, second_y="diag")
            if self.state_start is None
            else None
        )

    @property
    def tails(self) -> ColumnMoments:
        """Per-feature moments of ``Ψ(x)`` up to the fourth (the heavy-tail diagnostic)."""
        assert self.zy.tails is not None
        return self.zy.tails

    def state_moments(self, center: bool) -> tuple[np.ndarray, np.ndarray]:
        """Covariance (or raw second moment) and mean of the state ``x``."""
        if self.state is None:
            if self.state_start is None:
                raise ValueError(
                    "these statistics carry no state moments (pooled with with_state=False)."
                )
            cov, _, mean, _ = _moments(self.zy, center)
            sl = slice(self.state_start, self.state_start + self.state_dim)
            return cov[sl, sl], mean[sl]
        cov, _, mean, _ = _moments(self.state, center)
        return cov, mean

    @property
    def n(self) -> int:
        return self.zy.n

    def update(
        self, x: np.ndarray, psi_x: np.ndarray, u: np.ndarray, psi_y: np.ndarray
    ) -> EDMDcStatistics:
        """Add a block of already lifted rows; returns ``self``."""
        self.update_stream([(x, psi_x, u, psi_y)])
        return self

    def update_stream(self, chunks: Iterable[tuple[Any, Any, Any, Any]]) -> None:
        """Add a stream of lifted chunks ``(x, Ψ(x), u, Ψ(y))``: the sums of ``Z`` stay on
        the data's device for the whole stream and are merged once at its end."""

        def z_and_y() -> Iterator[tuple[Any, Any]]:
            for x, psi_x, u, psi_y in chunks:
                if self.state is not None:
                    self.state.update(x, psi_x)
                # Z = [Ψ(x), u] goes as column blocks straight into the working buffer
                yield (psi_x, u), psi_y

        self.zy.update_chunks(z_and_y())

    def merge(self, other: EDMDcStatistics) -> EDMDcStatistics:
        """Fold ``other`` into ``self`` in place and return ``self``."""
        if (other.n_features, other.n_controls, other.state_dim, other.state_start) != (
            self.n_features,
            self.n_controls,
            self.state_dim,
            self.state_start,
        ):
            raise ValueError("cannot merge statistics of different shapes (dictionary/control).")
        self.zy.merge(other.zy)
        if self.state is not None and other.state is not None:  # equal shapes: both or neither
            self.state.merge(other.state)
        return self

    def project_controls(self, V: np.ndarray) -> EDMDcStatistics:
        """The statistics of ``Z = [Ψ(x), u V]`` (``V`` ``[d_u, r]``, e.g. a control basis):
        fits that share ``V`` solve the same operator from these (with the identity as their
        basis) on ``(N + r)``-wide moments instead of ``(N + d_u)``-wide ones."""
        N = self.n_features
        if V.ndim != 2 or V.shape[0] != self.n_controls:
            raise ValueError(f"V must be [{self.n_controls}, r]; got shape {V.shape}.")
        out = EDMDcStatistics(N, V.shape[1], self.state_dim, self.state_start)
        out.zy = self.zy.project_x(scipy.linalg.block_diag(np.eye(N), V))  # keeps Ψ(x)'s tails
        out.state = copy.deepcopy(self.state)
        return out

    def copy(self) -> EDMDcStatistics:
        out = EDMDcStatistics(self.n_features, self.n_controls, self.state_dim, self.state_start)
        out.merge(self)
        return out


def _same_shape(parts: Iterable[EDMDcStatistics]) -> list[EDMDcStatistics]:
    """``parts`` as a list, checked to be non-empty and of one dictionary and control."""
    parts = list(parts)
    if not parts:
        raise ValueError("nothing to merge.")
    shapes = {(p.n_features, p.n_controls, p.state_dim, p.state_start) for p in parts}
    if len(shapes) > 1:
        raise ValueError("cannot merge statistics of different shapes (dictionary/control).")
    return parts


@serial_blas()
def merge_statistics(parts: Iterable[EDMDcStatistics], weights: Any = None) -> EDMDcStatistics:
    """Pool several statistics into a new object (inputs unchanged).

    ``weights`` are integer multiplicities, one per part (default: each once): a bootstrap
    resample of prompt blocks is ``weights = np.bincount(draw, minlength=len(parts))``.  The
    cross moments are pooled in one pass (:meth:`CrossMoments.pool`); many weightings of the
    same parts (split halves, bootstrap resamples) pool faster together with
    :func:`merge_statistics_many`.
    """
    parts = _same_shape(parts)
    first = parts[0]
    out = EDMDcStatistics(first.n_features, first.n_controls, first.state_dim, first.state_start)
    w = np.ones(len(parts), dtype=np.int64) if weights is None else np.asarray(weights)
    out.zy = CrossMoments.pool([p.zy for p in parts], w)
    if out.state is not None:
        out.state = CrossMoments.pool([p.state for p in parts], w)  # type: ignore[misc]
    return out


def merge_statistics_many(
    parts: Iterable[EDMDcStatistics],
    weights: Any,
    *,
    with_state: bool = True,
    chunk_bytes: int = POOL_CHUNK_BYTES,
) -> Iterator[EDMDcStatistics]:
    """:func:`merge_statistics` of the same ``parts`` for every row of ``weights`` ``[B, K]``.

    Yields ``B`` new statistics in row order, the ``b``-th equal to
    ``merge_statistics(parts, weights[b])`` up to float64 rounding: all rows are pooled by
    one matrix product per chunk (:meth:`CrossMoments.pool_many`), where a loop of
    :func:`merge_statistics` reads every part's matrices again per row.  For the split
    halves, noise-floor halves and bootstrap resamples of one block list.

    Parameters
    ----------
    parts : statistics of one dictionary and control (e.g. per prompt block).
    weights : non-negative integer multiplicities, a row per pooling, a column per part.
    with_state : also pool the separate state moments (``False``: the outputs' ``state`` is
        ``None``; enough for the operator, :func:`control_basis` and the sample count, but
        not for a least-squares read-out, so not for :func:`solve` without a selector).
    chunk_bytes : size of the rows pooled at once (see :meth:`CrossMoments.pool_many`).
    """
    parts = _same_shape(parts)
    first = parts[0]
    zy = CrossMoments.pool_many([p.zy for p in parts], weights, chunk_bytes=chunk_bytes)
    state = None
    if with_state and first.state is not None:
        state = CrossMoments.pool_many(
            [p.state for p in parts],  # type: ignore[misc]
            weights,
            chunk_bytes=chunk_bytes,
        )
    return _merged_rows(first, zy, state)


def _merged_rows(
    first: EDMDcStatistics, zy: Iterator[CrossMoments], state: Iterator[CrossMoments] | None
) -> Iterator[EDMDcStatistics]:
    for acc in zy:
        out = EDMDcStatistics(
            first.n_features, first.n_controls, first.state_dim, first.state_start
        )
        out.zy = acc
        out.state = None if state is None else next(state)
        yield out


def _check_triplet(
    x: Any, u: Any, y: Any, finite: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = check_array(x, name="X", finite=finite)
    u = check_array(u, name="U", finite=finite)
    y = check_array(y, name="Y", finite=finite)
    if not (x.shape[0] == u.shape[0] == y.shape[0]):
        raise ValueError(
            f"X, U, Y must have the same number of rows (one per token position); got "
            f"{x.shape[0]}, {u.shape[0]}, {y.shape[0]}."
        )
    if y.shape[1] != x.shape[1]:
        raise ValueError(f"Y has {y.shape[1]} columns but X has {x.shape[1]}; both are states.")
    return x, u, y


def iter_chunks(
    X: Any, U: Any, Y: Any, prompt_ids: Any = None, block_size: int = 16384
) -> Iterator[tuple[Any, ...]]:
    """Yield row chunks ``(X, U, Y[, prompt_ids])`` of in-memory arrays."""
    m = len(X)
    for s in range(0, m, block_size):
        sl = slice(s, s + block_size)
        if prompt_ids is None:
            yield X[sl], U[sl], Y[sl]
        else:
            yield X[sl], U[sl], Y[sl], np.asarray(prompt_ids)[sl]


def accumulate(
    dictionary: Dictionary, stream: Iterable[tuple[Any, ...]], *, n_blocks: int = 1, seed: int = 0
) -> list[EDMDcStatistics]:
    """Lift and accumulate a stream of ``(X, U, Y)`` or ``(X, U, Y, prompt_ids)`` chunks.

    Returns ``n_blocks`` statistics; with ``n_blocks > 1`` every row goes to the block of its
    prompt (a seeded hash of the prompt id, :func:`block_assignment`), so blocks are by prompt
    and chunks of the same prompt may arrive separately.  ``merge_statistics`` of the blocks
    equals the single-block result.  One block takes the stream whole
    (:meth:`EDMDcStatistics.update_stream`).
    """
    current: list[np.ndarray] = []  # the chunk being reduced, to name the input with NaN/inf

    def lifted() -> Iterator[tuple[Any, ...]]:
        for item in stream:
            if len(item) not in (3, 4):
                raise ValueError("stream items must be (X, U, Y) or (X, U, Y, prompt_ids).")
            # NaN/inf are caught by the moments' fused check (a scatter diagonal turns
            # non-finite); only then is the chunk scanned again, to name X, U or Y
            x, u, y = _check_triplet(item[0], item[1], item[2], finite=False)
            current[:] = [x, u, y]
            psi_x = dictionary.transform(x, finite=False)
            psi_y = dictionary.transform(y, finite=False)
            yield x, psi_x, u, psi_y, (item[3] if len(item) == 4 else None)

    chunks = lifted()
    try:
        first = next(chunks, None)
        if first is None:
            raise ValueError("the stream was empty.")
        sl = dictionary.state_slice
        start = None if sl is None else sl.start
        x0, u0 = first[0], first[2]
        blocks = [
            EDMDcStatistics(dictionary.n_features, u0.shape[1], x0.shape[1], start)
            for _ in range(n_blocks)
        ]
        rest = itertools.chain([first], chunks)
        if n_blocks == 1:
            blocks[0].update_stream(c[:4] for c in rest)
        else:
            for x, psi_x, u, psi_y, ids in rest:
                _split_by_prompt(blocks, x, psi_x, u, psi_y, ids, seed)
    except ValueError:
        if current:
            _check_triplet(current[0], current[1], current[2])  # names the input with NaN/inf
        raise
    return blocks


def _split_by_prompt(
    blocks: list[EDMDcStatistics],
    x: np.ndarray,
    psi_x: np.ndarray,
    u: np.ndarray,
    psi_y: np.ndarray,
    ids: Any,
    seed: int,
) -> None:
    if ids is None:
        raise ValueError("n_blocks > 1 needs prompt ids: stream (X, U, Y, prompt_ids).")
    ids = np.asarray(ids)
    if ids.shape != (x.shape[0],):
        raise ValueError(f"prompt_ids must have shape ({x.shape[0]},); got {ids.shape}.")
    which = block_assignment(ids, len(blocks), seed)
    for b in np.unique(which):
        rows = which == b
        blocks[b].update(x[rows], psi_x[rows], u[rows], psi_y[rows])


@dataclass(frozen=True)
class EDMDcResult(Result):
    """A fitted Koopman realisation ``(A, B, C)`` with its provenance.

    ``B`` acts on control PCA coordinates ``Vᵣᵀ(u − μ_u)``; :meth:`B_full` returns ``B Vᵣᵀ``
    acting on raw ``u``.  ``cond_gram`` is the 2-norm condition number of the regularised
    ``Cov(Z, Z)`` that was inverted, ``cond_psi`` that of ``Cov(Ψx)`` alone.
    """

    A: np.ndarray
    B: np.ndarray
    C: np.ndarray
    eigenvalues: np.ndarray
    control_basis: np.ndarray
    control_mean: np.ndarray
    psi_mean_x: np.ndarray
    psi_mean_y: np.ndarray
    state_mean: np.ndarray
    state_cov: np.ndarray
    control_cov: np.ndarray
    n_samples: int
    alpha: float
    center: bool
    control_rank: int
    control_energy_kept: float
    cond_gram: float
    cond_psi: float
    readout: str
    estimator: str
    n_blocks: int
    dictionary: dict[str, Any]

    def B_full(self) -> np.ndarray:
        """``B Vᵣᵀ`` (N × d_u), acting on raw (centred) controls."""
        return self.B @ self.control_basis.T

    def predict(self, psi_x: np.ndarray, u: np.ndarray) -> np.ndarray:
        """One-step prediction of Ψ(y) for rows of ``psi_x`` and ``u``."""
        psi_x, u = np.asarray(psi_x, np.float64), np.asarray(u, np.float64)
        return (
            self.psi_mean_y
            + (psi_x - self.psi_mean_x) @ self.A.T
            + ((u - self.control_mean) @ self.control_basis) @ self.B.T
        )


def _moments(acc: CrossMoments, center: bool) -> tuple[np.ndarray, ...]:
    """(Cov_xx, Cov_xy, mean_x, mean_y) — centred or raw second moments per sample."""
    n = acc.n
    if center:
        return acc.s_xx / n, acc.s_xy / n, acc.mean_x, acc.mean_y
    return (
        acc.s_xx / n + np.outer(acc.mean_x, acc.mean_x),
        acc.s_xy / n + np.outer(acc.mean_x, acc.mean_y),
        np.zeros_like(acc.mean_x),
        np.zeros_like(acc.mean_y),
    )


def control_basis(
    stats: EDMDcStatistics, config: EDMDcConfig
) -> tuple[np.ndarray, float, np.ndarray]:
    """Top principal directions ``Vᵣ`` (d_u × r) of the control, the fraction of Var(u) kept
    and the kept variances (eigenvalues of Cov(u), descending)."""
    N = stats.n_features
    cov_u = _moments(stats.zy, config.center)[0][N:, N:]
    evals, evecs = np.linalg.eigh(cov_u)
    evals, evecs = np.clip(evals[::-1], 0, None), evecs[:, ::-1]
    total = float(evals.sum())
    if total <= 0:
        raise ValueError("the control U has zero variance; nothing to regress on.")
    if config.control_rank is not None:
        if config.control_rank > stats.n_controls:
            raise ValueError(
                f"control_rank={config.control_rank} exceeds the control dimension "
                f"{stats.n_controls}."
            )
        r = config.control_rank
    elif config.control_energy is not None:
        r = int(np.searchsorted(np.cumsum(evals) / total, config.control_energy - 1e-12) + 1)
        r = min(r, stats.n_controls)
    else:
        r = stats.n_controls
    return evecs[:, :r], float(evals[:r].sum() / total), evals[:r]


def _ridge(g: np.ndarray, alpha: float) -> np.ndarray:
    g = g.copy()
    if alpha > 0:
        g[np.diag_indices_from(g)] += alpha * np.trace(g) / g.shape[0]
    return g


def _cond(g: np.ndarray) -> float:
    ev = np.linalg.eigvalsh(g)
    return float(ev[-1] / ev[0]) if ev[0] > 0 else float("inf")


def _solve_operator(
    stats: EDMDcStatistics, config: EDMDcConfig, V: np.ndarray
) -> tuple[np.ndarray, float]:
    """``[A B]`` (N × (N+r)) for given control basis, and the condition number inverted."""
    N, r = stats.n_features, V.shape[1]
    if stats.n <= N + r:
        raise ValueError(
            f"{stats.n} samples are too few for {N} dictionary features plus {r} control "
            f"components; need more than {N + r}. Use more prompts, a smaller dictionary or "
            f"a lower control_rank."
        )
    czz, czy, _, _ = _moments(stats.zy, config.center)
    T = scipy.linalg.block_diag(np.eye(N), V)
    g = _ridge(T.T @ czz @ T, config.alpha)
    h = T.T @ czy
    try:
        factor = scipy.linalg.cho_factor(g, lower=False, check_finite=False)
    except np.linalg.LinAlgError as err:
        raise ValueError(
            "Cov(Z, Z) is singular (a constant or duplicated dictionary feature, or too little "
            "excitation); set alpha > 0 or lower control_rank."
        ) from err
    return scipy.linalg.cho_solve(factor, h, check_finite=False).T, _cond(g)


def state_operator(stats: EDMDcStatistics, config: EDMDcConfig, V: np.ndarray) -> np.ndarray:
    """``A`` (``Ψ(x) → Ψ(y)``, ``N × N``) of the fit from ``stats`` with control basis ``V``:
    :func:`solve`'s ``A`` for the same basis, without the read-out and state moments (so
    statistics pooled without their state moments suffice)."""
    return _solve_operator(stats, config, V)[0][:, : stats.n_features]


def _readout(
    stats: EDMDcStatistics, config: EDMDcConfig, dictionary: Dictionary | None
) -> tuple[np.ndarray, str]:
    N, d = stats.n_features, stats.state_dim
    sl = dictionary.state_slice if dictionary is not None else None
    if sl is not None:
        C = np.zeros((d, N))
        C[np.arange(d), np.arange(sl.start, sl.start + d)] = 1.0
        return C, "selector"
    if stats.state is None:
        raise ValueError("these statistics carry no state moments; pass the dictionary.")
    _, cxpsi, _, _ = _moments(stats.state, config.center)
    cpsi = _moments(stats.zy, config.center)[0][:N, :N]
    g = _ridge(cpsi, max(config.alpha, 1e-12))
    return scipy.linalg.solve(g, cxpsi.T, assume_a="pos").T, "least_squares"


@serial_blas()
def solve(
    stats: EDMDcStatistics,
    config: EDMDcConfig,
    dictionary: Dictionary | None = None,
    *,
    basis: np.ndarray | None = None,
) -> EDMDcResult:
    """Solve EDMDc from accumulated statistics.

    ``dictionary`` supplies the identity block (for the exact read-out) and the provenance;
    ``basis`` fixes the control basis (e.g. one shared across split halves).
    """
    V, kept, _ = control_basis(stats, config)
    if basis is not None:
        V, kept = basis, float("nan")
    K, cond_g = _solve_operator(stats, config, V)
    N = stats.n_features
    A, B = K[:, :N], K[:, N:]
    C, readout = _readout(stats, config, dictionary)
    czz, _, mz, my = _moments(stats.zy, config.center)
    cxx, mx = stats.state_moments(config.center)
    return EDMDcResult(
        A=A,
        B=B,
        C=C,
        eigenvalues=np.linalg.eigvals(A),
        control_basis=V,
        control_mean=mz[N:],
        psi_mean_x=mz[:N],
        psi_mean_y=my,
        state_mean=mx,
        state_cov=cxx,
        control_cov=V.T @ czz[N:, N:] @ V,
        n_samples=stats.n,
        alpha=config.alpha,
        center=config.center,
        control_rank=V.shape[1],
        control_energy_kept=kept,
        cond_gram=cond_g,
        cond_psi=_cond(_ridge(czz[:N, :N], config.alpha)),
        readout=readout,
        estimator="edmdc",
        n_blocks=1,
        dictionary=dictionary.config() if dictionary is not None else {},
    )


@serial_blas()
def solve_median_of_means(
    blocks: list[EDMDcStatistics], config: EDMDcConfig, dictionary: Dictionary | None = None
) -> EDMDcResult:
    """Median-of-means EDMDc: geometric median (Frobenius) of per-block ``[A_b B_b]``.

    The control basis, read-out and means come from the pooled statistics so every block
    operator lives in the same coordinates.  Each block needs more samples than ``N + r``.
    """
    if len(blocks) < 3:
        raise ValueError(f"median of means needs at least 3 blocks; got {len(blocks)}.")
    pooled = merge_statistics(blocks)
    ref = solve(pooled, config, dictionary)
    Ks = np.stack([np.ravel(_solve_operator(b, config, ref.control_basis)[0]) for b in blocks])
    K = geometric_median(Ks).reshape(ref.A.shape[0], -1)
    N = ref.A.shape[0]
    return _replace(
        ref,
        A=K[:, :N],
        B=K[:, N:],
        eigenvalues=np.linalg.eigvals(K[:, :N]),
        estimator="median_of_means",
        n_blocks=len(blocks),
    )


def _replace(res: EDMDcResult, **changes: Any) -> EDMDcResult:
    import dataclasses

    return dataclasses.replace(res, **changes)


class EDMDc:
    """Estimator: a frozen dictionary plus an :class:`EDMDcConfig`.

    The streaming protocol: :meth:`partial_fit` folds chunks into the mergeable
    ``statistics_`` (an :class:`EDMDcStatistics`; ``merge()`` returns self, so statistics of
    several workers or shards sum), :meth:`fit_from_statistics` solves them, and :meth:`fit`
    does both on in-memory arrays; every fit returns a frozen :class:`EDMDcResult`.

    Examples
    --------
    >>> est = EDMDc(IdentityDictionary().fit(X), EDMDcConfig(alpha=0.0))  # doctest: +SKIP
    >>> res = est.fit(X, U, Y)  # doctest: +SKIP
    >>> for chunk in chunks:  # doctest: +SKIP
    ...     est.partial_fit(chunk)
    >>> est.fit_from_statistics(est.statistics_).eigenvalues  # doctest: +SKIP
    """

    def __init__(self, dictionary: Dictionary, config: EDMDcConfig | None = None) -> None:
        self.dictionary = dictionary
        self.config = config or EDMDcConfig()
        self.statistics_: EDMDcStatistics | None = None

    def partial_fit(self, chunk: tuple[Any, ...]) -> EDMDc:
        """Fold one ``(X, U, Y)`` chunk into ``statistics_`` (created by the first call)."""
        stats = accumulate(self.dictionary, [chunk])[0]
        self.statistics_ = stats if self.statistics_ is None else self.statistics_.merge(stats)
        return self

    def fit_from_statistics(self, stats: EDMDcStatistics) -> EDMDcResult:
        """Solve EDMDc from accumulated (possibly merged) statistics."""
        return solve(stats, self.config, self.dictionary)

    def statistics(
        self,
        X: Any,
        U: Any,
        Y: Any,
        prompt_ids: Any = None,
        *,
        n_blocks: int = 1,
        seed: int = 0,
    ) -> list[EDMDcStatistics]:
        """Accumulate in-memory arrays (chunked) into ``n_blocks`` prompt blocks."""
        _check_triplet(X[:1], U[:1], Y[:1])
        if not (len(X) == len(U) == len(Y)):
            raise ValueError(f"X, U, Y have {len(X)}, {len(U)}, {len(Y)} rows; must be equal.")
        chunks = iter_chunks(X, U, Y, prompt_ids, self.config.block_size)
        return accumulate(self.dictionary, chunks, n_blocks=n_blocks, seed=seed)

    def fit(self, X: Any, U: Any, Y: Any) -> EDMDcResult:
        """Fit on in-memory arrays ``X, U, Y`` (rows = samples)."""
        return solve(self.statistics(X, U, Y)[0], self.config, self.dictionary)

    def fit_stream(self, stream: Iterable[tuple[Any, ...]]) -> EDMDcResult:
        """Fit on a stream of ``(X, U, Y)`` chunks (memory independent of its length)."""
        return solve(accumulate(self.dictionary, stream)[0], self.config, self.dictionary)

    def fit_median_of_means(
        self, X: Any, U: Any, Y: Any, prompt_ids: Any, *, n_blocks: int = 10, seed: int = 0
    ) -> EDMDcResult:
        """Median-of-means fit with ``n_blocks`` blocks by prompt."""
        blocks = self.statistics(X, U, Y, prompt_ids, n_blocks=n_blocks, seed=seed)
        return solve_median_of_means(blocks, self.config, self.dictionary)


if TYPE_CHECKING:  # the roles of structlens.estimator, checked by mypy
    from structlens.estimator import Statistics, StreamingEstimator

    _EDMDcStatistics: type[Statistics] = EDMDcStatistics
    _EDMDc: type[StreamingEstimator[EDMDcStatistics, EDMDcResult]] = EDMDc

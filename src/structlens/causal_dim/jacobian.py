"""Expected Jacobian outer product ``Σ = E_x[J(x)ᵀ J(x)]`` at one residual site.

The model enters as a **batched callable** ``f(H) -> Y``: ``H`` is ``[b, d]`` (one residual
vector per row, the vector that is patched in at the site) and ``Y`` is ``[b, V]`` (outputs at
the same position) or ``[b, P, V]`` (outputs at ``P`` downstream positions).  Rows must not
interact (no batch norm), and ``f`` must support forward-mode AD (``torch.func.jvp``) for the
exact method; HF models do with ``attn_implementation="eager"``.  The lead's model adapter builds
``f`` by patching ``blocks.{l}.hook_resid_pre`` at one position and running the rest.

Conventions
-----------
* ``J(x)`` is ``∂ vec(Y) / ∂ h`` with ``vec`` stacking positions, so for ``[b, P, V]`` outputs
  ``JᵀJ = Σ_p J_pᵀ J_p`` (a **sum** over downstream positions, not a mean).
* ``output="log_probs"`` applies ``log_softmax`` over the last axis first; that removes the
  all-ones logit direction (``J`` of log-probs = ``(I − 1 pᵀ) J_logits``).  ``"raw"`` uses ``Y``.
* ``Σ`` is the mean over residual vectors (rows), accumulated in float64.

Estimation methods
------------------
``exact``: ``d`` Jacobian-vector products per vector (forward mode, vmapped over blocks of
tangents with one shared primal pass), then ``JᵀJ`` as one GEMM; cost about ``d`` tangent
passes per vector.
``sketch``: ``M`` vector-Jacobian products per vector with Rademacher cotangents ``u``;
``E_u[Jᵀu uᵀJ] = JᵀJ``, and the projection error has relative MSE ≈ ``(PR + 1)/M`` per vector
(PR = participation ratio); the reported error comes from the spread between independent groups.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from structlens.errors import InputError
from structlens.results import Result
from structlens.stats.intervals import group_jackknife, leave_one_group_out_means
from structlens.stats.moments import symmetric_gram
from structlens.stats.ranks import CONVENTION, default_rank_rtol, effective_ranks

BatchedFn = Callable[[torch.Tensor], torch.Tensor]


class EJOPAccumulator:
    """Mergeable float64 sums of ``JᵀJ`` in ``n_groups`` independent groups.

    The ``statistics`` of :class:`CausalDimension` and
    :class:`~structlens.causal_dim.kappa.KappaEstimator`.  Batches (or whole chunks, see
    ``JacobianConfig.group_unit``) are assigned to groups round-robin; the between-group
    spread gives the jackknife errors.  ``merge`` adds sums and
    counts in place, so partial results from several workers combine into exactly what one
    pass would give.  Memory is ``n_groups · d²`` float64 whatever the number of vectors; the
    object pickles (for Ray workers and saving).
    """

    def __init__(self, d: int, n_groups: int = 8) -> None:
        if d < 1 or n_groups < 1:
            raise InputError("d and n_groups must be positive.")
        self.d = int(d)
        self.n_groups = int(n_groups)
        self.sums = torch.zeros(n_groups, d, d, dtype=torch.float64)
        self.counts = torch.zeros(n_groups, dtype=torch.float64)
        # Sketch only: Σ over vectors of (half-A mean − half-B mean)/2 of the projections.
        self.split_diff: torch.Tensor | None = None
        self._next = 0

    @classmethod
    def from_grams(cls, grams: np.ndarray | torch.Tensor) -> EJOPAccumulator:
        """Statistics with one group per vector from per-vector Grams ``[n, d, d]``.

        With one vector per group the delete-a-group jackknife is the delete-one jackknife.
        A writable C-contiguous float64 input is shared, not copied (a stack of thousands of
        Grams is not duplicated): ``add`` to the result would write into ``grams``; ``merge``
        would not.
        """
        if isinstance(grams, np.ndarray):
            arr = np.ascontiguousarray(grams, dtype=np.float64)  # no copy if it already is
            sums = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
        else:
            sums = grams.detach().cpu().to(torch.float64)
        if sums.ndim != 3 or sums.shape[1] != sums.shape[2] or sums.shape[0] < 1:
            raise InputError(f"grams must be [n, d, d] with n >= 1, got {tuple(sums.shape)}.")
        out = cls(sums.shape[1], sums.shape[0])
        out.sums = sums
        out.counts = torch.ones(sums.shape[0], dtype=torch.float64)
        out._next = sums.shape[0]
        return out

    def update(self, gram: torch.Tensor, count: int, group: int | None = None) -> EJOPAccumulator:
        """Add ``gram`` = ``Σ_rows JᵀJ`` over ``count`` residual vectors to the next group
        (round-robin), or to ``group`` when given (the round-robin position then stays);
        returns ``self``."""
        if gram.shape != (self.d, self.d):
            raise InputError(f"gram has shape {tuple(gram.shape)}, expected {(self.d, self.d)}.")
        if group is None:
            g = self._next % self.n_groups
            self._next += 1
        elif 0 <= group < self.n_groups:
            g = int(group)
        else:
            raise InputError(f"group {group} outside [0, {self.n_groups}).")
        # Sums live on the CPU whatever device the Jacobians were computed on.
        self.sums[g] += gram.to(device=self.sums.device, dtype=torch.float64)
        self.counts[g] += count
        return self

    def next_group(self) -> int:
        """Claim the next group of the round-robin for a unit (e.g. one chunk) of vectors."""
        g = self._next % self.n_groups
        self._next += 1
        return g

    def merge(self, other: EJOPAccumulator) -> EJOPAccumulator:
        """Fold ``other`` into ``self`` in place and return ``self`` (``other`` is unchanged)."""
        if (other.d, other.n_groups) != (self.d, self.n_groups):
            raise InputError(
                "can only merge accumulators with the same d and n_groups; build both with "
                "the same config."
            )
        # New tensors rather than +=: sums may share memory with caller data (from_grams).
        self.sums = self.sums + other.sums
        self.counts = self.counts + other.counts
        if self.split_diff is not None and other.split_diff is not None:
            self.split_diff = self.split_diff + other.split_diff
        else:
            self.split_diff = None  # a sketch error needs the split of every vector
        self._next = self._next + other._next
        return self

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def sigma(self) -> torch.Tensor:
        """The estimate ``Σ̂`` (float64, symmetrised)."""
        if self.n == 0:
            raise InputError("no residual vectors were accumulated.")
        s = self.sums.sum(0) / self.counts.sum()
        return (s + s.T) / 2

    def group_sigmas(self) -> list[torch.Tensor]:
        """Leave-one-group-out estimates (the jackknife replicates); empty if < 2 groups filled."""
        return leave_one_group_out_means(self.sums, self.counts)


def _as_batches(residuals: torch.Tensor | Iterable[torch.Tensor]) -> Iterator[torch.Tensor]:
    if isinstance(residuals, torch.Tensor):
        if residuals.ndim != 2:
            raise ValueError(
                f"residuals must be [n, d] (one residual vector per row), "
                f"got shape {tuple(residuals.shape)}."
            )
        yield residuals
        return
    yield from residuals


def _checked(h: torch.Tensor, d: int | None) -> torch.Tensor:
    if not isinstance(h, torch.Tensor) or h.ndim != 2:
        raise ValueError("each residual batch must be a [n, d] torch tensor.")
    if d is not None and h.shape[1] != d:
        raise ValueError(f"residual batch has d = {h.shape[1]}, earlier batches had {d}.")
    if not torch.isfinite(h).all():
        raise ValueError("residual vectors contain NaN or inf.")
    return h


def _wrap(f: BatchedFn, output: str) -> BatchedFn:
    if output not in ("raw", "log_probs"):
        raise ValueError(f"output must be 'raw' or 'log_probs', got {output!r}.")

    def g(h: torch.Tensor) -> torch.Tensor:
        y = f(h)
        if not isinstance(y, torch.Tensor) or y.ndim not in (2, 3) or y.shape[0] != h.shape[0]:
            shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
            raise ValueError(
                f"f must map [b, d] to [b, V] or [b, P, V]; got {shape} for b = {h.shape[0]}."
            )
        if output == "log_probs":
            y = torch.log_softmax(y, dim=-1)
        return y.reshape(h.shape[0], -1)

    return g


def jacobians_forward(
    f: BatchedFn, h: torch.Tensor, *, max_rows: int = 2048, output: str = "raw"
) -> torch.Tensor:
    """Transposed Jacobians ``Jᵀ`` of ``f`` at each row of ``h``: shape ``[n, d, out]``.

    Forward mode over blocks of basis directions: ``torch.func.vmap`` of one
    ``torch.func.jvp`` over the tangents, so the primal pass runs once per block of residual
    vectors and only the tangents are batched (at most ``max_rows`` vector-direction pairs
    per call).  Where ``f`` cannot be vmapped (hooks that call ``.item()``, data-dependent
    control flow), each row is instead replicated once per tangent and one plain ``jvp``
    gives all columns.
    """
    g = _wrap(f, output)
    n, d = h.shape
    eye = torch.eye(d, dtype=h.dtype, device=h.device)
    per = max(1, max_rows // d)  # vectors per call when a whole basis fits
    chunk = min(d, max_rows)
    step = per if chunk == d else 1
    use_vmap = True
    out = []
    for s in range(0, n, step):
        hs = h[s : s + step]
        cols = []
        for c in range(0, d, chunk):
            tang = eye[c : c + chunk]
            jv = None
            if use_vmap:
                try:
                    jv = _jvp_vmapped(g, hs, tang)
                except RuntimeError:  # f is not vmappable: replicate rows from now on
                    use_vmap = False
            if jv is None:
                jv = _jvp_replicated(g, hs, tang)
            cols.append(jv)
        out.append(torch.cat(cols, dim=1))
    return torch.cat(out, 0)


def _jvp_vmapped(g: BatchedFn, hs: torch.Tensor, tang: torch.Tensor) -> torch.Tensor:
    """``[b, k, out]`` columns ``J(h_i) t_j`` by vmapping one jvp over the tangents ``t_j``."""
    tangents = tang[:, None, :].expand(tang.shape[0], *hs.shape)  # the same t_j for every row

    def column(t: torch.Tensor) -> torch.Tensor:
        return torch.func.jvp(g, (hs,), (t,))[1]

    return torch.func.vmap(column)(tangents).transpose(0, 1)


def _jvp_replicated(g: BatchedFn, hs: torch.Tensor, tang: torch.Tensor) -> torch.Tensor:
    """The same columns with each row replicated once per tangent (one plain jvp)."""
    inp = hs.repeat_interleave(tang.shape[0], dim=0)
    tan = tang.repeat(hs.shape[0], 1)
    jv = torch.func.jvp(g, (inp,), (tan,))[1]  # (output, jvp_out) without has_aux
    return jv.reshape(hs.shape[0], tang.shape[0], -1)


def _gram(jt: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``Σ_rows Jᵀ J`` for stacked ``Jᵀ`` [n, d, out] as one symmetric rank-k update."""
    n, d, o = jt.shape
    m = jt.permute(1, 0, 2).reshape(d, n * o).to(dtype)
    return symmetric_gram(m.T)


def vjp_sketch_grads(
    f: BatchedFn,
    h: torch.Tensor,
    n_projections: int,
    generator: torch.Generator,
    *,
    output: str = "raw",
    projection: Literal["rademacher", "gaussian"] = "rademacher",
) -> torch.Tensor:
    """``g = J(h)ᵀ u`` for ``n_projections`` random ``u`` per row: shape ``[n, M, d]``.

    Rows are replicated ``M`` times and one backward pass gives every sketch (no vmap needed).
    ``u`` has i.i.d. unit-variance entries, so ``E[g gᵀ] = JᵀJ``.
    """
    g_fn = _wrap(f, output)
    n, d = h.shape
    inp = h.detach().repeat_interleave(n_projections, dim=0).requires_grad_(True)
    with torch.enable_grad():
        y = g_fn(inp)
        if projection == "rademacher":
            u = torch.randint(0, 2, y.shape, generator=generator).to(y.dtype) * 2 - 1
        elif projection == "gaussian":
            u = torch.randn(y.shape, generator=generator, dtype=y.dtype)
        else:
            raise ValueError("projection must be 'rademacher' or 'gaussian'.")
        (grad,) = torch.autograd.grad(y, inp, grad_outputs=u.to(y.device))
    return grad.reshape(n, n_projections, d)


@dataclasses.dataclass(frozen=True)
class JacobianConfig:
    """Settings of :class:`CausalDimension`.

    Attributes
    ----------
    method : {"exact", "sketch"}
    output : {"raw", "log_probs"}
        Use ``f``'s output as is (e.g. logits) or its ``log_softmax`` over the last axis.
    max_rows : int
        Largest number of rows passed to ``f`` in one call (memory control).
    n_projections : int
        Sketch: random cotangents per residual vector.
    projection : {"rademacher", "gaussian"}
    n_groups : int
        Independent groups for the standard error / jackknife (≥ 2 for an error estimate).
    group_unit : {"vector", "chunk"}
        What is dealt round-robin over the groups: residual vectors (each batch split so that
        every group gets some; right when the rows are independent draws under one ``f``) or
        whole chunks (every vector of one ``(f, residuals)`` chunk in one group; right when a
        chunk's vectors share a prompt's context and so are correlated).
    gram_dtype : torch.dtype
        Precision of the per-batch ``JᵀJ`` product (the running sum is always float64).
    rank_rtol : float | None
        Tolerance for the numerical rank (default ``(d·eps_float32)²``, see stats.ranks).
    seed : int
    """

    method: Literal["exact", "sketch"] = "exact"
    output: Literal["raw", "log_probs"] = "raw"
    max_rows: int = 2048
    n_projections: int = 64
    projection: Literal["rademacher", "gaussian"] = "rademacher"
    n_groups: int = 8
    gram_dtype: torch.dtype = torch.float64
    rank_rtol: float | None = None
    seed: int = 0
    group_unit: Literal["vector", "chunk"] = "vector"

    def __post_init__(self) -> None:
        if self.group_unit not in ("vector", "chunk"):
            raise ValueError(f"group_unit must be 'vector' or 'chunk', got {self.group_unit!r}.")
        if self.method not in ("exact", "sketch"):
            raise ValueError(f"method must be 'exact' or 'sketch', got {self.method!r}.")
        if self.output not in ("raw", "log_probs"):
            raise ValueError(f"output must be 'raw' or 'log_probs', got {self.output!r}.")
        if self.max_rows < 1 or self.n_projections < 1 or self.n_groups < 1:
            raise ValueError("max_rows, n_projections and n_groups must be positive.")


@dataclasses.dataclass(frozen=True)
class CausalDimensionResult(Result):
    """``Σ = E[JᵀJ]`` and its effective ranks (κ).

    Attributes
    ----------
    sigma : np.ndarray
        ``[d, d]`` float64 estimate of ``Σ``.
    eigenvalues : np.ndarray
        Eigenvalues of ``Σ``, descending.
    erank, participation_ratio, stable_rank : float
        κ (Roy–Vetterli entropy effective rank), κ_PR and the stable rank of ``Σ``.
    numerical_rank : int
    rank_rtol : float
    kappa_over_d : float
        ``erank / d``.
    d, n_samples : int
    method, output : str
    n_projections : int | None
        Sketch only.
    relative_error : float | None
        Standard error of ``Σ̂`` in Frobenius norm relative to ``‖Σ̂‖_F`` from the spread
        between groups (token sampling, plus projections for the sketch).
    projection_error : float | None
        Sketch only: the error of ``Σ̂`` against the exact ``Σ`` *on the same vectors*
        (projection noise alone), relative Frobenius, estimated from two independent halves
        of the projections: ``‖(Σ̂_A − Σ̂_B)/2‖_F / ‖Σ̂‖_F``.
    erank_se, participation_ratio_se : float | None
        Jackknife (leave-one-group-out) standard errors.
    convention : str
    """

    sigma: np.ndarray
    eigenvalues: np.ndarray
    erank: float
    participation_ratio: float
    stable_rank: float
    numerical_rank: int
    rank_rtol: float
    kappa_over_d: float
    d: int
    n_samples: int
    method: str
    output: str
    n_projections: int | None
    relative_error: float | None
    projection_error: float | None
    erank_se: float | None
    participation_ratio_se: float | None
    convention: str = (
        "Σ = mean over residual vectors of JᵀJ, J = ∂vec(outputs)/∂h (positions summed); "
        + CONVENTION
    )


Chunk = tuple[BatchedFn, "torch.Tensor | Iterable[torch.Tensor]"]


class CausalDimension:
    """Estimate ``Σ = E[JᵀJ]`` at one site and its effective ranks (the estimator protocol).

    A chunk is ``(f, residuals)``: a batched callable and the residual vectors (one ``[n, d]``
    tensor or an iterable of them) at which its Jacobians are taken; prompts with their own
    context each bring their own ``f``.  :meth:`partial_fit` folds a chunk into
    ``statistics`` (an :class:`EJOPAccumulator`, whose ``merge`` returns self),
    :meth:`fit_from_statistics` turns statistics (possibly merged from several workers) into a
    frozen :class:`CausalDimensionResult`, and :meth:`fit` does both for one ``f``.

    Examples
    --------
    >>> W = torch.randn(50, 8)
    >>> res = CausalDimension(JacobianConfig()).fit(lambda h: h @ W.T, torch.randn(16, 8))
    >>> bool(np.allclose(res.sigma, (W.T @ W).double().numpy(), rtol=1e-4))  # float32 Jacobians
    True
    """

    def __init__(self, config: JacobianConfig | None = None) -> None:
        self.config = config or JacobianConfig()
        self.statistics: EJOPAccumulator | None = None

    def partial_fit(self, chunk: Chunk) -> CausalDimension:
        """Fold the Grams ``JᵀJ`` of one chunk ``(f, residuals)`` into ``statistics``.

        With ``group_unit="vector"`` each batch is split so that every group receives
        vectors even from a single batch; with ``"chunk"`` the whole chunk goes to the next
        group of the round-robin.  The sketch draws its projections from a generator seeded
        with ``config.seed`` at every call, so a chunk contributes the same statistics
        whichever chunks came before it (on this worker or another).
        """
        if not (isinstance(chunk, tuple) and len(chunk) == 2 and callable(chunk[0])):
            raise InputError("a chunk is a pair (f, residuals): a batched callable and [n, d].")
        f, residuals = chunk
        cfg = self.config
        gen = torch.Generator().manual_seed(cfg.seed)
        acc = self.statistics
        d = acc.d if acc is not None else None
        group: int | None = None
        for h in _as_batches(residuals):
            h = _checked(h, d)
            d = h.shape[1]
            if acc is None:
                acc = EJOPAccumulator(d, cfg.n_groups)
            if cfg.group_unit == "chunk" and group is None:
                group = acc.next_group()
            step = max(1, -(-h.shape[0] // cfg.n_groups)) if group is None else h.shape[0]
            if cfg.method == "exact":
                step = min(step, max(1, cfg.max_rows // d))
            else:
                step = min(step, max(1, cfg.max_rows // cfg.n_projections))
            for s in range(0, h.shape[0], step):
                part = h[s : s + step]
                if cfg.method == "exact":
                    jt = jacobians_forward(f, part, max_rows=cfg.max_rows, output=cfg.output)
                    acc.update(_gram(jt.detach(), cfg.gram_dtype), part.shape[0], group)
                else:
                    g = vjp_sketch_grads(
                        f,
                        part,
                        cfg.n_projections,
                        gen,
                        output=cfg.output,
                        projection=cfg.projection,
                    )
                    half = cfg.n_projections // 2
                    ga = g[:, :half].reshape(-1, d).to(cfg.gram_dtype)
                    gb = g[:, half:].reshape(-1, d).to(cfg.gram_dtype)
                    sa, sb = ga.T @ ga, gb.T @ gb
                    acc.update((sa + sb) / cfg.n_projections, part.shape[0], group)
                    if half > 0:
                        diff = (sa / half - sb / (cfg.n_projections - half)) / 2
                        acc.split_diff = diff if acc.split_diff is None else acc.split_diff + diff
        if acc is None:
            raise InputError("no residual vectors were given; pass at least one [n, d] batch.")
        self.statistics = acc
        return self

    def fit(
        self, f: BatchedFn, residuals: torch.Tensor | Iterable[torch.Tensor]
    ) -> CausalDimensionResult:
        """Estimate ``Σ`` from residual vectors (fresh statistics) with its effective ranks."""
        self.statistics = None
        stats = self.partial_fit((f, residuals)).statistics
        assert stats is not None  # partial_fit raises on an empty chunk
        return self.fit_from_statistics(stats)

    def fit_from_statistics(self, stats: EJOPAccumulator) -> CausalDimensionResult:
        """Turn (possibly merged) statistics into a result.

        ``relative_error`` is the jackknife standard error of ``Σ̂`` over groups (deviations
        taken about ``Σ̂``), in Frobenius norm relative to ``‖Σ̂‖_F``; ``erank_se`` and
        ``participation_ratio_se`` are the jackknife standard errors of the two ranks.
        """
        cfg = self.config
        sigma = stats.sigma()
        lam = torch.linalg.eigvalsh(sigma).flip(0).numpy()
        ranks = effective_ranks(lam, rtol=cfg.rank_rtol)
        rel = erank_se = pr_se = None
        loo = stats.group_sigmas()
        if loo:
            jack = group_jackknife(
                sigma.numpy(), np.stack([s.numpy() for s in loo]), about="estimate"
            )
            rel = float(np.linalg.norm(jack.se) / max(float(torch.linalg.norm(sigma)), 1e-300))
            er, pr = [], []
            for s in loo:
                r = effective_ranks(torch.linalg.eigvalsh((s + s.T) / 2).numpy())
                er.append(r.entropy_effective_rank)
                pr.append(r.participation_ratio)
            erank_se = float(group_jackknife(ranks.entropy_effective_rank, er).se)
            pr_se = float(group_jackknife(ranks.participation_ratio, pr).se)
        return CausalDimensionResult(
            sigma=sigma.numpy(),
            eigenvalues=lam,
            erank=ranks.entropy_effective_rank,
            participation_ratio=ranks.participation_ratio,
            stable_rank=ranks.stable_rank,
            numerical_rank=ranks.numerical_rank,
            rank_rtol=ranks.rank_rtol if cfg.rank_rtol is not None else default_rank_rtol(stats.d),
            kappa_over_d=ranks.entropy_effective_rank / stats.d,
            d=stats.d,
            n_samples=stats.n,
            method=cfg.method,
            output=cfg.output,
            n_projections=cfg.n_projections if cfg.method == "sketch" else None,
            relative_error=rel,
            projection_error=(
                float(torch.linalg.norm(stats.split_diff / stats.n) / torch.linalg.norm(sigma))
                if stats.split_diff is not None
                else None
            ),
            erank_se=erank_se,
            participation_ratio_se=pr_se,
        )


if TYPE_CHECKING:  # the roles of structlens.estimator, checked by mypy
    from structlens.estimator import Statistics, StreamingEstimator

    _EJOPAccumulator: type[Statistics] = EJOPAccumulator
    _CausalDimension: type[StreamingEstimator[EJOPAccumulator, CausalDimensionResult]] = (
        CausalDimension
    )

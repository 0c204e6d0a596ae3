"""κ from Jacobian Grams: point estimate, a valid jackknife interval, the few-vector bias
curve and the doubling convergence rule.

:class:`KappaEstimator` speaks the estimator protocol: ``partial_fit((f, residuals))`` folds
exact Grams ``G_i = J(x_i)ᵀ J(x_i)`` into an :class:`~structlens.causal_dim.EJOPAccumulator`
(its ``statistics``: float64 sums in groups, merged in place), and ``fit_from_statistics``
gives a :class:`KappaResult`.  :func:`kappa_from_grams` does the same for a stack ``G``
[n, d, d] of per-vector Grams already computed (each vector its own group, or the groups
given).

``Σ̂ = mean_i G_i``; κ is the entropy effective rank (Roy–Vetterli, ``exp`` of the Shannon
entropy in nats of the normalised eigenvalues of ``Σ̂``), κ_PR the participation ratio
``(Σλ)² / Σλ²``.

Σ̂ ↦ κ is concave in the normalised spectrum, so the plug-in κ(Σ̂_n) is biased low by O(1/n)
and rises towards κ(Σ) as ``n`` grows.  That rules out the percentile bootstrap: a resample
with duplicated vectors has fewer distinct Grams, so its κ is lower still, and the interval
sits *below* the plug-in estimate (which itself is below κ(Σ)).  The interval used here is the
**jackknife** (:func:`structlens.stats.intervals.group_jackknife`), which is valid for smooth
functions of a mean; over ``n`` groups (single vectors: delete-one):

* ``κ_(i)`` = κ without group ``i``; ``SE = sqrt((n−1)/n · Σ (κ_(i) − κ̄)²)``;
* bias-corrected estimate ``κ_J = n·κ − (n−1)·κ̄`` (removes the O(1/n) bias);
* interval ``κ_J ± t_{B−1, (1+ci)/2} · SE_J``.

``SE`` is the spread of the plug-in, but ``κ_J`` varies more, since its correction is itself
estimated; with correlated windows in a chunk an interval of width ``SE`` around ``κ_J``
covered κ(Σ) in 0.89 of planted instances (docs/calibration.md).  So ``SE_J`` is the
jackknife of ``κ_J`` itself, recomputed without each of ``B = min(n, SE_BLOCKS)`` blocks of
groups (:func:`structlens.stats.intervals.bias_corrected_jackknife`); with 2 groups, which
cannot give it, the interval falls back to ``SE`` and ``n − 1`` degrees of freedom and
``ci_method`` says so.  Its cost is about ``B·n`` eigendecompositions of a ``d × d`` matrix.

Point and interval refer to one estimand, κ(Σ): the reported ``erank`` (and
``participation_ratio``) is the bias-corrected ``κ_J``, the centre of its interval, projected
onto the range ``[1, d]`` that κ(Σ) lies in (interval ends too); the plug-in κ(Σ̂) is
``erank_plugin``.  When the plug-in bias exceeds the sampling error the plug-in lies below
the interval: the signal to add vectors.

**Jackknife unit.**  The jackknife assumes independent groups.  Vectors that share context
(windows cut from one corpus chunk, positions of one prompt) are correlated, and dealing them
into different groups understates the SE; so the groups are whole chunks: ``groups=`` of
:func:`kappa_from_grams` (one label per vector, e.g. its chunk's index) and
``KappaConfig.unit="chunk"`` (every vector of one ``(f, residuals)`` chunk in one group).

**When κ is identified.**  The jackknife removes the O(1/n) bias only; what is left is
O(1/n²) and, with few vectors of low rank against ``d``, larger than the interval: on a flat
64-d spectrum sampled by 64 rank-2 vectors the jackknife interval misses κ = 64 in most
instances (tests/causal_dim/test_causal_dim_kappa.py).
:func:`residual_bias` estimates it by Richardson extrapolation (the bias-corrected κ of the
two halves of the groups carries four times the bias of all of them), and
:func:`kappa_until_identified` doubles the vectors until the interval, its upper end raised
by that estimate, lies within ``±(tolerance − 1)`` of the point.  The paper's rule, the
plug-in ratio κ(n)/κ(n/2) < 1.05 (:func:`doubling_ratio`), is recorded beside it but does
not decide: it stopped with the plug-in κ more than 5% low in 0.45 of planted instances
(docs/calibration.md).  :func:`kappa_curve` measures the bias curve by subsampling
``n' ≤ n`` vectors without replacement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from structlens.causal_dim.jacobian import CausalDimension, Chunk, EJOPAccumulator, JacobianConfig
from structlens.config import check_choices
from structlens.errors import InputError
from structlens.results import Result
from structlens.stats.intervals import (
    bias_corrected_jackknife,
    group_jackknife,
    leave_one_group_out_means,
)
from structlens.stats.ranks import CONVENTION, effective_ranks

#: Most blocks of groups of the jackknife of the bias-corrected κ (the value calibrated).
SE_BLOCKS = 32
#: The rule :func:`kappa_until_identified` applies, named for the cache keys of stored κ fits
#: (a fit stored under another rule must not be read back as this one's).
IDENTIFICATION_RULE = "interval raised by the Richardson residual bias, within ±(tolerance − 1)"


def _stack(grams: np.ndarray | torch.Tensor | Sequence[np.ndarray]) -> np.ndarray:
    if isinstance(grams, torch.Tensor):
        grams = grams.detach().cpu().numpy()
    g = np.asarray(grams if isinstance(grams, np.ndarray) else np.stack(grams), dtype=np.float64)
    if g.ndim != 3 or g.shape[1] != g.shape[2]:
        raise ValueError(f"grams must be [n, d, d] (one Gram per vector), got shape {g.shape}.")
    if not np.all(np.isfinite(g)):
        raise ValueError("grams contain NaN or inf.")
    return g


def _ranks(sigma: np.ndarray) -> tuple[float, float]:
    r = effective_ranks(np.linalg.eigvalsh((sigma + sigma.T) / 2))
    return r.entropy_effective_rank, r.participation_ratio


@dataclasses.dataclass(frozen=True)
class KappaResult(Result):
    """κ (erank) and κ_PR of ``Σ̂ = mean_i G_i`` with jackknife SEs and intervals.

    ``n_vectors`` counts residual vectors; the jackknife runs over the ``n_groups`` filled
    groups of the statistics (``ci_method`` says which: delete-one when every vector is its
    own group).

    ``erank``/``participation_ratio`` are the bias-corrected jackknife estimates of κ(Σ) and
    κ_PR(Σ), the centres of their intervals (``*_ci``, level ``ci``), both within ``[1, d]``
    (see the module docstring); ``kappa_over_d`` is ``erank / d``.
    ``erank_plugin``/``participation_ratio_plugin`` are the plug-in values of ``Σ̂`` (biased
    low), as are ``stable_rank`` and ``numerical_rank``.  ``ratio_last_doubling`` is
    ``κ(n) / κ(n/2)`` of the plug-in (:func:`doubling_ratio`); ``eigenvalues`` are those of
    ``Σ̂``, descending.
    """

    erank: float
    participation_ratio: float
    erank_plugin: float
    participation_ratio_plugin: float
    stable_rank: float
    numerical_rank: int
    kappa_over_d: float
    erank_se: float
    participation_ratio_se: float
    erank_ci: list
    participation_ratio_ci: list
    ratio_last_doubling: float
    eigenvalues: np.ndarray
    d: int
    n_vectors: int
    ci: float
    ci_method: str
    convention: str
    n_groups: int = 0


@dataclasses.dataclass(frozen=True)
class KappaConfig:
    """Settings of :class:`KappaEstimator`.

    Attributes
    ----------
    output : {"raw", "log_probs"}
        Jacobians of ``f``'s output as is (e.g. logits) or of its ``log_softmax``.
    n_groups : int
        Groups for the jackknife (≥ 2), filled round-robin one ``unit`` at a time.
    unit : {"chunk", "vector"}
        What one group receives at a time: every vector of one chunk (the default: a chunk's
        vectors share its prompt and are correlated, so the chunk is the independent unit) or
        single vectors (only for vectors drawn independently under one ``f``; then with at
        least as many groups as vectors each vector is its own group, delete-one).
    ci : float
        Two-sided level of the intervals, in (0, 1).
    max_rows : int
        Largest number of rows passed to ``f`` in one call (memory control).
    """

    output: Literal["raw", "log_probs"] = "raw"
    n_groups: int = 8
    ci: float = 0.95
    max_rows: int = 2048
    unit: Literal["chunk", "vector"] = "chunk"

    def __post_init__(self) -> None:
        check_choices(self)
        if self.n_groups < 2:
            raise InputError(f"n_groups must be >= 2 for an interval, got {self.n_groups}.")
        if not 0 < self.ci < 1:
            raise InputError(f"ci must lie in (0, 1), got {self.ci}.")
        if self.max_rows < 1:
            raise InputError(f"max_rows must be >= 1, got {self.max_rows}.")


class KappaEstimator:
    """κ with a bias-corrected jackknife interval, by the estimator protocol.

    A chunk is ``(f, residuals)`` as for :class:`~structlens.causal_dim.CausalDimension`,
    whose exact Jacobian path computes the Grams; ``statistics`` is its
    :class:`~structlens.causal_dim.EJOPAccumulator`.

    Examples
    --------
    A linear map ``f(h) = W h`` has ``JᵀJ = WᵀW`` at every vector (so no spread and no
    bias); four chunks of two vectors fill four groups:

    >>> W = torch.diag(torch.tensor([3.0, 2.0, 1.0, 0.0], dtype=torch.float64))
    >>> est = KappaEstimator(KappaConfig(n_groups=4))
    >>> for h in torch.randn(4, 2, 4).double():
    ...     _ = est.partial_fit((lambda h: h @ W.T, h))
    >>> res = est.fit_from_statistics(est.statistics)
    >>> round(res.participation_ratio, 9), res.n_vectors, res.n_groups  # 14² / 98
    (2.0, 8, 4)
    """

    def __init__(self, config: KappaConfig | None = None) -> None:
        self.config = config or KappaConfig()
        cfg = self.config
        self._jacobians = CausalDimension(
            JacobianConfig(
                method="exact",
                output=cfg.output,
                max_rows=cfg.max_rows,
                n_groups=cfg.n_groups,
                group_unit=cfg.unit,
            )
        )

    @property
    def statistics(self) -> EJOPAccumulator | None:
        """The Gram sums so far (``None`` before the first chunk)."""
        return self._jacobians.statistics

    def partial_fit(self, chunk: Chunk) -> KappaEstimator:
        """Fold the exact Grams of one chunk ``(f, residuals)`` into ``statistics``."""
        self._jacobians.partial_fit(chunk)
        return self

    def fit(self, chunks: Iterable[Chunk]) -> KappaResult:
        """κ from fresh statistics of all ``chunks`` (pairs ``(f, residuals)``)."""
        self._jacobians.statistics = None
        for chunk in chunks:
            self.partial_fit(chunk)
        if self.statistics is None:
            raise InputError("no chunks were given; pass at least one (f, residuals) pair.")
        return self.fit_from_statistics(self.statistics)

    def fit_from_statistics(self, stats: EJOPAccumulator) -> KappaResult:
        """Bias-corrected effective ranks of ``Σ̂`` with jackknife SEs and t intervals over
        the groups of ``stats`` (at least 2 must hold vectors), plus the plug-in values."""
        sums, counts = stats.sums.numpy(), stats.counts.numpy()
        loo = leave_one_group_out_means(sums, counts)
        if not loo:
            raise InputError(
                f"an error estimate needs vectors in at least 2 groups, got {stats.n} vector(s) "
                f"in 1; add vectors or use more groups."
            )
        d = stats.d
        sigma = sums.sum(0) / counts.sum()
        lam = np.linalg.eigvalsh((sigma + sigma.T) / 2)[::-1]
        full = effective_ranks(lam)
        plug = np.array([full.entropy_effective_rank, full.participation_ratio])
        filled = counts > 0
        if filled.sum() >= 3:
            # the interval is centred on the bias-corrected κ, which varies more than the
            # plug-in whose spread the plain jackknife measures: its own jackknife sets the width
            jack = bias_corrected_jackknife(
                sums[filled], counts[filled], lambda m: np.array(_ranks(m)), max_blocks=SE_BLOCKS
            )
        else:
            jack = group_jackknife(plug, np.array([_ranks(s) for s in loo]))
        lo, hi = jack.interval(self.config.ci, distribution="t")
        point = np.asarray(jack.bias_corrected, dtype=np.float64)
        # κ(Σ) and κ_PR(Σ) lie in [1, d]; projecting onto that range keeps every covered value
        clipped = bool(np.any((point < 1) | (point > d)))
        point, lo, hi = (np.clip(v, 1.0, float(d)) for v in (point, lo, hi))
        n_filled = int(filled.sum())
        method = (
            "delete-one jackknife"
            if np.all(counts[filled] == 1)
            else f"delete-a-group jackknife over {n_filled} groups of vectors"
        )
        method += ", bias-corrected" + (
            f", its standard error a jackknife of it over {jack.n} blocks of groups"
            if n_filled >= 3
            else ", the plug-in's standard error (2 groups)"
        )
        method += f", t interval ({jack.n - 1} df)" + (", clipped to [1, d]" if clipped else "")
        return KappaResult(
            erank=float(point[0]),
            participation_ratio=float(point[1]),
            erank_plugin=full.entropy_effective_rank,
            participation_ratio_plugin=full.participation_ratio,
            stable_rank=full.stable_rank,
            numerical_rank=full.numerical_rank,
            kappa_over_d=float(point[0]) / d,
            erank_se=float(jack.se[0]),
            participation_ratio_se=float(jack.se[1]),
            erank_ci=[float(lo[0]), float(hi[0])],
            participation_ratio_ci=[float(lo[1]), float(hi[1])],
            ratio_last_doubling=_doubling_ratio(sums, counts),
            eigenvalues=lam.copy(),
            d=d,
            n_vectors=stats.n,
            ci=self.config.ci,
            ci_method=method,
            convention=CONVENTION,
            n_groups=n_filled,
        )


def kappa_from_grams(
    grams: np.ndarray | torch.Tensor | Sequence[np.ndarray],
    *,
    ci: float = 0.95,
    groups: Sequence[Hashable] | np.ndarray | None = None,
) -> KappaResult:
    """Bias-corrected effective ranks of the mean Gram with jackknife SEs and intervals.

    :meth:`KappaEstimator.fit_from_statistics` on per-vector Grams summed per group.

    Parameters
    ----------
    grams : array [n, d, d]
        Per-vector ``JᵀJ`` (symmetric PSD), n ≥ 2.
    ci : float
        Two-sided interval level in (0, 1).
    groups : sequence of hashable, length n, optional
        The independent unit of each vector, e.g. the index of the corpus chunk its window
        was cut from: vectors with one label form one group of the delete-a-group jackknife
        (at least 2 groups).  ``None``: every vector its own group (delete-one), valid only
        when the vectors were drawn independently.

    Examples
    --------
    Two windows from each of three chunks, grouped by chunk:

    >>> g = np.stack([np.diag([1.0, 1.0, 0.0])] * 6)
    >>> res = kappa_from_grams(g, groups=[0, 0, 1, 1, 2, 2])
    >>> round(res.erank, 6), res.n_groups, res.ci_method.split(",")[0]
    (2.0, 3, 'delete-a-group jackknife over 3 groups of vectors')
    """
    g = _stack(grams)
    n = g.shape[0]
    if n < 2:
        raise InputError(f"need at least 2 vectors for an error estimate, got {n}.")
    if groups is None:
        stats = EJOPAccumulator.from_grams(g)
        return KappaEstimator(KappaConfig(n_groups=n, ci=ci)).fit_from_statistics(stats)
    sums, counts = _group_sums(g, groups)
    if len(counts) < 2:
        raise InputError(
            f"all {n} vectors share one group; the jackknife needs at least 2 independent "
            "groups (vectors from more chunks)."
        )
    stats = EJOPAccumulator(g.shape[1], len(counts))
    stats.sums, stats.counts = torch.from_numpy(sums), torch.from_numpy(counts)
    stats._next = len(counts)
    cfg = KappaConfig(n_groups=max(2, len(counts)), ci=ci)
    return KappaEstimator(cfg).fit_from_statistics(stats)


def _group_sums(
    g: np.ndarray, groups: Sequence[Hashable] | np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Per-group sums ``[G, d, d]`` and counts ``[G]`` of per-vector Grams, groups in order of
    first appearance (``None``: every vector its own group)."""
    if groups is None:
        return g.astype(np.float64, copy=False), np.ones(len(g))
    labels = list(groups)
    if len(labels) != len(g):
        raise InputError(
            f"groups has {len(labels)} labels for {len(g)} Grams; give one per vector."
        )
    index: dict[Hashable, int] = {}
    idx = np.array([index.setdefault(x, len(index)) for x in labels])
    sums = np.stack([g[idx == k].sum(0) for k in range(len(index))])
    return sums, np.bincount(idx, minlength=len(index)).astype(np.float64)


def _doubling_ratio(sums: np.ndarray, counts: np.ndarray) -> float:
    """``κ(all) / mean κ(two halves)`` over the filled groups (first ⌊G/2⌋, next ⌊G/2⌋)."""
    if not np.all(counts > 0):  # copy only when some group is empty
        keep = counts > 0
        sums, counts = sums[keep], counts[keep]
    h = counts.size // 2
    halves = [
        _ranks(sums[:h].sum(0) / counts[:h].sum())[0],
        _ranks(sums[h : 2 * h].sum(0) / counts[h : 2 * h].sum())[0],
    ]
    return float(_ranks(sums.sum(0) / counts.sum())[0] / np.mean(halves))


def doubling_ratio(grams: np.ndarray | torch.Tensor | Sequence[np.ndarray]) -> float:
    """``κ(n) / κ(n/2)`` for the last doubling of the number of vectors.

    ``κ(n/2)`` is the mean erank of the two disjoint halves (first ``⌊n/2⌋`` vectors and the
    next ``⌊n/2⌋``), so the ratio is deterministic.  Close to 1 once adding vectors no longer
    raises κ; since the plug-in bias is O(1/n), the ratio − 1 is about the relative bias left
    at ``n/2``.
    """
    g = _stack(grams)
    n = g.shape[0]
    if n < 2:
        raise InputError(f"a doubling ratio needs at least 2 vectors, got {n}.")
    return _doubling_ratio(g, np.ones(n))


def _bias_corrected_erank(sums: np.ndarray, counts: np.ndarray) -> float:
    """The delete-a-group jackknife's bias-corrected erank ``G·κ − (G − 1)·mean κ_(g)``
    (the point of :class:`KappaEstimator`, without its standard error)."""
    loo = leave_one_group_out_means(sums, counts)
    plug = _ranks(sums.sum(0) / counts.sum())[0]
    return float(group_jackknife(plug, np.array([_ranks(m)[0] for m in loo])).bias_corrected)


def residual_bias(
    grams: np.ndarray | torch.Tensor | Sequence[np.ndarray],
    groups: Sequence[Hashable] | np.ndarray | None = None,
) -> float:
    """The bias left in the bias-corrected κ, by Richardson extrapolation.

    After the jackknife's correction the bias of κ from ``n`` vectors is about ``c/n²``, so
    the two disjoint halves of the groups (first ``⌊G/2⌋``, next ``⌊G/2⌋``) carry about four
    times it and ``b̂ = (κ_J(all) − mean κ_J(halves)) / 3``.  κ is concave in the spectrum, so
    the bias is downward; ``b̂`` is floored at 0 (a negative difference is sampling noise).

    Parameters
    ----------
    grams : array [n, d, d]
        Per-vector ``JᵀJ``.
    groups : sequence of hashable, length n, optional
        The jackknife unit of each vector (as for :func:`kappa_from_grams`).

    Returns
    -------
    float
        ``b̂ ≥ 0`` in units of κ, or NaN with fewer than 4 groups (a half needs 2).

    Examples
    --------
    Identical Grams leave no bias to estimate:

    >>> residual_bias(np.stack([np.diag([1.0, 1.0, 0.0])] * 8))
    0.0
    """
    return _residual_bias(*_group_sums(_stack(grams), groups))[0]


def _residual_bias(sums: np.ndarray, counts: np.ndarray) -> tuple[float, float]:
    """:func:`residual_bias` from group sums, and the bias-corrected κ of all groups."""
    whole = _bias_corrected_erank(sums, counts)
    h = len(counts) // 2
    if h < 2:
        return float("nan"), whole
    halves = [_bias_corrected_erank(sums[a : a + h], counts[a : a + h]) for a in (0, h)]
    return max(0.0, (whole - float(np.mean(halves))) / 3), whole


@dataclasses.dataclass(frozen=True)
class KappaConvergence(Result):
    """Outcome of :func:`kappa_until_identified`.

    ``fit`` is :func:`kappa_from_grams` on the Grams used (``grams``), its ``erank_ci`` upper
    end raised by the last residual bias; after each doubling (``n_vectors``) the plug-in
    erank, the paper's plug-in ratio κ(n)/κ(n/2) (``ratios``, a diagnostic) and
    :func:`residual_bias` (``residual_bias``).  ``identified`` says whether the rule stopped
    by its criterion (not at the cap).
    """

    grams: np.ndarray
    fit: KappaResult
    n_vectors: list
    erank: list
    ratios: list
    residual_bias: list
    ratio_last_doubling: float
    identified: bool
    tolerance: float


def _within(fit: KappaResult, bias: float, tolerance: float) -> bool:
    """The interval, its upper end raised by ``bias``, lies within ±(tolerance − 1) of κ."""
    lo, hi = fit.erank_ci
    slack = (tolerance - 1) * fit.erank
    return bool(fit.erank - lo <= slack and hi + bias - fit.erank <= slack)


def kappa_until_identified(
    draw: Callable[[int], np.ndarray | torch.Tensor],
    n_start: int,
    *,
    tolerance: float = 1.05,
    max_vectors: int = 4096,
    groups: Sequence[Hashable] | None = None,
    ci: float = 0.95,
) -> KappaConvergence:
    """Add vectors until κ is identified to within a factor ``tolerance``, or the cap.

    κ is identified at ``n`` vectors when the bias-corrected jackknife interval of
    :func:`kappa_from_grams`, its upper end raised by :func:`residual_bias` ``b̂``, lies within
    ``±(tolerance − 1)·κ_J`` of the point ``κ_J``: sampling error and the bias left are both
    within the tolerance.  ``b̂`` needs at least 4 groups; until then κ is not identified.
    The reported interval is the raised one, so it covers κ where the bias left exceeds the
    sampling error (a flat spectrum's, docs/calibration.md).

    Parameters
    ----------
    draw : callable
        ``draw(k)`` returns ``k`` new per-vector Grams ``[k, d, d]``.
    n_start : int
        Vectors before the first doubling (≥ 2).
    tolerance : float
        The relative precision asked of κ, as a factor (> 1).
    max_vectors : int
        The cap: ``n`` doubles while ``2n ≤ max_vectors``.
    groups : sequence of hashable, optional
        Jackknife unit of each vector in draw order, at least as many as will be drawn
        (``None``: each vector its own group).
    ci : float
        Level of the interval.
    """
    if n_start < 2 or max_vectors < n_start:
        raise ValueError(f"need 2 <= n_start <= max_vectors; got {n_start}, {max_vectors}.")
    if not tolerance > 1:
        raise ValueError(f"tolerance must exceed 1, got {tolerance}.")
    g = _stack(draw(n_start))
    sizes, eranks, ratios, biases = [], [], [], []
    identified = False
    while True:
        n = int(g.shape[0])
        labels = None if groups is None else list(groups)[:n]
        bias, point = _residual_bias(*_group_sums(g, labels))
        sizes.append(n)
        eranks.append(_ranks(g.mean(0))[0])
        ratios.append(doubling_ratio(g))
        biases.append(bias)
        fit = None
        # the jackknife of the bias-corrected κ costs ~G·min(G, 32) eigendecompositions:
        # compute it only once the cheap bias estimate is within the tolerance
        if np.isfinite(bias) and bias <= (tolerance - 1) * point:
            fit = kappa_from_grams(g, ci=ci, groups=labels)
            identified = _within(fit, bias, tolerance)
        if identified or 2 * n > max_vectors:
            break
        g = np.concatenate([g, _stack(draw(n))])
    fit = _raised(fit or kappa_from_grams(g, ci=ci, groups=labels), biases[-1])
    return KappaConvergence(
        grams=g, fit=fit, n_vectors=sizes, erank=eranks, ratios=ratios, residual_bias=biases,
        ratio_last_doubling=ratios[-1], identified=identified, tolerance=tolerance,
    )  # fmt: skip


def _raised(fit: KappaResult, bias: float) -> KappaResult:
    """``fit`` with its κ interval's upper end raised by ``bias`` (at most to ``d``)."""
    lo, hi = fit.erank_ci
    if not np.isfinite(bias):
        how = ", upper end not raised (the residual bias needs at least 4 groups)"
        return dataclasses.replace(fit, ci_method=fit.ci_method + how)
    return dataclasses.replace(
        fit,
        erank_ci=[lo, min(float(fit.d), hi + bias)],
        ci_method=fit.ci_method + f", upper end raised by the residual bias {bias:.3g}",
    )


@dataclasses.dataclass(frozen=True)
class KappaCurve(Result):
    """Outcome of :func:`kappa_curve`: for each subset size in ``sizes`` (floats, ascending as
    given), the mean (``erank``, ``pr``) and standard deviation (``erank_sd``, ``pr_sd``) over
    random subsets of κ (erank) and κ_PR of ``Σ̂``."""

    sizes: list
    erank: list
    erank_sd: list
    pr: list
    pr_sd: list


def kappa_curve(
    grams: np.ndarray | torch.Tensor | Sequence[np.ndarray],
    sizes: Sequence[int],
    *,
    n_draws: int = 20,
    seed: int = 0,
) -> KappaCurve:
    """Few-vector bias: κ and κ_PR of ``Σ̂`` from random subsets of ``n'`` vectors.

    For each ``n'`` in ``sizes`` (``1 ≤ n' ≤ n``), ``n_draws`` subsets are drawn without
    replacement (one subset when ``n' = n``).  Returns the mean and standard deviation over
    draws of the erank and the participation ratio per size (:class:`KappaCurve`).
    """
    g = _stack(grams)
    n = g.shape[0]
    sizes = [int(s) for s in sizes]
    if not sizes or min(sizes) < 1 or max(sizes) > n:
        raise ValueError(f"sizes must be a non-empty list of integers in [1, {n}].")
    if n_draws < 1:
        raise ValueError("n_draws must be positive.")
    rng = np.random.default_rng(seed)
    out: dict[str, list[float]] = {k: [] for k in ("erank", "erank_sd", "pr", "pr_sd")}
    for s in sizes:
        vals = np.array(
            [
                _ranks(g[rng.choice(n, s, replace=False)].mean(0))
                for _ in range(1 if s == n else n_draws)
            ]
        )
        out["erank"].append(float(vals[:, 0].mean()))
        out["erank_sd"].append(float(vals[:, 0].std()))
        out["pr"].append(float(vals[:, 1].mean()))
        out["pr_sd"].append(float(vals[:, 1].std()))
    return KappaCurve(sizes=[float(s) for s in sizes], **out)


__all__ = [
    "KappaConfig",
    "KappaConvergence",
    "KappaCurve",
    "KappaEstimator",
    "KappaResult",
    "doubling_ratio",
    "kappa_curve",
    "kappa_from_grams",
    "kappa_until_identified",
    "residual_bias",
]


if TYPE_CHECKING:  # the roles of structlens.estimator, checked by mypy
    from structlens.estimator import StreamingEstimator

    _KappaEstimator: type[StreamingEstimator[EJOPAccumulator, KappaResult]] = KappaEstimator

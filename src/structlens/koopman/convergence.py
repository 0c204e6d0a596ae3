"""Split-half convergence of the spectrum and the spectral universality test.

Both work on per-prompt-block statistics (``accumulate(..., n_blocks=K)``), so halves and
permutations are always *by prompt* and no activations are re-read: a half is the merge of
randomly chosen blocks.  The exception is :func:`refit_distance_test`, whose null fits each
half's dictionary afresh and so reads the rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from structlens.koopman.dictionaries import Dictionary
from structlens.koopman.edmdc import (
    EDMDc,
    EDMDcConfig,
    EDMDcStatistics,
    _solve_operator,
    control_basis,
    merge_statistics,
    merge_statistics_many,
    state_operator,
)
from structlens.koopman.spectral import eigendecomposition
from structlens.results import Result
from structlens.stats.intervals import group_jackknife
from structlens.stats.lanes import serial_blas
from structlens.stats.matching import bottleneck_distance, wasserstein_distance
from structlens.stats.robust import block_assignment


def _spectrum(stats: EDMDcStatistics, config: EDMDcConfig, V: np.ndarray) -> np.ndarray:
    return np.linalg.eigvals(state_operator(stats, config, V))


def _slope(m: np.ndarray, d: np.ndarray) -> float:
    return float(np.polyfit(np.log(m), np.log(d), 1)[0])


@dataclass(frozen=True)
class SplitHalfResult(Result):
    """Split-half spectral distances over a grid of sample sizes.

    ``n_samples[s]`` is the mean number of samples in *one* half at grid point ``s`` (the M of
    ``d_M ∝ M^{-1/2}``); ``w_inf``/``w2`` are ``(n_repeats, n_sizes)`` distances between the
    two halves' spectra.  ``slope`` is the least-squares log-log slope of the mean W∞ over the
    grid; ``slope_ci`` its 95% delete-a-group jackknife interval over prompt blocks
    (``slope_ci_method``): the blocks are dealt into ``n_groups`` groups, the whole curve is
    recomputed without each group (same random halves otherwise, so only the data differ),
    and ``slope ± t_{G−1} · se_jack``.  It covers the variation of the slope across
    independent data sets, which resampling repeats within one data set does not (the halves
    of one data set overlap heavily, so that spread is far too narrow).  ``slope_se`` is the
    jackknife standard error.  ``slope_last4`` is the slope over the four largest sizes (the
    rate is asymptotic).  ``eig_condition`` are the ``κ(λ_i)`` of the pooled fit: the rate
    needs ``κ ≪ √M``.
    """

    n_samples: np.ndarray
    w_inf: np.ndarray
    w2: np.ndarray
    w_inf_mean: np.ndarray
    w2_mean: np.ndarray
    slope: float
    slope_ci: list[float]
    slope_se: float
    slope_ci_method: str
    slope_w2: float
    slope_last4: float
    eig_condition: np.ndarray
    eig_condition_max: float
    n_repeats: int
    n_blocks: int
    n_groups: int
    seed: int


def _split_half_curve(
    blocks: Sequence[EDMDcStatistics],
    config: EDMDcConfig,
    V: np.ndarray,
    half_sizes: Sequence[int],
    orders: np.ndarray,
    keep: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """W∞, W2 and half sizes for halves drawn from the blocks with ``keep`` true.

    ``orders[s, r]`` is a random permutation of all blocks; a half pair takes the first
    ``2j`` kept blocks of it, so curves on different subsets share their random draws.
    """
    R = orders.shape[1]
    w_inf = np.empty((R, len(half_sizes)))
    w2, n_half = np.empty_like(w_inf), np.empty_like(w_inf)
    # every half as a 0/1 weighting of the blocks, all pooled in one pass (a fit reads zy only)
    weights = np.zeros((len(half_sizes), R, 2, len(blocks)), dtype=np.int64)
    for s, j in enumerate(half_sizes):
        for r in range(R):
            order = orders[s, r][keep[orders[s, r]]]
            weights[s, r, 0, order[:j]] = 1
            weights[s, r, 1, order[j : 2 * j]] = 1
    halves = merge_statistics_many(blocks, weights.reshape(-1, len(blocks)), with_state=False)
    for s in range(len(half_sizes)):
        for r in range(R):
            h1, h2 = next(halves), next(halves)
            e1, e2 = _spectrum(h1, config, V), _spectrum(h2, config, V)
            w_inf[r, s] = bottleneck_distance(e1, e2)
            w2[r, s] = wasserstein_distance(e1, e2, 2)
            n_half[r, s] = 0.5 * (h1.n + h2.n)
    return w_inf, w2, n_half


def default_groups(n_blocks: int) -> int:
    """Groups of the delete-a-group jackknife for ``n_blocks`` prompt blocks."""
    return max(2, min(8, n_blocks // 2))


def half_sizes_for(n_blocks: int, n_groups: int | None = None, *, smallest: int = 1) -> list[int]:
    """Powers of two from ``smallest``, then the largest half every jackknife replicate can
    draw, ``(K − ⌈K/G⌉) // 2`` blocks (the default grid of :func:`split_half_convergence`).

    The largest half ends the grid even when it is no power of two, so that the grid spans
    as much of M as the blocks allow: with 32 blocks and 8 groups, halves of 1 to 14 blocks
    (a factor 14 in M) rather than 1 to 8.

    >>> half_sizes_for(32)
    [1, 2, 4, 8, 14]
    >>> half_sizes_for(16)
    [1, 2, 4, 7]
    """
    g = default_groups(n_blocks) if n_groups is None else n_groups
    top = max((n_blocks - -(-n_blocks // g)) // 2, 1)
    sizes = [2**i for i in range(int(np.log2(top)) + 1) if 2**i >= smallest]
    return sizes + [top] if top not in sizes and top >= smallest else sizes


@serial_blas()
def split_half_convergence(
    blocks: Sequence[EDMDcStatistics],
    config: EDMDcConfig,
    *,
    half_sizes: Sequence[int] | None = None,
    n_repeats: int = 20,
    n_groups: int | None = None,
    seed: int = 0,
) -> SplitHalfResult:
    """Split-half W∞/W2 distances of spectra and their log-log slope against M.

    Parameters
    ----------
    blocks : per-prompt-block statistics, e.g. ``accumulate(dic, stream, n_blocks=64)``;
        empty blocks are dropped.
    half_sizes : numbers of blocks per half (default powers of two up to what every
        jackknife replicate can draw, ``(K − ⌈K/G⌉) // 2``).
    n_repeats : random prompt-level half pairs per size.
    n_groups : groups of blocks for the delete-a-group jackknife interval of the slope
        (see :class:`SplitHalfResult`); default ``min(8, K // 2)`` (at least 2).

    Notes
    -----
    The control basis is computed once from all blocks and shared by every fit, so the halves
    differ only by sampling.
    """
    blocks = [b for b in blocks if b.n > 0]  # a hash block may have received no prompt
    K = len(blocks)
    if K < 4:
        raise ValueError(f"need at least 4 prompt blocks for split halves; got {K}.")
    if n_groups is None:
        n_groups = default_groups(K)
    if not 2 <= n_groups <= K // 2:
        raise ValueError(f"n_groups must be in [2, {K // 2}] for {K} blocks; got {n_groups}.")
    usable = K - -(-K // n_groups)  # blocks left when the largest group is deleted
    if half_sizes is None:
        half_sizes = half_sizes_for(K, n_groups)
    half_sizes = list(half_sizes)
    if len(half_sizes) < 2 or any(not 1 <= j <= usable // 2 for j in half_sizes):
        raise ValueError(
            f"half_sizes must be >= 2 values in [1, {usable // 2}] (every jackknife replicate "
            f"drops a group of blocks); got {half_sizes}. Use more blocks or fewer sizes."
        )
    rng = np.random.default_rng(seed)
    V = control_basis(merge_statistics(blocks), config)[0]
    # Every fit shares V, so the blocks are projected onto it once: merges and solves then
    # work on (N + r)-wide moments instead of (N + d_u)-wide ones (the same operators).
    blocks = [b.project_controls(V) for b in blocks]
    V = np.eye(V.shape[1])
    pooled = merge_statistics(blocks)
    orders = np.stack(
        [np.stack([rng.permutation(K) for _ in range(n_repeats)]) for _ in half_sizes]
    )
    group = rng.permutation(K) % n_groups
    w_inf, w2, n_half = _split_half_curve(blocks, config, V, half_sizes, orders, np.ones(K, bool))
    m = n_half.mean(axis=0)
    mean_inf, mean_2 = w_inf.mean(axis=0), w2.mean(axis=0)
    slope = _slope(m, mean_inf)
    reps = np.empty(n_groups)
    for g in range(n_groups):
        wi, _, nh = _split_half_curve(blocks, config, V, half_sizes, orders, group != g)
        reps[g] = _slope(nh.mean(axis=0), wi.mean(axis=0))
    jack = group_jackknife(slope, reps)
    lo, hi = jack.interval(0.95, distribution="t", centre="estimate")
    K_all, _ = _solve_operator(pooled, config, V)
    cond = eigendecomposition(K_all[:, : pooled.n_features]).condition
    tail = slice(max(0, len(m) - 4), None)
    return SplitHalfResult(
        n_samples=m,
        w_inf=w_inf,
        w2=w2,
        w_inf_mean=mean_inf,
        w2_mean=mean_2,
        slope=slope,
        slope_ci=[float(lo), float(hi)],
        slope_se=float(jack.se),
        slope_ci_method=f"delete-a-group jackknife over prompt blocks, {n_groups} groups, t",
        slope_w2=_slope(m, mean_2),
        slope_last4=_slope(m[tail], mean_inf[tail]),
        eig_condition=cond,
        eig_condition_max=float(cond.max()),
        n_repeats=n_repeats,
        n_blocks=K,
        n_groups=n_groups,
        seed=seed,
    )


@dataclass(frozen=True)
class UniversalityResult(Result):
    """Permutation test of "same realisation" for two models under one dictionary protocol.

    ``distance`` is W∞ between the two pooled spectra; ``null`` are the same distances after
    randomly relabelling prompt blocks between the models (equal group sizes);
    ``p_value = (1 + #{null ≥ distance}) / (1 + n_permutations)``.  A small p-value says the
    spectra differ by more than sampling error at this M.
    """

    distance: float
    distance_w2: float
    null: np.ndarray
    p_value: float
    n_permutations: int
    seed: int


@serial_blas()
def universality_test(
    blocks_a: Sequence[EDMDcStatistics],
    blocks_b: Sequence[EDMDcStatistics],
    config: EDMDcConfig,
    *,
    n_permutations: int = 200,
    seed: int = 0,
) -> UniversalityResult:
    """Spectral distance between two realisations and a block-permutation null.

    Both models must be lifted by the same (shared, frozen) dictionary protocol so that
    their statistics have the same shapes; the null exchanges whole prompt blocks.
    """
    if len(blocks_a) < 2 or len(blocks_b) < 2:
        raise ValueError("need at least 2 prompt blocks per model.")
    pa, pb = merge_statistics(blocks_a), merge_statistics(blocks_b)
    if (pa.n_features, pa.n_controls) != (pb.n_features, pb.n_controls):
        raise ValueError("the two models' statistics differ in shape; use a shared dictionary.")

    def dist(sa: EDMDcStatistics, sb: EDMDcStatistics) -> tuple[float, float]:
        ea = _spectrum(sa, config, control_basis(sa, config)[0])
        eb = _spectrum(sb, config, control_basis(sb, config)[0])
        return bottleneck_distance(ea, eb), wasserstein_distance(ea, eb, 2)

    d_inf, d2 = dist(pa, pb)
    pool = list(blocks_a) + list(blocks_b)
    na = len(blocks_a)
    rng = np.random.default_rng(seed)
    perms = [rng.permutation(len(pool)) for _ in range(n_permutations)]
    weights = np.zeros((n_permutations, 2, len(pool)), dtype=np.int64)
    for i, perm in enumerate(perms):
        weights[i, 0, perm[:na]] = 1
        weights[i, 1, perm[na:]] = 1
    groups = merge_statistics_many(pool, weights.reshape(-1, len(pool)), with_state=False)
    null = np.empty(n_permutations)
    for i in range(n_permutations):
        null[i] = dist(next(groups), next(groups))[0]
    p = (1 + int(np.sum(null >= d_inf))) / (1 + n_permutations)
    return UniversalityResult(d_inf, d2, null, p, n_permutations, seed)


@dataclass(frozen=True)
class SpectralDistanceTest(Result):
    """Between-model spectral distance against a split-half resampling null.

    ``distance`` is W∞ between the two models' spectra (each fitted on all of its prompt
    blocks); ``null`` holds W∞ between random prompt halves of one model, rescaled to the
    spread expected between two full-size estimates (see :func:`spectral_distance_test`);
    ``p_value = (1 + #{null ≥ distance}) / (1 + n_resamples)``.
    """

    distance: float
    distance_w2: float
    null: np.ndarray
    null_scale: list[float]
    p_value: float
    n_resamples: int
    n_samples: list[int]
    seed: int


def _between_models(
    pooled: Sequence[EDMDcStatistics], config: EDMDcConfig
) -> tuple[list[np.ndarray], list[np.ndarray], list[float]]:
    """Each model's control basis and spectrum from its pooled statistics, and the factor
    that rescales its half-split distances to the spread between two full-size estimates."""
    if pooled[0].n_features != pooled[1].n_features:
        raise ValueError(
            "the two dictionaries have different numbers of features "
            f"({pooled[0].n_features} vs {pooled[1].n_features}); compare spectra of equal size."
        )
    bases = [control_basis(p, config)[0] for p in pooled]
    spectra = [_spectrum(p, config, V) for p, V in zip(pooled, bases, strict=True)]
    m_a, m_b = pooled[0].n, pooled[1].n
    return bases, spectra, [float(np.sqrt((1 / m_a + 1 / m_b) / (4 / p.n))) for p in pooled]


@serial_blas()
def spectral_distance_test(
    blocks_a: Sequence[EDMDcStatistics],
    blocks_b: Sequence[EDMDcStatistics],
    config: EDMDcConfig,
    *,
    n_resamples: int = 200,
    seed: int = 0,
) -> SpectralDistanceTest:
    """Are two models' spectra further apart than sampling error? (no shared basis needed)

    Unlike :func:`universality_test`, each model may be lifted by its own frozen dictionary
    (e.g. PCA-k of its own states, so seed replicas or models of different widths can be
    compared): only the spectra, which do not depend on the basis, are compared, and no
    blocks are exchanged between models.  The null comes from each model's own prompt-level
    halves.  With the M^{-1/2} rate (:func:`split_half_convergence` measures it), an estimate
    from M samples deviates with variance ∝ 1/M, so two halves of model X differ with
    variance ∝ 4/M_X and two full-size estimates of one spectrum with ∝ 1/M_A + 1/M_B; the
    half-split distances are multiplied by ``sqrt((1/M_A + 1/M_B) / (4/M_X))``.  Resamples
    alternate between the two models.  A small p-value says the spectra differ by more than
    the sampling error at these M.
    """
    if len(blocks_a) < 2 or len(blocks_b) < 2:
        raise ValueError("need at least 2 prompt blocks per model.")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}.")
    pooled = [merge_statistics(blocks_a), merge_statistics(blocks_b)]
    bases, (ea, eb), scales = _between_models(pooled, config)
    m_a, m_b = pooled[0].n, pooled[1].n
    rng = np.random.default_rng(seed)
    models = (blocks_a, blocks_b)
    # resample i splits model i % 2; its halves as 0/1 weightings, pooled per model in one pass
    weights: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
    for i in range(n_resamples):
        blocks = models[i % 2]
        perm = rng.permutation(len(blocks))
        half = len(blocks) // 2
        w = np.zeros((2, len(blocks)), dtype=np.int64)
        w[0, perm[:half]] = 1
        w[1, perm[half : 2 * half]] = 1
        weights[i % 2].append(w)
    null = np.empty(n_resamples)
    for which, (blocks, rows) in enumerate(zip(models, weights, strict=True)):
        if not rows:
            continue
        halves = merge_statistics_many(blocks, np.concatenate(rows), with_state=False)
        V = bases[which]
        for i in range(which, n_resamples, 2):
            h1, h2 = next(halves), next(halves)
            null[i] = scales[which] * bottleneck_distance(
                _spectrum(h1, config, V), _spectrum(h2, config, V)
            )
    d_inf = bottleneck_distance(ea, eb)
    p = (1 + int(np.sum(null >= d_inf))) / (1 + n_resamples)
    return SpectralDistanceTest(
        distance=d_inf,
        distance_w2=wasserstein_distance(ea, eb, 2),
        null=null,
        null_scale=scales,
        p_value=p,
        n_resamples=n_resamples,
        n_samples=[int(m_a), int(m_b)],
        seed=seed,
    )


Rows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@serial_blas()
def refit_distance_test(
    rows_a: Rows,
    rows_b: Rows,
    fit_dictionary: Callable[[np.ndarray], Dictionary],
    config: EDMDcConfig,
    *,
    n_blocks: int = 16,
    n_resamples: int = 200,
    seed: int = 0,
) -> SpectralDistanceTest:
    """:func:`spectral_distance_test` for models each lifted by a dictionary fitted on its
    own states, with a null that refits the dictionary on every half.

    ``rows_a`` and ``rows_b`` are ``(X, U, Y, prompt_ids)``; ``fit_dictionary(X)`` returns a
    dictionary fitted on the states ``X``.  Each model's spectrum comes from its dictionary
    fitted on all its rows; a null resample splits one model's prompt blocks into two random
    halves and fits a dictionary on each half's states before the spectra are compared, so the
    null holds what a fitted basis adds to the sampling error (two replicas of one system
    lifted by their own PCA-k keep slightly different subspaces: a frozen basis per model
    leaves that out of the null and reads it as a difference between the models).  The
    half distances are rescaled as in :func:`spectral_distance_test`.
    """
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}.")
    models = [rows_a, rows_b]
    pooled = [_lifted(fit_dictionary(r[0]), r, config) for r in models]
    bases, (ea, eb), scales = _between_models(pooled, config)
    m_a, m_b = pooled[0].n, pooled[1].n
    blocks = [block_assignment(r[3], n_blocks, seed) for r in models]
    if min(len(np.unique(b)) for b in blocks) < 2:
        raise ValueError("need at least 2 prompt blocks per model: give each more prompts.")
    rng = np.random.default_rng(seed)
    null = np.empty(n_resamples)
    for i in range(n_resamples):
        which = i % 2
        perm = rng.permutation(n_blocks)
        spectra = []
        for half in (perm[: n_blocks // 2], perm[n_blocks // 2 : 2 * (n_blocks // 2)]):
            keep = np.isin(blocks[which], half)
            part = tuple(a[keep] for a in models[which])
            stats = _lifted(fit_dictionary(part[0]), part, config)
            spectra.append(_spectrum(stats, config, bases[which]))
        null[i] = scales[which] * bottleneck_distance(*spectra)
    d_inf = bottleneck_distance(ea, eb)
    p = (1 + int(np.sum(null >= d_inf))) / (1 + n_resamples)
    return SpectralDistanceTest(
        distance=d_inf, distance_w2=wasserstein_distance(ea, eb, 2), null=null,
        null_scale=scales, p_value=p, n_resamples=n_resamples, n_samples=[int(m_a), int(m_b)],
        seed=seed,
    )  # fmt: skip


def _lifted(
    dictionary: Dictionary, rows: Sequence[np.ndarray], config: EDMDcConfig
) -> EDMDcStatistics:
    return EDMDc(dictionary, config).statistics(rows[0], rows[1], rows[2])[0]

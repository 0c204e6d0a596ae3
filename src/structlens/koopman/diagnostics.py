"""Diagnostics that keep estimation noise and heavy tails from being read as structure.

**Non-normality with a noise floor.**  An operator estimated from ``M`` samples is
``Â = A + E`` with ``‖E‖ ∝ M^{-1/2}``; even a normal ``A`` gives ``dep_F(Â) > 0``.  Noise adds to
the Henrici departure in quadrature, ``dep_F(Â_M)² ≈ D² + c/M``.  The mean of ``dep²`` over random
prompt halves (``≈ M/2``) and quarters (``≈ M/4``) gives ``c``, and the pooled fit (``M``) the
departure extrapolated to ``M → ∞``: ``D = √max(0, dep_M² − c/M)``.  ``floor = √(c/M)``
is the part of ``dep_M`` that sampling alone produces.  The same function serves full-state
fits (identity dictionary) and truncated ones (PCA-k, any dictionary): it only sees the
statistics.

**Heavy tails.**  The 95th percentile of per-coordinate kurtosis hides a few outlier
dimensions, which dominate second-moment (Gram) estimates.  :func:`tail_statistics` reports
the *maximum* per-coordinate excess kurtosis, the norm kurtosis ``E‖x − μ‖⁴ / (E‖x − μ‖²)²``
(``(d + 2)/d`` for an isotropic Gaussian) and the tails of the per-sample Gram entries
``z_i z_j`` (standardised coordinates; these are what the EDMDc Gram averages), and
:func:`lifting_tails` compares them before and after a dictionary lift.

The maximum of sample kurtoses is not an estimate of the largest population kurtosis: where a
coordinate has no finite eighth moment (Student-t with ν ≤ 8) its sample kurtosis has no
finite variance, and the maximum over hundreds of coordinates lands far above every population
value.  :func:`kurtosis_bounds` therefore bounds each coordinate's kurtosis by a
delete-a-block jackknife over groups of rows (prompts): a few extreme rows that decide a sample
kurtosis also decide its jackknife spread, so they widen the bound instead of lifting it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from structlens.koopman.dictionaries import Dictionary
from structlens.koopman.edmdc import (
    EDMDcConfig,
    EDMDcStatistics,
    control_basis,
    merge_statistics,
    merge_statistics_many,
    state_operator,
)
from structlens.koopman.spectral import non_normality
from structlens.results import Result

__all__ = [
    "HenriciNoiseFloor",
    "henrici_noise_floor",
    "KURTOSIS_ALPHA",
    "KURTOSIS_BLOCKS",
    "kurtosis_bounds",
    "tail_statistics",
    "lifting_tails",
]


@dataclass(frozen=True)
class HenriciNoiseFloor(Result):
    """Henrici departure of the pooled fit, its sampling floor and the extrapolation.

    ``henrici``: ``dep_F(Â)`` on all ``n_samples``; ``henrici_half``: mean over ``n_repeats``
    random prompt halves (``n_samples_half`` rows each on average; quarters are used too);
    ``noise_floor``: the
    sampling part of ``henrici``; ``henrici_extrapolated``: the ``M → ∞`` value (see module
    docstring).  ``*_relative`` divide by ``‖Â‖_F`` of the pooled fit.
    """

    henrici: float
    henrici_half: float
    noise_floor: float
    henrici_extrapolated: float
    henrici_relative: float
    noise_floor_relative: float
    henrici_extrapolated_relative: float
    n_samples: int
    n_samples_half: float
    n_features: int
    n_repeats: int
    seed: int


def henrici_noise_floor(
    blocks: Sequence[EDMDcStatistics],
    config: EDMDcConfig,
    *,
    n_repeats: int = 10,
    seed: int = 0,
) -> HenriciNoiseFloor:
    """Henrici departure with a split-half noise floor from per-prompt-block statistics.

    ``blocks``: e.g. ``EDMDc(dic, cfg).statistics(X, U, Y, prompt_ids, n_blocks=16)``; the
    control basis of the pooled data is shared by every fit.
    """
    K = len(blocks)
    if K < 4:
        raise ValueError(f"need at least 4 prompt blocks for halves and quarters; got {K}.")
    if n_repeats < 1:
        raise ValueError(f"n_repeats must be >= 1, got {n_repeats}.")
    V = control_basis(merge_statistics(blocks), config)[0]
    # every fit shares V: project the blocks once (see split_half_convergence)
    blocks = [b.project_controls(V) for b in blocks]
    V = np.eye(V.shape[1])
    pooled = merge_statistics(blocks)
    A = state_operator(pooled, config, V)
    full = non_normality(A)
    rng = np.random.default_rng(seed)
    dep2: dict[int, list[float]] = {2: [], 4: []}
    sizes: dict[int, list[int]] = {2: [], 4: []}
    # each repeat's two halves and four quarters as 0/1 weightings, pooled in one pass
    weights, split = [], []
    for _ in range(n_repeats):
        perm = rng.permutation(K)
        for parts in (2, 4):
            size = K // parts
            for p in range(parts):
                w = np.zeros(K, dtype=np.int64)
                w[perm[p * size : (p + 1) * size]] = 1
                weights.append(w)
                split.append(parts)
    pieces = merge_statistics_many(blocks, np.stack(weights), with_state=False)
    for parts, h in zip(split, pieces, strict=True):
        dep2[parts].append(non_normality(state_operator(h, config, V)).henrici ** 2)
        sizes[parts].append(h.n)
    M = float(pooled.n)
    Mh, Mq = float(np.mean(sizes[2])), float(np.mean(sizes[4]))
    d2 = full.henrici**2
    c = max(0.0, (np.mean(dep2[4]) - np.mean(dep2[2])) / (1.0 / Mq - 1.0 / Mh))
    floor = float(np.sqrt(c / M))
    extrapolated = float(np.sqrt(max(0.0, d2 - c / M)))
    fro = float(np.linalg.norm(A, "fro")) or 1.0
    return HenriciNoiseFloor(
        henrici=full.henrici,
        henrici_half=float(np.mean(np.sqrt(dep2[2]))),
        noise_floor=floor,
        henrici_extrapolated=extrapolated,
        henrici_relative=full.henrici / fro,
        noise_floor_relative=floor / fro,
        henrici_extrapolated_relative=extrapolated / fro,
        n_samples=int(M),
        n_samples_half=Mh,
        n_features=pooled.n_features,
        n_repeats=n_repeats,
        seed=seed,
    )


def _excess_kurtosis(z: np.ndarray) -> np.ndarray:
    zc = z - z.mean(0)
    z2 = zc * zc  # products, not powers: np.power of a float array is several times slower
    m2 = np.mean(z2, axis=0)
    m4 = np.mean(z2 * z2, axis=0)
    out = np.full(z.shape[1], np.nan)
    live = m2 > 1e-300
    out[live] = m4[live] / m2[live] ** 2 - 3.0
    return out


#: Most blocks of the jackknife of each coordinate's kurtosis (groups of rows dealt into them).
KURTOSIS_BLOCKS = 32
#: Level of the kurtosis bounds: the lower bounds at ``KURTOSIS_ALPHA / d`` per coordinate
#: (Bonferroni: "some coordinate is above" holds at ``KURTOSIS_ALPHA`` over the family), the
#: upper bounds at ``KURTOSIS_ALPHA`` per coordinate ("every coordinate is below" is an
#: intersection of claims, each tested at the level of the whole).
KURTOSIS_ALPHA = 0.05


def kurtosis_bounds(
    X: np.ndarray,
    groups: np.ndarray | None = None,
    *,
    blocks: int = KURTOSIS_BLOCKS,
    alpha: float = KURTOSIS_ALPHA,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each coordinate's excess kurtosis with one-sided confidence bounds.

    The rows of ``X`` ``(m, d)`` are dealt into ``B = min(blocks, G)`` blocks by their
    ``groups`` (``G`` distinct labels, e.g. prompt ids; ``None``: every row its own group),
    the groups in a ``seed``-ed random order; the sample kurtosis is recomputed without each
    block from per-block power sums (:func:`~structlens.stats.intervals.group_jackknife`),
    and the bounds are the bias-corrected estimate ∓ ``t_{B−1}`` quantile × its standard error.

    Returns
    -------
    estimate, lower, upper : arrays ``[d]``
        The bias-corrected kurtosis, its lower bound at one-sided level ``alpha / d`` and its
        upper bound at one-sided level ``alpha`` (see :data:`KURTOSIS_ALPHA`).  NaN for a
        constant coordinate, and the bounds NaN with fewer than 2 groups.
    """
    from scipy.stats import t as student_t

    from structlens.stats.intervals import group_jackknife

    x = np.asarray(X, dtype=np.float64)
    m, d = x.shape
    labels = np.arange(m) if groups is None else np.asarray(groups)
    if labels.shape != (m,):
        raise ValueError(f"groups must hold one label per row ({m}); got shape {labels.shape}.")
    if blocks < 2 or not 0 < alpha < 1:
        raise ValueError(f"blocks must be >= 2 and alpha in (0, 1); got {blocks}, {alpha}.")
    uniq, inverse = np.unique(labels, return_inverse=True)
    b = max(1, min(blocks, len(uniq)))
    order = np.random.default_rng(seed).permutation(len(uniq))
    block = np.empty(len(uniq), dtype=np.intp)
    block[order] = np.arange(len(uniq)) % b
    onehot = np.zeros((b, m))
    onehot[block[inverse], np.arange(m)] = 1.0
    xc = x - x.mean(0)  # centred once, so that the moments below cancel little
    x2 = xc * xc
    # power sums per block, [b, 5, d]: the count, then Σx, Σx², Σx³, Σx⁴
    powers = (xc, x2, x2 * xc, x2 * x2)
    sums = np.stack(
        [np.repeat(onehot.sum(1, keepdims=True), d, 1), *(onehot @ xp for xp in powers)], axis=1
    )
    total = sums.sum(0)
    if b < 2:
        nan = np.full(d, np.nan)
        return _kurtosis_of(total), nan, nan.copy()
    jk = group_jackknife(_kurtosis_of(total), np.stack([_kurtosis_of(total - s) for s in sums]))
    q_low = float(student_t.ppf(1 - alpha / d, b - 1))
    q_up = float(student_t.ppf(1 - alpha, b - 1))
    return jk.bias_corrected, jk.bias_corrected - q_low * jk.se, jk.bias_corrected + q_up * jk.se


def _kurtosis_of(s: np.ndarray) -> np.ndarray:
    """Excess kurtosis from power sums ``s`` ``[5, d]`` (count, Σx, Σx², Σx³, Σx⁴)."""
    n = s[0]
    mu, e2, e3, e4 = s[1] / n, s[2] / n, s[3] / n, s[4] / n
    m2 = e2 - mu**2
    m4 = e4 - 4 * mu * e3 + 6 * mu**2 * e2 - 3 * mu**4
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(m2 > 1e-300, m4 / m2**2 - 3.0, np.nan)


def tail_statistics(
    X: np.ndarray, groups: np.ndarray | None = None, *, max_coords: int = 64, seed: int = 0
) -> dict[str, float]:
    """Heavy-tail numbers of the rows of ``X`` ``(m, d)`` (see the module docstring).

    Returns ``max_excess_kurtosis`` (and ``argmax``), ``p95_excess_kurtosis``,
    ``norm_kurtosis``, ``norm_kurtosis_gaussian`` (``(d + 2)/d``, the isotropic-Gaussian
    reference); from :func:`kurtosis_bounds` over ``groups`` of rows (prompt ids; ``None``:
    rows), ``max_kurtosis_lower`` (the largest lower bound: some coordinate's kurtosis is
    above it, at level :data:`KURTOSIS_ALPHA` over the coordinates), ``max_kurtosis_upper``
    (the largest upper bound: every coordinate's kurtosis is below it) and
    ``kurtosis_blocks``; and, over the products ``z_i z_j`` (i < j) of at most
    ``max_coords`` standardised coordinates (the highest-kurtosis coordinate always
    included, the rest a seeded sample), ``gram_max_excess_kurtosis``,
    ``gram_p95_excess_kurtosis`` and ``gram_tail_ratio`` = 99.9th percentile of
    ``|z_i z_j|`` over its mean (pooled).  Constant coordinates are ignored.
    """
    x = np.asarray(X, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 4:
        raise ValueError(f"X must be (m, d) with m >= 4 rows; got shape {x.shape}.")
    kurt = _excess_kurtosis(x)
    live = np.flatnonzero(np.isfinite(kurt))
    if live.size == 0:
        raise ValueError("every coordinate of X is constant; no tails to measure.")
    _, lower, upper = kurtosis_bounds(x[:, live], groups, seed=seed)
    xc = x - x.mean(0)
    r2 = np.sum(xc**2, axis=1)
    d = int(live.size)
    n_groups = x.shape[0] if groups is None else len(np.unique(groups))
    out = {
        "max_excess_kurtosis": float(np.nanmax(kurt)),
        "argmax_excess_kurtosis": int(np.nanargmax(kurt)),
        "p95_excess_kurtosis": float(np.nanpercentile(kurt, 95)),
        "max_kurtosis_lower": float(np.max(lower)),
        "max_kurtosis_upper": float(np.max(upper)),
        "kurtosis_blocks": min(KURTOSIS_BLOCKS, n_groups),
        "norm_kurtosis": float(np.mean(r2**2) / np.mean(r2) ** 2),
        "norm_kurtosis_gaussian": (d + 2) / d,
    }
    rng = np.random.default_rng(seed)
    top = int(np.nanargmax(kurt))
    rest = rng.permutation(live[live != top])[: max(0, max_coords - 1)]
    cols = np.r_[top, rest]
    if cols.size < 2:
        return out | {
            "gram_max_excess_kurtosis": float("nan"),
            "gram_p95_excess_kurtosis": float("nan"),
            "gram_tail_ratio": float("nan"),
        }
    z = xc[:, cols] / np.sqrt(np.mean(xc[:, cols] ** 2, axis=0))
    iu, ju = np.triu_indices(cols.size, 1)
    prods = z[:, iu] * z[:, ju]
    gk = _excess_kurtosis(prods)
    a = np.abs(prods)
    out |= {
        "gram_max_excess_kurtosis": float(np.nanmax(gk)),
        "gram_p95_excess_kurtosis": float(np.nanpercentile(gk, 95)),
        "gram_tail_ratio": float(np.percentile(a, 99.9) / a.mean()),
    }
    return out


def lifting_tails(
    X: np.ndarray,
    dictionary: Dictionary,
    groups: np.ndarray | None = None,
    *,
    max_coords: int = 64,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """:func:`tail_statistics` of the states ``X`` and of their lift ``Ψ(X)`` (``dictionary``
    fitted), rows grouped by ``groups``, as ``{"state": ..., "lifted": ...}``."""
    return {
        "state": tail_statistics(X, groups, max_coords=max_coords, seed=seed),
        "lifted": tail_statistics(
            dictionary.transform(X), groups, max_coords=max_coords, seed=seed
        ),
    }

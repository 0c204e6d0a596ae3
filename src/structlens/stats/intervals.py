"""Every confidence interval of the project: Wilson, bootstrap (percentile, BCa, paired, cluster),
jackknife (delete-one and delete-a-group, normal or t), McNemar's exact paired test and its
clustered version.

Conventions: ``confidence`` is the two-sided coverage in (0, 1); intervals are returned as
``(low, high)`` floats (arrays for vector statistics).  Bootstrap resampling draws the rows of
the data with replacement, all resamples at once as ``rng.integers(0, n, (n_boot, n))``, so a
given ``seed`` (or ``numpy.random.Generator``) always gives the same resamples; the paired
bootstrap uses the same rows for every array, so differences between methods keep their
pairing.  Percentile intervals use NumPy's default (linear) quantiles.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal

import numpy as np

from structlens.errors import InputError
from structlens.stats.lanes import lane_budget, run_in_lanes

__all__ = [
    "JackknifeResult",
    "bootstrap_distribution",
    "bootstrap_interval",
    "cluster_bootstrap_ratio_interval",
    "group_jackknife",
    "bias_corrected_jackknife",
    "jackknife",
    "leave_one_group_out_means",
    "mcnemar_exact",
    "clustered_mcnemar",
    "sign_flip_exact",
    "paired_bootstrap_interval",
    "percentile_interval",
    "t_interval",
    "wilson_interval",
]

Statistic = Callable[..., Any]


def _check_confidence(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}.")
    return float(confidence)


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + _check_confidence(confidence) / 2.0)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``successes / n`` (sensible at 0 and n).

    Examples
    --------
    >>> lo, hi = wilson_interval(0, 10)
    >>> lo, round(hi, 4)
    (0.0, 0.2775)
    """
    if n < 1:
        raise ValueError(f"a proportion needs at least one trial, got n={n}.")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie in [0, {n}], got {successes}.")
    z = _z(confidence)
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # the exact bounds at 0 and n successes are 0 and 1; the formula misses them by rounding
    lo = 0.0 if successes == 0 else float(max(0.0, centre - half))
    hi = 1.0 if successes == n else float(min(1.0, centre + half))
    return lo, hi


def t_interval(values: Any, confidence: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean, ``mean ± t_{n−1} · s / sqrt(n)`` (``s`` with ddof 1)."""
    from scipy import stats

    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size < 2:
        raise ValueError(f"a t interval needs at least 2 values, got {v.size}.")
    mean = float(v.mean())
    half = (
        float(stats.t.ppf(0.5 + _check_confidence(confidence) / 2, v.size - 1))
        * float(v.std(ddof=1))
        / np.sqrt(v.size)
    )
    return mean - half, mean + half


def percentile_interval(samples: Any, confidence: float = 0.95) -> tuple[Any, Any]:
    """Percentile interval of bootstrap ``samples`` (axis 0); non-finite samples are dropped.

    Returns floats for 1-D samples, arrays (one interval per column) otherwise.
    """
    a = (1.0 - _check_confidence(confidence)) / 2.0
    s = np.asarray(samples, dtype=np.float64)
    if s.ndim == 1:
        s = s[np.isfinite(s)]
        if s.size == 0:
            raise ValueError("no finite bootstrap samples: the statistic failed on every resample.")
        return float(np.quantile(s, a)), float(np.quantile(s, 1.0 - a))
    lo = np.nanquantile(np.where(np.isfinite(s), s, np.nan), a, axis=0)
    hi = np.nanquantile(np.where(np.isfinite(s), s, np.nan), 1.0 - a, axis=0)
    return lo, hi


def _as_tuple(data: Any) -> tuple[np.ndarray, ...]:
    arrays = tuple(np.asarray(d) for d in data) if isinstance(data, tuple) else (np.asarray(data),)
    n = arrays[0].shape[0] if arrays[0].ndim else 0
    if n < 2:
        raise ValueError(f"resampling needs at least 2 rows, got {n}.")
    if any(a.shape[0] != n for a in arrays):
        raise ValueError(
            f"paired arrays must have the same number of rows, got {[a.shape[0] for a in arrays]}."
        )
    return arrays


def bootstrap_distribution(
    data: Any,
    statistic: Statistic = np.mean,
    *,
    n_boot: int = 2000,
    seed: int | np.random.Generator = 0,
    vectorized: bool = True,
) -> np.ndarray:
    """The statistic on ``n_boot`` row resamples of ``data``, stacked along axis 0.

    ``data`` is an array (rows = independent units) or a tuple of arrays with the same rows
    (resampled together: a paired bootstrap).  With ``vectorized=True`` the statistic is
    called once as ``statistic(*resampled, axis=1)`` on ``[n_boot, n, ...]`` stacks (NumPy
    reductions such as ``np.mean`` qualify); otherwise once per resample.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot must be positive, got {n_boot}.")
    arrays = _as_tuple(data)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arrays[0].shape[0], size=(n_boot, arrays[0].shape[0]))
    if vectorized:
        return np.asarray(statistic(*(a[idx] for a in arrays), axis=1), dtype=np.float64)
    return np.array([statistic(*(a[i] for a in arrays)) for i in idx], dtype=np.float64)


def bootstrap_interval(
    data: Any,
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int | np.random.Generator = 0,
    *,
    statistic: Statistic = np.mean,
    method: Literal["percentile", "bca"] = "percentile",
    vectorized: bool = True,
) -> tuple[Any, Any]:
    """Bootstrap interval of ``statistic`` (default: the mean) over the rows of ``data``.

    ``method="percentile"`` takes quantiles of the bootstrap distribution; ``"bca"`` corrects
    them for bias and skewness (Efron 1987), with the acceleration from the jackknife.
    See :func:`bootstrap_distribution` for ``data``, ``statistic`` and ``vectorized``.
    """
    _check_confidence(confidence)
    boot = bootstrap_distribution(data, statistic, n_boot=n_boot, seed=seed, vectorized=vectorized)
    if method == "percentile":
        return percentile_interval(boot, confidence)
    if method != "bca":
        raise ValueError(f"method must be 'percentile' or 'bca', got {method!r}.")
    arrays = _as_tuple(data)
    theta = _evaluate(statistic, arrays, vectorized)
    loo = _leave_one_out(statistic, arrays, vectorized)
    # bias correction: the share of resamples below the estimate (ties count half)
    below = np.mean(boot < theta, axis=0) + 0.5 * np.mean(boot == theta, axis=0)
    norm = NormalDist()
    z0 = np.vectorize(lambda p: norm.inv_cdf(min(max(p, 1e-12), 1 - 1e-12)))(below)
    d = loo.mean(axis=0) - loo
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.sum(d**3, axis=0) / (6.0 * np.sum(d**2, axis=0) ** 1.5)
    acc = np.nan_to_num(acc)
    zq = _z(confidence)
    ends = []
    for z in (-zq, zq):
        q = np.vectorize(norm.cdf)(z0 + (z0 + z) / (1.0 - acc * (z0 + z)))
        ends.append(
            np.array([np.quantile(boot[:, j], q.flat[j]) for j in range(q.size)]).reshape(q.shape)
            if boot.ndim > 1
            else float(np.quantile(boot, float(q)))
        )
    return ends[0], ends[1]


def paired_bootstrap_interval(
    a: Any,
    b: Any,
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int | np.random.Generator = 0,
    *,
    statistic: Statistic | None = None,
    method: Literal["percentile", "bca"] = "percentile",
) -> tuple[Any, Any]:
    """Bootstrap interval of a paired comparison: rows of ``a`` and ``b`` are resampled together.

    The default statistic is the mean difference ``mean(a) − mean(b)``.
    """
    stat = statistic or (lambda x, y, axis=0: np.mean(x, axis=axis) - np.mean(y, axis=axis))
    return bootstrap_interval(
        (a, b), confidence, n_boot, seed, statistic=stat, method=method, vectorized=True
    )


def _evaluate(statistic: Statistic, arrays: Sequence[np.ndarray], vectorized: bool) -> Any:
    if vectorized:
        return np.asarray(statistic(*(a[None] for a in arrays), axis=1), dtype=np.float64)[0]
    return np.asarray(statistic(*arrays), dtype=np.float64)


def _leave_one_out(statistic: Statistic, arrays: Sequence[np.ndarray], vectorized: bool) -> Any:
    n = arrays[0].shape[0]
    keep = ~np.eye(n, dtype=bool)
    rows = [np.flatnonzero(k) for k in keep]
    if vectorized:
        idx = np.stack(rows)
        return np.asarray(statistic(*(a[idx] for a in arrays), axis=1), dtype=np.float64)
    return np.array([statistic(*(a[r] for a in arrays)) for r in rows], dtype=np.float64)


@dataclass(frozen=True)
class JackknifeResult:
    """Jackknife estimates of a statistic from ``n`` leave-one-out (or leave-one-group-out)
    replicates ``θ_(i)``.

    ``estimate`` is the statistic on all data; ``bias = (n − 1)(mean_i θ_(i) − estimate)``;
    ``bias_corrected = n·estimate − (n − 1)·mean_i θ_(i)`` (``= estimate − bias``);
    ``se = sqrt((n − 1)/n · Σ (θ_(i) − c)²)`` with ``c`` the mean of the replicates (or the
    estimate, see :func:`group_jackknife`).  Vector statistics give arrays, one entry each.
    """

    estimate: Any
    bias: Any
    bias_corrected: Any
    se: Any
    n: int

    def interval(
        self,
        confidence: float = 0.95,
        *,
        distribution: Literal["normal", "t"] = "normal",
        centre: Literal["bias_corrected", "estimate"] = "bias_corrected",
    ) -> tuple[Any, Any]:
        """Interval ``centre ± q·se``.

        ``q`` is the standard normal quantile, or with ``distribution="t"`` Student's t with
        ``n − 1`` degrees of freedom (the interval to use with few replicates, e.g. a handful of
        groups).  ``centre`` is the bias-corrected estimate (default) or the plain one.
        """
        if distribution == "normal":
            q = _z(confidence)
        elif distribution == "t":
            from scipy.stats import t as student_t

            # (1 + c)/2, not 0.5 + c/2: the same float the t intervals of causal_dim and
            # koopman.convergence used before they were routed here
            q = float(student_t.ppf((1 + _check_confidence(confidence)) / 2, self.n - 1))
        else:
            raise InputError(f"distribution must be 'normal' or 't', got {distribution!r}.")
        if centre not in ("bias_corrected", "estimate"):
            raise InputError(f"centre must be 'bias_corrected' or 'estimate', got {centre!r}.")
        mid = self.bias_corrected if centre == "bias_corrected" else self.estimate
        half = q * self.se
        return mid - half, mid + half


def group_jackknife(
    estimate: Any, replicates: Any, *, about: Literal["mean", "estimate"] = "mean"
) -> JackknifeResult:
    """Delete-a-group jackknife from the statistic on all data and on the data without each group.

    The data are split into ``G`` groups (single rows give the ordinary delete-one jackknife);
    ``replicates[g]`` (axis 0) is the statistic recomputed without group ``g``.  The groups
    should be of about equal size and exchangeable (e.g. dealt at random or round-robin);
    the caller computes the replicates, so the statistic may be anything that can be
    recomputed without a group (a function of pooled sums, a whole fitted curve).

    Parameters
    ----------
    estimate : float or array
        The statistic on all data.
    replicates : array ``[G, ...]``
        The statistic without each group, ``G ≥ 2``.
    about : {"mean", "estimate"}
        Centre of the squared deviations in ``se``: the replicates' mean (the usual
        jackknife) or the full-data estimate (never smaller; Wolter's second form).

    Examples
    --------
    For the mean the standard error is exactly the classical ``s / sqrt(n)``:

    >>> x = np.array([1.0, 2.0, 3.0, 4.0])
    >>> loo = (x.sum() - x) / 3  # the mean without each row
    >>> r = group_jackknife(x.mean(), loo)
    >>> round(float(r.se), 6), round(float(x.std(ddof=1) / 2), 6)
    (0.645497, 0.645497)
    >>> [round(float(v), 4) for v in r.interval(0.95, distribution="t")]
    [0.4457, 4.5543]
    """
    theta = np.asarray(estimate, dtype=np.float64)
    reps = np.asarray(replicates, dtype=np.float64)
    if reps.ndim == 0 or reps.shape[0] < 2:
        raise InputError(
            f"a jackknife needs replicates for at least 2 groups, got shape {reps.shape}."
        )
    if reps.shape[1:] != theta.shape:
        raise InputError(
            f"replicates have shape {reps.shape[1:]} per group but the estimate {theta.shape}."
        )
    if about not in ("mean", "estimate"):
        raise InputError(f"about must be 'mean' or 'estimate', got {about!r}.")
    g = reps.shape[0]
    mean = reps.mean(axis=0)
    centre = mean if about == "mean" else theta
    se = np.sqrt((g - 1) / g * np.sum((reps - centre) ** 2, axis=0))
    return JackknifeResult(
        estimate=theta,
        bias=(g - 1) * (mean - theta),
        bias_corrected=g * theta - (g - 1) * mean,
        se=se,
        n=g,
    )


def bias_corrected_jackknife(
    sums: Any, counts: Any, statistic: Statistic, *, max_blocks: int = 32
) -> JackknifeResult:
    """The bias-corrected delete-a-group jackknife of a statistic of the pooled mean, with the
        standard error of that bias-corrected estimate.

        ``statistic(mean)`` is evaluated on the pooled mean ``Σ_g S_g / Σ_g n_g`` and on the mean
        without each group (:func:`leave_one_group_out_means`), as :func:`group_jackknife` takes
        them; that jackknife's ``se`` is the spread of the plain estimate, but the bias-corrected
        one ``G·θ̂ − (G − 1)·mean θ̂_(g)`` varies more (its correction is itself estimated).  Here
        ``se`` jackknifes the bias-corrected estimate: it is recomputed, correction included,
        without each of ``B = min(G, max_blocks)`` blocks of groups (consecutive runs of groups in
        their order; the cost is about ``B·G`` evaluations, the ``B`` replicates shared between
    :func:`~structlens.stats.lanes.run_in_lanes` lanes), so an interval centred on it
        (:meth:`JackknifeResult.interval`, t with ``B − 1`` degrees of freedom) has the width of
        the estimate it is centred on.

        Parameters
        ----------
        sums : array ``[G, ...]``
            The sum of the rows of each group (e.g. of per-vector Grams); every group non-empty.
        counts : array ``[G]``
            The rows in each group; at least 3 groups.
        statistic : callable
            Maps a mean row to a float or an array.
        max_blocks : int
            Most blocks of the outer jackknife.

        Returns
        -------
        JackknifeResult
            ``estimate`` the statistic of the pooled mean, ``bias`` and ``bias_corrected`` those
            of the delete-a-group jackknife, ``se`` the bias-corrected estimate's, ``n`` the
            blocks.

        Examples
        --------
        For the mean itself there is no bias and ``se`` is the classical ``s / sqrt(n)``:

        >>> x = np.array([1.0, 2.0, 3.0, 4.0, 6.0])
        >>> r = bias_corrected_jackknife(x, np.ones(5), lambda m: m)
        >>> classical = float(x.std(ddof=1)) / 5**0.5
        >>> round(float(r.bias_corrected), 6), round(float(r.se), 6), round(classical, 6)
        (3.2, 0.860233, 0.860233)
    """
    s_all = np.asarray(sums, dtype=np.float64)
    c_all = np.asarray(counts, dtype=np.float64)
    if c_all.ndim != 1 or len(c_all) != len(s_all):
        raise InputError(f"counts must hold one count per group of sums ({len(s_all)} groups).")
    if np.any(c_all <= 0):
        raise InputError("every group needs at least one row; drop the empty ones.")
    g = len(c_all)
    if g < 3:
        raise InputError(f"a jackknife of a bias-corrected estimate needs 3 groups, got {g}.")
    if max_blocks < 2:
        raise InputError(f"max_blocks must be >= 2, got {max_blocks}.")

    def corrected(keep: np.ndarray) -> tuple[Any, Any, Any]:
        s, c = s_all[keep], c_all[keep]
        total, n, m = s.sum(0), c.sum(), len(c)
        theta = np.asarray(statistic(total / n), dtype=np.float64)
        # one mean without group j at a time: G of them at once would be G copies of a row
        loo = np.mean([np.asarray(statistic((total - s[j]) / (n - c[j]))) for j in range(m)], 0)
        return theta, (m - 1) * (loo - theta), m * theta - (m - 1) * loo

    theta, bias, point = corrected(np.ones(g, dtype=bool))
    b = min(g, max_blocks)
    block = np.arange(g) * b // g

    # the B replicates are independent problems: one run of them per lane (each on one BLAS
    # thread), concatenated in block order, so the result does not depend on the lanes
    def replicates(blocks: np.ndarray) -> list[Any]:
        return [corrected(block != h)[2] for h in blocks]

    runs = np.array_split(np.arange(b), min(lane_budget(), b))
    parts = run_in_lanes([functools.partial(replicates, hs) for hs in runs])
    reps = np.stack([rep for part in parts for rep in part])
    se = np.sqrt((b - 1) / b * np.sum((reps - reps.mean(0)) ** 2, axis=0))
    return JackknifeResult(estimate=theta, bias=bias, bias_corrected=point, se=se, n=b)


def leave_one_group_out_means(sums: Any, counts: Any) -> list[Any]:
    """The mean without each filled group, ``(Σ_g S_g − S_h) / (Σ_g n_g − n_h)``: the
    replicates of :func:`group_jackknife` for a statistic of a pooled mean.

    ``sums`` ``[G, ...]`` are per-group sums and ``counts`` ``[G]`` per-group numbers of rows,
    NumPy arrays or torch tensors alike (the replicates come back as the same type).  Groups
    with no rows are skipped; the list is empty when fewer than 2 groups have rows.

    Examples
    --------
    >>> sums, counts = np.array([3.0, 0.0, 7.0]), np.array([1, 0, 2])  # group 1 is empty
    >>> [float(m) for m in leave_one_group_out_means(sums, counts)]
    [3.5, 3.0]
    """
    filled = [g for g in range(len(counts)) if counts[g] > 0]
    if len(filled) < 2:
        return []
    total, n = sums.sum(0), counts.sum()
    return [(total - sums[g]) / (n - counts[g]) for g in filled]


def jackknife(
    data: Any, statistic: Statistic = np.mean, *, vectorized: bool = True
) -> JackknifeResult:
    """Jackknife bias and standard error of ``statistic`` over the rows of ``data``.

    The delete-one case of :func:`group_jackknife`.  For the mean the standard error equals
    the classical ``s / sqrt(n)`` (``s`` with ddof 1).

    Examples
    --------
    >>> r = jackknife(np.array([1.0, 2.0, 3.0, 4.0]))
    >>> float(r.estimate), float(r.bias), round(float(r.se), 6)
    (2.5, 0.0, 0.645497)
    """
    arrays = _as_tuple(data)
    return group_jackknife(
        _evaluate(statistic, arrays, vectorized), _leave_one_out(statistic, arrays, vectorized)
    )


def sign_flip_exact(differences: Sequence[int] | np.ndarray) -> float:
    """Exact two-sided sign-flip test that integer cluster differences are centred on zero.

    Each cluster ``L`` (e.g. the heads of one layer) contributes ``d_L = b_L − c_L``, its
    discordant units favouring condition 1 minus those favouring condition 2.  Under the null
    of exchangeable conditions within every unit, each cluster's ``d_L`` is as likely as
    ``−d_L`` whatever the dependence among its units, so the p-value is the share of the
    ``2^k`` sign patterns whose ``|Σ ± d_L|`` reaches the observed ``|Σ d_L|``, computed exactly
    by convolving the clusters' two-point distributions.  With one unit per cluster it is
    :func:`mcnemar_exact` (two-sided).

    Examples
    --------
    >>> round(sign_flip_exact([1] * 9 + [-1]), 5) == round(mcnemar_exact(9, 1), 5)
    True
    >>> sign_flip_exact([3, 3])  # two layers of three heads: 2 of the 4 patterns reach 6
    0.5
    >>> sign_flip_exact([0, 0])
    1.0
    """
    d = np.asarray(differences)
    if d.ndim != 1 or not np.issubdtype(d.dtype, np.integer):
        raise InputError(f"differences must be a 1-D sequence of integers, got {d!r}.")
    d = np.abs(d[d != 0]).astype(np.int64)
    if d.size == 0:
        return 1.0
    total = int(d.sum())
    # probability of each signed sum -total..total, one cluster at a time
    pmf = np.zeros(2 * total + 1)
    pmf[total] = 1.0
    for v in d:
        pmf = 0.5 * (np.roll(pmf, int(v)) + np.roll(pmf, -int(v)))
    observed = abs(int(np.sum(differences)))
    sums = np.abs(np.arange(-total, total + 1))
    return float(min(1.0, pmf[sums >= observed].sum()))


def mcnemar_exact(
    b: int, c: int, alternative: Literal["two-sided", "greater", "less"] = "two-sided"
) -> float:
    """Exact McNemar test on the discordant pairs of a paired binary comparison.

    Of ``b + c`` discordant units, ``b`` succeed under condition 1 only and ``c`` under
    condition 2 only; under the null of equal success rates ``b ~ Binomial(b + c, 1/2)``
    given ``b + c``.  Concordant units carry no information on the difference and do not
    enter.  The test is exact, so its size is at most the nominal level for any number of
    discordant pairs (a chi-square McNemar is not at small ``b + c``).

    Parameters
    ----------
    b, c : int
        Discordant counts (non-negative).
    alternative : {"two-sided", "greater", "less"}
        ``"greater"``: condition 1 succeeds more often (``P(X >= b)``); ``"less"``:
        ``P(X <= b)``; ``"two-sided"``: ``min(1, 2 · P(X <= min(b, c)))``, which for the
        symmetric binomial equals :func:`scipy.stats.binomtest`'s two-sided p-value.

    Returns
    -------
    float
        The p-value; 1 when there is no discordant pair.

    Examples
    --------
    >>> round(mcnemar_exact(9, 1), 5)  # 2 · (1 + 10) / 2**10
    0.02148
    >>> mcnemar_exact(0, 0)
    1.0
    """
    from scipy.stats import binom

    b, c = int(b), int(c)
    if b < 0 or c < 0:
        raise InputError(f"discordant counts must be non-negative, got b={b}, c={c}.")
    n = b + c
    if n == 0:
        return 1.0
    if alternative == "greater":
        return float(binom.sf(b - 1, n, 0.5))
    if alternative == "less":
        return float(binom.cdf(b, n, 0.5))
    if alternative != "two-sided":
        raise InputError(
            f"alternative must be 'two-sided', 'greater' or 'less', got {alternative!r}."
        )
    return float(min(1.0, 2.0 * binom.cdf(min(b, c), n, 0.5)))


def clustered_mcnemar(
    partner_only: Sequence[int] | np.ndarray, null_only: Sequence[int] | np.ndarray
) -> tuple[float, float]:
    """McNemar's test for clustered matched pairs, with a small-sample correction.

    Cluster ``L`` (e.g. the heads of one layer) holds ``b_L`` units that succeed under
    condition 1 only and ``c_L`` under condition 2 only; its units may share their fate.
    The statistic is Durkalski et al.'s (2003), the variance of ``Σ (b_L − c_L)`` estimated
    over clusters::

        X² = (Σ_L d_L)² / Σ_L d_L²,    d_L = b_L − c_L,

    which is McNemar's ``(b − c)² / (b + c)`` when every cluster holds one unit, and McNemar's
    statistic divided by the estimated design effect ``Σ d_L² / (b + c)`` otherwise.  Its
    χ²₁ reference (Obuchowski 1998; Durkalski et al. 2003) needs many clusters, and
    ``X² ≤ K`` with ``K`` clusters (concordant ones included), so at a handful of layers it
    can hardly reject.
    The p-value instead refers ``t² = (K − 1) X² / (K − X²)`` to Student's t with ``K − 1``
    degrees of freedom: ``t`` is the one-sample t statistic of the ``d_L`` against 0, the
    usual small-sample form of a variance estimated from ``K`` clusters.  When the clusters
    show no spread (every ``d_L`` equal, ``X² = K``) the variance cannot be estimated and the
    exact sign-flip test over the clusters decides (:func:`sign_flip_exact`).

    Parameters
    ----------
    partner_only, null_only : sequence of int
        ``b_L`` and ``c_L`` per cluster (non-negative), in the same order.

    Returns
    -------
    statistic : float
        ``X²`` (0 without discordant units).
    p_value : float
        Two-sided; 1 without discordant units or with fewer than 2 clusters.

    Notes
    -----
    No test holds its level under every within-cluster dependence with few clusters: given
    the clusters' ``|d_L|`` the signs are uniform under the null, so a null that fixes the
    ``|d_L|`` gives any rule that ever rejects a rate of at least ``2^-K`` (one-sided).
    The t reference is what makes the test usable at ``K = 4`` layers; its level there rests
    on the ``d_L`` varying between clusters as sums of a few units do.

    Examples
    --------
    One head per cluster: the statistic is McNemar's.

    >>> b, c = [1] * 9 + [0], [0] * 9 + [1]
    >>> stat, p = clustered_mcnemar(b, c)
    >>> round(stat, 6), round((9 - 1) ** 2 / (9 + 1), 6)
    (6.4, 6.4)
    """
    b = np.asarray(partner_only)
    c = np.asarray(null_only)
    for name, v in (("partner_only", b), ("null_only", c)):
        if v.ndim != 1 or not np.issubdtype(v.dtype, np.integer) or np.any(v < 0):
            raise InputError(f"{name} must be a 1-D sequence of non-negative integers, got {v!r}.")
    if b.shape != c.shape:
        raise InputError(f"partner_only has {b.size} clusters, null_only {c.size}.")
    # every cluster counts, concordant ones too: K is the number of independent units
    d = (b - c).astype(np.int64)
    q = float(np.sum(d.astype(np.float64) ** 2))
    if q == 0:
        return 0.0, 1.0
    k = int(d.size)
    stat = float(np.sum(d)) ** 2 / q
    if k < 2:
        return stat, 1.0
    if np.all(d == d[0]):
        return stat, sign_flip_exact(d)
    from scipy.stats import t as student_t

    t2 = (k - 1) * stat / (k - stat)
    return stat, float(min(1.0, 2.0 * student_t.sf(np.sqrt(t2), k - 1)))


def cluster_bootstrap_ratio_interval(
    successes: Any,
    totals: Any,
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int | np.random.Generator = 0,
) -> tuple[float, float]:
    """Percentile interval of a pooled rate ``Σ k_g / Σ n_g`` resampling whole clusters.

    Units inside one cluster (the heads of one model pair, the tokens of one prompt) are
    not independent, so pooling them as if they were gives an interval as narrow as the
    number of units allows, not as the number of independent clusters does.  Resampling
    clusters with replacement keeps every within-cluster dependence.  With few clusters
    the percentile interval is itself too narrow (with ``G`` clusters it takes at most
    ``C(2G − 1, G)`` values); report ``G`` next to it.

    Parameters
    ----------
    successes, totals : array_like [G]
        Per-cluster numerator ``k_g`` and denominator ``n_g > 0``; ``G ≥ 2``.
    confidence, n_boot, seed
        As for :func:`bootstrap_interval`.

    Examples
    --------
    >>> cluster_bootstrap_ratio_interval([5, 5], [10, 10])  # equal clusters: no spread
    (0.5, 0.5)
    """
    k = np.asarray(successes, dtype=np.float64).ravel()
    n = np.asarray(totals, dtype=np.float64).ravel()
    if k.shape != n.shape:
        raise InputError(f"successes ({k.size}) and totals ({n.size}) must align per cluster.")
    if k.size < 2:
        raise InputError(f"a cluster bootstrap needs at least 2 clusters, got {k.size}.")
    if np.any(n <= 0) or np.any(k < 0) or np.any(k > n):
        raise InputError("every cluster needs totals > 0 and 0 <= successes <= totals.")
    if n_boot < 1:
        raise InputError(f"n_boot must be positive, got {n_boot}.")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, k.size, size=(n_boot, k.size))
    lo, hi = percentile_interval(k[idx].sum(1) / n[idx].sum(1), confidence)
    return float(lo), float(hi)

"""Every confidence interval of the project: Wilson, bootstrap (percentile, BCa, paired), jackknife.

Conventions: ``confidence`` is the two-sided coverage in (0, 1); intervals are returned as
``(low, high)`` floats (arrays for vector statistics).  Bootstrap resampling draws the rows of
the data with replacement, all resamples at once as ``rng.integers(0, n, (n_boot, n))``, so a
given ``seed`` (or ``numpy.random.Generator``) always gives the same resamples; the paired
bootstrap uses the same rows for every array, so differences between methods keep their
pairing.  Percentile intervals use NumPy's default (linear) quantiles.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal

import numpy as np

__all__ = [
    "JackknifeResult",
    "bootstrap_distribution",
    "bootstrap_interval",
    "jackknife",
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
    """Leave-one-out (jackknife) estimates of a statistic.

    ``estimate`` is the statistic on all rows; ``bias = (n − 1)(mean_loo − estimate)``;
    ``bias_corrected = estimate − bias``; ``se = sqrt((n − 1)/n · Σ (θ_(i) − mean_loo)²)``.
    """

    estimate: Any
    bias: Any
    bias_corrected: Any
    se: Any
    n: int

    def interval(self, confidence: float = 0.95) -> tuple[Any, Any]:
        """Normal interval ``bias_corrected ± z·se`` around the bias-corrected estimate."""
        z = _z(confidence)
        return self.bias_corrected - z * self.se, self.bias_corrected + z * self.se


def jackknife(
    data: Any, statistic: Statistic = np.mean, *, vectorized: bool = True
) -> JackknifeResult:
    """Jackknife bias and standard error of ``statistic`` over the rows of ``data``.

    For the mean the standard error equals the classical ``s / sqrt(n)`` (``s`` with ddof 1).

    Examples
    --------
    >>> r = jackknife(np.array([1.0, 2.0, 3.0, 4.0]))
    >>> float(r.estimate), float(r.bias), round(float(r.se), 6)
    (2.5, 0.0, 0.645497)
    """
    arrays = _as_tuple(data)
    n = arrays[0].shape[0]
    theta = _evaluate(statistic, arrays, vectorized)
    loo = _leave_one_out(statistic, arrays, vectorized)
    mean = loo.mean(axis=0)
    bias = (n - 1) * (mean - theta)
    se = np.sqrt((n - 1) / n * np.sum((loo - mean) ** 2, axis=0))
    return JackknifeResult(estimate=theta, bias=bias, bias_corrected=theta - bias, se=se, n=n)

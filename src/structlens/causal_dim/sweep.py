"""Width-sweep analysis: N_repr(m), N_causal(m), the wedge, saturating fits and κ̂.

Per SAE width ``m`` a :class:`FeatureStats` accumulator collects, over the evaluation tokens,
how often each feature fires and the sum of ``|AtP|`` (see :mod:`structlens.causal_dim.atp`),
split into ``n_blocks`` prompt blocks (every token of prompt ``p`` goes to block
``p mod n_blocks``) so the resampling can work on whole prompts without keeping per-token
data.  Accumulators merge by addition.

Resampling unit
---------------
Tokens of one prompt share its context, so their firings and ``|AtP|`` are correlated; a
token-level resample treats them as independent and its intervals are too narrow.  Every
interval here resamples or deletes whole prompt blocks, and the caller must say which prompt
each token came from (:func:`structlens.causal_dim.model.token_prompt_ids`).

Definitions (choices the paper leaves open are fixed here and recorded in the result)
-------------------------------------------------------------------------------------
* ``N_repr(m)`` = #features firing on at least ``min_count`` evaluation tokens (``f_i > 0``;
  for JumpReLU that is ``pre_i > θ_i``).
* ``AtP_i`` = mean over all evaluation tokens of ``|Δ_i|`` (non-firing tokens count as 0).
* ``ε`` = the largest base-width score outside the top ``⌈q·m_base⌉`` (``q = 1 − percentile/100``,
  default 0.02), over **all** base features, non-firing ones (score 0) included; so
  ``N_causal(m_base) = ⌈0.02·m_base⌉`` up to ties.
* ``N_causal(m)`` = #features with ``AtP_i > ε``.
* Growth ratios are relative to the base (smallest) width; the *wedge* is
  ``(N_repr growth) / (N_causal growth)`` at the largest width.
* Fits of ``N_causal(m)``: Michaelis–Menten ``K m/(m + m½)``, exponential ``K(1 − e^{−m/m₀})``,
  Hill ``K mⁿ/(mⁿ + m½ⁿ)``; least squares on ``log N`` (relative error, i.e. fitted in log
  width/log count space), parameters in log space.  κ̂ = ``K``; 95% CIs by bootstrap over
  prompt blocks (ε recomputed in every replicate) and by profile likelihood of the curve fit.
* **Distinct counts** (``N_repr``, its growth ratios and the wedge) get no bootstrap
  interval: a resample holds fewer distinct prompts, so fewer features fire in it and the
  percentile interval sits below the count it is meant to cover (it can exclude its own
  point estimate).  Their estimand is the expected value on an evaluation set of as many
  prompts from the same distribution, for which the observed count is unbiased; the
  interval is ``estimate ± t_{B−1} · SE`` with a jackknife SE over the ``B`` filled prompt
  blocks, cut to the statistic's range (counts in ``[0, m]``, ratios ``≥ 0``): the
  delete-one-block jackknife for ``N_repr`` and its growth, the delete-half jackknife for the
  wedge, whose ``N_causal`` is a threshold count at a sample quantile, not smooth enough for
  the delete-one jackknife (:func:`distinct_count_jackknife`).  The jackknife's bias
  correction is not applied: for a distinct count it extrapolates to an unlimited evaluation
  set by a first-order rule that species-count problems do not obey, and on planted data it
  covers neither target.
* **Fits** (:func:`fit_saturating`) profile ``log K`` out in closed form and search the shape
  parameters over their whole box (a grid, then a local refinement): the box's global
  least-squares solution.
* **Identification** (:func:`kappa_identification`).  The fits bound ``K`` below by
  ``max N_causal``; a ``K`` on a bound, or ``m½`` outside the measured widths, means the curve
  has not bent over inside the data and ``K`` is not determined by it.  A saturating curve
  also fits counts that grow as a power law ``a·m^b`` without limit, so the bend must be
  shown against that alternative: a power law through the counts must fail its lack-of-fit
  test (:func:`power_law_lack_of_fit`, generalised least squares on ``log N_causal`` with
  the counts' delete-half jackknife covariance across widths) at :data:`POWER_LAW_ALPHA`.
  Otherwise κ̂ is reported as ``"unidentified"`` with the reason, ``kappa_hat`` is NaN, and
  no interval is given.
* **Gates** (a status, not a fit).  ε is anchored at the base width, so ``N_causal(m_base)``
  is ``⌈0.02·m_base⌉`` by construction; with ``m_base < 4·d`` the whole curve is pinned near
  2% of a width too small to hold the layer's causal directions (the paper's base width is
  ≈ 7·d).  Given ``d_model``, a base width below ``min_base_width_ratio · d`` is rejected.
  Given the held-out FVU per width, a sweep whose FVU rises with width beyond the gate's
  tolerance gets ``sweep_status = "not interpretable"`` and no fits, with the cause
  (:func:`fvu_gate`): data-limited when the train–held-out gap widens where FVU rises (more
  tokens help), under-trained when it does not (longer training helps).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from structlens.causal_dim.atp import sparse_feature_atp
from structlens.results import Result
from structlens.sae.models import SparseAutoencoder
from structlens.stats.intervals import group_jackknife

FIT_MODELS = ("michaelis_menten", "exponential", "hill")
# K ranges over [max N_causal, max N_causal · e^25] in the fits
_LOG_K_SPAN = 25.0


class FeatureStats:
    """Mergeable per-feature firing counts and ``|AtP|`` sums in prompt blocks (float64).

    Every token of prompt ``p`` is added to block ``p mod n_blocks``, so each block holds
    whole prompts (see the module docstring).  ``prompt_ids`` is the set of prompt ids seen.
    """

    def __init__(self, d_sae: int, n_blocks: int = 64) -> None:
        if d_sae < 1 or n_blocks < 1:
            raise ValueError("d_sae and n_blocks must be positive.")
        self.d_sae = int(d_sae)
        self.n_blocks = int(n_blocks)
        self.abs_atp = torch.zeros(n_blocks, d_sae, dtype=torch.float64)
        self.signed_atp = torch.zeros(n_blocks, d_sae, dtype=torch.float64)
        self.fires = torch.zeros(n_blocks, d_sae, dtype=torch.float64)
        self.tokens = torch.zeros(n_blocks, dtype=torch.float64)
        self.n_seen = 0
        self.prompt_ids: set[int] = set()

    def _blocks(
        self, prompt_ids: torch.Tensor | np.ndarray | Sequence[int] | None, n: int
    ) -> torch.Tensor:
        if prompt_ids is None:
            if self.n_blocks == 1:  # nothing is resampled, so no unit is needed
                return torch.zeros(n, dtype=torch.long)
            raise ValueError(
                f"FeatureStats with n_blocks = {self.n_blocks} needs the prompt id of every "
                "token (update(sae, acts, grads, prompt_ids)): blocks must hold whole prompts; "
                "see structlens.causal_dim.model.token_prompt_ids."
            )
        ids = prompt_ids if torch.is_tensor(prompt_ids) else torch.as_tensor(np.asarray(prompt_ids))
        if ids.shape != (n,):
            raise ValueError(
                f"prompt_ids must hold one prompt id per token, shape ({n},); got "
                f"{tuple(ids.shape)}."
            )
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise ValueError(f"prompt_ids must be integers, got dtype {ids.dtype}.")
        ids = ids.to(torch.long).cpu()
        if n and int(ids.min()) < 0:
            raise ValueError("prompt_ids must be non-negative.")
        self.prompt_ids.update(torch.unique(ids).tolist())
        return ids % self.n_blocks

    def update(
        self,
        sae: SparseAutoencoder,
        acts: torch.Tensor,
        grads: torch.Tensor,
        prompt_ids: torch.Tensor | np.ndarray | Sequence[int] | None = None,
    ) -> FeatureStats:
        """Add tokens ``acts`` [n, d_in] with metric gradients ``grads`` [n, d_in].

        Parameters
        ----------
        sae : SparseAutoencoder
            The SAE whose features are scored (``d_sae`` must match).
        acts, grads : torch.Tensor
            ``[n, d_in]`` residuals and gradients of the metric at the same rows.
        prompt_ids : array_like of int, shape (n,)
            The prompt each token came from (non-negative; ids must be unique across the
            prompts of one evaluation set, e.g. the prompt's index).  Required unless
            ``n_blocks == 1``.

        Raises
        ------
        ValueError
            On a missing, mis-shaped, non-integer or negative ``prompt_ids``.
        """
        if sae.d_sae != self.d_sae:
            raise ValueError(f"SAE has {sae.d_sae} features, the accumulator {self.d_sae}.")
        n = acts.shape[0]
        block_of_token = self._blocks(prompt_ids, n)
        tok, feat, atp = sparse_feature_atp(sae, acts, grads)
        blk = block_of_token[tok]
        flat = blk * self.d_sae + feat
        atp = atp.double()
        self.abs_atp.view(-1).index_add_(0, flat, atp.abs())
        self.signed_atp.view(-1).index_add_(0, flat, atp)
        self.fires.view(-1).index_add_(0, flat, torch.ones_like(atp))
        self.tokens.index_add_(0, block_of_token, torch.ones(n, dtype=torch.float64))
        self.n_seen += n
        return self

    @property
    def n_prompts(self) -> int:
        """Distinct prompts seen (0 when updated without prompt ids)."""
        return len(self.prompt_ids)

    def merge(self, other: FeatureStats) -> FeatureStats:
        if (other.d_sae, other.n_blocks) != (self.d_sae, self.n_blocks):
            raise ValueError("can only merge FeatureStats with equal d_sae and n_blocks.")
        out = FeatureStats(self.d_sae, self.n_blocks)
        for name in ("abs_atp", "signed_atp", "fires", "tokens"):
            setattr(out, name, getattr(self, name) + getattr(other, name))
        out.n_seen = self.n_seen + other.n_seen
        out.prompt_ids = self.prompt_ids | other.prompt_ids
        return out

    def scores(self, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(AtP_i, fire_count_i)`` with optional block weights (resamples, deletions)."""
        w = np.ones(self.n_blocks) if weights is None else weights
        tokens = float(w @ self.tokens.numpy())
        if tokens <= 0:
            raise ValueError("no tokens were accumulated.")
        return (w @ self.abs_atp.numpy()) / tokens, w @ self.fires.numpy()


def calibrate_epsilon(scores: np.ndarray, top_fraction: float = 0.02) -> float:
    """Largest score outside the top ``⌈top_fraction·m⌉`` (so that many lie strictly above)."""
    m = scores.size
    n_top = math.ceil(round(top_fraction * m, 9))
    if not 0 < n_top < m:
        raise ValueError(f"top_fraction {top_fraction} leaves no threshold for m = {m}.")
    return float(np.partition(scores, m - n_top - 1)[m - n_top - 1])


def _log_shape(name: str, m: np.ndarray, log_h: np.ndarray, log_n: np.ndarray) -> np.ndarray:
    """``log`` of a saturating form with ``K = 1`` at widths ``m`` (last axis) for parameter
    arrays ``log_h`` (``m½``, or ``m₀`` of the exponential) and ``log_n`` (Hill's exponent)
    broadcast against it."""
    if name == "michaelis_menten":
        return np.log(m) - np.logaddexp(np.log(m), log_h)
    if name == "exponential":
        return np.log(-np.expm1(-m / np.exp(log_h)))
    if name == "hill":
        return -np.logaddexp(0.0, np.exp(log_n) * (log_h - np.log(m)))
    raise ValueError(f"unknown fit model {name!r}; choose from {FIT_MODELS}.")


class _Profiled:
    """Least squares on ``log N`` of one saturating form with ``log K`` profiled out.

    The residuals ``log K + log g(m; θ) − log N`` are linear in ``log K``, so for fixed shape
    parameters ``θ`` (``log m½`` and, for Hill, ``log n``) the best ``log K`` within its
    bounds is the mean residual without it, clipped to the bounds (the objective is a
    parabola in ``log K``).  What is left is a search over one or two shape parameters: a
    grid over their whole box, then a bounded local refinement from the best grid point, so
    the fit is the box's global least-squares solution up to the grid's resolution."""

    GRID = 0.25  # grid step of log m½ (nats)
    N_GRID = 21  # grid points of Hill's log n

    def __init__(self, name: str, widths: np.ndarray, counts: np.ndarray) -> None:
        if name not in FIT_MODELS:
            raise ValueError(f"unknown fit model {name!r}; choose from {FIT_MODELS}.")
        self.name, self.m = name, np.asarray(widths, dtype=np.float64)
        self.log_y = np.log(np.asarray(counts, dtype=np.float64))
        self.k_bounds = (float(self.log_y.max()) - 1e-9, float(self.log_y.max()) + _LOG_K_SPAN)
        self.box = [(math.log(self.m.min()) - 10, math.log(self.m.max()) + 25)]
        if name == "hill":
            self.box.append((math.log(0.1), math.log(10.0)))

    def _split(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        theta = np.asarray(theta, dtype=np.float64)
        log_n = theta[..., 1] if self.name == "hill" else np.zeros(theta.shape[:-1])
        return theta[..., 0, None], np.asarray(log_n)[..., None]

    def _profile(self, theta: np.ndarray, log_k: float | None) -> tuple[np.ndarray, np.ndarray]:
        """The log shape ``[..., widths]`` at ``theta`` and the ``log K`` that goes with it
        (the profiled one, clipped to its bounds, or ``log_k`` when given)."""
        log_h, log_n = self._split(theta)
        shape = _log_shape(self.name, self.m, log_h, log_n)
        if log_k is None:
            lk = np.clip(np.mean(self.log_y - shape, axis=-1), *self.k_bounds)
        else:
            lk = np.full(shape.shape[:-1], float(log_k))
        return shape, lk

    def rss(self, theta: np.ndarray, log_k: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Residual sums of squares at shape parameters ``theta`` (``[..., n_shape]``) and
        the ``log K`` they go with (the profiled one, or ``log_k`` when given)."""
        shape, lk = self._profile(theta, log_k)
        return np.sum((shape + lk[..., None] - self.log_y) ** 2, axis=-1), lk

    def residuals(self, theta: np.ndarray, log_k: float | None = None) -> np.ndarray:
        """The log residuals at one ``theta`` (with its profiled or the given ``log K``)."""
        shape, lk = self._profile(np.asarray(theta, dtype=np.float64)[None], log_k)
        return shape[0] + lk[0] - self.log_y

    def _hill_jacobian(self, theta: np.ndarray, log_k: float | None) -> np.ndarray:
        """d residuals / d (log m½, log n) of the Hill form: its log shape is
        ``−softplus(u)`` with ``u = n (log m½ − log m)``; a profiled, unclipped ``log K``
        subtracts the mean row."""
        n = math.exp(theta[1])
        u = n * (theta[0] - np.log(self.m))
        sig = 0.5 * (1 + np.tanh(u / 2))  # the logistic function, without overflow
        jac = np.stack([-sig * n, -sig * u], axis=1)
        lk = self._profile(np.asarray(theta, dtype=np.float64)[None], log_k)[1][0]
        if log_k is None and self.k_bounds[0] < lk < self.k_bounds[1]:
            jac -= jac.mean(axis=0)
        return jac

    def fit(self, log_k: float | None = None) -> tuple[float, np.ndarray, float]:
        """``(rss, θ, log K)`` of the best fit (``log K`` fixed at ``log_k`` when given)."""
        from scipy.optimize import least_squares, minimize_scalar

        lo, hi = self.box[0]
        h_grid = np.linspace(lo, hi, int(round((hi - lo) / self.GRID)) + 1)
        if self.name == "hill":
            n_grid = np.linspace(*self.box[1], self.N_GRID)
            grid = np.stack(np.meshgrid(h_grid, n_grid, indexing="ij"), -1).reshape(-1, 2)
        else:
            grid = h_grid[:, None]
        values, _ = self.rss(grid, log_k)
        start = grid[int(np.argmin(values))]

        def objective(theta: np.ndarray) -> float:
            return float(self.rss(np.atleast_1d(theta), log_k)[0])

        if self.name == "hill":  # two shapes: refine from the grid's best and the midpoint
            mid = np.array([math.log(float(np.median(self.m))), 0.0])
            tries = [
                least_squares(lambda theta: self.residuals(theta, log_k), x0, method="trf",
                              jac=lambda theta: self._hill_jacobian(theta, log_k),
                              bounds=tuple(np.array(self.box).T)).x
                for x0 in (start, mid)
            ]  # fmt: skip
            best = min(tries, key=objective)
        else:  # the grid's best point and its neighbours bracket the minimum
            a, b = max(lo, start[0] - self.GRID), min(hi, start[0] + self.GRID)
            best = np.array([minimize_scalar(objective, bounds=(a, b), method="bounded",
                                             options={"xatol": 1e-10}).x])  # fmt: skip
        if objective(best) > objective(start):  # the refinement never loses the grid's point
            best = start
        value, lk = self.rss(best, log_k)
        return float(value), np.asarray(best, dtype=np.float64), float(lk)


def fit_saturating(widths: np.ndarray, counts: np.ndarray, model: str) -> dict[str, float]:
    """Least-squares fit on ``log N`` of one saturating form; returns parameters and RMS.

    ``K`` ranges over ``[max N, max N · e^25]``, ``m½`` (``m₀``) over
    ``[min m · e^-10, max m · e^25]`` and Hill's ``n`` over ``[0.1, 10]``; the solution is the
    box's global one (:class:`_Profiled`).
    """
    m = np.asarray(widths, dtype=np.float64)
    y = np.asarray(counts, dtype=np.float64)
    if np.any(y <= 0):
        raise ValueError("counts must be positive to fit in log space.")
    n_par = 3 if model == "hill" else 2
    if m.size < n_par + 1:
        raise ValueError(f"the {model} fit needs at least {n_par + 1} widths, got {m.size}.")
    value, theta, log_k = _Profiled(model, m, y).fit()
    out = {"K": float(np.exp(log_k)), "m_half": float(np.exp(theta[0]))}
    if model == "hill":
        out["n"] = float(np.exp(theta[1]))
    out["rms_log_residual"] = float(np.sqrt(value / m.size))
    return out


#: Level at which a power law through the N_causal counts must fail its lack-of-fit test
#: before κ̂ counts as identified.
POWER_LAW_ALPHA = 0.05


def power_law_lack_of_fit(
    widths: np.ndarray, counts: np.ndarray, half_counts: np.ndarray, scale: float
) -> float:
    """p-value of a power law ``N = a·m^b`` through ``counts`` over ``widths``.

    Generalised least squares on ``log N`` with the covariance of ``log N`` across widths
    estimated from ``half_counts`` (``(halves, widths)``, the counts of random halves of the
    prompt blocks) times ``scale`` (the delete-half jackknife's ``(B − d)/d``); the statistic
    ``rᵀ Σ⁻¹ r`` of the residuals ``r`` is referred to χ² with ``widths − 2`` degrees of
    freedom.  A width whose count does not vary between halves (the base width, whose
    ``N_causal`` is fixed by ε's definition) is an exact point the law must pass through:
    it takes a variance far below the others', and the degrees of freedom stay ``widths − 2``.
    NaN when it cannot be computed: fewer than three widths, a zero count, or no count that
    varies.
    """
    from scipy.stats import chi2

    y, halves = np.asarray(counts, dtype=np.float64), np.asarray(half_counts, dtype=np.float64)
    if y.size < 3 or np.any(y <= 0) or np.any(halves <= 0):
        return float("nan")
    cov = scale * np.atleast_2d(np.cov(np.log(halves), rowvar=False))
    top = float(np.max(np.diag(cov)))
    if not top > 0:
        return float("nan")
    inv = np.linalg.inv(cov + 1e-9 * top * np.eye(y.size))
    X = np.column_stack([np.ones_like(y), np.log(np.asarray(widths, dtype=np.float64))])
    beta = np.linalg.lstsq(X.T @ inv @ X, X.T @ inv @ np.log(y), rcond=None)[0]
    r = np.log(y) - X @ beta
    return float(chi2.sf(float(r @ inv @ r), y.size - 2))


def kappa_identification(
    widths: np.ndarray,
    counts: np.ndarray,
    fit: Mapping[str, float],
    model: str = "michaelis_menten",
    rtol: float = 1e-6,
    power_law_p: float | None = None,
) -> tuple[str, str]:
    """``("identified", "")`` or ``("unidentified", reason)`` for a saturating fit of
    ``counts`` over ``widths`` (see the module docstring).

    Unidentified when ``K`` sits on its lower bound ``max N_causal`` (within ``rtol``: the
    constraint is active) or at the upper end of its range, when the half-saturation
    width ``m½`` (``m₀·ln 2`` for the exponential form, whose ``fit["m_half"]`` is its scale
    ``m₀``) lies outside the measured widths, or, given ``power_law_p``
    (:func:`power_law_lack_of_fit`), when a power law is not rejected at
    :data:`POWER_LAW_ALPHA` (a NaN p-value: it could not be tested).
    """
    m = np.asarray(widths, dtype=np.float64)
    y_max = float(np.max(counts))
    K, m_half = float(fit["K"]), float(fit["m_half"])
    if model == "exponential":
        m_half *= math.log(2.0)
    if K <= y_max * (1 + rtol):
        return "unidentified", (
            f"K = {K:.4g} sits on its lower bound max N_causal = {y_max:.4g}: the counts do not "
            "saturate inside the measured widths"
        )
    if K >= y_max * math.exp(_LOG_K_SPAN) * (1 - rtol):
        return "unidentified", f"K = {K:.4g} sits on the upper end of its range"
    if not m.min() <= m_half <= m.max():
        return "unidentified", (
            f"m_half = {m_half:.4g} lies outside the measured widths [{m.min():.4g}, "
            f"{m.max():.4g}]: the saturation is not observed"
        )
    if power_law_p is not None and not power_law_p < POWER_LAW_ALPHA:
        if math.isnan(power_law_p):
            return "unidentified", (
                "the bend cannot be tested against a power law (fewer than 3 widths, or a "
                "zero count)"
            )
        return "unidentified", (
            f"a power law N = a·m^b, which never saturates, fits the counts within their "
            f"sampling error (lack-of-fit p = {power_law_p:.3g} ≥ {POWER_LAW_ALPHA:g})"
        )
    return "identified", ""


def profile_interval_K(
    widths: np.ndarray, counts: np.ndarray, model: str, level: float = 0.95
) -> list[float]:
    """Profile-likelihood interval of the asymptote ``K`` of a saturating fit.

    The fit is least squares on ``log N`` (Gaussian log-errors); the interval holds every
    ``K`` whose profiled residual sum of squares satisfies
    ``RSS(K) ≤ RSS_min · (1 + F_{level}(1, n − p) / (n − p))`` (``n`` widths, ``p``
    parameters).  An end that reaches a bound of ``K``'s range is returned as that bound
    (``max N_causal``) or ``inf``.  Needs ``n > p``; a noiseless curve gives a zero-width
    interval.
    """
    from scipy.optimize import brentq
    from scipy.stats import f as f_dist

    m = np.asarray(widths, dtype=np.float64)
    y = np.asarray(counts, dtype=np.float64)
    fit = fit_saturating(m, y, model)
    n_par = 3 if model == "hill" else 2
    dof = m.size - n_par
    if dof < 1:
        raise ValueError(f"a profile interval needs more widths than {n_par} parameters.")
    profiled = _Profiled(model, m, y)
    lo_k, hi_k = math.log(y.max()), math.log(y.max()) + _LOG_K_SPAN
    log_k_hat = math.log(fit["K"])
    rss_min = profiled.fit(log_k_hat)[0]
    if rss_min <= 1e-24:  # an exact fit: no residual scale, the interval is the point
        return [fit["K"], fit["K"]]
    limit = rss_min * (1 + float(f_dist.ppf(level, 1, dof)) / dof)

    def excess(log_k: float) -> float:
        return profiled.fit(log_k)[0] - limit

    lower = math.exp(lo_k) if excess(lo_k) <= 0 else math.exp(brentq(excess, lo_k, log_k_hat))
    upper = float("inf")
    if excess(hi_k) > 0:
        upper = math.exp(brentq(excess, log_k_hat, hi_k))
    return [float(lower), float(upper)]


@dataclasses.dataclass(frozen=True)
class WidthSweepConfig:
    """Settings of :func:`analyze_width_sweep`.

    ``percentile`` defines ε (98 → top 2% at the base width); ``min_count`` defines firing
    for N_repr; ``fit_model`` picks which fit gives ``kappa_hat``; ``n_bootstrap`` replicates
    over prompt blocks give the CIs of ε, N_causal and ``K`` (``ci`` level; the distinct
    counts use the delete-one-block jackknife instead, see the module docstring).
    ``d_model`` (when given) enables the base-width check: the smallest width must be at
    least ``min_base_width_ratio · d_model`` (see the module docstring).  ``fvu_rise_tol`` is
    the held-out FVU gate's relative tolerance (:func:`fvu_gate`).
    """

    percentile: float = 98.0
    min_count: int = 1
    fit_model: str = "michaelis_menten"
    n_bootstrap: int = 200
    ci: float = 0.95
    seed: int = 0
    d_model: int | None = None
    min_base_width_ratio: float = 4.0
    fvu_rise_tol: float = 0.01

    def __post_init__(self) -> None:
        if not 0 <= self.fvu_rise_tol < 1:
            raise ValueError(f"fvu_rise_tol must lie in [0, 1), got {self.fvu_rise_tol}.")
        if self.d_model is not None and self.d_model < 1:
            raise ValueError(f"d_model must be >= 1, got {self.d_model}.")
        if self.min_base_width_ratio < 0:
            raise ValueError("min_base_width_ratio must be >= 0.")
        if not 0 < self.percentile < 100:
            raise ValueError("percentile must lie in (0, 100).")
        if self.min_count < 1 or self.n_bootstrap < 0 or not 0 < self.ci < 1:
            raise ValueError("min_count ≥ 1, n_bootstrap ≥ 0 and 0 < ci < 1 are required.")
        if self.fit_model not in FIT_MODELS:
            raise ValueError(f"fit_model must be one of {FIT_MODELS}.")


@dataclasses.dataclass(frozen=True)
class WidthSweepResult(Result):
    """N_repr, N_causal, growth ratios, fits and κ̂ for one width sweep.

    Array attributes are aligned with ``widths`` (ascending); ``*_ci`` are ``[2, n_widths]``
    (lower, upper).  ``epsilon_ci``, ``n_causal_ci``, ``n_causal_growth_ci`` and ``K_ci`` are
    bootstrap percentile intervals over prompt blocks (growth CIs of the per-replicate ratios
    to the base width; replicates with a zero base count are dropped).  ``n_repr_ci``,
    ``n_repr_growth_ci`` (delete-one-block jackknife) and ``wedge_ci`` (delete-half
    jackknife) are t intervals centred on the observed ``n_repr``, ``n_repr_growth`` and
    ``wedge`` (the estimand: their expected value on an evaluation set of ``n_prompts``
    prompts); ``n_repr_se``/``wedge_se`` are their jackknife SEs, ``distinct_ci_method`` and
    ``wedge_ci_method`` say how they were made and ``distinct_ci_reason`` why there is none
    (NaN intervals), e.g. when fewer than 2 prompt blocks hold tokens.
    ``n_blocks_filled`` counts the prompt blocks that hold tokens (the resampling units).
    ``fits`` maps each model name to its parameters on the full data plus ``K_ci``;
    ``kappa_hat``/``kappa_hat_ci`` come from ``fit_model``.  ``exact_erank`` /
    ``kappa_hat_over_erank`` are filled when the exact effective rank of Σ was supplied.
    ``definitions`` records every convention used.

    ``kappa_hat_status`` is ``"identified"``, ``"unidentified"`` (``kappa_hat`` NaN, reason in
    ``kappa_hat_reason``, raw fit still in ``fits``), ``"no fit"`` or ``"not interpretable"``
    (the sweep gate failed); ``power_law_p`` is the p-value of a power law through N_causal
    (:func:`power_law_lack_of_fit`, NaN where there was nothing to fit).  ``kappa_hat_ci`` is
    the bootstrap interval and ``kappa_hat_profile_ci`` the profile-likelihood interval, both
    only for identified fits.
    ``sweep_status`` is ``"interpretable"`` or ``"not interpretable"`` (reason in
    ``sweep_reason``, diagnosis in ``sweep_cause``, one of :data:`FVU_CAUSES`, ``None`` when
    the gate passed or did not run); ``fvu_monotone`` says whether held-out FVU falls with
    width within the gate's tolerance (``None`` when no held-out FVU was given).
    ``train_fvu`` and ``fvu_gap`` (held-out minus train FVU) are per width when the training
    FVU was given; ``fvu_rise_se`` is the standard error of each rise keyed by the wider
    width (string keys) and ``fvu_rise_allowance`` the rise each step tolerated.
    """

    widths: np.ndarray
    n_repr: np.ndarray
    n_causal: np.ndarray
    n_repr_growth: np.ndarray
    n_causal_growth: np.ndarray
    wedge: float
    epsilon: float
    epsilon_ci: list
    n_causal_ci: np.ndarray
    n_repr_ci: np.ndarray
    n_repr_growth_ci: np.ndarray
    n_causal_growth_ci: np.ndarray
    wedge_ci: list
    fits: dict
    fit_model: str
    kappa_hat: float
    kappa_hat_ci: list
    n_tokens: int
    n_bootstrap: int
    exact_erank: float | None
    kappa_hat_over_erank: float | None
    definitions: dict
    kappa_hat_status: str = "no fit"
    kappa_hat_reason: str = ""
    kappa_hat_profile_ci: list | None = None
    sweep_status: str = "interpretable"
    sweep_reason: str = ""
    base_width: int = 0
    d_model: int | None = None
    heldout_fvu: list | None = None
    fvu_monotone: bool | None = None
    sweep_cause: str | None = None
    train_fvu: list | None = None
    fvu_gap: list | None = None
    fvu_rise_se: dict | None = None
    fvu_rise_allowance: list | None = None
    fvu_rise_tol: float = 0.01
    n_prompts: int = 0
    n_blocks_filled: int = 0
    n_repr_se: np.ndarray | None = None
    wedge_se: float = float("nan")
    distinct_ci_method: str = ""
    distinct_ci_reason: str = ""
    wedge_ci_method: str = ""
    power_law_p: float = float("nan")


def _counts(
    stats: Sequence[FeatureStats], cfg: WidthSweepConfig, w: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, float]:
    """``(N_repr, N_causal, ε)`` per width under block weights ``w`` (all blocks: ``None``)."""
    n_repr, n_causal, eps = _counts_batch(
        stats, cfg, np.ones(stats[0].n_blocks) if w is None else w
    )
    return n_repr[0], n_causal[0], float(eps[0])


def _counts_batch(
    stats: Sequence[FeatureStats], cfg: WidthSweepConfig, weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_counts` under every row of block ``weights`` ``[R, n_blocks]`` at once (one
    matrix product per width and array): ``N_repr`` and ``N_causal`` ``[R, n_widths]``, ε
    ``[R]``."""
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    if w.shape[0] == 0:
        return np.zeros((0, len(stats))), np.zeros((0, len(stats))), np.zeros(0)
    tokens = w @ stats[0].tokens.numpy()
    if np.any(tokens <= 0):
        raise ValueError("no tokens were accumulated.")
    base = (w @ stats[0].abs_atp.numpy()) / tokens[:, None]
    m0 = base.shape[1]
    n_top = math.ceil(round((1 - cfg.percentile / 100) * m0, 9))
    if not 0 < n_top < m0:
        raise ValueError(
            f"top_fraction {1 - cfg.percentile / 100} leaves no threshold for m = {m0}."
        )
    eps = np.partition(base, m0 - n_top - 1, axis=1)[:, m0 - n_top - 1]
    n_repr, n_causal = [], []
    for st in stats:
        atp = base if st is stats[0] else (w @ st.abs_atp.numpy()) / tokens[:, None]
        n_repr.append(np.sum(w @ st.fires.numpy() >= cfg.min_count, axis=1))
        n_causal.append(np.sum(atp > eps[:, None], axis=1))
    return (np.stack(n_repr, 1).astype(np.float64), np.stack(n_causal, 1).astype(np.float64),
            eps)  # fmt: skip


def _fit_all(widths: np.ndarray, n_causal: np.ndarray) -> dict[str, dict[str, float]]:
    fits: dict[str, dict[str, float]] = {}
    for name in FIT_MODELS:
        n_par = 3 if name == "hill" else 2
        if widths.size > n_par and np.all(n_causal > 0):
            fits[name] = fit_saturating(widths, n_causal, name)
    return fits


#: A held-out FVU rise fails the sweep gate when it exceeds the tolerance by more than this
#: many jackknife standard errors (of the paired difference over prompt blocks): the
#: one-sided 95% lower bound of the rise lies above the tolerance.
FVU_RISE_Z = 1.645
#: The gate's diagnoses of a failing sweep (``undiagnosed``: no training FVU was given).
FVU_CAUSES = ("data_limited", "under_trained", "undiagnosed")


@dataclasses.dataclass(frozen=True)
class FVUGate:
    """The sweep gate's outcome (:func:`fvu_gate`), widths ascending.

    ``allowance[i]`` is how much the held-out FVU may rise from width ``i`` to ``i + 1``
    without failing; ``failing`` lists the wider widths of the rises above it; ``gap`` is the
    held-out minus the train FVU per width (when the train FVU was given).  On failure,
    ``cause`` is ``"data_limited"`` (at every failing width the train FVU still falls, so the
    gap grows: the wider SAEs fit their training tokens better and held-out tokens worse),
    ``"under_trained"`` (it does not: they fit neither better) or ``"undiagnosed"`` (no
    training FVU); ``None`` when the gate passes.  ``reason`` says the same in words.
    """

    passed: bool
    cause: str | None
    reason: str
    allowance: list
    failing: list
    gap: list | None


def fvu_gate(
    widths: Sequence[int],
    heldout_fvu: Sequence[float],
    *,
    train_fvu: Sequence[float] | None = None,
    rise_se: Mapping[int, float] | None = None,
    tolerance: float = 0.01,
) -> FVUGate:
    """Does held-out FVU fall with width, and if not, why?

    A rise from one width to the next fails the gate when it exceeds ``tolerance`` × the
    narrower width's FVU by more than :data:`FVU_RISE_Z` × ``rise_se[wider width]`` (the
    rise's standard error over prompt blocks, when given): the rise's one-sided 95% lower
    bound lies above the tolerance.  Rises within the tolerance are what training to a
    relative plateau resolves (the protocol's default tolerance is its convergence
    tolerance); the standard errors keep the evaluation sample's noise from failing a sweep
    whose true rise is within it.  ``train_fvu`` (same order as ``widths``) diagnoses a
    failure (see :class:`FVUGate`).

    Examples
    --------
    >>> fvu_gate([1, 2, 4], [0.30, 0.20, 0.201]).passed   # a 0.5% rise is within 1%
    True
    >>> g = fvu_gate([1, 2, 4], [0.30, 0.20, 0.25], train_fvu=[0.28, 0.17, 0.12])
    >>> g.passed, g.cause, g.failing
    (False, 'data_limited', [4])
    """
    order = np.argsort(np.asarray(widths))
    w = [int(x) for x in np.asarray(widths)[order]]
    f = np.asarray(heldout_fvu, dtype=np.float64)
    if f.shape != (len(widths),):
        raise ValueError(f"give one held-out FVU per width; got {f.shape} for {len(widths)}.")
    f = f[order]
    se = np.array([(rise_se or {}).get(m, 0.0) for m in w[1:]], dtype=np.float64)
    allowance = tolerance * f[:-1] + FVU_RISE_Z * se
    rises = np.diff(f)
    failing = [w[i + 1] for i in np.flatnonzero(rises > allowance)]
    train = gap = None
    if train_fvu is not None:
        train = np.asarray(train_fvu, dtype=np.float64)
        if train.shape != f.shape:
            raise ValueError(f"give one train FVU per width; got {train.shape} for {len(w)}.")
        train = train[order]
        gap = f - train
    if not failing:
        return FVUGate(True, None, "", allowance.tolist(), [], _as_list(gap))
    cause, why = _diagnose(w, train, gap, failing, tolerance)
    reason = (
        f"held-out FVU does not fall with width (FVU {np.round(f, 4).tolist()}; it rises by "
        f"more than {tolerance:.0%} of FVU plus {FVU_RISE_Z:g} SE at widths {failing}): {why}"
    )
    return FVUGate(False, cause, reason, allowance.tolist(), failing, _as_list(gap))


def _as_list(values: np.ndarray | None) -> list | None:
    return None if values is None else values.tolist()


def _diagnose(
    widths: list[int], train: np.ndarray | None, gap: np.ndarray | None, failing: list[int],
    tolerance: float,
) -> tuple[str, str]:  # fmt: skip
    """``(cause, explanation)`` of a failed gate: data-limited when, at every failing width,
    the train FVU falls by more than ``tolerance`` (relative) from the narrower width, so the
    train–held-out gap widens by more than the held-out rise (the wider SAE gained on its
    training tokens and lost on held-out ones); else under-trained (the wider SAE fits its
    training tokens no better)."""
    if train is None or gap is None:
        return "undiagnosed", (
            "no training FVU was given, so a data-limited sweep cannot be told from "
            "under-trained SAEs"
        )
    steps = [widths.index(m) for m in failing]
    gaps = np.round(gap, 4).tolist()
    if all(train[i] < (1 - tolerance) * train[i - 1] for i in steps):
        return "data_limited", (
            f"the train FVU keeps falling there, so the train–held-out FVU gap grows with "
            f"width (gaps {gaps}): the sweep is data-limited, the wider SAEs fit their "
            "training tokens better and held-out tokens worse; train them on more tokens "
            "(more corpus chunks or generated text), not for longer"
        )
    return "under_trained", (
        f"the train FVU does not fall there either (gaps {gaps}): the wider SAEs fit their "
        "training tokens no better, so they are under-trained; train each width to "
        "convergence"
    )


def heldout_fvu_rise_se(
    saes: Mapping[int, SparseAutoencoder],
    acts: Sequence[torch.Tensor],
    prompt_ids: Sequence[torch.Tensor],
    n_blocks: int,
) -> dict[int, float]:
    """Standard error of each held-out FVU rise ``FVU(m) − FVU(previous width)`` (keyed by
    the wider width ``m``): the delete-one-block jackknife over prompt blocks (prompt id mod
    ``n_blocks``), the FVU recomputed from per-block sums, paired since every width sees the
    same tokens.  Empty when fewer than 2 blocks hold tokens."""
    widths = sorted(saes)
    block = torch.cat([torch.as_tensor(p, dtype=torch.long) for p in prompt_ids]) % n_blocks
    count, sum_x, sum_sq, sse = _fvu_block_sums(saes, acts, block, n_blocks)
    filled = torch.nonzero(count > 0).flatten()
    if filled.numel() < 2:
        return {}

    def fvu(m: int, keep: torch.Tensor) -> float:
        sst = sum_sq[keep].sum() - sum_x[keep].sum(0).pow(2).sum() / count[keep].sum()
        return float(sse[m][keep].sum() / sst)

    out = {}
    for lo, hi in zip(widths, widths[1:]):
        est = fvu(hi, filled) - fvu(lo, filled)
        reps = [fvu(hi, filled[filled != b]) - fvu(lo, filled[filled != b]) for b in filled]
        out[hi] = float(group_jackknife(est, np.asarray(reps)).se)
    return out


@torch.no_grad()
def _fvu_block_sums(
    saes: Mapping[int, SparseAutoencoder],
    acts: Sequence[torch.Tensor],
    block: torch.Tensor,
    n_blocks: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
    """Per prompt block (float64): token counts, ``Σx``, ``Σ‖x‖²`` (the FVU's denominator,
    ``Σ‖x‖² − ‖Σx‖²/n`` over any set of blocks) and, per width, ``Σ‖x − x̂‖²``."""
    x = torch.cat(list(acts)).double()
    if block.shape[0] != x.shape[0]:
        raise ValueError(f"prompt_ids cover {block.shape[0]} rows, acts {x.shape[0]}.")

    def per_block(values: torch.Tensor) -> torch.Tensor:
        out = torch.zeros((n_blocks, *values.shape[1:]), dtype=torch.float64)
        return out.index_add_(0, block, values)

    sse = {}
    for m, sae in saes.items():
        recon = torch.cat([sae(a.to(sae.W_dec.dtype)).double() for a in acts])
        sse[m] = per_block((recon - x).pow(2).sum(1))
    return per_block(torch.ones_like(x[:, 0])), per_block(x), per_block(x.pow(2).sum(1)), sse


def block_bootstrap_weights(
    tokens: np.ndarray | torch.Tensor, n_boot: int, rng: np.random.Generator
) -> np.ndarray:
    """``[n_boot, n_blocks]`` bootstrap weights over the blocks that hold tokens.

    Each row draws the filled blocks with replacement (multinomial counts; empty blocks
    weigh 0, as they are no units), for :meth:`FeatureStats.scores`.  With fewer than 2
    filled blocks there is nothing to resample and the array has no rows.
    """
    t = np.asarray(tokens, dtype=np.float64)
    filled = np.flatnonzero(t > 0)
    out = np.zeros((n_boot if filled.size >= 2 else 0, t.size))
    for row in out:
        row[filled] = rng.multinomial(filled.size, np.full(filled.size, 1 / filled.size))
    return out


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("nan")


def _distinct(n_repr: np.ndarray, n_causal: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """``(N_repr, N_repr growth, wedge)`` of one set of counts (NaN where a base is 0)."""
    growth = n_repr / n_repr[0] if n_repr[0] > 0 else np.full_like(n_repr, np.nan)
    wedge = _ratio(_ratio(n_repr[-1], n_repr[0]), _ratio(n_causal[-1], n_causal[0]))
    if not (n_causal[0] > 0 and n_causal[-1] > 0):
        wedge = float("nan")
    return n_repr, growth, wedge


#: Random half-samples of the filled prompt blocks behind the wedge's interval.
HALF_SAMPLES = 100


@dataclasses.dataclass(frozen=True)
class _Halves:
    """``N_repr`` and ``N_causal`` ``[HALF_SAMPLES, n_widths]`` on random halves of the filled
    prompt blocks (``d = ⌊B/2⌋`` deleted, ε recomputed in each) and the delete-half
    jackknife's variance factor ``(B − d)/d`` (Shao & Wu 1989)."""

    n_repr: np.ndarray
    n_causal: np.ndarray
    scale: float

    @classmethod
    def of(
        cls, stats: Sequence[FeatureStats], cfg: WidthSweepConfig, filled: np.ndarray
    ) -> _Halves:
        rng = np.random.default_rng(cfg.seed)
        b = filled.size
        d = b // 2
        w = np.zeros((HALF_SAMPLES, stats[0].n_blocks))
        for row in w:
            row[rng.choice(filled, b - d, replace=False)] = 1.0
        n_repr, n_causal, _ = _counts_batch(stats, cfg, w)
        return cls(n_repr, n_causal, (b - d) / d)

    def wedge_se(self) -> float:
        """The delete-half jackknife standard error of the wedge; NaN when a half leaves it
        undefined."""
        reps = [_distinct(r, c)[2] for r, c in zip(self.n_repr, self.n_causal, strict=True)]
        return float(np.sqrt(self.scale * np.var(reps))) if np.all(np.isfinite(reps)) else math.nan


def distinct_count_jackknife(
    stats: Sequence[FeatureStats], cfg: WidthSweepConfig, halves: _Halves | None = None
) -> dict[str, Any]:
    """Jackknife intervals of ``N_repr``, its growth and the wedge.

    ``N_repr`` and its growth: each replicate drops one filled prompt block from every width
    (the delete-one-block jackknife).  The wedge: each replicate keeps a random half of the
    filled blocks (the delete-half jackknife; ``halves``, computed when not given), ε
    recomputed so its
    ``N_causal`` follows the same rule as on all data.  ``N_causal`` counts features whose
    mean lies above a threshold that is itself a sample quantile, a statistic that is not
    smooth in the data, for which the delete-one jackknife's variance is not consistent (it
    is for sample quantiles the textbook failure); the delete-d jackknife with ``d``
    proportional to ``B`` is.  On planted sweeps the delete-one standard error of the wedge
    was more than 1.8 times its sampling spread (``tests/causal_dim/
    test_causal_dim_resampling_unit.py``).  The intervals are
    ``estimate ± t_{B−1} · SE`` around the observed values (module docstring: the
    estimand is the expected count on an evaluation set of the same size), cut to the range
    of the statistic (counts in ``[0, m]``, ratios ``≥ 0``).

    Returns
    -------
    dict
        ``n_repr_ci``, ``n_repr_growth_ci`` (``[2, n_widths]``), ``wedge_ci`` (``[lo, hi]``),
        ``n_repr_se`` (``[n_widths]``), ``wedge_se``, ``method``, ``wedge_method``, ``reason``
        (why N_repr or its growth has no interval: fewer than 2 blocks hold tokens, or a zero
        base count) and ``wedge_reason`` (why the wedge has none, e.g. N_causal is 0 at a
        width without some half of the blocks); empty strings where the interval exists.
    """
    n_widths = len(stats)
    filled = np.flatnonzero(stats[0].tokens.numpy() > 0)
    nan2 = np.full((2, n_widths), np.nan)
    out: dict[str, Any] = {
        "n_repr_ci": nan2.copy(),
        "n_repr_growth_ci": nan2.copy(),
        "wedge_ci": [float("nan")] * 2,
        "n_repr_se": np.full(n_widths, np.nan),
        "wedge_se": float("nan"),
        "method": (
            f"delete-one-block jackknife over {filled.size} prompt blocks, t interval around "
            "the observed value (no bias correction)"
        ),
        "wedge_method": (
            f"delete-half jackknife ({HALF_SAMPLES} random halves of {filled.size} prompt "
            "blocks), t interval around the observed value"
        ),
        "reason": "",
        "wedge_reason": "",
    }
    if filled.size < 2:
        out["reason"] = out["wedge_reason"] = (
            f"{filled.size} prompt block(s) hold tokens: a jackknife needs at least 2 (give "
            "more prompts or more blocks)"
        )
        return out
    r, c, _ = _counts(stats, cfg, None)
    est_r, est_g, est_w = _distinct(r, c)
    w = np.ones((filled.size, stats[0].n_blocks))
    w[np.arange(filled.size), filled] = 0.0
    reps = [_distinct(rr, cc) for rr, cc in zip(*_counts_batch(stats, cfg, w)[:2], strict=True)]
    reps_r, reps_g = [r[0] for r in reps], [r[1] for r in reps]

    def interval(est: Any, reps: list) -> tuple[Any, Any, Any]:
        jack = group_jackknife(est, np.asarray(reps, dtype=np.float64))
        lo, hi = jack.interval(cfg.ci, distribution="t", centre="estimate")
        return lo, hi, jack.se

    # Counts lie in [0, m] and ratios of counts above 0: the t interval is projected onto
    # that range (covered values stay covered, the observed value stays inside).
    widths = np.array([s.d_sae for s in stats], dtype=np.float64)
    lo, hi, se = interval(est_r, reps_r)
    out["n_repr_ci"] = np.stack([np.clip(lo, 0, widths), np.clip(hi, 0, widths)])
    out["n_repr_se"] = np.asarray(se)
    if np.all(np.isfinite(reps_g)) and np.all(np.isfinite(est_g)):
        lo, hi, _ = interval(est_g, reps_g)
        out["n_repr_growth_ci"] = np.stack([np.maximum(lo, 0.0), hi])
    else:
        out["reason"] = "N_repr is 0 at the base width on all data or without some block"
    from scipy.stats import t as t_dist

    halves = halves or _Halves.of(stats, cfg, filled)
    se_w = halves.wedge_se() if np.isfinite(est_w) else math.nan
    if math.isfinite(se_w):
        half = float(t_dist.ppf(0.5 + cfg.ci / 2, filled.size - 1)) * se_w
        out["wedge_ci"] = [max(est_w - half, 0.0), est_w + half]
        out["wedge_se"] = se_w
    else:
        out["wedge_reason"] = (
            "the wedge is undefined (N_repr or N_causal is 0 at the base or widest width) on "
            "all data or on some half of the blocks"
        )
    return out


def analyze_width_sweep(
    stats: Mapping[int, FeatureStats],
    config: WidthSweepConfig | None = None,
    *,
    exact_erank: float | None = None,
    heldout_fvu: Mapping[int, float] | None = None,
    train_fvu: Mapping[int, float] | None = None,
    fvu_rise_se: Mapping[int, float] | None = None,
) -> WidthSweepResult:
    """Analyse per-width :class:`FeatureStats` gathered on the SAME evaluation tokens.

    ``heldout_fvu`` (width → FVU on held-out activations) enables the FVU gate
    (:func:`fvu_gate`, with ``config.fvu_rise_tol``, the rises' standard errors
    ``fvu_rise_se`` keyed by the wider width and the training FVU ``train_fvu`` that
    diagnoses a failure); with ``config.d_model`` set, a base width below
    ``min_base_width_ratio · d_model`` raises.
    The bootstrap resamples the filled prompt blocks (blocks without tokens are no units);
    the distinct counts get :func:`distinct_count_jackknife` intervals.
    """
    cfg = config or WidthSweepConfig()
    if len(stats) < 2:
        raise ValueError("a width sweep needs at least two widths.")
    widths = np.array(sorted(stats), dtype=np.float64)
    ordered = [stats[int(m)] for m in widths]
    for m, s in zip(widths, ordered, strict=True):
        if s.d_sae != int(m):
            raise ValueError(f"stats for width {int(m)} have d_sae = {s.d_sae}.")
    if len({(s.n_blocks, tuple(s.tokens.tolist())) for s in ordered}) != 1 or any(
        s.prompt_ids != ordered[0].prompt_ids for s in ordered
    ):
        raise ValueError(
            "all widths must be evaluated on the same tokens (same prompts and block counts)."
        )
    base = int(widths[0])
    if cfg.d_model is not None and base < cfg.min_base_width_ratio * cfg.d_model:
        raise ValueError(
            f"base width {base} < {cfg.min_base_width_ratio:g}·d = "
            f"{cfg.min_base_width_ratio * cfg.d_model:g}: ε is the base width's own 98th "
            f"percentile, so N_causal would be pinned near 2% of {base}; use a base width "
            f">= {math.ceil(cfg.min_base_width_ratio * cfg.d_model)} (the paper uses ≈ 7·d)."
        )
    fvu_list, train_list = _per_width(heldout_fvu, widths), _per_width(train_fvu, widths)
    gate = None
    if fvu_list is not None:
        gate = fvu_gate(
            [int(m) for m in widths], fvu_list, train_fvu=train_list, rise_se=fvu_rise_se,
            tolerance=cfg.fvu_rise_tol,
        )  # fmt: skip
    sweep_reason = gate.reason if gate else ""
    interpretable = gate is None or gate.passed
    n_repr, n_causal, eps = _counts(ordered, cfg, None)
    fits: dict[str, dict[str, Any]] = _fit_all(widths, n_causal) if interpretable else {}
    n_blocks = ordered[0].n_blocks
    filled = np.flatnonzero(ordered[0].tokens.numpy() > 0)
    # the half-samples behind the wedge's interval and the power-law test
    halves = _Halves.of(ordered, cfg, filled) if filled.size >= 2 else None
    power_p = float("nan")
    if fits and halves is not None:
        power_p = power_law_lack_of_fit(widths, n_causal, halves.n_causal, halves.scale)
    for name, fit in fits.items():
        fit["status"], fit["reason"] = kappa_identification(
            widths, n_causal, fit, name, power_law_p=power_p
        )
    rng = np.random.default_rng(cfg.seed)
    boot_c, boot_eps = [], []
    boot_k: dict[str, list[float]] = {name: [] for name in fits}
    weights = block_bootstrap_weights(ordered[0].tokens, cfg.n_bootstrap, rng)
    for c, e in zip(*_counts_batch(ordered, cfg, weights)[1:], strict=True):
        boot_c.append(c)
        boot_eps.append(e)
        if np.all(c > 0):
            for name, fit in _fit_all(widths, c).items():
                if name in boot_k:
                    boot_k[name].append(fit["K"])
    alpha = (1 - cfg.ci) / 2
    q = [100 * alpha, 100 * (1 - alpha)]

    def ci(values: list | np.ndarray) -> list[float]:
        arr = np.asarray(values, dtype=np.float64)
        if arr.shape[0] < 2:
            return [float("nan"), float("nan")]
        return np.percentile(arr, q, axis=0).tolist()

    nan2 = [float("nan"), float("nan")]
    for name, fit in fits.items():
        identified = fit["status"] == "identified"
        fit["K_ci"] = ci(boot_k[name]) if identified else nan2
        fit["n_bootstrap_fitted"] = len(boot_k[name])
        fit["K_profile_ci"] = (
            profile_interval_K(widths, n_causal, name, cfg.ci)
            if identified and widths.size > (3 if name == "hill" else 2)
            else None
        )

    def growth_ci(boot: list[np.ndarray]) -> np.ndarray:
        ok = [b / b[0] for b in boot if b[0] > 0]
        return np.asarray(ci(ok)) if len(ok) >= 2 else np.full((2, widths.size), np.nan)

    jack = distinct_count_jackknife(ordered, cfg, halves)
    _, repr_growth, wedge = _distinct(n_repr, n_causal)
    chosen = fits.get(cfg.fit_model)
    if not interpretable:
        status, reason = "not interpretable", sweep_reason
    elif chosen is None:
        status, reason = "no fit", "N_causal is 0 at some width or too few widths"
    else:
        status, reason = chosen["status"], chosen["reason"]
    identified = status == "identified"
    kappa = chosen["K"] if identified and chosen is not None else float("nan")
    kappa_ci = chosen["K_ci"] if identified and chosen is not None else nan2
    empty = np.full((2, widths.size), np.nan)
    return WidthSweepResult(
        widths=widths.astype(np.int64),
        n_repr=n_repr,
        n_causal=n_causal,
        n_repr_growth=repr_growth,
        n_causal_growth=n_causal / n_causal[0]
        if n_causal[0] > 0
        else np.full_like(n_causal, np.nan),
        wedge=float(wedge),
        epsilon=eps,
        epsilon_ci=ci(boot_eps),
        n_causal_ci=np.asarray(ci(boot_c)) if boot_c else empty,
        n_repr_ci=jack["n_repr_ci"],
        n_repr_growth_ci=jack["n_repr_growth_ci"],
        n_causal_growth_ci=growth_ci(boot_c),
        wedge_ci=jack["wedge_ci"],
        fits=fits,
        fit_model=cfg.fit_model,
        kappa_hat=float(kappa),
        kappa_hat_ci=list(kappa_ci),
        n_tokens=int(ordered[0].tokens.sum()),
        n_bootstrap=cfg.n_bootstrap,
        exact_erank=exact_erank,
        kappa_hat_over_erank=float(kappa / exact_erank) if exact_erank and identified else None,
        definitions={
            "n_repr": f"features with f_i > 0 on >= {cfg.min_count} evaluation tokens",
            "atp": "mean over tokens of |-f_i <W_dec[i], grad_h metric>| (zero ablation)",
            "epsilon": (
                f"largest base-width AtP outside the top ceil({1 - cfg.percentile / 100:g}*m), "
                "all base features (non-firing = 0) included"
            ),
            "n_causal": "features with AtP > epsilon",
            "fits": "least squares on log N_causal; kappa_hat = asymptote K",
            "bootstrap": (
                f"{cfg.n_bootstrap} resamples of the {filled.size} filled prompt blocks "
                f"(prompt id mod {n_blocks}; whole prompts) for epsilon, N_causal and K"
            ),
            "distinct_counts": (
                "N_repr and its growth: "
                + jack["method"]
                + "; the wedge: "
                + jack["wedge_method"]
                + "; estimand: the expected value on an evaluation "
                "set of as many prompts"
            ),
            "identification": (
                "unidentified when K sits on a bound, m_half lies outside the widths, or a "
                f"power law fits N_causal (lack-of-fit p >= {POWER_LAW_ALPHA:g}, delete-half "
                "jackknife covariance across widths)"
            ),
            "fvu_gate": (
                f"not interpretable when held-out FVU rises from one width to the next by more "
                f"than {cfg.fvu_rise_tol:g} x FVU plus {FVU_RISE_Z:g} jackknife SE over prompt "
                "blocks (the rise's one-sided 95% lower bound above the tolerance); "
                "data_limited when the train-held-out gap widens there, else under_trained"
            ),
        },
        kappa_hat_status=status,
        kappa_hat_reason=reason,
        power_law_p=power_p,
        kappa_hat_profile_ci=chosen["K_profile_ci"] if identified and chosen is not None else None,
        sweep_status="interpretable" if interpretable else "not interpretable",
        sweep_reason=sweep_reason,
        base_width=base,
        d_model=cfg.d_model,
        heldout_fvu=fvu_list,
        fvu_monotone=gate.passed if gate else None,
        sweep_cause=gate.cause if gate else None,
        train_fvu=train_list,
        fvu_gap=gate.gap if gate else None,
        fvu_rise_se=None
        if fvu_rise_se is None
        else {str(int(m)): fvu_rise_se[int(m)] for m in widths[1:] if int(m) in fvu_rise_se},
        fvu_rise_allowance=gate.allowance if gate else None,
        fvu_rise_tol=cfg.fvu_rise_tol,
        n_prompts=ordered[0].n_prompts,
        n_blocks_filled=int(filled.size),
        n_repr_se=jack["n_repr_se"],
        wedge_se=jack["wedge_se"],
        distinct_ci_method=jack["method"],
        wedge_ci_method=jack["wedge_method"],
        distinct_ci_reason="; ".join(
            dict.fromkeys(r for r in (jack["reason"], jack["wedge_reason"]) if r)
        ),
    )


def _per_width(values: Mapping[int, float] | None, widths: np.ndarray) -> list[float] | None:
    """``values`` (width → number) in the order of ``widths``; one for every width."""
    if values is None:
        return None
    missing = [int(m) for m in widths if int(m) not in values]
    if missing:
        raise ValueError(f"the FVU per width lacks widths {missing}; give one per width.")
    return [float(values[int(m)]) for m in widths]


def sweep_analysis(
    saes: Mapping[int, SparseAutoencoder],
    acts_grads: Sequence[tuple[torch.Tensor, torch.Tensor]],
    config: WidthSweepConfig | None = None,
    *,
    prompt_ids: Sequence[torch.Tensor] | None = None,
    n_blocks: int = 64,
    exact_erank: float | None = None,
    heldout_fvu: Mapping[int, float] | None = None,
    train_fvu: Mapping[int, float] | None = None,
    fvu_rise_se: Mapping[int, float] | None = None,
) -> tuple[WidthSweepResult, dict[int, FeatureStats]]:
    """:class:`FeatureStats` of every width from the SAME ``(acts, grads)`` batches, then
    :func:`analyze_width_sweep` (``heldout_fvu``, ``train_fvu``, ``fvu_rise_se``: the FVU
    gate's inputs).

    ``prompt_ids`` holds, per batch of ``acts_grads``, the prompt of every row
    (:func:`structlens.causal_dim.model.token_prompt_ids`): the bootstrap and jackknife
    resample whole prompts.  Required unless ``n_blocks == 1``.

    Raises
    ------
    ValueError
        Without ``prompt_ids`` (and ``n_blocks != 1``), or with one tensor too many or few.
    """
    batches = list(acts_grads)
    if prompt_ids is None:
        if n_blocks != 1:
            raise ValueError(
                "sweep_analysis needs prompt_ids (one tensor per batch, the prompt of each "
                "token; see structlens.causal_dim.model.token_prompt_ids): the intervals "
                "resample whole prompts."
            )
        ids: list[torch.Tensor | None] = [None] * len(batches)
    else:
        ids = list(prompt_ids)
        if len(ids) != len(batches):
            raise ValueError(
                f"prompt_ids has {len(ids)} batches but acts_grads {len(batches)}; give one "
                "tensor of prompt ids per (acts, grads) batch."
            )
    stats = {m: FeatureStats(m, n_blocks) for m in saes}
    for (acts, grads), pid in zip(batches, ids, strict=True):
        for m, sae in saes.items():
            stats[m].update(sae, acts, grads, pid)
    res = analyze_width_sweep(
        stats, config, exact_erank=exact_erank, heldout_fvu=heldout_fvu, train_fvu=train_fvu,
        fvu_rise_se=fvu_rise_se,
    )  # fmt: skip
    return res, stats


def pretrained_sweep_saes(
    specs: Sequence[str],
    *,
    model: Any = None,
    site: str | None = None,
    d_model: int | None = None,
    allow_foreign: bool = False,
) -> dict[int, SparseAutoencoder]:
    """The published SAEs ``specs`` (registry names ``RELEASE/SAE_ID`` or folders in any
    layout of :mod:`structlens.sae.formats`) as a width sweep, width → SAE, in float32.

    Each is refused as foreign unless it was made from ``model`` at ``site`` (the sweep's
    site; ``allow_foreign`` warns instead).  The sweep needs at least two SAEs of one site,
    one per width, of input width ``d_model``: transcoders (whose features write another
    site), repeated widths and other input widths are refused with an
    :class:`~structlens.errors.InputError`.
    """
    from structlens.errors import InputError
    from structlens.sae.formats import check_dictionary
    from structlens.sae.registry import read_pretrained

    if len(specs) < 2:
        raise InputError(f"a width sweep needs at least two SAEs; got {len(specs)} (--saes).")
    saes: dict[int, SparseAutoencoder] = {}
    names: dict[int, str] = {}
    for spec in specs:
        d = read_pretrained(spec, dtype=torch.float32)
        if not isinstance(d.module, SparseAutoencoder):
            raise InputError(
                f"{spec} is a transcoder: its features write {d.output_site or 'another site'}, "
                "so AtP through its decoder is not the SAE's; the sweep takes SAEs of one site."
            )
        check_dictionary(d, model=model, site=site, allow_foreign=allow_foreign)
        sae = d.module
        if d_model is not None and sae.d_in != d_model:
            raise InputError(f"{spec} reads d_in = {sae.d_in}, the model's d is {d_model}.")
        if sae.d_sae in saes:
            raise InputError(
                f"{names[sae.d_sae]} and {spec} both have width {sae.d_sae}: a width sweep "
                "takes one SAE per width."
            )
        saes[sae.d_sae], names[sae.d_sae] = sae, spec
    return dict(sorted(saes.items()))


if TYPE_CHECKING:  # the roles of structlens.estimator, checked by mypy
    from structlens.estimator import Statistics

    _FeatureStats: type[Statistics] = FeatureStats

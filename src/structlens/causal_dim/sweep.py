"""Width-sweep analysis: N_repr(m), N_causal(m), the wedge, saturating fits and κ̂.

Per SAE width ``m`` a :class:`FeatureStats` accumulator collects, over the evaluation tokens,
how often each feature fires and the sum of ``|AtP|`` (see :mod:`structlens.causal_dim.atp`),
split into ``n_blocks`` token blocks (token ``t`` goes to block ``t mod n_blocks``) so the
bootstrap can resample tokens without keeping per-token data.  Accumulators merge by addition.

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
  token blocks (ε recomputed in every replicate) and by profile likelihood of the curve fit.
* **Identification** (:func:`kappa_identification`).  The fits bound ``K`` below by
  ``max N_causal``; a ``K`` on a bound, or ``m½`` outside the measured widths, means the curve
  has not bent over inside the data and ``K`` is not determined by it.  Such a κ̂ is reported
  as ``"unidentified"`` with the reason, ``kappa_hat`` is NaN, and no interval is given.
* **Gates** (a status, not a fit).  ε is anchored at the base width, so ``N_causal(m_base)``
  is ``⌈0.02·m_base⌉`` by construction; with ``m_base < 4·d`` the whole curve is pinned near
  2% of a width too small to hold the layer's causal directions (the paper's base width is
  ≈ 7·d).  Given ``d_model``, a base width below ``min_base_width_ratio · d`` is rejected.
  Given the held-out FVU per width, a sweep whose FVU does not fall with width (under-trained
  SAEs) gets ``sweep_status = "not interpretable"`` and no fits.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from structlens.causal_dim.atp import sparse_feature_atp
from structlens.results import Result
from structlens.sae.models import SparseAutoencoder

FIT_MODELS = ("michaelis_menten", "exponential", "hill")
# K ranges over [max N_causal, max N_causal · e^25] in the fits
_LOG_K_SPAN = 25.0


class FeatureStats:
    """Mergeable per-feature firing counts and ``|AtP|`` sums in token blocks (float64)."""

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

    def update(self, sae: SparseAutoencoder, acts: torch.Tensor, grads: torch.Tensor) -> None:
        """Add tokens ``acts`` [n, d_in] with metric gradients ``grads`` [n, d_in]."""
        if sae.d_sae != self.d_sae:
            raise ValueError(f"SAE has {sae.d_sae} features, the accumulator {self.d_sae}.")
        tok, feat, atp = sparse_feature_atp(sae, acts, grads)
        n = acts.shape[0]
        block_of_token = (torch.arange(n) + self.n_seen) % self.n_blocks
        blk = block_of_token[tok]
        flat = blk * self.d_sae + feat
        atp = atp.double()
        self.abs_atp.view(-1).index_add_(0, flat, atp.abs())
        self.signed_atp.view(-1).index_add_(0, flat, atp)
        self.fires.view(-1).index_add_(0, flat, torch.ones_like(atp))
        self.tokens.index_add_(0, block_of_token, torch.ones(n, dtype=torch.float64))
        self.n_seen += n

    def merge(self, other: FeatureStats) -> FeatureStats:
        if (other.d_sae, other.n_blocks) != (self.d_sae, self.n_blocks):
            raise ValueError("can only merge FeatureStats with equal d_sae and n_blocks.")
        out = FeatureStats(self.d_sae, self.n_blocks)
        for name in ("abs_atp", "signed_atp", "fires", "tokens"):
            setattr(out, name, getattr(self, name) + getattr(other, name))
        out.n_seen = self.n_seen + other.n_seen
        return out

    def scores(self, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(AtP_i, fire_count_i)`` with optional bootstrap block weights."""
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


def _model(name: str, m: np.ndarray, p: np.ndarray) -> np.ndarray:
    k = np.exp(p[0])
    if name == "michaelis_menten":
        return k * m / (m + np.exp(p[1]))
    if name == "exponential":
        return k * -np.expm1(-m / np.exp(p[1]))
    if name == "hill":
        n = np.exp(p[2])
        return k / (1 + (np.exp(p[1]) / m) ** n)
    raise ValueError(f"unknown fit model {name!r}; choose from {FIT_MODELS}.")


def fit_saturating(widths: np.ndarray, counts: np.ndarray, model: str) -> dict[str, float]:
    """Least-squares fit on ``log N`` of one saturating form; returns parameters and RMS."""
    from scipy.optimize import least_squares

    m = np.asarray(widths, dtype=np.float64)
    y = np.asarray(counts, dtype=np.float64)
    if np.any(y <= 0):
        raise ValueError("counts must be positive to fit in log space.")
    n_par = 3 if model == "hill" else 2
    if m.size < n_par + 1:
        raise ValueError(f"the {model} fit needs at least {n_par + 1} widths, got {m.size}.")
    x0 = [np.log(2 * y.max()), np.log(np.median(m))] + ([0.0] if n_par == 3 else [])
    lo = [np.log(y.max()) - 1e-9, np.log(m.min()) - 10] + ([np.log(0.1)] if n_par == 3 else [])
    hi = [np.log(y.max()) + _LOG_K_SPAN, np.log(m.max()) + 25]
    hi += [np.log(10.0)] if n_par == 3 else []
    x0 = np.clip(x0, np.array(lo) + 1e-6, np.array(hi) - 1e-6)
    sol = least_squares(
        lambda p: np.log(_model(model, m, p)) - np.log(y), x0, bounds=(lo, hi), method="trf"
    )
    out = {"K": float(np.exp(sol.x[0])), "m_half": float(np.exp(sol.x[1]))}
    if model == "hill":
        out["n"] = float(np.exp(sol.x[2]))
    out["rms_log_residual"] = float(np.sqrt(np.mean(sol.fun**2)))
    return out


def kappa_identification(
    widths: np.ndarray,
    counts: np.ndarray,
    fit: Mapping[str, float],
    model: str = "michaelis_menten",
    rtol: float = 1e-6,
) -> tuple[str, str]:
    """``("identified", "")`` or ``("unidentified", reason)`` for a saturating fit of
    ``counts`` over ``widths`` (see the module docstring).

    Unidentified when ``K`` sits on its lower bound ``max N_causal`` (within ``rtol``: the
    constraint is active) or at the upper end of its range, or when the half-saturation
    width ``m½`` (``m₀·ln 2`` for the exponential form, whose ``fit["m_half"]`` is its scale
    ``m₀``) lies outside the measured widths.
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
    from scipy.optimize import brentq, least_squares
    from scipy.stats import f as f_dist

    m = np.asarray(widths, dtype=np.float64)
    y = np.asarray(counts, dtype=np.float64)
    fit = fit_saturating(m, y, model)
    n_par = 3 if model == "hill" else 2
    dof = m.size - n_par
    if dof < 1:
        raise ValueError(f"a profile interval needs more widths than {n_par} parameters.")
    lo_k, hi_k = math.log(y.max()), math.log(y.max()) + _LOG_K_SPAN
    rest_lo = [math.log(m.min()) - 10] + ([math.log(0.1)] if n_par == 3 else [])
    rest_hi = [math.log(m.max()) + 25] + ([math.log(10.0)] if n_par == 3 else [])
    start = [math.log(fit["m_half"])] + ([math.log(fit["n"])] if n_par == 3 else [])

    def rss(log_k: float) -> float:
        x0 = np.clip(start, np.array(rest_lo) + 1e-6, np.array(rest_hi) - 1e-6)
        sol = least_squares(
            lambda r: np.log(_model(model, m, np.r_[log_k, r])) - np.log(y),
            x0,
            bounds=(rest_lo, rest_hi),
            method="trf",
        )
        return float(np.sum(sol.fun**2))

    log_k_hat = math.log(fit["K"])
    rss_min = rss(log_k_hat)
    if rss_min <= 1e-24:  # an exact fit: no residual scale, the interval is the point
        return [fit["K"], fit["K"]]
    limit = rss_min * (1 + float(f_dist.ppf(level, 1, dof)) / dof)

    def excess(log_k: float) -> float:
        return rss(log_k) - limit

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
    over token blocks give the CIs (``ci`` level).  ``d_model`` (when given) enables the
    base-width check: the smallest width must be at least ``min_base_width_ratio · d_model``
    (see the module docstring).
    """

    percentile: float = 98.0
    min_count: int = 1
    fit_model: str = "michaelis_menten"
    n_bootstrap: int = 200
    ci: float = 0.95
    seed: int = 0
    d_model: int | None = None
    min_base_width_ratio: float = 4.0

    def __post_init__(self) -> None:
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
    (lower, upper) bootstrap percentile intervals, growth CIs are of the per-replicate ratios
    to the base width (replicates with a zero base count are dropped).  ``fits`` maps each
    model name to its parameters on the full data plus ``K_ci``; ``kappa_hat``/``kappa_hat_ci``
    come from ``fit_model``.  ``exact_erank`` / ``kappa_hat_over_erank`` are filled when the exact
    effective rank of Σ was supplied.  ``definitions`` records every convention used.

    ``kappa_hat_status`` is ``"identified"``, ``"unidentified"`` (``kappa_hat`` NaN, reason in
    ``kappa_hat_reason``, raw fit still in ``fits``), ``"no fit"`` or ``"not interpretable"``
    (the sweep gate failed).  ``kappa_hat_ci`` is the bootstrap interval and
    ``kappa_hat_profile_ci`` the profile-likelihood interval, both only for identified fits.
    ``sweep_status`` is ``"interpretable"`` or ``"not interpretable"`` (reason in
    ``sweep_reason``); ``fvu_monotone`` is ``None`` when no held-out FVU was given.
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


def _counts(
    stats: Sequence[FeatureStats], cfg: WidthSweepConfig, w: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, float]:
    pairs = [s.scores(w) for s in stats]
    eps = calibrate_epsilon(pairs[0][0], 1 - cfg.percentile / 100)
    n_repr = np.array([np.sum(c >= cfg.min_count) for _, c in pairs], dtype=np.float64)
    n_causal = np.array([np.sum(a > eps) for a, _ in pairs], dtype=np.float64)
    return n_repr, n_causal, eps


def _fit_all(widths: np.ndarray, n_causal: np.ndarray) -> dict[str, dict[str, float]]:
    fits: dict[str, dict[str, float]] = {}
    for name in FIT_MODELS:
        n_par = 3 if name == "hill" else 2
        if widths.size > n_par and np.all(n_causal > 0):
            fits[name] = fit_saturating(widths, n_causal, name)
    return fits


def fvu_gate(widths: Sequence[int], heldout_fvu: Sequence[float]) -> tuple[bool, str]:
    """Does held-out FVU fall strictly with width?  ``(ok, reason)``."""
    order = np.argsort(np.asarray(widths))
    f = np.asarray(heldout_fvu, dtype=np.float64)[order]
    if f.shape != (len(widths),):
        raise ValueError(f"give one held-out FVU per width; got {f.shape} for {len(widths)}.")
    rises = [int(np.asarray(widths)[order][i + 1]) for i in range(len(f) - 1) if f[i + 1] >= f[i]]
    if rises:
        return False, (
            f"held-out FVU does not fall with width (FVU {np.round(f, 4).tolist()}; no drop at "
            f"widths {rises}): the SAEs are under-trained, train each width to convergence"
        )
    return True, ""


def analyze_width_sweep(
    stats: Mapping[int, FeatureStats],
    config: WidthSweepConfig | None = None,
    *,
    exact_erank: float | None = None,
    heldout_fvu: Mapping[int, float] | None = None,
) -> WidthSweepResult:
    """Analyse per-width :class:`FeatureStats` gathered on the SAME evaluation tokens.

    ``heldout_fvu`` (width → FVU on held-out activations) enables the FVU gate; with
    ``config.d_model`` set, a base width below ``min_base_width_ratio · d_model`` raises.
    """
    cfg = config or WidthSweepConfig()
    if len(stats) < 2:
        raise ValueError("a width sweep needs at least two widths.")
    widths = np.array(sorted(stats), dtype=np.float64)
    ordered = [stats[int(m)] for m in widths]
    for m, s in zip(widths, ordered, strict=True):
        if s.d_sae != int(m):
            raise ValueError(f"stats for width {int(m)} have d_sae = {s.d_sae}.")
    if len({(s.n_blocks, tuple(s.tokens.tolist())) for s in ordered}) != 1:
        raise ValueError("all widths must be evaluated on the same tokens (same block counts).")
    base = int(widths[0])
    if cfg.d_model is not None and base < cfg.min_base_width_ratio * cfg.d_model:
        raise ValueError(
            f"base width {base} < {cfg.min_base_width_ratio:g}·d = "
            f"{cfg.min_base_width_ratio * cfg.d_model:g}: ε is the base width's own 98th "
            f"percentile, so N_causal would be pinned near 2% of {base}; use a base width "
            f">= {math.ceil(cfg.min_base_width_ratio * cfg.d_model)} (the paper uses ≈ 7·d)."
        )
    fvu_list, fvu_ok, sweep_reason = None, None, ""
    if heldout_fvu is not None:
        missing = [int(m) for m in widths if int(m) not in heldout_fvu]
        if missing:
            raise ValueError(f"heldout_fvu lacks widths {missing}; give one FVU per width.")
        fvu_list = [float(heldout_fvu[int(m)]) for m in widths]
        fvu_ok, sweep_reason = fvu_gate([int(m) for m in widths], fvu_list)
    interpretable = fvu_ok is not False
    n_repr, n_causal, eps = _counts(ordered, cfg, None)
    fits: dict[str, dict[str, Any]] = _fit_all(widths, n_causal) if interpretable else {}
    for name, fit in fits.items():
        fit["status"], fit["reason"] = kappa_identification(widths, n_causal, fit, name)
    rng = np.random.default_rng(cfg.seed)
    n_blocks = ordered[0].n_blocks
    boot_r, boot_c, boot_eps = [], [], []
    boot_k: dict[str, list[float]] = {name: [] for name in fits}
    for _ in range(cfg.n_bootstrap):
        w = rng.multinomial(n_blocks, np.full(n_blocks, 1 / n_blocks)).astype(np.float64)
        r, c, e = _counts(ordered, cfg, w)
        boot_r.append(r)
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

    wedges = [
        (r[-1] / r[0]) / (c[-1] / c[0])
        for r, c in zip(boot_r, boot_c, strict=True)
        if r[0] > 0 and c[0] > 0 and c[-1] > 0
    ]
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
        n_repr_growth=n_repr / n_repr[0] if n_repr[0] > 0 else np.full_like(n_repr, np.nan),
        n_causal_growth=n_causal / n_causal[0]
        if n_causal[0] > 0
        else np.full_like(n_causal, np.nan),
        wedge=float((n_repr[-1] / n_repr[0]) / (n_causal[-1] / n_causal[0]))
        if n_repr[0] > 0 and n_causal[0] > 0 and n_causal[-1] > 0
        else float("nan"),
        epsilon=eps,
        epsilon_ci=ci(boot_eps),
        n_causal_ci=np.asarray(ci(boot_c)) if boot_c else empty,
        n_repr_ci=np.asarray(ci(boot_r)) if boot_r else empty,
        n_repr_growth_ci=growth_ci(boot_r),
        n_causal_growth_ci=growth_ci(boot_c),
        wedge_ci=ci(wedges),
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
            "bootstrap": f"{cfg.n_bootstrap} resamples of {n_blocks} token blocks",
            "identification": (
                "unidentified when K sits on a bound or m_half lies outside the widths"
            ),
        },
        kappa_hat_status=status,
        kappa_hat_reason=reason,
        kappa_hat_profile_ci=chosen["K_profile_ci"] if identified and chosen is not None else None,
        sweep_status="interpretable" if interpretable else "not interpretable",
        sweep_reason=sweep_reason,
        base_width=base,
        d_model=cfg.d_model,
        heldout_fvu=fvu_list,
        fvu_monotone=fvu_ok,
    )

"""The width sweep's wedge and κ̂ on planted feature populations whose counts are known.

An instance plants one population of features per SAE width ``m`` of the protocol's sweep.
Each feature fires at a rate ``r_i`` per token and has an expected ``|AtP|`` ``μ_i`` (the mean
over tokens, non-firing tokens counting 0, as :class:`~structlens.causal_dim.sweep.
FeatureStats` defines it).  Of the ``m`` features:

* ``n_causal(m)`` are causal, ``μ_i = τ·exp(0.1 + |z|/2)``; the rest ``μ_i = τ·exp(−0.1 −
  |z|)`` (``z`` standard normal), so the protocol's threshold, the base width's 98th
  percentile, falls near ``τ`` while evaluation noise still moves features across it, as it
  moves real AtP scores;
* a share :data:`DEAD` never fires; the others fire at rates log-uniform over
  ``[0.3/(P·T), 0.02]`` (``P`` prompts of ``T`` tokens), so the rarest fire on no token of
  some evaluation sets and ``N_repr`` is a sample count too; causal features at rates
  log-uniform over ``[0.002, 0.02]``;
* features fire in bursts: a feature's count on a prompt is Poisson with mean
  ``T·r_i·g`` and ``g ~ Gamma(2, 1/2)`` drawn per prompt and feature, the within-prompt
  correlation the sweep's prompt-block resampling exists for.

The non-causal features have one ``|AtP|`` distribution at every width, so their number
near the threshold grows in proportion to the width (real SAEs split and weaken features as
they widen, which this does not model).  ``N_repr`` grows with the width in proportion (the
same share of live features at every width), so the planted wedge is
``(m_max/m_0) / (n_causal(m_max)/n_causal(m_0))``.

The population is drawn once per family (its seed); an instance redraws the evaluation
prompts only, which is the variability the sweep's intervals claim to cover (the SAEs are
fixed, the evaluation prompts a sample).  The counts go, per prompt block, straight into the
fields of the production accumulator :class:`~structlens.causal_dim.sweep.FeatureStats` (as
its ``update`` fills them; the SAE encoding and AtP arithmetic are tested elsewhere against
exact ablation), and :func:`~structlens.causal_dim.sweep.analyze_width_sweep` with
:func:`~structlens.causal_dim.verdicts.wedge` / :func:`~structlens.causal_dim.verdicts.
kappa_hat` decide, at the paper protocol's widths, ε percentile, prompts, blocks and
bootstrap.

Truths.  The wedge rule (a gap when the wedge's interval clears
:data:`~structlens.causal_dim.verdicts.WEDGE_GAP`) should say "gap" exactly when the planted
wedge exceeds it.  Its interval's estimand is the expected wedge on an evaluation set of as
many prompts, estimated here by the mean over the family's instances (which share the
population); coverage is reported against that mean and against the planted value.  κ̂ is
identified when the planted ``n_causal(m)`` is a Michaelis–Menten curve ``K m/(m + m½)`` with
``m½`` inside the widths, and should be unidentified for curves without an asymptote
(linear, a power law) or whose ``m½`` lies beyond the widths; its intervals should cover the
planted ``K``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from structlens.causal_dim.protocol import PROFILES, CausalProtocol
from structlens.stats.intervals import wilson_interval

__all__ = ["PROTOCOL", "DEAD", "WEDGES", "KAPPA_FAMILIES", "planted_counts", "planted_stats",
           "WedgeCalibration", "calibrate_wedge", "KappaHatCalibration",
           "calibrate_kappa_hat"]  # fmt: skip

#: The paper protocol's sweep (widths, ε percentile, evaluation prompts, blocks, bootstrap).
PROTOCOL: CausalProtocol = PROFILES["paper"]
#: Share of each width's features that never fire.
DEAD = 0.1
#: The planted wedges of the wedge rule's families (gap when above ``WEDGE_GAP`` = 1.5).
WEDGES = (1.0, 1.5, 2.0, 3.0, 5.0)
#: The κ̂ families: (curve, parameter); ``saturating`` at ``m½ = parameter · m_0``, ``power``
#: ``n ∝ m^parameter`` (1: linear).  Identified only for ``m½`` inside the widths.
KAPPA_FAMILIES = (
    ("saturating", 1.5), ("saturating", 3.0), ("saturating", 6.0), ("saturating", 32.0),
    ("power", 1.0), ("power", 0.5),
)  # fmt: skip
#: Log-distance of the planted AtP means from the threshold τ on either side.
GAP = 0.1
#: Firing rate per token of a feature whose expected |AtP| is τ, at the median |AtP| per
#: firing (the causal features fire about this often, the weakest 50–100× less).
THRESHOLD_RATE = 0.005


def planted_counts(
    curve: str, parameter: float, widths: tuple[int, ...], n_base: int
) -> tuple[np.ndarray, float]:
    """The planted ``n_causal`` per width (integers, ``n_base`` at the base width) and the
    asymptote ``K`` (``inf`` for a power law).

    ``curve``: ``"saturating"`` (``K m/(m + m½)``, ``m½ = parameter · m_0``), ``"power"``
    (``n_base (m/m_0)^parameter``) or ``"wedge"`` (a saturating curve whose growth to the
    widest width is ``(m_max/m_0)/parameter``: the planted wedge is ``parameter``; linear at
    1)."""
    m = np.asarray(widths, dtype=np.float64)
    m0, span = m[0], m[-1] / m[0]
    if curve == "wedge":
        growth = span / parameter
        if not 1 <= growth <= span:
            raise ValueError(f"a wedge of {parameter} needs a growth in [1, {span:g}].")
        if math.isclose(growth, span):
            return np.round(n_base * m / m0), math.inf
        # K m/(m + h) grows by span·(m0 + h)/(m_max + h) from m0 to m_max
        parameter, curve = span * (growth - 1) / (span - growth), "saturating"
    if curve == "saturating":
        h = parameter * m0
        k = n_base * (m0 + h) / m0
        return np.round(k * m / (m + h)), float(k)
    if curve == "power":
        return np.round(n_base * (m / m0) ** parameter), math.inf
    raise ValueError(f"unknown curve {curve!r}; choose saturating, power or wedge.")


@dataclass(frozen=True)
class _Population:
    rates: np.ndarray  # per token; 0: dead
    mean_atp: np.ndarray  # in units of the threshold τ


def _population(m: int, n_causal: int, rng: np.random.Generator) -> _Population:
    n_dead = int(round(DEAD * m))
    n_rest = m - n_causal - n_dead
    if n_rest < 0:
        raise ValueError(f"width {m} cannot hold {n_causal} causal features.")
    mean_atp = np.concatenate([
        np.exp(GAP + np.abs(rng.standard_normal(n_causal)) / 2),
        np.exp(-GAP - np.abs(rng.standard_normal(n_rest)) * 2),
        np.zeros(n_dead),
    ])  # fmt: skip
    # |AtP| per firing is lognormal around one value, independent of the rate: a feature's
    # expected |AtP| is mostly its rate, so rare features are weak ones, as in real SAEs
    per_firing = np.exp(0.5 * rng.standard_normal(m)) / THRESHOLD_RATE
    return _Population(mean_atp / per_firing, mean_atp)


def planted_stats(
    populations: dict[int, _Population],
    *,
    seed: int,
    protocol: CausalProtocol = PROTOCOL,
) -> dict:
    """One evaluation set of the protocol's prompts: a
    :class:`~structlens.causal_dim.sweep.FeatureStats` per width, filled with the planted
    firings and ``|AtP|`` sums in the protocol's prompt blocks."""
    import torch

    from structlens.causal_dim.sweep import FeatureStats

    rng = np.random.default_rng(seed)
    n_prompts, tokens = protocol.sae_eval_prompts + protocol.sae_eval_extra, protocol.chunk_tokens
    blocks = np.arange(n_prompts) % protocol.sweep_blocks
    out = {}
    for m, pop in populations.items():
        live = pop.rates > 0
        rate = np.zeros((n_prompts, m))
        rate[:, live] = tokens * pop.rates[live] * rng.gamma(2.0, 0.5, (n_prompts, int(live.sum())))
        fires = rng.poisson(rate).astype(np.float64)
        per_firing = np.divide(pop.mean_atp, pop.rates, out=np.zeros(m), where=live)
        stats = FeatureStats(m, protocol.sweep_blocks)
        fires_b = np.zeros((protocol.sweep_blocks, m))
        np.add.at(fires_b, blocks, fires)
        stats.fires = torch.as_tensor(fires_b)
        stats.abs_atp = torch.as_tensor(fires_b * per_firing)
        stats.signed_atp = stats.abs_atp.clone()
        stats.tokens = torch.as_tensor(np.bincount(blocks, minlength=protocol.sweep_blocks)
                                       * float(tokens))  # fmt: skip
        stats.n_seen = n_prompts * tokens
        stats.prompt_ids = set(range(n_prompts))
        out[m] = stats
    return out


def _populations(
    counts: np.ndarray, family: tuple[int, ...], protocol: CausalProtocol
) -> dict[int, _Population]:
    """The planted population of every width, seeded by the ``family`` (a tuple, apart from
    the integer seeds of the instances' evaluation sets)."""
    rng = np.random.default_rng(family)
    return {
        int(m): _population(int(m), int(c), rng)
        for m, c in zip(protocol.sweep_widths, counts, strict=True)
    }


def _sweep(stats: dict, cfg: Any) -> Any:
    """The :class:`~structlens.causal_dim.stages.SweepFit` the verdicts read, from
    :func:`~structlens.causal_dim.sweep.analyze_width_sweep` as the sweep stage makes it (the
    stage's layer, quality and AtP-mass fields are no part of these rules)."""
    from structlens.causal_dim.stages import SweepFit
    from structlens.causal_dim.sweep import WidthSweepResult, analyze_width_sweep

    res = analyze_width_sweep(stats, cfg)
    return SweepFit(**{f.name: getattr(res, f.name) for f in fields(WidthSweepResult)})


def _n_base(protocol: CausalProtocol) -> int:
    return math.ceil(round((1 - protocol.percentile / 100) * protocol.sweep_widths[0], 9))


@dataclass(frozen=True)
class WedgeCalibration:
    """The wedge rule on ``n`` evaluation sets of one planted population whose wedge is
    ``effect``; ``expected`` whether the rule should see a gap (``effect > WEDGE_GAP``).
    ``rate``: the verdict sees a gap (reproduced or partly); ``mean_estimate`` the mean
    measured wedge (the interval's estimand, up to Monte-Carlo error), ``coverage`` the share
    of intervals that hold it, ``coverage_planted`` of those that hold ``effect``,
    ``mean_width`` the intervals' mean width; ``planted_n_causal_growth`` the planted growth
    of ``N_causal`` to the widest width, ``mean_n_causal_growth`` and ``mean_n_repr_growth``
    the measured ones; ``n_causal_rsd`` and ``epsilon_rsd`` the relative spread (standard
    deviation over mean) of the widest width's ``N_causal`` and of ε over the instances, the
    planted evaluation noise (on SmolLM2's sweep the bootstrap CIs of the wider widths'
    ``N_causal`` reach ±12–15% and ε's ±6.5%, about two such spreads)."""

    effect: float
    expected: bool
    n: int
    rate: float
    rate_ci: tuple[float, float]
    mean_estimate: float
    coverage: float
    coverage_ci: tuple[float, float]
    coverage_planted: float
    mean_width: float
    planted_n_causal_growth: float
    mean_n_causal_growth: float
    mean_n_repr_growth: float
    n_causal_rsd: float
    epsilon_rsd: float
    seeds: tuple[int, int]


def calibrate_wedge(
    wedge: float, n: int, *, first_seed: int = 0, protocol: CausalProtocol = PROTOCOL
) -> WedgeCalibration:
    """:func:`~structlens.causal_dim.verdicts.wedge` on ``n`` evaluation sets (seeds
    ``first_seed, ...``) of the population planted with ``wedge`` (its seed fixed by the
    family).  The wedge's interval is a jackknife, so the sweep runs without its bootstrap,
    which only the κ̂ and ``N_causal`` intervals use."""
    from structlens.causal_dim import verdicts

    counts, _ = planted_counts("wedge", wedge, protocol.sweep_widths, _n_base(protocol))
    pops = _populations(counts, (1, int(round(100 * wedge))), protocol)
    cfg = protocol.width_sweep(None, n_bootstrap=0)
    gaps, est, cis, gc, gr, top, eps = 0, [], [], [], [], [], []
    for seed in range(first_seed, first_seed + n):
        res = _sweep(planted_stats(pops, seed=seed, protocol=protocol), cfg)
        gaps += verdicts.wedge(res).verdict != "not reproduced"
        est.append(res.wedge)
        cis.append(res.wedge_ci)
        gc.append(res.n_causal_growth[-1])
        gr.append(res.n_repr_growth[-1])
        top.append(res.n_causal[-1])
        eps.append(res.epsilon)
    lo, hi = np.asarray(cis, dtype=np.float64).T
    target = float(np.mean(est))
    covered = int(np.sum((lo <= target) & (target <= hi)))
    return WedgeCalibration(
        effect=float(wedge), expected=wedge > verdicts.WEDGE_GAP, n=n, rate=gaps / n,
        rate_ci=wilson_interval(gaps, n), mean_estimate=target, coverage=covered / n,
        coverage_ci=wilson_interval(covered, n),
        coverage_planted=float(np.mean((lo <= wedge) & (wedge <= hi))),
        mean_width=float(np.mean(hi - lo)), planted_n_causal_growth=float(counts[-1] / counts[0]),
        mean_n_causal_growth=float(np.mean(gc)), mean_n_repr_growth=float(np.mean(gr)),
        n_causal_rsd=_rsd(top), epsilon_rsd=_rsd(eps), seeds=(first_seed, first_seed + n - 1),
    )  # fmt: skip


def _rsd(values: list[float]) -> float:
    return float(np.std(values) / np.mean(values)) if len(values) > 1 else float("nan")


@dataclass(frozen=True)
class KappaHatCalibration:
    """κ̂ on ``n`` evaluation sets of one planted population: ``family`` the curve
    (``saturating`` at ``m½ = effect · m_0``, ``power`` with exponent ``effect``), ``K`` the
    planted asymptote (``inf``: none), ``expected`` whether κ̂ should be identified (``m½``
    inside the widths).  ``rate``: κ̂ is identified; among identified instances
    ``coverage`` / ``profile_coverage`` the share whose bootstrap (the claim's) / profile
    interval holds ``K`` (NaN with none identified or no ``K``), ``mean_kappa`` the mean κ̂,
    ``mean_width`` the bootstrap intervals' mean width."""

    family: str
    effect: float
    K: float
    expected: bool
    n: int
    rate: float
    rate_ci: tuple[float, float]
    n_identified: int
    coverage: float
    coverage_ci: tuple[float, float]
    profile_coverage: float
    mean_kappa: float
    mean_width: float
    seeds: tuple[int, int]


def calibrate_kappa_hat(
    curve: str,
    parameter: float,
    n: int,
    *,
    first_seed: int = 0,
    intervals: bool = False,
    protocol: CausalProtocol = PROTOCOL,
) -> KappaHatCalibration:
    """κ̂'s identification (:func:`~structlens.causal_dim.verdicts.kappa_hat_status`) on ``n``
    evaluation sets (seeds ``first_seed, ...``) of the population planted with ``curve`` at
    ``parameter`` (:func:`planted_counts`).  The decision comes from the fit on all data, so
    it runs without the bootstrap unless ``intervals`` asks for the intervals' coverage too
    (the protocol's bootstrap: about 1 s an instance)."""
    from structlens.causal_dim import verdicts

    widths = protocol.sweep_widths
    counts, k_true = planted_counts(curve, parameter, widths, _n_base(protocol))
    pops = _populations(counts, (2, int(curve == "power"), int(round(100 * parameter))), protocol)
    cfg = protocol.width_sweep(None, n_bootstrap=None if intervals else 0)
    expected = curve == "saturating" and parameter * widths[0] <= widths[-1]
    ident, covered, profiled, kappas, widths_ci = 0, 0, 0, [], []
    for seed in range(first_seed, first_seed + n):
        res = _sweep(planted_stats(pops, seed=seed, protocol=protocol), cfg)
        if verdicts.kappa_hat_status(res)[0] != "identified":
            continue
        ident += 1
        lo, hi = (float(v) for v in res.kappa_hat_ci)
        covered += lo <= k_true <= hi
        plo, phi = (float(v) for v in res.kappa_hat_profile_ci or (math.nan, math.nan))
        profiled += plo <= k_true <= phi
        kappas.append(res.kappa_hat)
        widths_ci.append(hi - lo)
    finite = intervals and math.isfinite(k_true) and ident > 0
    nan = float("nan")
    return KappaHatCalibration(
        family=curve, effect=float(parameter), K=k_true, expected=bool(expected), n=n,
        rate=ident / n, rate_ci=wilson_interval(ident, n), n_identified=ident,
        coverage=covered / ident if finite else nan,
        coverage_ci=wilson_interval(covered, ident) if finite else (nan, nan),
        profile_coverage=profiled / ident if finite else nan,
        mean_kappa=float(np.mean(kappas)) if kappas else nan,
        mean_width=float(np.mean(widths_ci)) if widths_ci else nan,
        seeds=(first_seed, first_seed + n - 1),
    )  # fmt: skip

"""Koopman rules on planted linear systems: the split-half convergence rate, the
non-normality rule and the universality rule.

For a linear depth map ``y = A x + B u + noise`` lifted by the identity dictionary, the
split-half distance W∞ between the spectra fitted on two independent halves falls as
``M^-1/2`` when ``A`` has simple eigenvalues, but as ``M^-1/4`` when ``A`` has a 2x2 Jordan
block (a perturbation of size ε moves a double eigenvalue of a defective matrix by √ε).
:func:`planted_rows` draws either family as the :class:`~structlens.koopman.stages.LayerRows`
the production stage :func:`~structlens.koopman.stages.split_half` reads, with rows grouped
into "prompts" as real data is, so the jackknife over prompt blocks is the one under test.

The replication's rule is "the slope's 95% CI contains −0.5"; it is scored on both families:
its acceptance rate on the simple family is the interval's coverage of the true slope, on the
Jordan family (true slope −0.25) it is the rate at which the rule says "reproduced" when the
claim is false.

The non-normality rule ("the noise-floor-extrapolated relative Henrici departure of Â exceeds
0.1", :func:`~structlens.koopman.stages.spectrum`) is scored on ``A = diag(0.9, 0.6, 0.3,
−0.4)`` with one off-diagonal entry ``A[0, 1] = c``: ``c = 0`` is normal (the rule must say
no), and the true relative departure grows with ``c`` (:func:`henrici_departure`).

The universality rule ("no seed pair's spectra differ beyond their sampling null, after
Holm's adjustment over the pairs") is scored on replicas of one system, each with its own
samples, and on replicas whose last one has an eigenvalue moved
(:func:`calibrate_universality`), in the identity lift and in each replica's own PCA-4 with
the null that refits the PCA per half (each replica's PCA keeps a slightly different
subspace: the dictionary-mismatch confound, which the null must hold).

The heavy-tail rule ("a coordinate set is heavy-tailed when some coordinate's excess kurtosis
is above ``HEAVY = 10`` with confidence, light when every coordinate's is below it",
:func:`~structlens.koopman.verdicts.tail_class` on the jackknife bounds of
:func:`~structlens.koopman.diagnostics.tail_statistics`) is scored on planted states
``X (m, d)`` whose population excess kurtosis is known in closed form
(:func:`planted_states`, :func:`planted_kurtosis`): Gaussian states (the null), a few
"massive" coordinates spiking on a small share of rows, and Student-t coordinates
(:func:`calibrate_heavy_tails`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from structlens.koopman.protocol import KoopmanProtocol
from structlens.koopman.stages import LayerRows, split_half
from structlens.stats.intervals import wilson_interval

__all__ = [
    "FAMILIES", "SlopeCalibration", "RuleRate", "planted_rows", "linear_rows", "calibrate_slope",
    "calibrate_henrici", "henrici_departure", "PROTOCOL", "HENRICI_THRESHOLD", "REPLICAS",
    "UNIVERSALITY_SYSTEMS", "UniversalityRate", "calibrate_universality", "TAIL_FAMILIES",
    "MASSIVE_COORDINATES", "MASSIVE_SHARE", "spike_size", "planted_kurtosis", "planted_states",
    "PROMPT_ROWS", "TailRate", "calibrate_heavy_tails",
]  # fmt: skip

Family = Literal["simple", "jordan"]
#: The true split-half slope of each planted family.
FAMILIES: dict[str, float] = {"simple": -0.5, "jordan": -0.25}
#: The paper protocol with the control basis of the planted 2-d controls and dictionaries
#: fitted on all rows (the identity dictionary fits nothing).
PROTOCOL = KoopmanProtocol(control_rank=2, split_half_control_rank=2, dictionary_fit="all")


def planted_rows(
    family: Family, *, n_prompts: int = 256, rows_per_prompt: int = 16, seed: int = 0
) -> LayerRows:
    """Samples of a planted linear depth map ``y = A x + B u + 0.1 ε`` (d = 4, 2 controls).

    ``simple``: ``A = diag(0.9, 0.6, 0.3, −0.4)``.  ``jordan``: the eigenvalue 0.5 twice in
    one Jordan block (``A[1, 2] = 1``) beside 0.9 and −0.4.  States and controls are standard
    normal; ``B`` is drawn from ``seed``.
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {sorted(FAMILIES)}; got {family!r}.")
    if family == "simple":
        A = np.diag([0.9, 0.6, 0.3, -0.4])
    else:
        A = np.diag([0.9, 0.5, 0.5, -0.4])
        A[1, 2] = 1.0
    return linear_rows(A, n_prompts=n_prompts, rows_per_prompt=rows_per_prompt, seed=seed)


def linear_rows(
    A: np.ndarray,
    *,
    n_prompts: int = 256,
    rows_per_prompt: int = 16,
    seed: int = 0,
    B: np.ndarray | None = None,
    scales: np.ndarray | None = None,
) -> LayerRows:
    """Samples of ``y = A x + B u + 0.1 ε`` with 2-d standard normal controls and normal
    states (standard, or with standard deviations ``scales``), ``B`` drawn from ``seed``
    unless given, rows grouped into ``n_prompts`` prompts."""
    rng = np.random.default_rng(seed)
    d = A.shape[0]
    drawn = 0.3 * rng.standard_normal((d, 2))
    B = drawn if B is None else B
    n = n_prompts * rows_per_prompt
    X = rng.standard_normal((n, d)) * (1.0 if scales is None else scales)
    U = rng.standard_normal((n, 2))
    Y = X @ A.T + U @ B.T + 0.1 * rng.standard_normal((n, d))
    return LayerRows((0,), X, U, Y, np.repeat(np.arange(n_prompts), rows_per_prompt))


@dataclass(frozen=True)
class SlopeCalibration:
    """The split-half slope on ``n`` instances of one planted ``family``.

    ``coverage`` is the share of 95% CIs that contain the true slope ``truth``;
    ``accepted`` the share the replication's rule calls M^-1/2
    (:func:`structlens.koopman.verdicts.rate_decision`: the CI holds −0.5 and excludes
    −0.25); ``holds_rate`` the share whose CI merely holds −0.5 (the rule before the slower
    rate had to be excluded), each with its Wilson interval over instances; ``mean_slope``
    and ``mean_width`` (of the CI) summarise the estimates.
    """

    family: str
    truth: float
    n: int
    mean_slope: float
    sd_slope: float
    mean_width: float
    coverage: float
    coverage_ci: tuple[float, float]
    accepted: float
    accepted_ci: tuple[float, float]
    holds_rate: float
    holds_rate_ci: tuple[float, float]
    seeds: tuple[int, int]


def calibrate_slope(
    family: Family, n: int, *, first_seed: int = 0, protocol: KoopmanProtocol = PROTOCOL
) -> SlopeCalibration:
    """Run :func:`~structlens.koopman.stages.split_half` (identity dictionary) on ``n``
    planted instances of ``family`` with seeds ``first_seed, first_seed + 1, ...``."""
    from structlens.koopman.verdicts import rate_decision

    truth = FAMILIES[family]
    slopes, widths, covered, accepted, holds = [], [], 0, 0, 0
    for seed in range(first_seed, first_seed + n):
        fit = split_half(protocol.replace(seed=seed), planted_rows(family, seed=seed), "identity")
        lo, hi = fit.slope_ci
        slopes.append(fit.slope)
        widths.append(hi - lo)
        covered += lo <= truth <= hi
        accepted += rate_decision(fit.slope_ci) == "reproduced"
        holds += lo <= -0.5 <= hi
    return SlopeCalibration(
        family=family, truth=truth, n=n, mean_slope=float(np.mean(slopes)),
        sd_slope=float(np.std(slopes, ddof=1)) if n > 1 else float("nan"),
        mean_width=float(np.mean(widths)), coverage=covered / n,
        coverage_ci=wilson_interval(covered, n), accepted=accepted / n,
        accepted_ci=wilson_interval(accepted, n), holds_rate=holds / n,
        holds_rate_ci=wilson_interval(holds, n), seeds=(first_seed, first_seed + n - 1),
    )  # fmt: skip


#: The replication's non-normality threshold on the relative Henrici departure.
HENRICI_THRESHOLD = 0.1


def henrici_departure(A: np.ndarray) -> float:
    """The relative Henrici departure ``sqrt(‖A‖_F² − Σ|λ|²) / ‖A‖_F`` of ``A``."""
    lam = np.linalg.eigvals(A)
    frob = float(np.linalg.norm(A))
    return float(np.sqrt(max(0.0, frob**2 - float(np.sum(np.abs(lam) ** 2))))) / frob


@dataclass(frozen=True)
class RuleRate:
    """How often a rule says yes on ``n`` instances of one planted effect size.

    ``truth`` is the planted quantity (here the true relative Henrici departure) and
    ``expected`` whether the rule should say yes there; ``rate`` the share of yes with its
    Wilson interval over instances, ``mean_estimate`` the mean of the statistic the rule
    thresholds.
    """

    effect: float
    truth: float
    expected: bool
    n: int
    mean_estimate: float
    rate: float
    rate_ci: tuple[float, float]


def calibrate_henrici(
    offdiag: float, n: int, *, first_seed: int = 0, protocol: KoopmanProtocol = PROTOCOL
) -> RuleRate:
    """The non-normality rule on ``n`` instances of ``A[0, 1] = offdiag`` (see module doc),
    through :func:`~structlens.koopman.stages.spectrum` with the identity dictionary."""
    from structlens.koopman.stages import spectrum

    A = np.diag([0.9, 0.6, 0.3, -0.4])
    A[0, 1] = offdiag
    truth = henrici_departure(A)
    # the rule reads the point fit only: no radius bootstrap, no median of means
    fast = protocol.replace(spectrum_bootstrap=0, mom_blocks=0)
    estimates, yes = [], 0
    for seed in range(first_seed, first_seed + n):
        fit = spectrum(fast.replace(seed=seed), linear_rows(A, seed=seed), "identity")
        value = (
            fit.henrici_relative
            if fit.henrici_extrapolated_relative is None
            else fit.henrici_extrapolated_relative
        )
        estimates.append(value)
        yes += value > HENRICI_THRESHOLD
    return RuleRate(
        effect=float(offdiag), truth=truth, expected=truth > HENRICI_THRESHOLD, n=n,
        mean_estimate=float(np.mean(estimates)), rate=yes / n, rate_ci=wilson_interval(yes, n),
    )  # fmt: skip


# ---------------------------------------------------------------- universality
#: Seed replicas of one system per instance; every pair is compared, as the replication
#: compares its three seed replicas.
REPLICAS = 3
#: Resamples of each pair's sampling null (the replication draws 200; 100 resolve a p-value
#: to 0.01, below Holm's smallest threshold 0.05 / 3).
UNIVERSALITY_RESAMPLES = 100
#: The planted systems: a 4-d one, and an 8-d one with decaying state scales whose leading
#: principal subspace each replica's own PCA-4 estimates slightly differently.
UNIVERSALITY_SYSTEMS: dict[str, dict[str, Any]] = {
    "4-d": {"eigenvalues": (0.9, 0.6, 0.3, -0.4)},
    "8-d, decaying scales": {
        "eigenvalues": (0.9, 0.7, 0.5, 0.3, 0.1, -0.2, -0.4, -0.6),
        "scales": tuple(float(2 ** (-j / 2)) for j in range(8)),
    },
}  # fmt: skip


@dataclass(frozen=True)
class UniversalityRate:
    """How often the universality rule says "not universal" (some seed pair differs after
    Holm's adjustment over the pairs) on ``n`` instances of ``replicas`` replicas of one
    planted ``system`` compared in ``dictionary`` (see
    :func:`~structlens.koopman.stages.compare_spectra`), the last replica's second eigenvalue
    moved by ``shift`` (0: all replicas share one system, so the rule must say universal).
    ``raw_rate`` is the same with each pair tested alone at α (no adjustment), for
    contrast."""

    system: str
    dictionary: str
    shift: float
    replicas: int
    expected: bool
    n: int
    rate: float
    rate_ci: tuple[float, float]
    raw_rate: float
    raw_rate_ci: tuple[float, float]
    seeds: tuple[int, int]


def calibrate_universality(
    system: str,
    dictionary: str,
    shift: float,
    n: int,
    *,
    first_seed: int = 0,
    protocol: KoopmanProtocol = PROTOCOL,
    n_resamples: int = UNIVERSALITY_RESAMPLES,
) -> UniversalityRate:
    """The universality rule through :func:`~structlens.koopman.stages.compare_spectra`
    and :func:`~structlens.koopman.verdicts.differing_pairs` on ``n`` instances (seeds
    ``first_seed, ...``): per instance one ``B``, :data:`REPLICAS` replicas with their own
    samples, all pairs compared."""
    from structlens.koopman.stages import compare_spectra
    from structlens.koopman.verdicts import ALPHA, differing_pairs

    spec = UNIVERSALITY_SYSTEMS[system]
    lam = np.array(spec["eigenvalues"])
    scales = np.array(spec["scales"]) if "scales" in spec else None
    pairs = [(i, j) for i in range(REPLICAS) for j in range(i + 1, REPLICAS)]
    adjusted = raw = 0
    for seed in range(first_seed, first_seed + n):
        B = 0.3 * np.random.default_rng(seed).standard_normal((len(lam), 2))
        rows = []
        for r in range(REPLICAS):
            A = np.diag(lam + (shift if r == REPLICAS - 1 else 0.0) * (np.arange(len(lam)) == 1))
            rows.append(linear_rows(A, B=B, scales=scales, seed=seed * REPLICAS + r + 1))
        tests = [
            compare_spectra(
                protocol.replace(seed=seed),
                rows[i],
                rows[j],
                pair=f"{i} vs {j}",
                kind="seeds",
                n_resamples=n_resamples,
                dictionary=dictionary,
            )  # fmt: skip
            for i, j in pairs
        ]
        adjusted += differing_pairs(tests).any_rejected
        raw += any(t.p_value < ALPHA for t in tests)
    return UniversalityRate(
        system=system, dictionary=dictionary, shift=float(shift), replicas=REPLICAS,
        expected=shift != 0, n=n, rate=adjusted / n, rate_ci=wilson_interval(adjusted, n),
        raw_rate=raw / n, raw_rate_ci=wilson_interval(raw, n),
        seeds=(first_seed, first_seed + n - 1),
    )  # fmt: skip


# ---------------------------------------------------------------- heavy tails
#: The planted state families of the heavy-tail rule (see :func:`planted_states`).
TAIL_FAMILIES = (
    "isotropic Gaussian", "correlated Gaussian", "massive coordinates", "Student-t",
)  # fmt: skip
#: Coordinates that carry the spikes of the ``massive coordinates`` family, and the share of
#: rows (token positions) on which they spike.
MASSIVE_COORDINATES = 4
MASSIVE_SHARE = 0.005


def spike_size(kurtosis: float, p: float = MASSIVE_SHARE) -> float:
    """The spike size ``a`` whose coordinate ``g + a·B`` (``g ~ N(0, 1)``, ``B ~
    Bernoulli(p)``) has excess kurtosis ``kurtosis`` (see :func:`planted_kurtosis`)."""
    v = p * (1 - p)
    r = np.sqrt(kurtosis * v / (1 - 6 * v))
    if not 0 <= r < 1:
        top = (1 - 6 * v) / v
        raise ValueError(
            f"a spike on a share {p} of rows reaches excess kurtosis below {top:.0f}; "
            f"got {kurtosis}."
        )
    return float(np.sqrt(r / (1 - r) / v))


def planted_kurtosis(family: str, effect: float) -> float:
    """The population excess kurtosis of the heaviest coordinate of :func:`planted_states`.

    * ``isotropic Gaussian`` and ``correlated Gaussian``: 0 (every coordinate is marginally
      normal; ``effect`` is ignored).
    * ``massive coordinates``: ``effect`` itself.  A massive coordinate is ``g + a·B`` with
      ``g`` its unit-variance normal part and ``B ~ Bernoulli(p)`` independent of it; cumulants
      of independent parts add, so with ``v = p(1 − p)`` its excess kurtosis is
      ``a⁴ v (1 − 6v) / (1 + a² v)²``, and ``a`` is solved from it (``p`` =
      :data:`MASSIVE_SHARE`).
    * ``Student-t``: ``effect`` is the degrees of freedom ν > 4, and the excess kurtosis of
      t_ν is ``6 / (ν − 4)``.
    """
    if family not in TAIL_FAMILIES:
        raise ValueError(f"family must be one of {list(TAIL_FAMILIES)}; got {family!r}.")
    if family == "massive coordinates":
        return float(effect)
    if family == "Student-t":
        if effect <= 4:
            raise ValueError(f"t_ν has a finite kurtosis only for ν > 4; got ν = {effect}.")
        return 6.0 / (effect - 4.0)
    return 0.0


def planted_states(family: str, effect: float, d: int, m: int, *, seed: int = 0) -> np.ndarray:
    """``m`` planted states of width ``d`` (rows are token positions), drawn from ``seed``.

    * ``isotropic Gaussian``: ``N(0, I)``.
    * ``correlated Gaussian``: ``N(0, Σ)``, ``Σ = Q diag(1/j) Qᵀ`` with ``Q`` a random
      orthogonal matrix (a decaying spectrum in random directions).
    * ``massive coordinates``: the correlated Gaussian states, and on a share
      :data:`MASSIVE_SHARE` of rows (the same rows for all of them) :data:`MASSIVE_COORDINATES`
      random coordinates each add ``a·σ_j`` (``σ_j`` the coordinate's standard deviation,
      ``a`` from the planted excess kurtosis ``effect``; one sign, as the massive activations
      of LLM residual streams have).
    * ``Student-t``: every coordinate independent t with ``effect`` degrees of freedom.

    :func:`planted_kurtosis` gives the heaviest coordinate's population excess kurtosis.
    """
    planted_kurtosis(family, effect)  # checks family and effect
    rng = np.random.default_rng(seed)
    if family == "isotropic Gaussian":
        return rng.standard_normal((m, d))
    if family == "Student-t":
        return rng.standard_t(effect, size=(m, d))
    Q, R = np.linalg.qr(rng.standard_normal((d, d)))
    Q *= np.sign(np.diag(R))  # Haar-distributed
    scales = 1.0 / np.sqrt(np.arange(1, d + 1))
    X = (rng.standard_normal((m, d)) * scales) @ Q.T
    if family == "correlated Gaussian":
        return X
    cols = rng.choice(d, size=min(MASSIVE_COORDINATES, d), replace=False)
    sd = np.sqrt((Q[cols] ** 2) @ scales**2)
    rows = rng.random(m) < MASSIVE_SHARE
    X[np.ix_(rows, cols)] += spike_size(effect) * sd
    return X


#: Rows of one planted "prompt": the jackknife of the rule deals prompts into blocks, as the
#: stage does with a layer's prompt ids (planted rows are independent, so any grouping holds).
PROMPT_ROWS = 16


@dataclass(frozen=True)
class TailRate:
    """How the heavy-tail rule classifies ``n`` instances of planted states
    (:func:`planted_states`) of one ``family`` and parameter ``effect`` at width ``d`` and
    ``m`` rows.

    ``kurtosis`` is the planted population excess kurtosis of the heaviest coordinate (the
    truth) and ``expected`` whether it exceeds the threshold, i.e. whether "heavy" is right
    there and "light" wrong; ``rate`` is the share of instances the rule calls heavy and
    ``light_rate`` the share it calls light, with their Wilson intervals (the rest are
    unidentified).  ``quantiles`` (5%, 50%, 95%) summarise the largest lower bound the rule
    compares with the threshold; ``raw_quantiles`` and ``raw_rate`` the maximum over
    coordinates of the sample excess kurtosis, and how often it alone exceeds the threshold
    (the rule before the bounds).
    """

    family: str
    effect: float
    kurtosis: float
    d: int
    m: int
    expected: bool
    n: int
    quantiles: tuple[float, float, float]
    rate: float
    rate_ci: tuple[float, float]
    light_rate: float
    light_rate_ci: tuple[float, float]
    raw_quantiles: tuple[float, float, float]
    raw_rate: float
    raw_rate_ci: tuple[float, float]
    seeds: tuple[int, int]


def calibrate_heavy_tails(
    family: str, effect: float, d: int, m: int, n: int, *, first_seed: int = 0
) -> TailRate:
    """The heavy-tail rule, :func:`~structlens.koopman.verdicts.tail_class` on
    :func:`~structlens.koopman.diagnostics.tail_statistics` with rows grouped into prompts of
    :data:`PROMPT_ROWS`, on ``n`` instances of :func:`planted_states` with seeds
    ``first_seed, first_seed + 1, ...``."""
    from structlens.koopman.diagnostics import tail_statistics
    from structlens.koopman.verdicts import HEAVY, tail_class

    truth = planted_kurtosis(family, effect)
    prompts = np.arange(m) // PROMPT_ROWS
    lower, raw, heavy, light, raw_heavy = [], [], 0, 0, 0
    for seed in range(first_seed, first_seed + n):
        X = planted_states(family, effect, d, m, seed=seed)
        # the rule reads the coordinates' kurtosis only: no Gram-entry tails (max_coords=2)
        stats = tail_statistics(X, prompts, max_coords=2, seed=seed)
        lower.append(stats["max_kurtosis_lower"])
        raw.append(stats["max_excess_kurtosis"])
        c = tail_class(stats)
        heavy, light = heavy + (c == "heavy"), light + (c == "light")
        raw_heavy += stats["max_excess_kurtosis"] > HEAVY

    def q(v: list[float]) -> tuple[float, float, float]:
        a, b, c = np.quantile(v, (0.05, 0.5, 0.95))
        return float(a), float(b), float(c)

    return TailRate(
        family=family, effect=float(effect), kurtosis=truth, d=d, m=m, expected=truth > HEAVY,
        n=n, quantiles=q(lower), rate=heavy / n, rate_ci=wilson_interval(heavy, n),
        light_rate=light / n, light_rate_ci=wilson_interval(light, n), raw_quantiles=q(raw),
        raw_rate=raw_heavy / n, raw_rate_ci=wilson_interval(raw_heavy, n),
        seeds=(first_seed, first_seed + n - 1),
    )  # fmt: skip

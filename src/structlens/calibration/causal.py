"""The exact-κ interval on planted Jacobians whose ``E[JᵀJ]`` is known.

Each planted instance draws per-window Jacobians ``J_i = Z_i diag(√m)`` (``k × d``, ``Z_i``
standard normal), so ``E[J_iᵀ J_i] = k·diag(m)`` and κ(Σ) is the entropy effective rank of
``m`` (computed here directly, not by the code under test).  Each ``J_i`` has rank ``k``, so a
handful of windows gives a plug-in κ biased far below κ(Σ), as output Jacobians of real
models do.  Windows are cut from "chunks" as the protocol cuts them from corpus chunks: the
windows of one chunk share a common part, ``Z_i = √ρ Z_chunk + √(1−ρ) E_i``, and are drawn in
the protocol's chunk-major order.

The instances run the production stage :func:`structlens.causal_dim.stages.kappa` (vectors
doubled until κ is identified, the bias-corrected delete-a-group jackknife over the protocol's
unit, the interval's upper end raised by the residual bias) with the
planted Grams in place of the model's; the unit ``"vector"`` (every window its own group) is
scored beside the protocol's ``"chunk"`` to show what the unit changes when windows of one
chunk are correlated.

:func:`calibrate_stopping` scores the identification rule as a decision: "κ is identified"
is false when the reported κ lies more than :data:`STOPPING_CLOSE` from the truth.  Beside it,
the same doublings score the paper's rule (the plug-in κ(n)/κ(n/2) below the tolerance),
which it replaced.  Its planted families (:data:`STOPPING_SPECTRA`) range from spectra that
128 rank-2 windows resolve to spectra they cannot.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from structlens.causal_dim.protocol import PROFILES, CausalProtocol
from structlens.causal_dim.stages import KappaFit, PromptSets, kappa
from structlens.stats.intervals import wilson_interval

__all__ = ["PROTOCOL", "SPECTRUM", "STOPPING_SPECTRA", "KappaCalibration", "StoppingCalibration",
           "planted_grams", "true_kappa", "calibrate_kappa", "calibrate_stopping", "SCALE_RATIOS",
           "SCALE_BASE", "spectrum_with_kappa", "ScaleCalibration", "calibrate_scale",
           "GATE_WIDTHS", "GATE_FVU", "GateCalibration", "planted_sae", "planted_gate_sweep",
           "calibrate_gate"]  # fmt: skip

#: The paper protocol's κ rules (start, cap, tolerance, unit, level).
PROTOCOL: CausalProtocol = PROFILES["paper"]
#: The planted spectrum ``m_j = j^-1`` in d = 16 dimensions.
SPECTRUM = np.arange(1, 17, dtype=np.float64) ** -1.0


#: The planted spectra of the identification rule's calibration, by label: ``j^-1`` in 16, 32
#: and 64 dimensions, ``j^-1/2`` and a flat spectrum in 64.
STOPPING_SPECTRA: dict[str, np.ndarray] = {
    "d=16, j^-1": SPECTRUM,
    "d=32, j^-1": np.arange(1, 33, dtype=np.float64) ** -1.0,
    "d=64, j^-1": np.arange(1, 65, dtype=np.float64) ** -1.0,
    "d=64, j^-1/2": np.arange(1, 65, dtype=np.float64) ** -0.5,
    "d=64, flat": np.ones(64),
}
#: Relative error within which a κ counts as found (the rule's own tolerance).
STOPPING_CLOSE = 0.05


def true_kappa(m: np.ndarray = SPECTRUM) -> float:
    """``exp`` of the Shannon entropy (nats) of ``m / Σm``: κ of ``diag(m)``."""
    p = np.asarray(m, dtype=np.float64) / np.sum(m)
    p = p[p > 0]
    return float(np.exp(-np.sum(p * np.log(p))))


def planted_grams(
    rho: float,
    *,
    seed: int,
    n_chunks: int = 32,
    windows_per_chunk: int = 4,
    rank: int = 2,
    m: np.ndarray = SPECTRUM,
) -> tuple[PromptSets, np.ndarray]:
    """The prompt sets (chunk labels in the protocol's chunk-major order) and the per-window
    Grams ``[n_chunks·windows_per_chunk, d, d]`` of one planted instance."""
    if not 0 <= rho < 1:
        raise ValueError(f"rho must lie in [0, 1), got {rho}.")
    rng = np.random.default_rng(seed)
    d = len(m)
    shared = rng.standard_normal((n_chunks, rank, d))
    order = [c for _ in range(windows_per_chunk) for c in range(n_chunks)]
    own = rng.standard_normal((len(order), rank, d))
    J = (np.sqrt(rho) * shared[order] + np.sqrt(1 - rho) * own) * np.sqrt(m)
    grams = np.einsum("nki,nkj->nij", J, J)
    prompts = PromptSets(
        sae_train=[], sae_eval=[], ce=[], kappa_windows=[[0]] * len(order), kappa_chunks=order,
        kappa_train_chunks=0, n_chunks=n_chunks, n_heldout=n_chunks,
    )  # fmt: skip
    return prompts, grams


def _windows(grams: np.ndarray, start: int, stop: int) -> np.ndarray:
    return grams[start:stop]


@dataclass(frozen=True)
class KappaCalibration:
    """The κ stage on ``n`` instances of one planted family (within-chunk correlation ``rho``,
    jackknife ``unit``).

    ``coverage`` is the share of intervals that contain κ(Σ) (``truth``), with its Wilson
    interval over instances; ``mean_estimate``/``sd_estimate`` summarise the bias-corrected
    point, ``mean_plugin`` the plug-in; ``mean_vectors`` is the mean number of windows at which
    the doubling stopped and ``identified`` the share of instances in which it stopped because
    κ was identified (not at the cap).
    """

    rho: float
    unit: str
    truth: float
    n: int
    mean_estimate: float
    sd_estimate: float
    mean_plugin: float
    mean_width: float
    coverage: float
    coverage_ci: tuple[float, float]
    mean_vectors: float
    identified: float
    seeds: tuple[int, int]


def calibrate_kappa(
    rho: float, unit: str, n: int, *, first_seed: int = 0, protocol: CausalProtocol = PROTOCOL
) -> KappaCalibration:
    """Run :func:`~structlens.causal_dim.stages.kappa` on ``n`` planted instances with seeds
    ``first_seed, first_seed + 1, ...`` under ``protocol`` with ``kappa_unit=unit``."""
    truth = true_kappa()
    points, plugins, widths, vectors, covered, identified = [], [], [], [], 0, 0
    for seed in range(first_seed, first_seed + n):
        prompts, grams = planted_grams(rho, seed=seed)
        fit = kappa(
            protocol.replace(kappa_unit=unit, seed=seed), None, 0, prompts,
            grams=functools.partial(_windows, grams),
        )  # fmt: skip
        lo, hi = fit.erank_ci
        points.append(fit.erank)
        plugins.append(fit.erank_plugin)
        widths.append(hi - lo)
        vectors.append(fit.n_vectors)
        covered += lo <= truth <= hi
        identified += fit.identified
    return KappaCalibration(
        rho=float(rho), unit=unit, truth=truth, n=n, mean_estimate=float(np.mean(points)),
        sd_estimate=float(np.std(points, ddof=1)) if n > 1 else float("nan"),
        mean_plugin=float(np.mean(plugins)), mean_width=float(np.mean(widths)),
        coverage=covered / n, coverage_ci=wilson_interval(covered, n),
        mean_vectors=float(np.mean(vectors)), identified=identified / n,
        seeds=(first_seed, first_seed + n - 1),
    )  # fmt: skip


@dataclass(frozen=True)
class StoppingCalibration:
    """The identification rule on ``n`` instances of one planted spectrum (``family``, true κ
    ``truth``; independent windows, the protocol's unit).

    ``rate`` is the share of instances in which the rule says "κ is identified", with its
    Wilson interval; ``false_stop_rate`` the share in which it did so while the reported
    (bias-corrected) κ lay more than :data:`STOPPING_CLOSE` from the truth;
    ``plugin_close`` / ``estimate_close`` the shares of all instances whose plug-in /
    bias-corrected κ lies within :data:`STOPPING_CLOSE` of it; ``coverage`` that of the
    reported interval; ``mean_vectors`` the windows used.  ``paper_rate`` and
    ``paper_false_stop_rate`` score the paper's rule on the same doublings: it stops at the
    first plug-in κ(n)/κ(n/2) below the tolerance, falsely when that κ(n) is more than
    :data:`STOPPING_CLOSE` low.
    """

    family: str
    d: int
    truth: float
    n: int
    rate: float
    rate_ci: tuple[float, float]
    false_stop_rate: float
    false_stop_ci: tuple[float, float]
    plugin_close: float
    estimate_close: float
    mean_plugin: float
    mean_estimate: float
    coverage: float
    coverage_ci: tuple[float, float]
    mean_vectors: float
    paper_rate: float
    paper_false_stop_rate: float
    paper_false_stop_ci: tuple[float, float]
    seeds: tuple[int, int]


def _paper_stop(fit: KappaFit, tolerance: float) -> float | None:
    """The plug-in κ(n) at which the paper's rule would have stopped (``None``: never)."""
    for erank, ratio in zip(fit.doubling_erank, fit.doubling_ratios, strict=True):
        if ratio < tolerance:
            return float(erank)
    return None


def calibrate_stopping(
    family: str, n: int, *, first_seed: int = 0, protocol: CausalProtocol = PROTOCOL
) -> StoppingCalibration:
    """Run :func:`~structlens.causal_dim.stages.kappa` on ``n`` instances of planted spectrum
    ``family`` (a key of :data:`STOPPING_SPECTRA`) with seeds from ``first_seed`` under
    ``protocol``, and score its identification rule (and the paper's) as a decision."""
    m = STOPPING_SPECTRA[family]
    truth, close = true_kappa(m), STOPPING_CLOSE
    stops = false_stops = plugin_close = estimate_close = covered = paper = paper_false = 0
    plugins, points, vectors = [], [], []
    for seed in range(first_seed, first_seed + n):
        prompts, grams = planted_grams(0.0, seed=seed, m=m)
        fit = kappa(protocol.replace(seed=seed), None, 0, prompts,
                    grams=functools.partial(_windows, grams))  # fmt: skip
        lo, hi = fit.erank_ci
        stops += fit.identified
        false_stops += fit.identified and abs(fit.erank - truth) > close * truth
        at = _paper_stop(fit, protocol.kappa_tolerance)
        paper += at is not None
        paper_false += at is not None and at < (1 - close) * truth
        plugin_close += abs(fit.erank_plugin - truth) <= close * truth
        estimate_close += abs(fit.erank - truth) <= close * truth
        covered += lo <= truth <= hi
        plugins.append(fit.erank_plugin)
        points.append(fit.erank)
        vectors.append(fit.n_vectors)
    return StoppingCalibration(
        family=family, d=len(m), truth=truth, n=n, rate=stops / n,
        rate_ci=wilson_interval(stops, n), false_stop_rate=false_stops / n,
        false_stop_ci=wilson_interval(false_stops, n), plugin_close=plugin_close / n,
        estimate_close=estimate_close / n, mean_plugin=float(np.mean(plugins)),
        mean_estimate=float(np.mean(points)), coverage=covered / n,
        coverage_ci=wilson_interval(covered, n), mean_vectors=float(np.mean(vectors)),
        paper_rate=paper / n, paper_false_stop_rate=paper_false / n,
        paper_false_stop_ci=wilson_interval(paper_false, n),
        seeds=(first_seed, first_seed + n - 1),
    )  # fmt: skip


#: κ_A/κ_B of the scale rule's planted pairs: within :data:`~structlens.causal_dim.verdicts.
#: SCALE_MATCH` of 1 (the rule should not say "different") and beyond it (it should not say
#: "the same").
SCALE_RATIOS = (1.0, 1.1, 1.5, 2.0, 3.0)
#: The scale rule's first model: the ``j^-1`` spectrum in 64 dimensions (κ ≈ 29), which 128
#: rank-2 windows do not identify within 5%, as in the real models.
SCALE_BASE = "d=64, j^-1"


def spectrum_with_kappa(kappa_: float, d: int) -> np.ndarray:
    """The spectrum ``j^-a`` (``j = 1..d``) whose κ is ``kappa_`` (``a ≥ 0`` by bisection; κ
    falls as ``a`` grows, from ``d`` at ``a = 0``)."""
    if not 1 < kappa_ <= d:
        raise ValueError(f"kappa must lie in (1, d = {d}]; got {kappa_}.")
    j = np.arange(1, d + 1, dtype=np.float64)
    lo, hi = 0.0, 1.0
    while true_kappa(j**-hi) > kappa_:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if true_kappa(j**-mid) > kappa_ else (lo, mid)
    return j ** -((lo + hi) / 2)


@dataclass(frozen=True)
class ScaleCalibration:
    """The scale rule (:func:`~structlens.causal_dim.verdicts.scale_invariance`) on ``n``
    planted pairs whose true κ are ``kappa`` (the first model's and the second's, ratio
    ``ratio``).  ``expected`` is whether the pair truly differs by more than the rule's factor
    (so "different" is right and "the same" wrong); ``rate`` the share of pairs called
    different (not reproduced), ``same_rate`` the share called the same (reproduced), with
    their Wilson intervals; ``identified`` the share of pairs whose two κ were both
    identified."""

    ratio: float
    kappa: tuple[float, float]
    expected: bool
    n: int
    rate: float
    rate_ci: tuple[float, float]
    same_rate: float
    same_rate_ci: tuple[float, float]
    identified: float
    seeds: tuple[int, int]


def calibrate_scale(
    ratios: Sequence[float], n: int, *, first_seed: int = 0, protocol: CausalProtocol = PROTOCOL
) -> list[ScaleCalibration]:
    """Run :func:`~structlens.causal_dim.stages.kappa` on both members of ``n`` planted pairs
    per ratio of ``ratios`` (seeds ``first_seed, ...``; the second member's windows from an
    independent seed) under ``protocol``, and the scale rule on the two fits.  The first
    member of a seed is the same at every ratio, so it is fitted once."""
    from structlens.causal_dim.verdicts import SCALE_MATCH, scale_invariance

    def fit(m: np.ndarray, seed: int) -> KappaFit:
        prompts, grams = planted_grams(0.0, seed=seed, m=m)
        return kappa(protocol.replace(seed=seed), None, 0, prompts,
                     grams=functools.partial(_windows, grams))  # fmt: skip

    m_a = STOPPING_SPECTRA[SCALE_BASE]
    seeds = range(first_seed, first_seed + n)
    firsts = [fit(m_a, seed) for seed in seeds]
    out = []
    for ratio in ratios:
        m_b = spectrum_with_kappa(true_kappa(m_a) / ratio, len(m_a))
        different = same = both = 0
        for seed, a in zip(seeds, firsts, strict=True):
            b = fit(m_b, seed + 1_000_000)
            verdict = scale_invariance([a], {0: b}).verdict
            different += verdict == "not reproduced"
            same += verdict == "reproduced"
            both += a.identified and b.identified
        out.append(ScaleCalibration(
            ratio=float(ratio), kappa=(true_kappa(m_a), true_kappa(m_b)),
            expected=bool(max(ratio, 1 / ratio) > SCALE_MATCH), n=n, rate=different / n,
            rate_ci=wilson_interval(different, n), same_rate=same / n,
            same_rate_ci=wilson_interval(same, n), identified=both / n,
            seeds=(first_seed, first_seed + n - 1),
        ))  # fmt: skip
    return out


#: The sweep gate's planted SAEs: four widths' true held-out FVU on a falling curve (the
#: last one moved by each family's relative rise), the planted states' width and spectrum
#: (``1/j``, anisotropic as residual streams are), the share of the residual map the widths
#: share (SAEs of different widths err on the same tokens) and the correlation of the
#: tokens of one prompt.
GATE_WIDTHS = (64, 128, 256, 512)
GATE_FVU = (0.30, 0.25, 0.21)
GATE_D = 64
GATE_SHARED = 0.8
GATE_PROMPT_CORRELATION = 0.5


def planted_sae(residual: np.ndarray) -> Any:
    """A ReLU SAE of width ``2d`` whose reconstruction is ``x + x Rᵀ`` (``R`` the planted
    ``residual`` map): encoder ``[I; −I]``, decoder ``[I + Rᵀ; −(I + Rᵀ)]``, no biases, so
    ``ReLU(x)(I + Rᵀ) − ReLU(−x)(I + Rᵀ) = x (I + Rᵀ)``."""
    import torch

    from structlens.sae.models import ReLUSAE

    d = residual.shape[0]
    sae = ReLUSAE(d, 2 * d, dtype=torch.float64)
    eye = torch.eye(d, dtype=torch.float64)
    dec = eye + torch.as_tensor(residual.T, dtype=torch.float64)
    with torch.no_grad():
        sae.W_enc_t.copy_(torch.cat([eye, -eye]))
        sae.W_dec.copy_(torch.cat([dec, -dec]))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae


def planted_gate_sweep(
    rise: float, n_prompts: int, tokens: int, *, seed: int
) -> tuple[dict[int, Any], list[Any], list[Any], dict[int, float]]:
    """One planted width sweep: SAEs by width (:func:`planted_sae`), the held-out
    activations and their prompt ids per prompt, and each width's true FVU.

    Tokens are ``x = Σ^½ (√ρ u_prompt + √(1 − ρ) e_token)`` with ``Σ = diag(1/j)`` in
    :data:`GATE_D` dimensions; width ``m``'s residual map is ``R_m ∝ √s G + √(1 − s) G_m``
    (``s`` = :data:`GATE_SHARED`, Gaussian ``G``), scaled so that its population FVU
    ``tr(R_m Σ R_mᵀ) / tr Σ`` is :data:`GATE_FVU` for the first three widths and the third's
    times ``1 + rise`` for the last."""
    import torch

    rng = np.random.default_rng(seed)
    d, rho, s = GATE_D, GATE_PROMPT_CORRELATION, GATE_SHARED
    sigma = 1.0 / np.arange(1, d + 1)
    truth = dict(zip(GATE_WIDTHS, (*GATE_FVU, GATE_FVU[-1] * (1 + rise)), strict=True))
    shared = rng.standard_normal((d, d))
    saes = {}
    for m, f in truth.items():
        g = np.sqrt(s) * shared + np.sqrt(1 - s) * rng.standard_normal((d, d))
        g *= np.sqrt(f * sigma.sum() / np.sum(g**2 * sigma))  # tr(G Σ Gᵀ) = Σ_ij G_ij² σ_j
        saes[m] = planted_sae(g)
    u = rng.standard_normal((n_prompts, 1, d))
    e = rng.standard_normal((n_prompts, tokens, d))
    x = (np.sqrt(rho) * u + np.sqrt(1 - rho) * e) * np.sqrt(sigma)
    acts = [torch.as_tensor(p) for p in x]
    ids = [torch.full((tokens,), i, dtype=torch.long) for i in range(n_prompts)]
    return saes, acts, ids, truth


@dataclass(frozen=True)
class GateCalibration:
    """How often the width-sweep gate fails ``n`` planted sweeps whose last width's true
    held-out FVU is ``effect`` (relative) above the previous width's (negative: the curve
    keeps falling); ``expected`` whether the gate should fail (the true rise exceeds the
    protocol's ``fvu_rise_tol``).  ``rate``: the gate fails; ``raw_rate``: the rule it
    replaced fails (a rise above the larger of the tolerance and 2 SE); ``mean_rise`` the
    mean measured relative rise of the last width; ``mean_rise_se`` the mean standard error
    of that rise over prompt blocks, relative to the third width's FVU."""

    effect: float
    expected: bool
    n: int
    rate: float
    rate_ci: tuple[float, float]
    raw_rate: float
    raw_rate_ci: tuple[float, float]
    mean_rise: float
    mean_rise_se: float
    seeds: tuple[int, int]


def calibrate_gate(
    rise: float, n: int, *, first_seed: int = 0, protocol: CausalProtocol = PROTOCOL
) -> GateCalibration:
    """The gate on ``n`` planted sweeps (seeds ``first_seed, ...``) evaluated on
    ``protocol``'s held-out prompts (``sae_eval_prompts + sae_eval_extra`` chunks of
    ``chunk_tokens``) in its ``sweep_blocks``, through the calls the sweep stage makes:
    :func:`~structlens.sae.sweep.sae_quality` (held-out FVU),
    :func:`~structlens.causal_dim.sweep.heldout_fvu_rise_se` and
    :func:`~structlens.causal_dim.sweep.fvu_gate` at ``fvu_rise_tol``."""
    import torch

    from structlens.causal_dim.sweep import fvu_gate, heldout_fvu_rise_se
    from structlens.sae.sweep import sae_quality

    n_prompts = protocol.sae_eval_prompts + protocol.sae_eval_extra
    fails, raw, rises, ses = 0, 0, [], []
    last, before = GATE_WIDTHS[-1], GATE_WIDTHS[-2]
    for seed in range(first_seed, first_seed + n):
        saes, acts, ids, _ = planted_gate_sweep(rise, n_prompts, protocol.chunk_tokens, seed=seed)
        eval_acts = torch.cat(acts)
        fvu = {m: sae_quality(sae, eval_acts)["fvu"] for m, sae in saes.items()}
        rise_se = heldout_fvu_rise_se(saes, acts, ids, protocol.sweep_blocks)
        gate = fvu_gate(list(fvu), list(fvu.values()), rise_se=rise_se,
                        tolerance=protocol.fvu_rise_tol)  # fmt: skip
        fails += not gate.passed
        f = [fvu[m] for m in GATE_WIDTHS]
        raw += any(f[i + 1] - f[i] > max(protocol.fvu_rise_tol * f[i], 2 * rise_se[m])
                   for i, m in enumerate(GATE_WIDTHS[1:]))  # fmt: skip
        rises.append(fvu[last] / fvu[before] - 1)
        ses.append(rise_se.get(last, float("nan")) / fvu[before])
    return GateCalibration(
        effect=float(rise), expected=rise > protocol.fvu_rise_tol, n=n, rate=fails / n,
        rate_ci=wilson_interval(fails, n), raw_rate=raw / n, raw_rate_ci=wilson_interval(raw, n),
        mean_rise=float(np.mean(rises)),
        mean_rise_se=float(np.mean(ses)), seeds=(first_seed, first_seed + n - 1),
    )  # fmt: skip

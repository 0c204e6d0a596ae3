"""NDM's rules on planted structure: the merge rule on planted pairs of subspaces whose
mutual information is known, the Gini rule on planted subspace patching effects, and the
share sweep's layer rule on planted per-layer whole-space effects.

NDM merges two subspaces when their KSG mutual information, normalised by ``d_a + d_b``,
exceeds the protocol's ``merge_threshold`` (computed on ``mi_samples`` rows by
:func:`structlens.stats.mutual_info.subspace_mutual_information`, the call NDM's merge rounds
make).  A planted pair is two ``d``-dimensional Gaussian blocks whose coordinates are
correlated pairwise with ``ρ``: ``b = ρ a + √(1 − ρ²) e``, so the normalised mutual
information is known exactly, ``−¼ log(1 − ρ²)`` nats, whatever ``d``.  ``ρ = 0`` is the null
(independent subspaces: a merge is a false positive); the rule should merge exactly when the
true value exceeds the threshold.  Scored at the unit sizes NDM starts from.

The Gini rule ("NDM's mean dimension-normalised Gini is significantly above a baseline's",
one-sided paired bootstrap p-values adjusted by Holm over the baselines) is scored on
planted per-prompt patching effects (:func:`planted_patch_runs`) through the production
stage :func:`~structlens.ndm.stages.gini` and :func:`~structlens.ndm.verdicts.above_baselines`:
every baseline's effects spread over the subspaces with one profile; NDM's concentrate a share
``c`` of theirs on one subspace (``c = 0``: NDM is no better, so "above a baseline" is a false
positive).  Prompts share a factor across methods (the same prompts are patched), as real
patching runs do.

The layer rule (:func:`~structlens.ndm.evaluate.choose_layer`: leave the mapped layer only
for a layer within one standard error of the largest share whose paired gain over the mapped
one survives Holm's adjustment) is scored on planted sweeps (:func:`planted_sweep_runs`):
every candidate carries one share except the layer after the mapped one, which carries
``effect`` more (0: the null, where leaving the mapped layer is a false positive).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from structlens.ndm.protocol import PROFILES, NDMProtocol
from structlens.stats.intervals import wilson_interval
from structlens.stats.mutual_info import subspace_mutual_information

__all__ = [
    "PROTOCOL", "MergeRate", "normalized_mi", "planted_pair", "calibrate_merge", "GiniRate",
    "planted_patch_runs", "calibrate_gini", "GINI_TESTS", "GINI_SUBSPACES", "LAYER_SHARE",
    "LayerRate", "planted_sweep_runs", "calibrate_layer_rule",
]  # fmt: skip

#: The paper protocol's merge rule (``merge_threshold``, ``mi_samples``).
PROTOCOL: NDMProtocol = PROFILES["paper"]


def normalized_mi(rho: float) -> float:
    """The exact MI of a planted pair over ``d_a + d_b``: ``d`` independent coordinate pairs
    of correlation ``ρ`` carry ``−d/2 · log(1 − ρ²)`` nats, over ``2d`` dimensions."""
    return float(-0.25 * np.log1p(-(rho**2)))


def planted_pair(rho: float, d: int, n: int, *, seed: int) -> np.ndarray:
    """``n`` rows of two ``d``-dimensional blocks ``[a, b]`` with ``b = ρ a + √(1 − ρ²) e``."""
    if not 0 <= rho < 1:
        raise ValueError(f"rho must lie in [0, 1), got {rho}.")
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, d))
    return np.concatenate([a, rho * a + np.sqrt(1 - rho**2) * rng.standard_normal((n, d))], 1)


@dataclass(frozen=True)
class MergeRate:
    """How often the merge rule merges ``n`` planted pairs of ``d``-dimensional subspaces at
    correlation ``rho``: ``truth`` is the exact normalised MI, ``expected`` whether it exceeds
    the threshold, ``mean_estimate`` the mean KSG estimate, ``rate`` the share merged (Wilson
    interval over instances)."""

    rho: float
    d: int
    truth: float
    expected: bool
    n: int
    mean_estimate: float
    rate: float
    rate_ci: tuple[float, float]
    seeds: tuple[int, int]


def calibrate_merge(
    rho: float, d: int, n: int, *, first_seed: int = 0, protocol: NDMProtocol = PROTOCOL
) -> MergeRate:
    """The merge rule on ``n`` planted pairs (seeds ``first_seed, ...``) at ``protocol``'s
    ``merge_threshold`` and ``mi_samples`` (KSG with k = 1, standardised blocks, as NDM)."""
    truth = normalized_mi(rho)
    estimates = []
    for seed in range(first_seed, first_seed + n):
        z = planted_pair(rho, d, protocol.mi_samples, seed=seed)
        mi = subspace_mutual_information(z, [d, d], k=1, standardize=True, normalize=True)
        estimates.append(float(mi[0, 1]))
    merged = int(np.sum(np.asarray(estimates) > protocol.merge_threshold))
    return MergeRate(
        rho=float(rho), d=d, truth=truth, expected=truth > protocol.merge_threshold, n=n,
        mean_estimate=float(np.mean(estimates)), rate=merged / n,
        rate_ci=wilson_interval(merged, n), seeds=(first_seed, first_seed + n - 1),
    )  # fmt: skip


#: Screened tests per planted instance, and the subspaces (equal sizes) of every method.
GINI_TESTS = 2
GINI_SUBSPACES = 8
#: The baselines' effect profile over the subspaces (decaying: a dimension-normalised Gini
#: of 0.36, near the baselines' in the replication), and the per-prompt noise.
_PROFILE = np.exp(-np.arange(GINI_SUBSPACES) / 3.0)
_NOISE = 0.5


def _weights(concentration: float) -> np.ndarray:
    w = _PROFILE / _PROFILE.sum()
    return (1 - concentration) * w + concentration * (np.arange(GINI_SUBSPACES) == 0)


def planted_patch_runs(
    concentration: float, methods: tuple[str, ...], n_prompts: int, *, seed: int
) -> dict[str, Any]:
    """Per method a :class:`~structlens.ndm.evaluate.PatchRun` of ``n_prompts`` prompts:
    ``effects[i, s] = w_s (1 + ½ z_i) + ½ w̄ ε_is`` with the prompt factor ``z_i`` shared by
    the methods; the baselines' ``w`` is the decaying profile, NDM's moves a share
    ``concentration`` of it onto subspace 0."""
    from structlens.ndm.evaluate import PatchRun

    rng = np.random.default_rng(seed)
    z = rng.standard_normal(n_prompts)
    out = {}
    for m in methods:
        w = _weights(concentration if m == "ndm" else 0.0)
        e = w * (1 + 0.5 * z[:, None]) + _NOISE * w.mean() * rng.standard_normal(
            (n_prompts, GINI_SUBSPACES)
        )
        zero = np.zeros(n_prompts)
        out[m] = PatchRun(zero, zero, e, e.sum(1), np.zeros(e.shape, int), zero, zero)
    return out


@dataclass(frozen=True)
class GiniRate:
    """How often the Gini rule calls NDM above a baseline on ``n`` planted instances at
    ``concentration`` (``truth``: NDM's noise-free dimension-normalised Gini minus the
    baselines'; ``expected``: NDM is above them).  ``rate``: some baseline beaten after Holm's
    adjustment (what a "partly" verdict rests on); ``all_rate``: every baseline beaten;
    ``raw_rate``: some baseline's paired 95% interval above 0 without adjustment."""

    concentration: float
    truth: float
    expected: bool
    n: int
    rate: float
    rate_ci: tuple[float, float]
    all_rate: float
    all_rate_ci: tuple[float, float]
    raw_rate: float
    raw_rate_ci: tuple[float, float]
    seeds: tuple[int, int]


def _p(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def calibrate_gini(
    concentration: float, n: int, *, first_seed: int = 0, protocol: NDMProtocol = PROTOCOL
) -> GiniRate:
    """The Gini rule on ``n`` planted instances (seeds ``first_seed, ...``) of
    :data:`GINI_TESTS` screened tests with ``protocol``'s patch prompts, baselines and
    bootstrap resamples, through :func:`~structlens.ndm.stages.gini`."""
    from structlens.ndm.evaluate import PAPER_TESTS
    from structlens.ndm.stages import Decomposition, Screen, gini
    from structlens.ndm.verdicts import above_baselines
    from structlens.stats.gini import gini_dimension_normalized

    methods = ("ndm", *protocol.baselines)
    dims = (1,) * GINI_SUBSPACES
    decomposition = Decomposition(
        0, dims, {}, {m: [1.0] * GINI_SUBSPACES for m in methods}
    )  # fmt: skip
    some = every = raw = 0
    for seed in range(first_seed, first_seed + n):
        runs = {
            t.name: planted_patch_runs(
                concentration, methods, protocol.patch_prompts, seed=seed * GINI_TESTS + i
            )
            for i, t in enumerate(PAPER_TESTS[:GINI_TESTS])
        }
        screens = [Screen(t, 0, runs[t.name]["ndm"], 1.0, True) for t in PAPER_TESTS[:GINI_TESTS]]
        summary = gini(protocol.replace(seed=seed), screens, runs, {0: decomposition})
        diff = summary.ndm_minus or {}
        p_above = {m: _p(v["dimension"].p_above) for m, v in diff.items()}
        beaten = above_baselines(p_above)
        some += bool(beaten)
        every += len(beaten) == len(protocol.baselines)
        raw += any(v["dimension"].ci[0] > 0 for v in diff.values())
    truth = gini_dimension_normalized(_weights(concentration), dims) - gini_dimension_normalized(
        _weights(0.0), dims
    )
    return GiniRate(
        concentration=float(concentration), truth=float(truth), expected=concentration > 0,
        n=n, rate=some / n, rate_ci=wilson_interval(some, n), all_rate=every / n,
        all_rate_ci=wilson_interval(every, n), raw_rate=raw / n,
        raw_rate_ci=wilson_interval(raw, n),
        seeds=(first_seed, first_seed + n - 1),
    )  # fmt: skip


#: The layer rule's planted sweep: the share every candidate layer carries (the flat
#: null), the planted clean metric's mean and spread over prompts, and the spread of a
#: prompt's whole-space effect around ``share · clean``.
LAYER_SHARE = 0.5
_CLEAN = (2.0, 1.0)
_EFFECT_NOISE = 0.5


def planted_sweep_runs(shares: Any, rho: float, n_prompts: int, *, seed: int) -> list[Any]:
    """Per candidate layer a :class:`~structlens.ndm.evaluate.PatchRun` of the same
    ``n_prompts`` prompts: clean metric ``c_i ~ N(2, 1)``, whole-space effect
    ``s_l c_i + ½ (√ρ z_i + √(1 − ρ) ε_il)``, so layer ``l``'s true share is ``s_l`` and a
    prompt's noise is shared between layers with correlation ``ρ`` (the same prompts are
    patched at every layer)."""
    from structlens.ndm.evaluate import PatchRun

    if not 0 <= rho <= 1:
        raise ValueError(f"rho must lie in [0, 1], got {rho}.")
    rng = np.random.default_rng(seed)
    clean = rng.normal(*_CLEAN, n_prompts)
    shared = rng.standard_normal(n_prompts)
    runs, empty, zero = [], np.empty((n_prompts, 0)), np.zeros(n_prompts, dtype=np.int64)
    for s in shares:
        own = rng.standard_normal(n_prompts)
        full = s * clean + _EFFECT_NOISE * (np.sqrt(rho) * shared + np.sqrt(1 - rho) * own)
        runs.append(PatchRun(clean, clean - full, empty, full, empty.astype(np.int64),
                             zero, zero))  # fmt: skip
    return runs


@dataclass(frozen=True)
class LayerRate:
    """How the share sweep's layer rule chooses on ``n`` planted sweeps over the paper
    protocol's window: every candidate carries share :data:`LAYER_SHARE` except the layer
    after the mapped one, which carries ``effect`` more (0: the flat null, where leaving the
    mapped layer is a false positive), with the layers' prompt noise correlated ``rho``.
    ``rate``: the rule leaves the mapped layer; ``best_rate``: it chooses the layer with the
    largest true share (the mapped one on the null); ``raw_rate``: the one-standard-error
    rule without the paired test leaves the mapped layer."""

    effect: float
    rho: float
    expected: bool
    n: int
    rate: float
    rate_ci: tuple[float, float]
    best_rate: float
    best_rate_ci: tuple[float, float]
    raw_rate: float
    raw_rate_ci: tuple[float, float]
    seeds: tuple[int, int]


def calibrate_layer_rule(
    effect: float, rho: float, n: int, *, first_seed: int = 0, protocol: NDMProtocol = PROTOCOL
) -> LayerRate:
    """The layer rule on ``n`` planted sweeps (seeds ``first_seed, ...``) of ``protocol``'s
    ``sweep_window`` and ``sweep_prompts``, through the functions the sweep stage calls:
    :func:`~structlens.ndm.evaluate.whole_space_share`, its standard error,
    :func:`~structlens.ndm.evaluate.share_gain_p` and
    :func:`~structlens.ndm.evaluate.choose_layer`."""
    from structlens.ndm.evaluate import (
        choose_layer,
        share_gain_p,
        whole_space_share,
        whole_space_share_error,
    )

    w = protocol.sweep_window
    candidates = tuple(range(-w, w + 1))  # the mapped layer is 0
    shares = [LAYER_SHARE + (effect if c == 1 else 0.0) for c in candidates]
    best = 1 if effect > 0 else 0
    moved = hit = raw = 0
    for seed in range(first_seed, first_seed + n):
        runs = planted_sweep_runs(shares, rho, protocol.sweep_prompts, seed=seed)
        s = [whole_space_share(r) for r in runs]
        e = [whole_space_share_error(r) for r in runs]
        chosen = choose_layer(0, candidates, s, e, share_gain_p(runs, w))
        moved += chosen != 0
        hit += chosen == best
        raw += choose_layer(0, candidates, s, e, [0.0] * len(candidates)) != 0
    return LayerRate(
        effect=float(effect), rho=float(rho), expected=effect > 0, n=n, rate=moved / n,
        rate_ci=wilson_interval(moved, n), best_rate=hit / n, best_rate_ci=wilson_interval(hit, n),
        raw_rate=raw / n, raw_rate_ci=wilson_interval(raw, n),
        seeds=(first_seed, first_seed + n - 1),
    )  # fmt: skip

"""NDM's merge rule on planted pairs of subspaces whose mutual information is known.

NDM merges two subspaces when their KSG mutual information, normalised by ``d_a + d_b``,
exceeds the protocol's ``merge_threshold`` (computed on ``mi_samples`` rows by
:func:`structlens.stats.mutual_info.subspace_mutual_information`, the call NDM's merge rounds
make).  A planted pair is two ``d``-dimensional Gaussian blocks whose coordinates are
correlated pairwise with ``ρ``: ``b = ρ a + √(1 − ρ²) e``, so the normalised mutual
information is known exactly, ``−¼ log(1 − ρ²)`` nats, whatever ``d``.  ``ρ = 0`` is the null
(independent subspaces: a merge is a false positive); the rule should merge exactly when the
true value exceeds the threshold.  Scored at the unit sizes NDM starts from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from structlens.ndm.protocol import PROFILES, NDMProtocol
from structlens.stats.intervals import wilson_interval
from structlens.stats.mutual_info import subspace_mutual_information

__all__ = ["PROTOCOL", "MergeRate", "normalized_mi", "planted_pair", "calibrate_merge"]

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

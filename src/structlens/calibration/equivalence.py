"""The equivalence decision on planted per-head outcomes whose answer is known.

A comparison validates ``n`` matched heads twice: each head replaced by its partner (does
model B still behave?) and, as the null, mean-ablated.  The decision
(:func:`structlens.equivalence.score.decide_paired_null`, called by every comparison) says
"equivalent" when partners pass where the null fails significantly more often than the
reverse (a paired test at the protocol's ``null_alpha`` over its ``null_unit``: McNemar's
test for clustered data over B's layers, or McNemar's exact test over heads) and the partner
pass rate reaches ``equivalent_at``.  Both units are scored: the protocol's, and the other
for contrast.

Planted outcomes, heads grouped in layers of three as a model's are:

* ``null``: partner and null pass independently with one probability (0.3) — partners do no
  better than mean ablation, so "equivalent" is a false positive;
* ``null, layer-shared``: the same, but the three heads of a layer pass or fail together
  (one draw per layer for the partners, one for the null) — McNemar counts heads as
  independent units, so this family measures what shared fate within a layer does to it;
* ``alternative``: partners pass with probability ``p`` > 0.3, heads independent — the
  rate of "equivalent" is the power at that effect.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from structlens.equivalence.protocol import PROFILES, EquivalenceProtocol
from structlens.equivalence.score import component_clusters, decide_paired_null
from structlens.stats.intervals import wilson_interval

__all__ = ["PROTOCOL", "NULL_PASS", "HEADS_PER_LAYER", "DecisionRate", "planted_outcomes",
           "calibrate_decision", "GROUP_ROWS", "GroupRate", "calibrate_group"]  # fmt: skip

#: The paper protocol's decision settings (``null_alpha``, ``equivalent_at``).
PROTOCOL: EquivalenceProtocol = PROFILES["paper"]
#: Pass probability of the null (and of partners under the null families).
NULL_PASS = 0.3
HEADS_PER_LAYER = 3


def planted_outcomes(
    partner_pass: float, n_heads: int, *, shared: bool, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-head pass/fail of the partners (probability ``partner_pass``) and of the null
    (:data:`NULL_PASS`); with ``shared`` the heads of one layer share one draw."""
    rng = np.random.default_rng(seed)
    n_draws = -(-n_heads // HEADS_PER_LAYER) if shared else n_heads
    partner = rng.random(n_draws) < partner_pass
    null = rng.random(n_draws) < NULL_PASS
    if shared:
        partner = np.repeat(partner, HEADS_PER_LAYER)[:n_heads]
        null = np.repeat(null, HEADS_PER_LAYER)[:n_heads]
    return partner, null


@dataclass(frozen=True)
class DecisionRate:
    """How often the decision says "equivalent" on ``n`` instances of one planted family.

    ``expected`` is whether it should (partners better than the null); ``rate`` is the share
    of "equivalent" with its Wilson interval over instances.
    """

    family: str
    partner_pass: float
    n_heads: int
    shared: bool
    unit: str
    expected: bool
    n: int
    rate: float
    rate_ci: tuple[float, float]
    seeds: tuple[int, int]


def calibrate_decision(
    family: str,
    partner_pass: float,
    n_heads: int,
    n: int,
    *,
    shared: bool = False,
    unit: str | None = None,
    first_seed: int = 0,
    protocol: EquivalenceProtocol = PROTOCOL,
) -> DecisionRate:
    """The decision on ``n`` planted instances (seeds ``first_seed, ...``) of ``n_heads``
    heads, at ``protocol.null_alpha`` and ``protocol.equivalent_at``, over ``unit``
    (default the protocol's ``null_unit``)."""
    unit = unit or protocol.null_unit
    # head i sits in layer i // HEADS_PER_LAYER, as planted_outcomes lays them out
    pairs = [[[i // HEADS_PER_LAYER, 0], [i // HEADS_PER_LAYER, i]] for i in range(n_heads)]
    clusters = component_clusters(pairs, unit)
    yes = 0
    for seed in range(first_seed, first_seed + n):
        partner, null = planted_outcomes(partner_pass, n_heads, shared=shared, seed=seed)
        d = decide_paired_null(
            partner, null, alpha=protocol.null_alpha, min_score=protocol.equivalent_at,
            clusters=clusters,
        )  # fmt: skip
        yes += d.verdict == "equivalent"
    return DecisionRate(
        family=family, partner_pass=float(partner_pass), n_heads=n_heads, shared=shared,
        unit=unit,
        expected=partner_pass > NULL_PASS, n=n, rate=yes / n, rate_ci=wilson_interval(yes, n),
        seeds=(first_seed, first_seed + n - 1),
    )  # fmt: skip


#: Rows of one scenario group (the seeds group compares three pairs of replicas).
GROUP_ROWS = 3


@dataclass(frozen=True)
class GroupRate:
    """The group rule on ``n`` planted groups of :data:`GROUP_ROWS` comparisons of
    ``n_heads`` heads each, partners passing with ``partner_pass`` in every row (the null
    with :data:`NULL_PASS`).  ``rate``: some row claimed after Holm's adjustment over the
    group's rows (the group's verdict is then not "unidentified"); ``all_rate``: every row
    claimed; ``raw_rate``: some row claimed at α alone."""

    family: str
    partner_pass: float
    n_heads: int
    rows: int
    expected: bool
    n: int
    rate: float
    rate_ci: tuple[float, float]
    all_rate: float
    all_rate_ci: tuple[float, float]
    raw_rate: float
    raw_rate_ci: tuple[float, float]
    seeds: tuple[int, int]


def calibrate_group(
    family: str,
    partner_pass: float,
    n_heads: int,
    n: int,
    *,
    first_seed: int = 0,
    protocol: EquivalenceProtocol = PROTOCOL,
) -> GroupRate:
    """The rows' decisions (:func:`~structlens.equivalence.score.decide_paired_null`, heads
    independent, the protocol's unit) and the group's
    (:func:`~structlens.equivalence.verdicts.group_decisions`) on ``n`` planted groups."""
    from structlens.equivalence.verdicts import group_decisions

    pairs = [[[i // HEADS_PER_LAYER, 0], [i // HEADS_PER_LAYER, i]] for i in range(n_heads)]
    clusters = component_clusters(pairs, protocol.null_unit)
    some = every = raw = 0
    for seed in range(first_seed, first_seed + n):
        decisions = {}
        for row in range(GROUP_ROWS):
            partner, null = planted_outcomes(
                partner_pass, n_heads, shared=False, seed=seed * GROUP_ROWS + row
            )
            decisions[str(row)] = decide_paired_null(
                partner, null, alpha=protocol.null_alpha, min_score=protocol.equivalent_at,
                clusters=clusters,
            )  # fmt: skip
        found = list(group_decisions(decisions).values())
        some += any(found)
        every += all(found)
        raw += any(d.partner_only > d.null_only and d.p_value < d.alpha for d in decisions.values())
    return GroupRate(
        family=family, partner_pass=float(partner_pass), n_heads=n_heads, rows=GROUP_ROWS,
        expected=partner_pass > NULL_PASS, n=n, rate=some / n, rate_ci=wilson_interval(some, n),
        all_rate=every / n, all_rate_ci=wilson_interval(every, n), raw_rate=raw / n,
        raw_rate_ci=wilson_interval(raw, n), seeds=(first_seed, first_seed + n - 1),
    )  # fmt: skip

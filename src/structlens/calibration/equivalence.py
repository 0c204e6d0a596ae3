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

CONGRUITY's decision (:func:`congruity_decision`: the production statistics and verdict on
two groups of implementations) is scored on planted implementations
(:func:`planted_implementations`) whose truth is known: copies and exchangeable groups, where
"different" is a false positive, and models that carry a share ε of their variance in
variables the other lacks, where it is the power at ε.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from structlens.equivalence.protocol import PROFILES, EquivalenceProtocol
from structlens.equivalence.score import component_clusters, decide_paired_null
from structlens.stats.intervals import wilson_interval

if TYPE_CHECKING:
    from structlens.equivalence.stages import CongruityScores

__all__ = ["PROTOCOL", "NULL_PASS", "HEADS_PER_LAYER", "DecisionRate", "planted_outcomes",
           "calibrate_decision", "GROUP_ROWS", "GroupRate", "calibrate_group",
           "CONGRUITY_WIDTH", "HEAD_REMOVED", "IMPLEMENTATION_NOISE", "CONGRUITY_FAMILIES",
           "planted_implementations", "congruity_decision", "CongruityRate",
           "calibrate_congruity"]  # fmt: skip

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


#: Columns of CONGRUITY's planted accumulated representations.  Their prompt variables'
#: standard deviations fall as ``j^-1/2``: a privileged basis, as a residual stream has (a few
#: coordinates carry most of the variance), which a rotation of B's basis spreads out.
CONGRUITY_WIDTH = 64
#: Share of its head's variable that an intervention on the head removes.
HEAD_REMOVED = 0.5
#: Noise of every implementation of the exchangeable families, as a share of the variance of
#: each coordinate's prompt variable.
IMPLEMENTATION_NOISE = 0.1
#: CONGRUITY's planted families: name -> (B's basis rotated, implementation noise).
CONGRUITY_FAMILIES: dict[str, tuple[bool, float]] = {
    "copy, same basis": (False, 0.0),
    "copy, rotated basis": (True, 0.0),
    "exchangeable, same basis": (False, IMPLEMENTATION_NOISE),
    "exchangeable, rotated basis": (True, IMPLEMENTATION_NOISE),
    "private variables, rotated basis": (True, 0.0),
}


def planted_implementations(
    family: str, effect: float, seed: int, *, protocol: EquivalenceProtocol = PROTOCOL
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Two models' groups of CONGRUITY implementations: per model the clean representation,
    then one per intervened head (``protocol.congruity_top_k`` heads), each
    ``[protocol.probe_prompts, CONGRUITY_WIDTH]``.

    A model's clean representation of the prompts is ``Z diag(s) + H U``: ``Z`` its prompt
    variables (one per coordinate, ``s_j = j^-1/2``), ``H`` the variables of its ``k`` heads,
    each written along a unit direction (a row of ``U``, shared by both models: one
    mechanism).  Intervening on head ``i`` removes :data:`HEAD_REMOVED` of its variable.  Model
    B's variables are ``√(1 − ε)`` of A's plus ``√ε`` of its own, independent of A's
    (``ε = effect``), so ε is the share of each model's variance that no implementation of the
    other carries; the truth is "different" exactly when ε > 0.  Per family
    (:data:`CONGRUITY_FAMILIES`): B's representations are in a random orthogonal basis of
    their own (rotated) or in A's, and every implementation of both models carries noise of
    its own (:data:`IMPLEMENTATION_NOISE`, the exchangeable families: the two groups are
    draws from one distribution) or none (a copy: with ε = 0 B's implementations are A's, in
    B's basis).  All draws of one seed are shared between effects.
    """
    rotated, noise = CONGRUITY_FAMILIES[family]
    if not 0 <= effect < 1:
        raise ValueError(f"effect must lie in [0, 1), got {effect}.")
    rng = np.random.default_rng(seed)
    n, heads, width = protocol.probe_prompts, protocol.congruity_top_k, CONGRUITY_WIDTH
    scale = np.arange(1, width + 1, dtype=np.float64) ** -0.5
    z, h = rng.standard_normal((n, width)), rng.standard_normal((n, heads))
    write = rng.standard_normal((heads, width))
    write /= np.linalg.norm(write, axis=1, keepdims=True)
    groups = []
    for model in range(2):
        z_m = np.sqrt(1 - effect) * z + np.sqrt(effect) * rng.standard_normal((n, width))
        h_m = np.sqrt(1 - effect) * h + np.sqrt(effect) * rng.standard_normal((n, heads))
        basis = np.eye(width)
        if rotated and model == 1:
            basis, _ = np.linalg.qr(rng.standard_normal((width, width)))
        group = []
        for head in range(heads + 1):
            h_i = h_m.copy()
            if head:
                h_i[:, head - 1] *= 1 - HEAD_REMOVED
            rep = z_m * scale + h_i @ write
            if noise:
                rep += np.sqrt(noise) * rng.standard_normal((n, width)) * scale
            group.append(rep @ basis)
        groups.append(group)
    return groups[0], groups[1]


def congruity_decision(
    group_a: list[np.ndarray],
    group_b: list[np.ndarray],
    *,
    protocol: EquivalenceProtocol = PROTOCOL,
) -> CongruityScores:
    """CONGRUITY's verdict on two groups of implementations (clean first, then one per
    intervened head) as a comparison reaches it: the statistics of
    ``structlens.equivalence.patching._congruity_statistics`` under both ways of averaging
    per-coordinate ``R^2`` on the same triples, put together as
    :func:`structlens.equivalence.patching.congruity` puts them, and the
    :class:`~structlens.equivalence.stages.CongruityScores` that
    ``structlens.equivalence.stages._congruity`` makes of them ("different" when the uniform
    estimate's decision rate exceeds 0.5 in either direction, else "unidentified")."""
    from structlens.equivalence.encoding import MULTIOUTPUTS, EncodingConfig
    from structlens.equivalence.patching import _congruity_statistics
    from structlens.equivalence.stages import _congruity

    config = protocol.compare_config()
    stats = {
        m: _congruity_statistics(
            group_a, group_b, group_a[1:], group_b[1:], config, EncodingConfig(multioutput=m)
        )[0]
        for m in MULTIOUTPUTS
    }
    heads = [[0, i] for i in range(len(group_a) - 1)]
    scores = _congruity(
        stats["uniform_average"]
        | {
            "variance_weighted": stats["variance_weighted"],
            "representation": "planted",
            "intervention": "planted head interventions",
            "top_heads_a": heads,
            "top_heads_b": heads,
            "top_kl_a": [0.0] * len(heads),
            "top_kl_b": [0.0] * len(heads),
        }
    )
    assert scores is not None  # only an empty record (CONGRUITY not run) gives none
    return scores


@dataclass(frozen=True)
class CongruityRate:
    """CONGRUITY's verdict on ``n`` planted instances of one family
    (:func:`planted_implementations`).

    ``expected``: the truth is "different" (ε > 0); ``rate``: share of "different" from the
    deciding estimate (uniform ``R^2``), ``weighted_rate`` from the variance-weighted one
    reported beside it, each with its Wilson interval over instances; ``decision_rate`` /
    ``weighted_decision_rate``: mean over instances of the larger direction's share of straps
    calling the models different; ``mean_p`` / ``weighted_mean_p``: mean over instances and
    both directions of the share of triples whose within-model encoding wins.
    """

    family: str
    effect: float
    rotated: bool
    noise: float
    expected: bool
    n: int
    rate: float
    rate_ci: tuple[float, float]
    weighted_rate: float
    weighted_rate_ci: tuple[float, float]
    decision_rate: float
    weighted_decision_rate: float
    mean_p: float
    weighted_mean_p: float
    seeds: tuple[int, int]


def calibrate_congruity(
    family: str,
    effect: float,
    n: int,
    *,
    first_seed: int = 0,
    protocol: EquivalenceProtocol = PROTOCOL,
) -> CongruityRate:
    """:func:`congruity_decision` on ``n`` planted instances (seeds ``first_seed, ...``) of
    ``family`` at ``effect``, under ``protocol``'s CONGRUITY settings."""
    said, weighted, rates, w_rates, ps, w_ps = 0, 0, [], [], [], []
    for seed in range(first_seed, first_seed + n):
        a, b = planted_implementations(family, effect, seed, protocol=protocol)
        u, w = congruity_decision(a, b, protocol=protocol).estimates
        said += u.decision == "different"
        weighted += w.decision == "different"
        rates.append(max(u.decision_rate_ab, u.decision_rate_ba))
        w_rates.append(max(w.decision_rate_ab, w.decision_rate_ba))
        ps.append((u.mean_p_ab + u.mean_p_ba) / 2)
        w_ps.append((w.mean_p_ab + w.mean_p_ba) / 2)
    rotated, noise = CONGRUITY_FAMILIES[family]
    return CongruityRate(
        family=family, effect=float(effect), rotated=rotated, noise=noise, expected=effect > 0,
        n=n, rate=said / n, rate_ci=wilson_interval(said, n), weighted_rate=weighted / n,
        weighted_rate_ci=wilson_interval(weighted, n), decision_rate=float(np.mean(rates)),
        weighted_decision_rate=float(np.mean(w_rates)), mean_p=float(np.mean(ps)),
        weighted_mean_p=float(np.mean(w_ps)), seeds=(first_seed, first_seed + n - 1),
    )  # fmt: skip

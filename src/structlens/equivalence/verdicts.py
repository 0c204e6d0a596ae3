"""The verdicts of interpretive equivalence, computed from the stages' typed results.

:data:`PAPER` is the one table of the paper's values (claim id -> the value and the range a
measurement is compared with).  A row of the scenario table
(:data:`~structlens.equivalence.scenarios.SCENARIOS`) gets its verdict from its
:class:`~structlens.equivalence.stages.ModelComparison` (:func:`row_verdict`); a scenario
group pools its rows over model pairs into one :class:`~structlens.verdicts.Claim`
(:func:`group_claim`); the sanity rows are a ``check`` with a positive control
(:func:`sanity_claim`).  :func:`section` is the ``analyze`` section of a
:class:`~structlens.equivalence.stages.ModelAnalysis`.  Verdicts use the one vocabulary of
:data:`structlens.verdicts.VERDICTS`, each with its reason; the paired test's decisions
("equivalent", "unidentified", "not tested") stay decisions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from structlens.equivalence.scenarios import SCENARIOS, Scenario, basis_change
from structlens.equivalence.score import PairedNullDecision
from structlens.equivalence.stages import (
    CongruityEstimate,
    CongruityScores,
    ModelAnalysis,
    ModelComparison,
    SanityCheck,
)
from structlens.results import to_jsonable
from structlens.stats.intervals import cluster_bootstrap_ratio_interval, wilson_interval
from structlens.stats.multiplicity import holm
from structlens.verdicts import Caveat, Claim, Number, Section

__all__ = [
    "PAPER",
    "PAPER_SOURCE",
    "PaperValue",
    "Pooled",
    "GroupSummary",
    "claim_id",
    "claimed",
    "claimed_in_group",
    "group_decisions",
    "vs_paper",
    "row_verdict",
    "row_verdicts",
    "row_caveats",
    "layer_maps",
    "pooled_interval",
    "pool",
    "summarize_group",
    "group_claim",
    "sanity_claim",
    "rows_of",
    "claims",
    "row_block",
    "blocks",
    "congruity_row",
    "congruity_caveats",
    "sanity_copies",
    "sanity_congruity",
    "section",
]


@dataclasses.dataclass(frozen=True)
class PaperValue:
    """The paper's value as it states it (``text``) and the range ``[low, high]`` our
    interval is compared with."""

    text: str
    low: float
    high: float


#: Where the paper's values come from.
PAPER_SOURCE = (
    "the scenario table of the circulating method summary of Sun & Toneva (arXiv 2603.30002); "
    "it is not in the paper's public code (no matching step, no encoder-decoder models there)"
)
#: The models the paper's values were measured on (none of them ours).
PAPER_MODELS = "GPT-2 family, 12 vs 24 layers"
#: The paper's value of each claim (claim id ``<group>_score``, :func:`claim_id`).
PAPER: dict[str, PaperValue] = {
    "sanity_score": PaperValue("1 (by construction)", 1.0, 1.0),
    "seeds_score": PaperValue("≈ 0.85", 0.85, 0.85),
    "depth_score": PaperValue("≈ 0.6 (12 vs 24 layers)", 0.6, 0.6),
    "finetune_score": PaperValue("0.4–0.9", 0.4, 0.9),
    "encoder-decoder_score": PaperValue("≈ 0.3", 0.3, 0.3),
    # MiniLM is an encoder trained on other data: the summary's row is about encoder–decoders
    "encoder-other-data_score": PaperValue("≈ 0.3 (for enc–dec vs dec)", 0.3, 0.3),
    # no range: the summary compares models of one family, so the row is measured, not judged
    "cross-family_score": PaperValue(
        "none (the summary compares GPT-2 models of one family)", math.nan, math.nan
    ),
}
#: The sanity copy computes the same function: its logits may differ by float round-off only.
SANITY_MAX_LOGIT_DIFF = 1e-3
#: The sanity copy whose residual basis is kept, as a row of the ``analyze`` section.
UNROTATED_COPY = "head-permuted copy, basis kept (known: equivalent; CONGRUITY only)"
#: How each way of averaging per-coordinate encoding R² is named in words.
R2_NAMES = {
    "uniform_average": "uniform R² (the reference's, deciding)",
    "variance_weighted": "variance-weighted R² (rotation-invariant, reported beside)",
}
#: Matched layers this similar are the same layer up to the map; failing them is the map's fault.
SAME_LAYER_SIMILARITY = 0.999


def claim_id(group: str) -> str:
    """The id of the claim a scenario group tests."""
    return f"{group}_score"


def _ci(interval: Sequence[float]) -> str:
    return f"[{interval[0]:.2f}, {interval[1]:.2f}]"


def claimed(r: ModelComparison) -> bool | None:
    """Whether the paired test finds the partners better than the mean-ablation null on the
    row's validated heads alone (more heads pass with their partner only, McNemar exact
    p < α); ``None`` without a null.  Score and null come from the same heads, so their
    intervals are not compared."""
    if r.heads.null_passed is None:
        return None
    d = r.heads.decision
    return bool(d.partner_only > d.null_only and d.p_value < d.alpha)


def claimed_in_group(rows: Mapping[str, ModelComparison]) -> dict[str, bool | None]:
    """:func:`claimed` for every row of one scenario group: :func:`group_decisions` of the
    rows' paired tests (``None`` for a row without a null)."""
    return group_decisions(
        {k: None if r.heads.null_passed is None else r.heads.decision for k, r in rows.items()}
    )


def group_decisions(decisions: Mapping[str, PairedNullDecision | None]) -> dict[str, bool | None]:
    """Per row of one scenario group, whether its paired test finds the partners better than
    the null (more heads pass with their partner only) with its p-value adjusted by Holm over
    the group's tests at their α (a group's verdict rests on all of its rows, so one row
    claimed by chance would change it; the rows of a group share one protocol).  ``None``
    for a row without a test."""
    tested = {k: d for k, d in decisions.items() if d is not None}
    out: dict[str, bool | None] = {k: None for k in decisions}
    if not tested:
        return out
    alpha = next(iter(tested.values())).alpha
    p = [1.0 if math.isnan(d.p_value) else d.p_value for d in tested.values()]
    for (k, d), adjusted in zip(tested.items(), holm(p, alpha).adjusted, strict=True):
        out[k] = bool(d.partner_only > d.null_only and adjusted < d.alpha)
    return out


def vs_paper(group: str, interval: Sequence[float]) -> str:
    """Where ``interval`` lies against the paper's range: lower, higher or consistent."""
    paper = PAPER[claim_id(group)]
    if math.isnan(paper.low):
        return "no paper value"
    # 1e-9: a Wilson bound of k = n is 1 up to rounding
    if interval[1] < paper.low - 1e-9:
        return "lower"
    if interval[0] > paper.high + 1e-9:
        return "higher"
    return "consistent"


def row_verdict(group: str, r: ModelComparison, is_claimed: bool | None = None) -> tuple[str, str]:
    """The row's verdict against the paper (one of the vocabulary) and its reason;
    ``is_claimed`` is the row's :func:`claimed_in_group` (default: the row alone)."""
    if not r.heads.passed:
        return "not tested", "no head was validated"
    if (claimed(r) if is_claimed is None else is_claimed) is False:
        return "unidentified", (
            "the paired test does not find the partners better than the mean-ablation null "
            f"({r.heads.decision.reason}"
            + (", after Holm's adjustment over the group's rows)" if claimed(r) else ")")
        )
    paper, where = PAPER[claim_id(group)].text, vs_paper(group, r.heads.score_ci)
    if where == "no paper value":
        return "not tested", f"the paper has no value to compare with: {paper}"
    if where == "consistent":
        return "reproduced", f"the paper's {paper} lies in {_ci(r.heads.score_ci)}"
    return "not reproduced", f"{_ci(r.heads.score_ci)} lies {where} than the paper's {paper}"


def row_verdicts(results: Mapping[str, ModelComparison]) -> dict[str, tuple[str, str]]:
    """:func:`row_verdict` of every row of the scenario table that ran, each with its
    group's :func:`claimed_in_group`."""
    out: dict[str, tuple[str, str]] = {}
    for group in dict.fromkeys(sc.group for sc in SCENARIOS):
        rows = rows_of(group, results)
        found = claimed_in_group(rows)
        out |= {k: row_verdict(group, r, found[k]) for k, r in rows.items()}
    return out


def row_caveats(r: ModelComparison) -> tuple[Caveat, ...]:
    """The comparison's caveats (null passes, no patching, reduced encodings) and, where
    matched layers that are the same layer up to the map fail when replaced through it, that
    the layer score measures the map."""
    out = [Caveat(c.kind, c.message) for c in r.caveats]
    lv = r.layers
    if lv is not None and lv.kl:
        same = [
            i for i, (s, ok) in enumerate(zip(lv.similarity, lv.passed, strict=True))
            if s >= SAME_LAYER_SIMILARITY and not ok
        ]  # fmt: skip
        if same:
            failed = ", ".join(
                f"{lv.pairs[i]}: KL {lv.kl[i]:.2f} nats, top-1 {lv.top1[i]:.2f}" for i in same
            )
            out.append(
                Caveat(
                    "layer_map_fails",
                    f"matched layers with CKA ≥ {SAME_LAYER_SIMILARITY} still fail when replaced "
                    f"through the fitted map ({failed}), so the layer score {lv.score:.2f} "
                    "measures the map, not the models",
                )
            )
    return tuple(out)


def pooled_interval(
    ks: Sequence[int], ns: Sequence[int], n_boot: int = 2000
) -> tuple[tuple[float, float], str]:
    """Interval of a pass rate pooled over model pairs and how it was made.

    Heads of one pair share both models (and pairs of a group share models too), so the
    heads are no independent sample: with two or more pairs the interval resamples whole
    pairs (cluster bootstrap, ``n_boot`` draws), with one pair it is that pair's Wilson
    interval.
    """
    keep = [(k, n) for k, n in zip(ks, ns, strict=True) if n > 0]
    k, n = sum(k for k, _ in keep), sum(n for _, n in keep)
    if len(keep) < 2:
        return wilson_interval(k, n), "Wilson, one pair"
    lo, hi = cluster_bootstrap_ratio_interval(
        [k for k, _ in keep], [n for _, n in keep], n_boot=n_boot
    )
    return (lo, hi), f"cluster bootstrap over {len(keep)} pairs"


@dataclasses.dataclass(frozen=True)
class Pooled:
    """``k`` of ``n`` components passed, pooled over model pairs, with the interval ``ci``
    of :func:`pooled_interval` and how it was made (``how``)."""

    k: int
    n: int
    ci: tuple[float, float]
    how: str

    @property
    def rate(self) -> float:
        return self.k / self.n


def pool(ks: Sequence[int], ns: Sequence[int], n_boot: int) -> Pooled | None:
    """The pooled rate of ``sum(ks) / sum(ns)`` (``None`` when nothing was counted)."""
    if not sum(ns):
        return None
    interval, how = pooled_interval(ks, ns, n_boot)
    return Pooled(sum(ks), sum(ns), (float(interval[0]), float(interval[1])), how)


@dataclasses.dataclass(frozen=True)
class GroupSummary:
    """One scenario group pooled over its rows: the validated-head score, the null, the
    score on the heads whose null fails (``informative``), the whole-layer head groups
    against their all-heads null, how many patched rows the paired test claims, and every
    row's verdict with its reason (``verdicts``, in row order)."""

    group: str
    rows: tuple[str, ...]
    method: str
    score: Pooled | None
    null: Pooled | None
    informative: Pooled | None
    head_groups: Pooled | None
    head_groups_null: Pooled | None
    head_groups_informative: Pooled | None
    n_patched: int
    n_claimed: int
    verdicts: tuple[tuple[str, str], ...]


def _counts(rates: Sequence[Any]) -> tuple[list[int], list[int]]:
    return [r.n_passed if r else 0 for r in rates], [r.n if r else 0 for r in rates]


def summarize_group(group: str, rows: Mapping[str, ModelComparison], n_boot: int) -> GroupSummary:
    """Pool the rows of ``group`` (name -> comparison, in table order)."""
    rs = list(rows.values())
    found = claimed_in_group(rows)
    patched = [r for r in rs if r.heads.null_passed is not None]
    grouped = [g for r in patched if (g := r.head_groups) is not None]
    null_k = [sum(r.heads.null_passed or ()) for r in patched]
    return GroupSummary(
        group=group,
        rows=tuple(rows),
        method=rs[0].heads.method,
        score=pool([sum(r.heads.passed) for r in rs], [len(r.heads.passed) for r in rs], n_boot),
        null=pool(null_k, [len(r.heads.null_passed or ()) for r in patched], n_boot),
        informative=pool(*_counts([r.heads.informative for r in patched]), n_boot),
        head_groups=pool([sum(g.passed) for g in grouped], [len(g.pairs) for g in grouped], n_boot),
        head_groups_null=pool(
            [sum(g.null_passed or ()) for g in grouped], [len(g.pairs) for g in grouped], n_boot
        ),
        head_groups_informative=pool(*_counts([g.informative for g in grouped]), n_boot),
        n_patched=len(patched),
        n_claimed=sum(bool(c) for c in found.values()),
        verdicts=tuple(row_verdict(group, r, found[k]) for k, r in rows.items()),
    )


def _group_verdict(verdicts: Sequence[str]) -> str:
    """All rows alike -> that verdict; else partly."""
    kinds = set(verdicts)
    return kinds.pop() if len(kinds) == 1 else "partly"


def group_claim(group: str, rows: Mapping[str, ModelComparison], n_boot: int = 2000) -> Claim:
    """The claim of one scenario group: the pooled validated-head score against the paper,
    its verdict from the rows' (:func:`row_verdict`), every row's score, verdict, reason
    and caveats in ``per_setting``."""
    s = summarize_group(group, rows, n_boot)
    per_row = {
        name: {
            "score": r.heads.score,
            "score_ci": list(r.heads.score_ci),
            "verdict": v,
            "reason": why,
            "caveats": [c.to_json() for c in row_caveats(r)],
        }
        for (name, r), (v, why) in zip(rows.items(), s.verdicts, strict=True)
    }
    return Claim(
        id=claim_id(group),
        paper=PAPER[claim_id(group)].text,
        ours=s.score.rate if s.score else None,
        ci=s.score.ci if s.score else None,
        verdict=_group_verdict([v for v, _ in s.verdicts]),
        settings={"rows": list(s.rows), "validation": s.method,
                  "interval": s.score.how if s.score else None,
                  "layer_map": layer_maps(rows)},
        ci_reason=None if s.score else "no head was validated",
        note="; ".join(f"{x}: {v} ({why})" for x, (v, why) in zip(s.rows, s.verdicts, strict=True)),
        per_setting=per_row,
    )  # fmt: skip


def layer_maps(rows: Mapping[str, ModelComparison]) -> dict[str, dict[str, Any] | None]:
    """Each row's whole-layer map as the claims' settings state it: the pair's relation, the
    map (``None``: the layers were not validated) and why (``None`` for a row that patched
    no layer)."""
    return {
        name: None if (m := r.layer_map) is None
        else {"relation": m.relation, "method": m.method, "reason": m.reason}
        for name, r in rows.items()
    }  # fmt: skip


def sanity_claim(checks: Mapping[str, SanityCheck]) -> Claim:
    """The sanity group is a check (an exact copy scores 1 by construction when the code is
    right), beside its positive control: the copy computes the same logits and matching
    finds every planted head partner."""
    k = sum(sum(c.comparison.heads.passed) for c in checks.values())
    n = sum(len(c.comparison.heads.passed) for c in checks.values())
    control = {
        "passed": bool(checks)
        and all(
            c.max_abs_logit_diff < SANITY_MAX_LOGIT_DIFF and c.heads_recovered == 1.0
            for c in checks.values()
        ),
        "what": f"the copy's logits equal the model's (max |Δlogit| < "
        f"{SANITY_MAX_LOGIT_DIFF:g}) and matching recovers every planted head partner",
        "max_abs_logit_diff": {x: c.max_abs_logit_diff for x, c in checks.items()},
        "heads_recovered": {x: c.heads_recovered for x, c in checks.items()},
    }
    ok = [c.passed for c in checks.values()]
    verdict = "reproduced" if ok and all(ok) else "not reproduced" if ok else "not tested"
    interval, how = pooled_interval([k], [n]) if n else (None, "")
    return Claim(
        id=claim_id("sanity"), paper=PAPER[claim_id("sanity")].text,
        ours=k / n if n else None, ci=interval, verdict=verdict,
        settings={"rows": list(checks), "interval": how or None,
                  "layer_map": layer_maps({x: c.comparison for x, c in checks.items()})},
        kind="check",
        positive_control=control, ci_reason=None if n else "no head was validated",
        note="; ".join(f"{x}: {c.reason}" for x, c in checks.items())
        or "the sanity stage did not run",
    )  # fmt: skip


def rows_of(group: str, results: Mapping[str, ModelComparison]) -> dict[str, ModelComparison]:
    """The rows of ``group`` that ran, in the scenario table's order."""
    return {
        sc.name: results[sc.name] for sc in SCENARIOS if sc.group == group and sc.name in results
    }


def claims(
    results: Mapping[str, ModelComparison],
    sanity: Mapping[str, SanityCheck],
    n_boot: Mapping[str, int],
) -> tuple[Claim, ...]:
    """One claim per scenario group that ran (rows ``results``, sanity rows' checks
    ``sanity``), its pooled interval drawn ``n_boot[row]`` times (its first row's protocol:
    the rows of a group share one)."""
    out = []
    for group in dict.fromkeys(sc.group for sc in SCENARIOS):
        rows = rows_of(group, results)
        if not rows:
            continue
        if group == "sanity":
            out.append(sanity_claim({x: sanity[x] for x in rows if x in sanity}))
        else:
            out.append(group_claim(group, rows, n_boot.get(next(iter(rows)), 2000)))
    return tuple(out)


def row_block(
    sc: Scenario, r: ModelComparison, protocol: Any, row: tuple[str, str]
) -> dict[str, Any]:
    """One row of the claims JSON: score, null, layer score, verdict and reason (``row``: its
    :func:`row_verdicts` entry), decisions, the paired test, the representational score,
    caveats, the protocol, and the row's stated choices: the layers compared, the layer map
    with its reason and how the validated heads were chosen."""
    h, rs = r.heads, r.representational
    verdict, why = row

    def finite(pair: Sequence[float] | None) -> list[float] | None:
        return list(pair) if pair is not None and all(map(math.isfinite, pair)) else None

    return {
        "name": sc.name,
        "group": sc.group,
        "score": h.score,
        "score_ci": finite(h.score_ci),
        "null_score": h.null_score,
        "null_score_ci": finite(h.null_score_ci),
        "layer_score": r.layers.score if r.layers else None,
        "verdict": verdict,
        "verdict_reason": why,
        "decision": r.decision,
        "decision_reason": r.decision_reason,
        "congruity_decision": r.congruity.decision if r.congruity else None,
        "congruity": congruity_row(sc.name, r.congruity) if r.congruity else None,
        "paired_test": h.decision.to_json(),
        "representational_score": rs.score,
        "representational_score_ci": finite(rs.score_ci),
        "representational_min_similarity": protocol.representational_min_similarity,
        "caveats": [c.to_json() for c in row_caveats(r)],
        "protocol": protocol.to_json(),
        "compared_layers": r.compared_layers,
        "layer_map": to_jsonable(r.layer_map),
        "head_selection": to_jsonable(r.head_selection),
    }


def blocks(
    results: Mapping[str, ModelComparison],
    sanity: Mapping[str, SanityCheck],
    protocols: Mapping[str, Any],
) -> dict[str, Any]:
    """The claims document's blocks: where the paper's values come from, the sanity row
    (SmolLM2's where it ran, else the tiny model's) and every row (:func:`row_block`)."""
    row = next((x for x in ("sanity-smollm2", "sanity-tiny") if x in results), None)
    first = results[row] if row else None
    check = sanity.get(row) if row is not None else None
    verdicts = row_verdicts(results)
    return {
        "paper_targets": {"source": PAPER_SOURCE, "in_paper_code": False},
        "sanity": {
            "row": row,
            "head_score": first.heads.score if first else None,
            "layer_score": first.layers.score if first and first.layers else None,
            "passed": check.passed if check is not None else None,
            "congruity": sanity_congruity(check) if check is not None else [],
        },
        "rows": [
            row_block(sc, r, protocols[sc.name], verdicts[sc.name])
            for sc in SCENARIOS
            if (r := results.get(sc.name))
        ],  # fmt: skip
    }


def congruity_row(pair: str, c: CongruityScores, known: str | None = None) -> dict[str, Any]:
    """One pair's CONGRUITY under both ways of averaging per-coordinate ``R^2``: the
    decision (the uniform estimate's, pre-registered), the known answer where there is one
    (``"equivalent"`` for the sanity copies), and each estimate's decision rates, mean
    ``p``, selectivity and clean-run ``R^2`` (``variance_weighted`` ``None`` when not
    measured)."""
    weighted = c.variance_weighted
    return {
        "pair": pair,
        "known": known,
        "decision": c.decision,
        "decided_by": "uniform_average",
        "uniform_average": c.uniform.to_json(),
        "variance_weighted": None if weighted is None else weighted.to_json(),
    }


def _calls_different(c: CongruityScores) -> list[CongruityEstimate]:
    return [e for e in c.estimates if e.decision == "different"]


def congruity_caveats(check: SanityCheck) -> list[Caveat]:
    """Caveats of CONGRUITY on the sanity copies, both known to be equivalent: each copy it
    calls "different" (a false alarm, with the estimators that raised it), and, when the
    rotated and the unrotated copy get different decisions from one estimator, that the
    basis alone moved that estimator."""
    out = []
    for pair, c in sanity_copies(check):
        if not (wrong := _calls_different(c)):
            continue
        said = "; ".join(
            f"{R2_NAMES[e.multioutput]}: decision rates {e.decision_rate_ab:.2f} (A→B) / "
            f"{e.decision_rate_ba:.2f} (B→A)"
            for e in wrong
        )
        out.append(
            Caveat(
                "congruity_false_difference",
                f"{pair}: CONGRUITY calls the copy different although it computes the same "
                f"function ({said}).",
            )
        )
    rotated, unrotated = check.comparison.congruity, check.unrotated
    changed = basis_change(check.comparison.model_b)
    if rotated is not None and unrotated is not None:
        for r, u in zip(rotated.estimates, unrotated.estimates, strict=False):
            if r.decision != u.decision:
                out.append(
                    Caveat(
                        "congruity_basis_dependent",
                        f"CONGRUITY with {R2_NAMES[r.multioutput]} decides {r.decision!r} on "
                        f"the {changed} copy and {u.decision!r} on the one whose basis was "
                        f"kept: the two copies differ only by the {changed} residual basis, "
                        "so that estimator's answer depends on the basis.",
                    )
                )
    return out


def sanity_copy(check: SanityCheck) -> str:
    """The row name of the sanity copy: how its basis was changed (rotated; a signed
    permutation for Gemma 2/3, whose sandwich norms admit no rotation) and its heads
    permuted."""
    return f"{basis_change(check.comparison.model_b)} + head-permuted copy (known: equivalent)"


def sanity_copies(check: SanityCheck) -> list[tuple[str, CongruityScores]]:
    """The sanity copies that ran CONGRUITY, each with its row name: the one whose basis was
    changed (:func:`sanity_copy`), then the one whose basis was kept (both known to be
    equivalent)."""
    copies = [(sanity_copy(check), check.comparison.congruity), (UNROTATED_COPY, check.unrotated)]
    return [(pair, c) for pair, c in copies if c is not None]


def sanity_congruity(check: SanityCheck) -> list[dict[str, Any]]:
    """:func:`congruity_row` of both sanity copies (:func:`sanity_copies`; the unrotated
    one with its logit gap); their known answer is equivalent."""
    out = []
    for pair, c in sanity_copies(check):
        row = congruity_row(pair, c, "equivalent")
        if pair == UNROTATED_COPY:
            row["max_abs_logit_diff"] = check.unrotated_max_abs_logit_diff
        out.append(row)
    return out


def _analysis_row(res: ModelComparison, name: str) -> dict[str, Any]:
    nan = float("nan")
    layers = res.layers
    return {
        "pair": name,
        "model_b": res.model_b,
        "probe": res.probe,
        "score": res.heads.score,
        "score_ci": list(res.heads.score_ci),
        "null_score": nan if res.heads.null_score is None else res.heads.null_score,
        "null_score_ci": list(res.heads.null_score_ci or (nan, nan)),
        "layer_score": nan if layers is None else layers.score,
        "layer_score_ci": [nan, nan] if layers is None else list(layers.score_ci),
        "decisions": {"matching": res.decision}
        | ({} if res.congruity is None else {"congruity": res.congruity.decision}),
        "comparison": to_jsonable(res),
        "layer_similarity": res.layer_similarity.tolist(),
    }


def section(result: ModelAnalysis) -> Section:
    """The ``analyze`` section: one row for the sanity copy and one for the second model,
    their scores and nulls as headline numbers and every caveat, each naming its row."""
    rows: list[tuple[str, dict[str, Any]]] = []
    caveats: list[Caveat] = []
    congruity: list[dict[str, Any]] = []
    check = result.sanity
    if result.sanity_error is not None:
        caveats.append(Caveat("not_run", f"sanity row: {result.sanity_error}"))
    if check is not None:
        row = _analysis_row(check.comparison, sanity_copy(check))
        row["sanity"] = {k: getattr(check, k) for k in ("passed", "reason", "heads_recovered")}
        row["sanity"] |= {
            "unrotated": to_jsonable(check.unrotated),
            "unrotated_max_abs_logit_diff": check.unrotated_max_abs_logit_diff,
        }
        rows.append(("sanity", row))
        caveats += [
            Caveat(c.kind, f"{row['pair']}: {c.message}.") for c in check.comparison.caveats
        ]
        if not check.passed:
            caveats.append(Caveat("failed_sanity", f"{check.reason}."))
        congruity += sanity_congruity(check)
        caveats += congruity_caveats(check)
    if (other := result.compare) is not None:
        row = _analysis_row(other, f"vs {other.model_b}")
        rows.append(("compare", row))
        caveats += [Caveat(c.kind, f"{row['pair']}: {c.message}.") for c in other.caveats]
        if other.congruity is not None:
            congruity.append(congruity_row(row["pair"], other.congruity))
    headline = {}
    for key, r in rows:
        headline[f"{key}_score"] = Number.of(r["score"], r["score_ci"], "", f"score: {r['pair']}")
        headline[f"{key}_null"] = Number.of(
            r["null_score"], r["null_score_ci"], "", f"null score: {r['pair']}"
        )
    details = {
        "rows": [r for _, r in rows],
        "congruity": congruity,
        "protocol": result.protocol.to_json(),
    }
    return Section(headline=headline, caveats=tuple(caveats), details=details)

"""Markdown and claims JSON of the interpretive-equivalence replication.

:func:`write` renders ``equivalence.md`` (the scenario table, per-row details, settings and
the discussion derived from the numbers) and ``equivalence.json``
(:class:`~structlens.replication.claims.ClaimsDocument`: one claim per scenario group, the
sanity scores and every row's score, null and intervals) from one run's stage results.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from structlens.equivalence.compare import CompareConfig, ComparisonResult
from structlens.equivalence.score import (
    EquivalenceScore,
    PairedNullDecision,
    decide_paired_null,
    representational_score,
    wilson_interval,
)
from structlens.replication.claims import Claim, ClaimsDocument
from structlens.replication.equivalence.run import (
    ENC_CFG,
    FINETUNES,
    FT_PROMPTS,
    FT_TARGET_KL,
    FT_TRAIN,
    METHOD,
    PAPER,
    SCENARIOS,
    SMALL,
    SMOL_CFG,
    SMOL_PROBE,
    EquivalenceReplication,
    Scenario,
)
from structlens.replication.markdown import ci, finite_ci, num, write_text
from structlens.stats.intervals import cluster_bootstrap_ratio_interval


def _nan(x: float | str) -> bool:
    """NaN test for a loaded result, whose JSON stores NaN as the string "nan"."""
    return bool(np.isnan(float(x)))


def paired(r: ComparisonResult) -> PairedNullDecision | None:
    """The paired test of partner against null on the row's validated heads (McNemar exact on
    the discordant heads), recomputed from the per-head records; None without patching."""
    if _nan(r.null_score) or not r.null_validation:
        return None
    return decide_paired_null(
        [v["passed"] for v in r.validation],
        [v["passed"] for v in r.null_validation],
        alpha=r.config.get("null_alpha", 0.05),
    )


def verdicts(r: ComparisonResult) -> dict[str, Any]:
    """The row's verdicts with the matched one decided by the paired test, recomputed from
    the per-head records (a comparison cached before the test existed still carries the
    verdict of the interval comparison)."""
    out = dict(r.verdicts)
    t = paired(r)
    if t is not None:
        d = decide_paired_null(
            [v["passed"] for v in r.validation],
            [v["passed"] for v in r.null_validation],
            alpha=t.alpha,
            min_score=r.config.get("equivalent_at", 0.0),
        )
        out |= {"matching": d.verdict, "matching_reason": d.reason, "matching_test": d.to_json()}
        if "congruity" in out:
            out["agree"] = out["congruity"] == d.verdict
    return out


def informative(r: ComparisonResult) -> bool | None:
    """Whether the patching criterion separates partners from no information on this row:
    more heads pass with their partner only than with the null only, McNemar exact p < α
    (None without patching).  The score and null come from the same heads, so their Wilson
    intervals are not compared."""
    t = paired(r)
    if t is None:
        return None
    return bool(t.partner_only > t.null_only and t.p_value < t.alpha)


def _vs_paper(group: str, ci: list | tuple) -> str:
    _, lo, hi = PAPER[group]
    # 1e-9: a Wilson bound of k = n is 1 up to rounding
    if ci[1] < lo - 1e-9:
        return "lower"
    if ci[0] > hi + 1e-9:
        return "higher"
    return "consistent"


def representational(r: ComparisonResult) -> EquivalenceScore | None:
    """The representational sufficient condition on the validated head pairs (the same pairs
    as the behavioural score): share whose similarity (the comparison's metric) is at least
    :func:`~structlens.equivalence.representational_score`'s threshold, Wilson CI; ``None``
    without validated pairs."""
    records = r.validation
    if not records:
        return None
    return representational_score([v["pair"] for v in records], [v["similarity"] for v in records])


def verdict(group: str, r: ComparisonResult) -> str:
    if informative(r) is False:
        return "uninformative (null ≈ score)"
    return _vs_paper(group, r.score_ci)


def _row(sc: Scenario, r: ComparisonResult, seconds: dict[str, float]) -> str:
    cg = r.congruity
    rate = (
        " / ".join(f"{cg[k]['decision_rate']:.2f}" for k in ("point_test_ab", "point_test_ba"))
        if cg
        else "—"
    )
    t = paired(r)
    if _nan(r.null_score) or t is None:
        null = inf = "— (no patching)"
    else:
        null = (
            f"{r.null_score:.2f} {ci(r.null_score_ci)}; paired: {t.partner_only} vs "
            f"{t.null_only} discordant heads, p = {t.p_value:.2g}"
        )
        i = r.informative
        inf = (
            f"{i['n_passed']}/{i['n_heads']} = {i['score']:.2f} {ci(i['score_ci'])}"
            if i.get("n_heads")
            else "0 heads"
        )
    layer = "—" if _nan(r.layer_score) else f"{r.layer_score:.2f}"
    g = r.head_groups
    groups = f"{g['score']:.2f} / {g['null_score']:.2f} ({len(g['pairs'])} layers)" if g else "—"
    vs = verdicts(r)
    agree = {True: "yes", False: "**no**", None: "—"}[vs.get("agree")]
    return (
        f"| {sc.group} | {sc.setting} | {PAPER[sc.group][0]} | **{r.score:.2f}** "
        f"{ci(r.score_ci)} ({r.validation_method}) | {len(r.validation)} | {null} | "
        f"{inf} | {groups} | {layer} | {rate} | {vs['matching']} / "
        f"{vs.get('congruity', '—')} | {agree} | {verdict(sc.group, r)} | "
        f"{f'{seconds[sc.name]:.0f}' if sc.name in seconds else '?'} |"
    )


# The previous protocol's numbers (docs/replication/equivalence.md at commit 3cb132a): row ->
# (score, null score, layer score, matched decision, CONGRUITY decision).  History, so the
# "what changed" section can say how each row moved; nothing here enters a verdict.
PREVIOUS: dict[str, tuple[float, float | None, float | None, str, str]] = {
    "sanity-tiny": (1.00, 0.00, 1.00, "equivalent", "equivalent"),
    "sanity-smollm2": (1.00, 0.97, 0.00, "equivalent", "equivalent"),
    "enc-dec": (0.07, None, 0.83, "different", "different"),
    "seeds-s0-s1": (0.69, 0.38, 0.00, "equivalent", "different"),
    "seeds-s0-s2": (0.69, 0.56, 0.00, "equivalent", "different"),
    "seeds-s1-s2": (0.62, 0.56, 0.00, "equivalent", "different"),
    "depth-2-4": (0.50, 0.25, 0.00, "equivalent", "different"),
    "depth-4-8": (0.75, 0.56, 0.00, "equivalent", "different"),
    "depth-2-8": (0.50, 0.38, 0.00, "equivalent", "equivalent"),
    "ft-ioi": (1.00, 1.00, 0.00, "equivalent", "equivalent"),
    "ft-facts": (1.00, 0.97, 0.00, "equivalent", "equivalent"),
}


def _plateau(record: dict[str, Any]) -> bool:
    """The stopping rule ended the run before its step budget (a stall at the budget's last
    evaluation is the cosine schedule reaching 0, not a plateau)."""
    return bool(record.get("converged")) and record["steps_run"] < record["config"]["steps"]


def what_changed(rep: EquivalenceReplication, results: dict[str, ComparisonResult]) -> str:
    """The protocol changes and how each row moved (previous protocol → now)."""

    def num_or_dash(x: float | None) -> str:
        return "—" if x is None or not np.isfinite(x) else f"{x:.2f}"

    rows = []
    for sc in SCENARIOS:
        r, old = results.get(sc.name), PREVIOUS.get(sc.name)
        if r is None or old is None:
            continue
        now = (r.score, None if _nan(r.null_score) else r.null_score, r.layer_score)
        rows.append(
            f"| {sc.name} | {' / '.join(num_or_dash(x) for x in old[:3])} | {old[3]} / "
            f"{old[4]} | {' / '.join(num_or_dash(x) for x in now)} | {verdicts(r)['matching']} "
            f"/ {r.verdicts.get('congruity', '—')} |"
        )
    small = [c for n, c in rep.small_info.items() if c.get("held_out_loss")]
    ft = list(rep.ft_info.values())
    trained = (
        f" Now: {sum(_plateau(c) for c in small)} of {len(small)} reached a held-out plateau "
        f"before the step budget, the others ran {max(c['steps_run'] for c in small)} steps "
        "(their cosine rate reaches 0 there); held-out loss "
        f"{min(c['held_out_loss'][-1][1] for c in small):.2f}–"
        f"{max(c['held_out_loss'][-1][1] for c in small):.2f} nats/byte."
        if small
        else ""
    )
    tuned = (
        " Now: "
        + "; ".join(
            f"`{n}` {c['steps_run']} steps to held-out KL {c['held_out_kl'][-1][1]:.2f} nats"
            for n, c in rep.ft_info.items()
            if c.get("held_out_kl")
        )
        + "."
        if ft
        else ""
    )
    return "\n".join(
        [
            "## What changed and why",
            "",
            "* **Layer maps (a bug).** A whole `resid_post` was replaced through a ridge map "
            "fitted on ~170 token rows for d = 576, which failed even between identical layers "
            "(`sanity-smollm2` layer score 0.00). Layers of equal width are now mapped by "
            "orthogonal Procrustes on more fit rows than dimensions (96 IOI prompts for the "
            "SmolLM2 rows).",
            '* **Decisions with a null.** "Equivalent" used to mean score ≥ 0.5, whatever '
            "the null; it is now printed only when the score's 95 % interval lies above the "
            'mean-ablation null\'s (otherwise "undecided" with the reason), for CONGRUITY too '
            '(a decision rate of 0.00 no longer reads as "equivalent").',
            "* **A paired test against the null.** Score and null come from the same heads, "
            "yet the verdict compared their Wilson intervals as if independent; it now comes "
            "from McNemar's exact test on the heads where only one of the two passes. Pooled "
            "group scores resample whole model pairs instead of treating the heads of pairs "
            "that share a model as independent.",
            "* **Calibrated single-head score.** Next to the score over all validated heads: "
            "the score on the heads whose mean ablation fails (the only heads on which a "
            "passing partner is evidence), whole-layer head groups against an all-heads "
            "null, and the representational sufficient condition (matched heads with "
            "debiased CKA ≥ 0.9) beside the behavioural one.",
            "* **Seed and depth replicas trained to convergence.** Before: 400 steps, "
            "≈ 2 nats/byte, no held-out measure. The corpus' last tenth is now held out and "
            "training stops when its loss stalls." + trained,
            "* **Substantive fine-tunes.** Before: 16 AdamW steps (median head KL 3e-6, the "
            "model nearly unchanged). Now each fine-tune runs until the behaviour on held-out "
            f"prompts of its task has moved by KL ≥ {FT_TARGET_KL} nats, on the probe's own "
            "task (IOI) and on a dissimilar one (factual recall)." + tuned,
            "* **An encoder–decoder trained on the same data.** The summary's row compares an "
            "encoder–decoder with a decoder-only model; the previous stand-in, MiniLM-L6, is "
            "an encoder trained on other data and could only be scored by sentence-level "
            "similarity. `enc-dec-same-data` is a T5 (2 encoder + 4 decoder layers) trained "
            "on the same bytes with the same next-byte objective (its encoder reads a "
            "preceding context of 0–32 bytes), run as a language model over its decoder with "
            "an empty source, so its decoder heads are matched and validated by patching "
            "like every other row. The MiniLM pair is no longer part of the cpu profile "
            '(`only=["enc-dec"]` still runs it).',
            "",
            "| row | before: score / null / layer | before: matched / CONGRUITY | now: score / "
            "null / layer | now: matched / CONGRUITY |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )


def render_markdown(
    rep: EquivalenceReplication,
    results: dict[str, ComparisonResult],
    fold: dict[str, Any] | None,
    source: str,
) -> str:
    """The scenario table, per-row details, settings and discussion, from the stage results."""
    lines = []
    for sc in SCENARIOS:
        r = results.get(sc.name)
        if r is None and sc.name not in rep.s["scenarios"]:
            continue  # not part of this profile
        if r is None:
            lines.append(
                f"| {sc.group} | {sc.setting} | {PAPER[sc.group][0]} | not run yet "
                "(rerun the script) |" + " |" * 10
            )
        else:
            lines.append(_row(sc, r, rep.seconds))
    table = "\n".join(
        [
            "| scenario | pair | paper (summary) | our score [95 % CI] (method) | heads "
            "validated | null score [95 % CI] | partner passes where the null fails | "
            "whole-layer head groups: score / null | layer score | CONGRUITY decision rate "
            "A→B / B→A | verdicts: matched / CONGRUITY | agree | verdict vs paper | s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            *lines,
        ]
    )
    detail = []
    for sc in SCENARIOS:
        r = results.get(sc.name)
        if r is None:
            continue
        sims = r.matching["layers"]["similarities"]
        kl = [v["kl"] for v in r.validation if "kl" in v]
        detail.append(
            f"* **{sc.name}** ({r.model_a} vs {r.model_b}, probe `{r.probe}`, {r.n_fit} fit / "
            f"{r.n_heldout} held-out prompts, {r.representation} rows): matched-layer "
            f"similarity mean {np.mean(sims):.2f} (min {np.min(sims):.2f}); mean matched-head "
            f"similarity {np.mean(r.matching['heads']['similarities']):.2f}"
            + (f"; median head KL {np.median(kl):.3g} nats" if kl else "")
            + (
                f"; representational score (similarity ≥ {rs.criterion['min_similarity']}) "
                f"{rs.n_passed}/{rs.n_matched} = {rs.score:.2f} {ci(rs.score_ci)} next to the "
                f"behavioural {r.score:.2f} {ci(r.score_ci)}"
                if (rs := representational(r)) is not None
                else ""
            )
            + (
                f"; CONGRUITY mean p A→B {r.congruity['point_test_ab']['mean_p']:.2f}, "
                f"selectivity {r.congruity['selectivity_ab']:.2f}"
                if r.congruity
                else ""
            )
        )
    small = {n: rep.small_info[n] for n in SMALL if n in rep.small_info}
    train_lines = [
        f"* `{n}`: {c['config']['n_layers']} layers, d = {c['config']['d_model']}, "
        f"{c.get('steps_run', c['loss'][-1][0])} steps, training loss {c['loss'][-1][1]:.2f} "
        + (
            f"and held-out loss {c['held_out_loss'][-1][1]:.2f} nats/byte, "
            f"{'converged' if _plateau(c) else 'stopped at the step budget'}"
            if c.get("held_out_loss")
            else "nats/byte (no held-out measure)"
        )
        + f", {c['seconds']:.0f} s"
        for n, c in small.items()
    ]
    ft = {n: rep.ft_info[n] for n in FINETUNES if n in rep.ft_info}
    ft_lines = [
        f"* `{n}`: task `{c['task']}`, {len(c['losses'])} steps, answer loss "
        f"{c['losses'][0]:.2f} → {c['losses'][-1]:.2f} nats (first → last step)"
        + (
            f", held-out KL(base ‖ tuned) {c['held_out_kl'][-1][1]:.2f} nats "
            f"({'target reached' if c['reached'] else 'target not reached'})"
            if c.get("held_out_kl")
            else ""
        )
        + f", {c['seconds']:.0f} s"
        for n, c in ft.items()
    ]
    fold_text = (
        "SmolLM2-135M-Instruct folded (norm gains into readers, tied unembedding untied), rotated "
        f"and head-permuted: max |Δlogit| {fold['max_abs_logit_diff']:.2g} (max |logit| "
        f"{fold['max_abs_logit']:.1f}), top-1 unchanged: {fold['top1_unchanged']}; moved heads' "
        f"hook_z equal to {fold['max_abs_z_diff_layer12']:.2g}; resid_post · R equals the new "
        f"residual to {fold['max_abs_resid_rotation_error_layer12']:.2g} (max |resid| "
        f"{fold['max_abs_resid_layer12']:.0f}, float32)."
        if fold
        else "not run yet."
    )
    return TEMPLATE.format(
        source=source,
        fold=fold_text,
        discussion=discussion(results),
        disagree=disagreements(results),
        table=table,
        detail="\n".join(detail),
        train="\n".join(train_lines),
        ft="\n".join(ft_lines),
        small_cfg=json.dumps(dataclasses.asdict(rep.s["small"]["L4-s0"])),
        smol_cfg=_cfg_text(SMOL_CFG),
        small_cmp=_cfg_text(rep.s["small_cfg"]),
        enc_cfg=_cfg_text(ENC_CFG),
        smol_probe=SMOL_PROBE,
        ft_kl=FT_TARGET_KL,
        ft_n=FT_PROMPTS,
        ft_train=FT_TRAIN,
        changed=what_changed(rep, results),
    )


def pooled_interval(ks: list[int], ns: list[int]) -> tuple[tuple[float, float], str]:
    """Interval of a pass rate pooled over model pairs and how it was made.

    Heads of one pair share both models (and pairs of a group share models too), so the
    heads are no independent sample: with two or more pairs the interval resamples whole
    pairs (cluster bootstrap), with one pair it is that pair's Wilson interval.
    """
    keep = [(k, n) for k, n in zip(ks, ns, strict=True) if n > 0]
    k, n = sum(k for k, _ in keep), sum(n for _, n in keep)
    if len(keep) < 2:
        return wilson_interval(k, n), "Wilson, one pair"
    lo, hi = cluster_bootstrap_ratio_interval([k for k, _ in keep], [n for _, n in keep])
    return (lo, hi), f"cluster bootstrap over {len(keep)} pairs"


def _pooled(ks: list[int], ns: list[int], group: str | None = None) -> str:
    """``k/n = rate [CI] (method)`` pooled over pairs (:func:`pooled_interval`), and the
    verdict against the paper when ``group`` is given."""
    k, n = sum(ks), sum(ns)
    (lo, hi), how = pooled_interval(ks, ns)
    text = f"{k}/{n} = {k / n:.2f} {ci((lo, hi))} ({how})"
    return text + (f" ({_vs_paper(group, (lo, hi))} vs paper)" if group else "")


def discussion(results: dict[str, ComparisonResult]) -> str:
    """Bullet points derived from the numbers: per group, the pooled score, null and
    informative-head score against the paper; then every row where the estimators disagree."""
    out = []
    for group, (claim, _, _) in PAPER.items():
        rs = [results[sc.name] for sc in SCENARIOS if sc.group == group and sc.name in results]
        if not rs:
            continue
        k = [sum(v["passed"] for v in r.validation) for r in rs]
        n = [len(r.validation) for r in rs]
        line = (
            f"* **{group}** ({len(rs)} pair(s), paper {claim}): pooled score {_pooled(k, n)} "
            f"({rs[0].validation_method})"
        )
        patched = [r for r in rs if not _nan(r.null_score)]
        if patched:
            kn = [sum(v["passed"] for v in r.null_validation) for r in patched]
            nn = [len(r.null_validation) for r in patched]
            ki = [r.informative["n_passed"] for r in patched]
            ni = [r.informative["n_heads"] for r in patched]
            line += f"; pooled null {_pooled(kn, nn)}; "
            line += (
                f"partner passes on {_pooled(ki, ni, group)} of the heads whose null fails"
                if sum(ni)
                else "no validated head fails under mean ablation, so the patching "
                "criterion cannot tell a partner from no information here"
            )
            grouped = [r for r in patched if r.head_groups]
            if grouped:
                kg = [sum(v["passed"] for v in r.head_groups["validation"]) for r in grouped]
                kgn = [sum(v["passed"] for v in r.head_groups["null_validation"]) for r in grouped]
                ng = [len(r.head_groups["pairs"]) for r in grouped]
                kgi = [r.head_groups["informative"]["n_passed"] for r in grouped]
                ngi = [r.head_groups["informative"]["n_heads"] for r in grouped]
                line += (
                    f"; whole-layer head groups {_pooled(kg, ng)} against their all-heads null "
                    f"{_pooled(kgn, ng)}"
                )
                if sum(ngi):
                    line += (
                        f", partner groups pass on {_pooled(kgi, ngi, group)} of the layers "
                        "whose null fails"
                    )
            flags = [bool(informative(r)) for r in patched]  # never None on patched rows
            line += (
                f"; partner beats the null in the paired test (score claimed) in {sum(flags)} "
                f"of {len(flags)} row(s)"
            )
        verdicts = sorted({verdict(group, r) for r in rs})
        line += f"; verdict vs paper: {', '.join(verdicts)}."
        out.append(line)
    for sc in SCENARIOS:
        r = results.get(sc.name)
        if r is None:
            continue
        same = [v for v in r.layer_validation if v["similarity"] >= 0.999 and not v["passed"]]
        if same:
            out.append(
                f"* Layer map check (`{sc.name}`): matched layers with CKA ≥ 0.999 still fail "
                "when replaced through the fitted map ("
                + ", ".join(
                    f"{v['pair']}: KL {v['kl']:.2f} nats, top-1 {v['top1']:.2f}" for v in same
                )
                + f"), so this row's layer score {r.layer_score:.2f} measures the map "
                "(fitted on fewer token rows than residual dimensions), not the models."
            )
    return "\n".join(out)


def disagreements(results: dict[str, ComparisonResult]) -> str:
    """One bullet per row where the matched-component and CONGRUITY verdicts differ."""
    dis = [sc.name for sc in SCENARIOS if sc.name in results and not _agree(results[sc.name])]
    lines = [f"The verdicts differ on {len(dis)} of {len(results)} row(s)" + (":" if dis else ".")]
    for name in dis:
        r = results[name]
        cg = r.congruity
        inf = r.informative
        lines.append(
            f"* `{name}`: matched score {r.score:.2f} → {verdicts(r)['matching']} (null "
            f"{r.null_score:.2f}; partner passes on {inf.get('n_passed', 0)} of "
            f"{inf.get('n_heads', 0)} heads whose null fails); CONGRUITY decision rates "
            f"{cg['point_test_ab']['decision_rate']:.2f} (A→B) / "
            f"{cg['point_test_ba']['decision_rate']:.2f} (B→A), mean p "
            f"{cg['point_test_ab']['mean_p']:.2f} / {cg['point_test_ba']['mean_p']:.2f} → "
            f"{r.verdicts['congruity']}; top-KL heads A {cg['top_heads_a']} "
            f"(KL {', '.join(f'{x:.3f}' for x in cg['top_kl_a'])}), B {cg['top_heads_b']} "
            f"(KL {', '.join(f'{x:.3f}' for x in cg['top_kl_b'])})."
        )
    return "\n".join(lines)


def _agree(r: ComparisonResult) -> bool:
    return verdicts(r).get("agree", True)


def _cfg_text(cfg: CompareConfig) -> str:
    d = dataclasses.asdict(cfg)
    default = dataclasses.asdict(CompareConfig())
    return ", ".join(f"{k}={v}" for k, v in d.items() if v != default[k]) or "defaults"


TEMPLATE = """# Replication: interpretive equivalence scenario table

Produced by `{source}` (2 shared CPU cores, no GPU; caches under
`results/replication/equivalence/`). The "paper" column is the scenario table of the
circulating method summary of Sun & Toneva (arXiv 2603.30002). **That table is not in the
paper's public code** (../shared/notes/equivalence.md §3: the reference code has no matching
step and no encoder–decoder models), and its models (GPT-2 family, 12 vs 24 layers) are not
ours, so the verdicts compare orders of magnitude, not numbers.

## Method

Matched-component estimator (`structlens.equivalence.compare.compare`, an extension): linear
CKA (debiased) between every layer (`hook_resid_post`) and every head (`attn.hook_z`) of the
two models on the fit half of the probe set (position 0 excluded); layers matched by the
monotone (depth-preserving) assignment, heads by one global Hungarian assignment. Each matched
head of B is replaced, on the held-out half, by its partner's activations in A mapped through a
ridge map fitted on the fit half; it **passes** when mean KL(B ‖ patched B) ≤ 0.1 nats and
top-1 agreement ≥ 0.9 at the evaluated positions (all tokens for corpus probes; the IOI END
token for IOI probes). Score = passed / validated heads, Wilson 95 % interval (descriptive).
The **null score** replaces the same heads by their mean activation instead: where it is close
to the score, the criterion does not distinguish a partner from no information. Score and null
are measured on the same heads, so they are compared by a paired test, not by their intervals:
McNemar's exact test on the discordant heads (partner passes and null fails vs the reverse). We
call a row's score *claimed* only when more heads pass with their partner only than with the
null only at two-sided p < 0.05; otherwise the verdict column says "uninformative". Pooled
scores of a group resample whole model pairs (cluster bootstrap; a single pair keeps its Wilson
interval), since heads of one pair are not independent; with two or three pairs that interval
is coarse. The column "partner passes where the null fails" restricts the score to the heads
whose mean ablation fails the criterion, the only heads on which a passing partner shows that
it carries what B needs. Because single heads are often redundant, the *whole-layer head
groups* column replaces all heads of one layer of B at once (each by its own matched partner
through its own map) against a null that mean-ablates all of them; one record per layer of B.
The layer score replaces `resid_post` of matched layers the same way. The encoder–decoder
trained on the same bytes (`enc-dec-same-data`) reads each probe as a language model over its
decoder (the encoder sees only the start token), so its decoder's layers and heads are matched
and patched into B like any decoder's. For MiniLM against SmolLM2 the tokenizers differ, so
rows are sentences (mean over tokens), no patching is possible and the score is the share of
matched heads with CKA ≥ 0.5 ("similarity"); no null exists for it.

CONGRUITY (reference-code statistics): accumulated residual stream (last token for IOI, mean
over tokens for corpus probes), implementations = clean run + runs with one of the top-KL
heads patched (IOI: from the `abc` corrupted prompt; corpus: mean-ablated), encoding scores
(ridge, fixed folds), bootstrapped point test (20 triples, 40 straps); the table gives the
share of straps declaring the two models different in each direction; the verdict is
"different" when either exceeds 0.5. The matched-component verdict is "equivalent" when the
score ≥ 0.5 and the paired test above finds the partners better than the null.

## Results

Function-preserving fold check: {fold}

{table}

{detail}

## Settings

* Small LMs (`structlens.equivalence.train_small`): Llama architecture, byte-level tokenizer
  (257 tokens), trained on the first nine tenths of the bundled Jane Austen corpus until the
  held-out loss on the last tenth stalls (three evaluations in a row, every 100 steps,
  improving by < 0.5 %) or the step budget: {small_cfg}.
{train}
* Fine-tunes of SmolLM2-135M-Instruct (`finetune_on_task`): cross-entropy on the answer
  token, AdamW, 8 prompts a step, lr 2e-4, decoder layers 15–29 trained, until the behaviour
  has changed: the mean KL(base ‖ tuned) of the next-token distribution at the end of held-out
  prompts of the same task reaches {ft_kl} nats (checked every 10 steps; at most 300 steps).
  IOI is the probe's own task (similar), factual recall a dissimilar one; {ft_n} prompts of
  each drawn with seed 1 (the IOI probe uses seed 0), the first {ft_train} trained on.
{ft}
* Compare settings (non-default fields): small LMs: {small_cmp}; SmolLM2 pairs: {smol_cfg};
  encoder–decoder: {enc_cfg}. Everything else is the `CompareConfig` default (debiased
  linear CKA, monotone layer matching, global Hungarian head matching, ridge maps for heads,
  Procrustes maps for whole layers of equal width (more fit rows than dimensions), KL ≤ 0.1
  nats and top-1 ≥ 0.9, 20 point-test triples × 40 straps, seed 0). Probes: 48 corpus
  sentences (40–160 characters) for the byte-level LMs (32 for `sanity-tiny`), {smol_probe}
  IOI prompts for the SmolLM2 pairs, 64 corpus sentences for MiniLM vs SmolLM2; half of each
  probe is held out. These settings are the same for every row of a model family; no row
  was shrunk to fit the time budget.

{changed}

## Reading the table

{discussion}

**How to read the rows.** A score is a claim only where the paired test finds the partners
better than the mean-ablation null on the same heads (the matched verdict says so). Where
single heads are redundant, the null passes about as often as the partner and the single-head
score says nothing; the evidence is then in the heads and whole layers whose mean ablation does
break B (the "partner passes where the null fails" and head-group columns, pooled per group
above). The sanity rows bound the method: an exact copy must pass everywhere, so a failure
there is the method's, not the models'.

## Where the two estimators disagree

{disagree}

Why they can disagree: the two verdicts answer different questions on different data. The
matched estimator asks, one head at a time, whether B's next-token output survives replacing
a head by its (linearly mapped) partner, against the same head mean-ablated. CONGRUITY asks
whether A's implementations (its clean run and a few one-head interventions) encode each
other better than they encode B's, on the accumulated residual stream of a few dozen prompts;
its point test is directional, so its two directions can differ, and a weak direction says
as much about how far a model's own one-head interventions move its representation as about
a shared mechanism. Where the models share most of their computation (the sanity pairs, the
fine-tunes with layers 0–14 frozen) both estimators have the least room to differ.

## Cost profile

One compare, profiled with cProfile on an idle machine, one thread, before the changes
below (SmolLM2 vs its IOI fine-tune, 12 validated heads, 1 CONGRUITY layer, 110 s): model
forward passes 94 s (86 %): CONGRUITY 65 s (its one-head patch forwards 51 s), validation
patching 38 s (one forward of B per validated head, layer and null), activation collection
1.7 s; head × head and layer × layer CKA 4.6 s (4 %, one grouped feature-space pass); CONGRUITY
encoding statistics 6.2 s (6 %); KL 1.5 s. The small LMs behave alike (seeds pair: 31 s,
25 s in forwards). The waste removed: the point test and the selectivity test refitted the
ridge SVDs of a predictor for every target it encodes; they now factorise each
implementation once (identical numbers; 2.4× less CPU time for the statistics on SmolLM2-sized
representations). The forwards are the method (one per patched component); what remains is
that every patched forward recomputes the layers before the patched site, which only a
start-at-layer forward in the foundation could avoid. With the machine shared by 3–4 jobs the
rows of the table ran slower than they would alone (column s: wall seconds under that load).

Caveats that hold whatever the numbers: the sufficient condition is per component (one head
replaced at a time), so in a model with many heads most single replacements change little and
pass; the null score measures exactly this. Whole layers are replaced through an orthogonal
Procrustes map fitted on more token rows than dimensions ({smol_probe} IOI prompts for the
SmolLM2 rows, half of them fit rows); an earlier ridge map fitted on ~170 rows for d = 576
could not even reproduce identical layers. The byte-level LMs are small (d = 128) and trained
on half a megabyte of text, to the held-out plateau that corpus allows (see Settings), so
the seed and depth rows compare small models, not GPT-2-scale ones; training times reflect
the machine's load at the time.
The summary's numbers come from models we cannot run (GPT-2 family,
12 vs 24 layers) with a matching step and threshold the public code does not contain, so
"consistent" means only that the paper's value lies inside our interval.
"""


def _finite(x: Any) -> float | None:
    """A result's score as a float, ``None`` where it is NaN (not measured for that row)."""
    v = num(x)
    return v if np.isfinite(v) else None


def _representational_block(rs: EquivalenceScore | None) -> dict[str, Any]:
    return {
        "representational_score": rs.score if rs else None,
        "representational_score_ci": finite_ci(rs.score_ci) if rs else None,
        "representational_min_similarity": rs.criterion["min_similarity"] if rs else None,
    }


def _group_verdict(row_verdicts: list[str]) -> str:
    """A group's claims verdict from its rows': all consistent → reproduced; all lower or
    higher → not reproduced; all uninformative (null ≈ score) → unidentified; else partly."""
    kinds = {"consistent" if v == "consistent" else "uninformative" if v.startswith("un")
             else "off" for v in row_verdicts}  # fmt: skip
    if kinds == {"consistent"}:
        return "reproduced"
    if kinds == {"off"}:
        return "not reproduced"
    if kinds == {"uninformative"}:
        return "unidentified"
    return "partly"


def claims(results: dict[str, ComparisonResult], source: str) -> ClaimsDocument:
    """One claim per scenario group (pooled validated-head score, Wilson CI) plus the
    sanity, per-row and settings blocks of the protocol."""
    found = []
    for group, (claim, _, _) in PAPER.items():
        names = [sc.name for sc in SCENARIOS if sc.group == group and sc.name in results]
        if not names:
            continue
        rs = [results[n] for n in names]
        ks = [sum(v["passed"] for v in r.validation) for r in rs]
        ns = [len(r.validation) for r in rs]
        k, n = sum(ks), sum(ns)
        interval, how = pooled_interval(ks, ns) if n else (None, None)
        rows = [verdict(group, r) for r in rs]
        found.append(
            Claim(
                id=f"{group}_score",
                paper=claim,
                ours=k / n if n else None,
                ci=finite_ci(interval) if interval is not None else None,
                verdict=_group_verdict(rows),
                settings={
                    "rows": names,
                    "validation": rs[0].validation_method,
                    "interval": how,
                },
                ci_reason=None if n else "no head was validated",
                note="row verdicts: " + ", ".join(f"{a} {b}" for a, b in zip(names, rows)),
            )
        )
    sanity = [results[n] for n in ("sanity-smollm2", "sanity-tiny") if n in results]
    blocks: dict[str, Any] = {
        "sanity": {
            "row": next(n for n in ("sanity-smollm2", "sanity-tiny") if n in results)
            if sanity
            else None,
            "head_score": _finite(sanity[0].score) if sanity else None,
            "layer_score": _finite(sanity[0].layer_score) if sanity else None,
        },
        "rows": [
            {
                "name": sc.name,
                "group": sc.group,
                "score": _finite(r.score),
                "score_ci": finite_ci(r.score_ci),
                "null_score": _finite(r.null_score),
                "null_score_ci": finite_ci(r.null_score_ci),
                "layer_score": _finite(r.layer_score),
                # null-calibrated by the paired test (decide_paired_null)
                "verdict": verdicts(r)["matching"],
                "verdict_reason": verdicts(r)["matching_reason"],
                "paired_test": verdicts(r).get("matching_test"),
                **_representational_block(representational(r)),
                "verdicts": verdicts(r),
                "verdict_vs_paper": verdict(sc.group, r),
            }
            for sc in SCENARIOS
            if (r := results.get(sc.name)) is not None
        ],
    }
    return ClaimsDocument(METHOD, source, tuple(found), blocks)


def write(
    rep: EquivalenceReplication,
    results: dict[str, ComparisonResult],
    fold: dict[str, Any] | None,
    doc_dir: str | Path,
) -> tuple[Path, Path]:
    """Write ``equivalence.md`` and ``equivalence.json`` into ``doc_dir``."""
    from structlens.replication import command

    doc_dir = Path(doc_dir)
    source = command(METHOD, rep.s["profile"])
    md = write_text(doc_dir / f"{METHOD}.md", render_markdown(rep, results, fold, source))
    return md, claims(results, source).write(doc_dir / f"{METHOD}.json")

"""Markdown and claims JSON of the interpretive-equivalence replication.

:func:`write` renders ``equivalence.md`` (the scenario table, per-row details, settings and
the discussion derived from the numbers) and ``equivalence.json``
(:class:`~structlens.replication.claims.ClaimsDocument`: one claim per scenario group, the
sanity scores and every row's score, null and intervals) from one run's typed stage results
(:class:`~structlens.equivalence.stages.ModelComparison`).  Verdicts use the one vocabulary of
:data:`~structlens.replication.claims.VERDICTS`, each with its reason; the decisions of the
paired test ("equivalent", "unidentified", "not tested") are reported as decisions.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from structlens.equivalence.protocol import PROFILES as PROTOCOLS
from structlens.equivalence.protocol import EquivalenceProtocol
from structlens.equivalence.stages import ModelComparison
from structlens.replication.claims import ClaimsDocument
from structlens.replication.equivalence.run import (
    ENC_PROTOCOL,
    FINETUNES,
    FT_PROMPTS,
    FT_TARGET_KL,
    FT_TRAIN,
    METHOD,
    PAPER,
    SCENARIOS,
    SMALL,
    SMOL_PROTOCOL,
    EquivalenceReplication,
    Scenario,
)
from structlens.replication.markdown import ci, finite_ci, write_text
from structlens.stats.intervals import cluster_bootstrap_ratio_interval, wilson_interval
from structlens.verdicts import Claim

#: Where the "paper" column comes from, stated in the JSON as well as in the markdown.
TARGETS = (
    "the scenario table of the circulating method summary of Sun & Toneva (arXiv 2603.30002); "
    "it is not in the paper's public code (no matching step, no encoder-decoder models there)"
)


def claimed(r: ModelComparison) -> bool | None:
    """Whether the paired test finds the partners better than the mean-ablation null on the
    row's validated heads (more heads pass with their partner only, McNemar exact p < α);
    ``None`` without a null.  Score and null come from the same heads, so their intervals
    are not compared."""
    if r.heads.null_passed is None:
        return None
    d = r.heads.decision
    return bool(d.partner_only > d.null_only and d.p_value < d.alpha)


def _vs_paper(group: str, interval: Any) -> str:
    _, lo, hi = PAPER[group]
    # 1e-9: a Wilson bound of k = n is 1 up to rounding
    if interval[1] < lo - 1e-9:
        return "lower"
    if interval[0] > hi + 1e-9:
        return "higher"
    return "consistent"


def row_verdict(group: str, r: ModelComparison) -> tuple[str, str]:
    """The row's verdict against the paper, from :data:`VERDICTS`, and its reason."""
    if claimed(r) is False:
        return "unidentified", (
            "the paired test does not find the partners better than the mean-ablation null "
            f"({r.heads.decision.reason})"
        )
    where = _vs_paper(group, r.heads.score_ci)
    if where == "consistent":
        return "reproduced", f"the paper's {PAPER[group][0]} lies in {ci(r.heads.score_ci)}"
    return (
        "not reproduced",
        f"{ci(r.heads.score_ci)} lies {where} than the paper's {PAPER[group][0]}",
    )


def _row(sc: Scenario, r: ModelComparison, seconds: dict[str, float]) -> str:
    cg, h = r.congruity, r.heads
    rate = f"{cg.decision_rate_ab:.2f} / {cg.decision_rate_ba:.2f}" if cg else "—"
    if h.null_score is None:
        null = inf = "— (no patching)"
    else:
        d = h.decision
        null = (
            f"{h.null_score:.2f} {ci(h.null_score_ci or (np.nan, np.nan))}; paired: "
            f"{d.partner_only} vs {d.null_only} discordant heads, p = {d.p_value:.2g}"
        )
        i = h.informative
        inf = f"{i.n_passed}/{i.n} = {i.score:.2f} {ci(i.score_ci)}" if i and i.n else "0 heads"
    layer = "—" if r.layers is None else f"{r.layers.score:.2f}"
    g = r.head_groups
    groups = f"{g.score:.2f} / {g.null_score:.2f} ({len(g.pairs)} layers)" if g else "—"
    agree = {True: "yes", False: "**no**", None: "—"}[r.agree]
    verdict, _ = row_verdict(sc.group, r)
    return (
        f"| {sc.group} | {sc.setting} | {PAPER[sc.group][0]} | **{h.score:.2f}** "
        f"{ci(h.score_ci)} ({h.method}) | {len(h.passed)} | {null} | {inf} | {groups} | "
        f"{layer} | {rate} | {r.decision} / {cg.decision if cg else '—'} | {agree} | "
        f"{verdict} | {f'{seconds[sc.name]:.0f}' if sc.name in seconds else '?'} |"
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


def _num_or_dash(x: float | None) -> str:
    return "—" if x is None or not np.isfinite(x) else f"{x:.2f}"


def what_changed(rep: EquivalenceReplication, results: dict[str, ModelComparison]) -> str:
    """The protocol changes and how each row moved (previous protocol → now)."""
    rows = []
    for sc in SCENARIOS:
        r, old = results.get(sc.name), PREVIOUS.get(sc.name)
        if r is None or old is None:
            continue
        now = (r.heads.score, r.heads.null_score, r.layers.score if r.layers else None)
        rows.append(
            f"| {sc.name} | {' / '.join(_num_or_dash(x) for x in old[:3])} | {old[3]} / "
            f"{old[4]} | {' / '.join(_num_or_dash(x) for x in now)} | {r.decision} / "
            f"{r.congruity.decision if r.congruity else '—'} |"
        )
    small = [c for c in rep.small_info.values() if c.get("held_out_loss")]
    trained = (
        f" Now: {sum(_plateau(c) for c in small)} of {len(small)} reached a held-out plateau "
        f"before the step budget, the others ran {max(c['steps_run'] for c in small)} steps "
        "(their cosine rate reaches 0 there); held-out loss "
        f"{min(c['held_out_loss'][-1][1] for c in small):.2f}–"
        f"{max(c['held_out_loss'][-1][1] for c in small):.2f} nats/byte."
        if small
        else ""
    )
    tuned = "".join(
        f" `{n}`: {c['steps_run']} steps to held-out KL {c['held_out_kl'][-1][1]:.2f} nats."
        for n, c in rep.ft_info.items()
        if c.get("held_out_kl")
    )
    return "\n".join(
        [
            "## What changed and why",
            "",
            "* **One protocol for every driver.** The comparison's choices (probe, split, "
            "metric, matching, maps, criterion, null, paired decision, CONGRUITY, seeds) are "
            "one `EquivalenceProtocol`; `structlens equiv`, `structlens analyze` and this "
            "replication run the same stages under it. The `sanity-tiny` row now runs the "
            "`paper` protocol of the other byte-level rows (48 corpus prompts, was 32; the "
            "model at the protocol's seed 0, was 1) and is the `sanity` stage (rotated copy, "
            "planted partners recovered, logit gap).",
            "* **One vocabulary.** A row's verdict against the paper is one of reproduced, "
            "partly, not reproduced, unidentified, not tested, with its reason (rows whose "
            'paired test fails were "uninformative"); the paired test\'s decision is '
            '"equivalent", "unidentified" (was "undecided") or "not tested" (no null).',
            "* **Layer maps (a bug).** A whole `resid_post` was replaced through a ridge map "
            "fitted on ~170 token rows for d = 576, which failed even between identical layers "
            "(`sanity-smollm2` layer score 0.00). Layers of equal width are now mapped by "
            "orthogonal Procrustes on more fit rows than dimensions (96 IOI prompts for the "
            "SmolLM2 rows).",
            "* **A paired test against the null.** Score and null come from the same heads; "
            "the decision comes from McNemar's exact test on the heads where only one of the "
            "two passes. Pooled group scores resample whole model pairs.",
            "* **Calibrated single-head score.** Next to the score over all validated heads: "
            "the score on the heads whose mean ablation fails, whole-layer head groups against "
            "an all-heads null, and the representational sufficient condition (matched heads "
            "with debiased CKA ≥ 0.9) beside the behavioural one.",
            "* **Seed and depth replicas trained on a held-out stopping rule.**" + trained,
            "* **Substantive fine-tunes.** Each fine-tune runs until the behaviour on held-out "
            f"prompts of its task has moved by KL ≥ {FT_TARGET_KL} nats, on the probe's own "
            "task (IOI) and on a dissimilar one (factual recall)." + tuned,
            "* **An encoder–decoder trained on the same data** (`enc-dec-same-data`, a T5 of "
            "2 encoder + 4 decoder layers, run as a language model over its decoder); the "
            'MiniLM pair is no longer part of the cpu profile (`only=["enc-dec"]` runs it).',
            "",
            "| row | before: score / null / layer | before: matched / CONGRUITY | now: score / "
            "null / layer | now: matched / CONGRUITY |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )


def _detail(sc: Scenario, r: ModelComparison) -> str:
    rs, cg = r.representational, r.congruity
    return (
        f"* **{sc.name}** ({r.model_a} vs {r.model_b}, probe `{r.probe}`, {r.n_fit} fit / "
        f"{r.n_heldout} held-out prompts, {r.representation} rows): matched-layer similarity "
        f"mean {np.mean(r.matched_layer_similarity):.2f} (min "
        f"{np.min(r.matched_layer_similarity):.2f}); mean matched-head similarity "
        f"{np.mean(r.matched_head_similarity):.2f}"
        + (f"; median head KL {np.median(r.heads.kl):.3g} nats" if r.heads.kl else "")
        + f"; representational score {rs.n_passed}/{rs.n} = {rs.score:.2f} {ci(rs.score_ci)} "
        f"next to the behavioural {r.heads.score:.2f} {ci(r.heads.score_ci)}"
        + (
            f"; CONGRUITY mean p A→B {cg.mean_p_ab:.2f}, selectivity {cg.selectivity_ab:.2f}"
            if cg
            else ""
        )
        + "".join(f"; caveat: {c.message}" for c in r.caveats if c.kind == "encoding_reduced")
    )


def render_markdown(
    rep: EquivalenceReplication,
    results: dict[str, ModelComparison],
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
            "A→B / B→A | decisions: matched / CONGRUITY | agree | verdict vs paper | s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            *lines,
        ]
    )
    detail = [_detail(sc, results[sc.name]) for sc in SCENARIOS if sc.name in results]
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
        discussion=discussion(rep, results),
        disagree=disagreements(results),
        table=table,
        detail="\n".join(detail),
        train="\n".join(train_lines),
        ft="\n".join(ft_lines),
        small_cfg=json.dumps(dataclasses.asdict(rep.s["small"]["L4-s0"])),
        smol_cfg=_protocol_text(SMOL_PROTOCOL),
        small_cmp=_protocol_text(rep.s["small_protocol"]),
        enc_cfg=_protocol_text(ENC_PROTOCOL),
        smol_probe=SMOL_PROTOCOL.probe_prompts,
        ft_kl=FT_TARGET_KL,
        ft_n=FT_PROMPTS,
        ft_train=FT_TRAIN,
        changed=what_changed(rep, results),
    )


def pooled_interval(
    ks: list[int], ns: list[int], n_boot: int = 2000
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


def _pooled(ks: list[int], ns: list[int], n_boot: int, group: str | None = None) -> str:
    """``k/n = rate [CI] (method)`` pooled over pairs (:func:`pooled_interval`), and where it
    lies against the paper when ``group`` is given."""
    k, n = sum(ks), sum(ns)
    (lo, hi), how = pooled_interval(ks, ns, n_boot)
    text = f"{k}/{n} = {k / n:.2f} {ci((lo, hi))} ({how})"
    return text + (f" ({_vs_paper(group, (lo, hi))} vs paper)" if group else "")


def _resamples(rep: EquivalenceReplication, names: list[str]) -> int:
    """The pooled interval's draws: the protocol's (rows of a group share one protocol)."""
    return rep.protocols.get(names[0], PROTOCOLS["paper"]).pool_resamples if names else 2000


def discussion(rep: EquivalenceReplication, results: dict[str, ModelComparison]) -> str:
    """Bullet points derived from the numbers: per group, the pooled score, null and
    informative-head score against the paper; then every row whose layer map fails."""
    out = []
    for group, (claim, _, _) in PAPER.items():
        names = [sc.name for sc in SCENARIOS if sc.group == group and sc.name in results]
        if not names:
            continue
        rs, nb = [results[n] for n in names], _resamples(rep, names)
        k = [sum(r.heads.passed) for r in rs]
        n = [len(r.heads.passed) for r in rs]
        line = (
            f"* **{group}** ({len(rs)} pair(s), paper {claim}): pooled score "
            f"{_pooled(k, n, nb)} ({rs[0].heads.method})"
        )
        patched = [r for r in rs if r.heads.null_passed is not None]
        if patched:
            kn = [sum(r.heads.null_passed or ()) for r in patched]
            nn = [len(r.heads.null_passed or ()) for r in patched]
            inf = [r.heads.informative for r in patched]
            ki = [i.n_passed if i else 0 for i in inf]
            ni = [i.n if i else 0 for i in inf]
            line += f"; pooled null {_pooled(kn, nn, nb)}; "
            line += (
                f"partner passes on {_pooled(ki, ni, nb, group)} of the heads whose null fails"
                if sum(ni)
                else "no validated head fails under mean ablation, so the patching "
                "criterion cannot tell a partner from no information here"
            )
            grouped = [r.head_groups for r in patched if r.head_groups]
            if grouped:
                kg = [sum(g.passed) for g in grouped]
                kgn = [sum(g.null_passed or ()) for g in grouped]
                ng = [len(g.pairs) for g in grouped]
                gi = [g.informative for g in grouped]
                kgi, ngi = [i.n_passed if i else 0 for i in gi], [i.n if i else 0 for i in gi]
                line += (
                    f"; whole-layer head groups {_pooled(kg, ng, nb)} against their all-heads "
                    f"null {_pooled(kgn, ng, nb)}"
                )
                if sum(ngi):
                    line += (
                        f", partner groups pass on {_pooled(kgi, ngi, nb, group)} of the layers "
                        "whose null fails"
                    )
            flags = [bool(claimed(r)) for r in patched]
            line += (
                f"; partner beats the null in the paired test (score claimed) in {sum(flags)} "
                f"of {len(flags)} row(s)"
            )
        verdicts = sorted({row_verdict(group, r)[0] for r in rs})
        line += f"; verdict vs paper: {', '.join(verdicts)}."
        out.append(line)
    for sc in SCENARIOS:
        r = results.get(sc.name)
        if r is None or r.layers is None or not r.layers.kl:
            continue
        lv = r.layers
        same = [
            i for i, (s, ok) in enumerate(zip(lv.similarity, lv.passed, strict=True))
            if s >= 0.999 and not ok
        ]  # fmt: skip
        if same:
            out.append(
                f"* Layer map check (`{sc.name}`): matched layers with CKA ≥ 0.999 still fail "
                "when replaced through the fitted map ("
                + ", ".join(
                    f"{lv.pairs[i]}: KL {lv.kl[i]:.2f} nats, top-1 {lv.top1[i]:.2f}" for i in same
                )
                + f"), so this row's layer score {lv.score:.2f} measures the map, not the models."
            )
    return "\n".join(out)


def disagreements(results: dict[str, ModelComparison]) -> str:
    """One bullet per row where the matched-component and CONGRUITY decisions differ."""
    dis = [sc.name for sc in SCENARIOS if sc.name in results and results[sc.name].agree is False]
    lines = [f"The decisions differ on {len(dis)} of {len(results)} row(s)" + (":" if dis else ".")]
    for name in dis:
        r = results[name]
        cg, inf = r.congruity, r.heads.informative
        assert cg is not None  # agree is False only where CONGRUITY ran
        lines.append(
            f"* `{name}`: matched score {r.heads.score:.2f} → {r.decision} (null "
            f"{_num_or_dash(r.heads.null_score)}; partner passes on "
            f"{inf.n_passed if inf else 0} of {inf.n if inf else 0} heads whose null fails); "
            f"CONGRUITY decision rates {cg.decision_rate_ab:.2f} (A→B) / "
            f"{cg.decision_rate_ba:.2f} (B→A), mean p {cg.mean_p_ab:.2f} / {cg.mean_p_ba:.2f} "
            f"→ {cg.decision}; top-KL heads A {cg.top_heads_a} "
            f"(KL {', '.join(f'{x:.3f}' for x in cg.top_kl_a)}), B {cg.top_heads_b} "
            f"(KL {', '.join(f'{x:.3f}' for x in cg.top_kl_b)})."
        )
    return "\n".join(lines)


def _protocol_text(protocol: EquivalenceProtocol) -> str:
    paper = PROTOCOLS["paper"].to_json()
    d = protocol.to_json()
    return ", ".join(f"{k}={v}" for k, v in d.items() if v != paper[k]) or "the `paper` protocol"


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
null only at two-sided p < 0.05; otherwise the row's verdict is "unidentified" (with the
reason). Pooled
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
share of straps declaring the two models different in each direction; its decision is
"different" when either exceeds 0.5, else "unidentified" (the point test has no null). The
matched-component decision is "equivalent" when the score ≥ 0.5 and the paired test above
finds the partners better than the null, "unidentified" otherwise and "not tested" without a
null. A row's verdict against the paper uses the one vocabulary of every replication
(reproduced, partly, not reproduced, unidentified, not tested), with its reason.

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
* Protocols (`EquivalenceProtocol`, fields that differ from `paper`): small LMs:
  {small_cmp}; SmolLM2 pairs: {smol_cfg}; encoder–decoder: {enc_cfg}. Everything else is the
  `paper` protocol (debiased
  linear CKA, monotone layer matching, global Hungarian head matching, ridge maps for heads,
  Procrustes maps for whole layers of equal width (more fit rows than dimensions), KL ≤ 0.1
  nats and top-1 ≥ 0.9, 20 point-test triples × 40 straps, seed 0). Probes: 48 corpus
  sentences (40–160 characters) for the byte-level LMs and `sanity-tiny`, {smol_probe}
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


def _group_verdict(rows: list[str]) -> str:
    """A group's verdict from its rows': all alike → that verdict; else partly."""
    kinds = set(rows)
    return kinds.pop() if len(kinds) == 1 else "partly"


def _sanity_claim(rep: EquivalenceReplication, names: list[str], k: int, n: int) -> Claim:
    """The sanity group is a check (an exact copy scores 1 by construction when the code is
    right), beside its positive control: the copy computes the same logits and matching
    finds every planted head partner."""
    checks = [rep.sanity[x] for x in names if x in rep.sanity]
    control = {
        "passed": bool(checks)
        and all(c.max_abs_logit_diff < 1e-3 and c.heads_recovered == 1.0 for c in checks),
        "what": "the rotated copy's logits equal the model's (max |Δlogit| < 1e-3) and "
        "matching recovers every planted head partner",
        "max_abs_logit_diff": {
            x: rep.sanity[x].max_abs_logit_diff for x in names if x in rep.sanity
        },
        "heads_recovered": {x: rep.sanity[x].heads_recovered for x in names if x in rep.sanity},
    }
    ok = [c.passed for c in checks]
    verdict = "reproduced" if ok and all(ok) else "not reproduced" if ok else "not tested"
    interval, how = pooled_interval([k], [n]) if n else (None, None)
    return Claim(
        id="sanity_score", paper=PAPER["sanity"][0], ours=k / n if n else None,
        ci=finite_ci(interval) if interval is not None else None, verdict=verdict,
        settings={"rows": names, "interval": how}, kind="check", positive_control=control,
        ci_reason=None if n else "no head was validated",
        note="; ".join(f"{x}: {rep.sanity[x].reason}" for x in names if x in rep.sanity)
        or "the sanity stage did not run",
    )  # fmt: skip


def claims(
    rep: EquivalenceReplication, results: dict[str, ModelComparison], source: str
) -> ClaimsDocument:
    """One claim per scenario group (pooled validated-head score, its interval over model
    pairs) plus the sanity, per-row and settings blocks of the protocol."""
    found = []
    for group, (claim, _, _) in PAPER.items():
        names = [sc.name for sc in SCENARIOS if sc.group == group and sc.name in results]
        if not names:
            continue
        rs = [results[x] for x in names]
        ks, ns = [sum(r.heads.passed) for r in rs], [len(r.heads.passed) for r in rs]
        k, n = sum(ks), sum(ns)
        if group == "sanity":
            found.append(_sanity_claim(rep, names, k, n))
            continue
        interval, how = pooled_interval(ks, ns, _resamples(rep, names)) if n else (None, None)
        rows = [row_verdict(group, r) for r in rs]
        found.append(
            Claim(
                id=f"{group}_score",
                paper=claim,
                ours=k / n if n else None,
                ci=finite_ci(interval) if interval is not None else None,
                verdict=_group_verdict([v for v, _ in rows]),
                settings={"rows": names, "validation": rs[0].heads.method, "interval": how},
                ci_reason=None if n else "no head was validated",
                note="; ".join(
                    f"{x}: {v} ({why})" for x, (v, why) in zip(names, rows, strict=True)
                ),
                per_setting={
                    x: {"score": r.heads.score, "score_ci": list(r.heads.score_ci)}
                    for x, r in zip(names, rs, strict=True)
                },
            )  # fmt: skip
        )
    sanity = next((x for x in ("sanity-smollm2", "sanity-tiny") if x in results), None)
    first = results[sanity] if sanity else None
    blocks: dict[str, Any] = {
        "paper_targets": {"source": TARGETS, "in_paper_code": False},
        "sanity": {
            "row": sanity,
            "head_score": first.heads.score if first else None,
            "layer_score": first.layers.score if first and first.layers else None,
            "passed": rep.sanity[sanity].passed if sanity in rep.sanity else None,
        },
        "rows": [_row_block(sc, r, rep) for sc in SCENARIOS if (r := results.get(sc.name))],
    }
    return ClaimsDocument(METHOD, source, tuple(found), blocks)


def _row_block(sc: Scenario, r: ModelComparison, rep: EquivalenceReplication) -> dict[str, Any]:
    h, rs = r.heads, r.representational
    verdict, why = row_verdict(sc.group, r)
    protocol = rep.protocols.get(sc.name)
    return {
        "name": sc.name,
        "group": sc.group,
        "score": h.score,
        "score_ci": finite_ci(h.score_ci),
        "null_score": h.null_score,
        "null_score_ci": finite_ci(h.null_score_ci),
        "layer_score": r.layers.score if r.layers else None,
        "verdict": verdict,
        "verdict_reason": why,
        "decision": r.decision,
        "decision_reason": r.decision_reason,
        "congruity_decision": r.congruity.decision if r.congruity else None,
        "paired_test": h.decision.to_json(),
        "representational_score": rs.score,
        "representational_score_ci": finite_ci(rs.score_ci),
        "representational_min_similarity": protocol.representational_min_similarity
        if protocol
        else None,
        "caveats": [dataclasses.asdict(c) for c in r.caveats],
        "protocol": protocol.to_json() if protocol else None,
    }


def write(
    rep: EquivalenceReplication,
    results: dict[str, ModelComparison],
    fold: dict[str, Any] | None,
    doc_dir: str | Path,
) -> tuple[Path, Path]:
    """Write ``equivalence.md`` and ``equivalence.json`` into ``doc_dir``."""
    from structlens.replication import command

    doc_dir = Path(doc_dir)
    source = command(METHOD, rep.s["profile"])
    md = write_text(doc_dir / f"{METHOD}.md", render_markdown(rep, results, fold, source))
    return md, claims(rep, results, source).write(doc_dir / f"{METHOD}.json")

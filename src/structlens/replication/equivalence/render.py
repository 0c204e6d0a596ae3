"""Markdown and claims JSON of the interpretive-equivalence replication.

:func:`write` renders ``equivalence.md`` (``template.md`` filled in) and ``equivalence.json``
(:class:`~structlens.replication.claims.ClaimsDocument`) from one run's typed stage results:
the claims, row verdicts, pooled group scores and caveats all come from
:mod:`structlens.equivalence.verdicts`; this module only lays them out.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from structlens.equivalence import scenarios
from structlens.equivalence import verdicts as v
from structlens.equivalence.protocol import PROFILES as PROTOCOLS
from structlens.equivalence.protocol import EquivalenceProtocol
from structlens.equivalence.scenarios import SCENARIOS, Scenario
from structlens.equivalence.stages import ModelComparison
from structlens.replication.claims import ClaimsDocument
from structlens.replication.equivalence.run import METHOD, EquivalenceReplication
from structlens.replication.markdown import ci, fmt, with_calibration, write_text


def _row(sc: Scenario, r: ModelComparison, seconds: dict[str, float], verdict: str) -> str:
    cg, h, g = r.congruity, r.heads, r.head_groups
    null = inf = "— (no patching)"
    if h.null_score is not None:
        d, i = h.decision, h.informative
        null = (
            f"{h.null_score:.2f} {ci(h.null_score_ci or (np.nan, np.nan))}; paired: "
            f"{d.partner_only} vs {d.null_only} discordant heads, p = {d.p_value:.2g}"
        )
        inf = f"{i.n_passed}/{i.n} = {i.score:.2f} {ci(i.score_ci)}" if i and i.n else "0 heads"
    cells = [
        sc.group, sc.setting, v.PAPER[v.claim_id(sc.group)].text,
        f"**{h.score:.2f}** {ci(h.score_ci)} ({h.method})", str(len(h.passed)), null, inf,
        f"{g.score:.2f} / {g.null_score:.2f} ({len(g.pairs)} layers)" if g else "—",
        "—" if r.layers is None else f"{r.layers.score:.2f}",
        f"{cg.decision_rate_ab:.2f} / {cg.decision_rate_ba:.2f}" if cg else "—",
        f"{r.decision} / {cg.decision if cg else '—'}",
        {True: "yes", False: "**no**", None: "—"}[r.agree], verdict,
        ", ".join(c.kind for c in v.row_caveats(r)) or "—",
        f"{seconds[sc.name]:.0f}" if sc.name in seconds else "?",
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def _detail(sc: Scenario, r: ModelComparison) -> str:
    rs, cg, sim = r.representational, r.congruity, r.matched_layer_similarity
    return (
        f"* **{sc.name}** ({r.model_a} vs {r.model_b}, probe `{r.probe}`, {r.n_fit} fit / "
        f"{r.n_heldout} held-out prompts, {r.representation} rows): matched-layer similarity "
        f"mean {np.mean(sim):.2f} (min {np.min(sim):.2f}); mean matched-head similarity "
        f"{np.mean(r.matched_head_similarity):.2f}"
        + (f"; median head KL {np.median(r.heads.kl):.3g} nats" if r.heads.kl else "")
        + f"; representational score {rs.n_passed}/{rs.n} = {rs.score:.2f} {ci(rs.score_ci)} "
        f"next to the behavioural {r.heads.score:.2f} {ci(r.heads.score_ci)}"
        + (f"; CONGRUITY mean p A→B {cg.mean_p_ab:.2f}, selectivity {cg.selectivity_ab:.2f}"
           if cg else "")
        + "".join(f"; caveat ({c.kind}): {c.message}" for c in v.row_caveats(r))
    )  # fmt: skip


def _pooled(p: v.Pooled | None, group: str | None = None) -> str:
    if p is None:
        return "—"
    text = f"{p.k}/{p.n} = {p.rate:.2f} {ci(p.ci)} ({p.how})"
    return text + (f" ({v.vs_paper(group, p.ci)} vs paper)" if group else "")


def _group_line(s: v.GroupSummary) -> str:
    line = (
        f"* **{s.group}** ({len(s.rows)} pair(s), paper {v.PAPER[v.claim_id(s.group)].text}): "
        f"pooled score {_pooled(s.score)} ({s.method})"
    )
    if s.n_patched:
        line += f"; pooled null {_pooled(s.null)}; " + (
            f"partner passes on {_pooled(s.informative, s.group)} of the heads whose null fails"
            if s.informative
            else "no validated head fails under mean ablation, so the patching criterion "
            "cannot tell a partner from no information here"
        )
        if s.head_groups:
            line += (
                f"; whole-layer head groups {_pooled(s.head_groups)} against their all-heads "
                f"null {_pooled(s.head_groups_null)}"
            )
            if s.head_groups_informative:
                line += (
                    f", partner groups pass on {_pooled(s.head_groups_informative, s.group)} "
                    "of the layers whose null fails"
                )
        line += (
            f"; partner beats the null in the paired test (score claimed) in {s.n_claimed} "
            f"of {s.n_patched} row(s)"
        )
    return line + f"; verdict vs paper: {', '.join(sorted({x for x, _ in s.verdicts}))}."


def discussion(rep: EquivalenceReplication, results: dict[str, ModelComparison]) -> str:
    """Per group, the pooled scores against the paper; then every row's layer-map caveat."""
    out = []
    for group in dict.fromkeys(sc.group for sc in SCENARIOS):
        if rows := v.rows_of(group, results):
            n_boot = rep.protocols[next(iter(rows))].pool_resamples
            out.append(_group_line(v.summarize_group(group, rows, n_boot)))
    for name, r in results.items():
        for c in v.row_caveats(r):
            if c.kind == "layer_map_fails":
                out.append(f"* Layer map check (`{name}`): {c.message}.")
    return "\n".join(out)


def disagreements(results: dict[str, ModelComparison]) -> str:
    """One bullet per row where the matched-component and CONGRUITY decisions differ."""
    dis = {name: r for name, r in results.items() if r.agree is False and r.congruity}
    lines = [f"The decisions differ on {len(dis)} of {len(results)} row(s)" + (":" if dis else ".")]
    for name, r in dis.items():
        cg, i = r.congruity, r.heads.informative
        assert cg is not None
        lines.append(
            f"* `{name}`: matched score {r.heads.score:.2f} → {r.decision} (null "
            f"{fmt(r.heads.null_score)}; partner passes on {i.n_passed if i else 0} of "
            f"{i.n if i else 0} heads whose null fails); CONGRUITY decision rates "
            f"{cg.decision_rate_ab:.2f} (A→B) / {cg.decision_rate_ba:.2f} (B→A), mean p "
            f"{cg.mean_p_ab:.2f} / {cg.mean_p_ba:.2f} → {cg.decision}; top-KL heads A "
            f"{cg.top_heads_a} (KL {', '.join(f'{x:.3f}' for x in cg.top_kl_a)}), B "
            f"{cg.top_heads_b} (KL {', '.join(f'{x:.3f}' for x in cg.top_kl_b)})."
        )
    return "\n".join(lines)


def _plateau(record: dict[str, Any]) -> bool:
    """The stopping rule ended the run before its step budget (a stall at the budget's last
    evaluation is the cosine schedule reaching 0, not a plateau)."""
    return bool(record.get("converged")) and record["steps_run"] < record["config"]["steps"]


def _training(rep: EquivalenceReplication) -> tuple[str, str]:
    """The small LMs' and the fine-tunes' training records, one bullet each."""
    small = [
        f"* `{n}`: {c['config']['n_layers']} layers, d = {c['config']['d_model']}, "
        f"{c.get('steps_run', c['loss'][-1][0])} steps, training loss {c['loss'][-1][1]:.2f} "
        + (f"and held-out loss {c['held_out_loss'][-1][1]:.2f} nats/byte, "
           f"{'converged' if _plateau(c) else 'stopped at the step budget'}"
           if c.get("held_out_loss") else "nats/byte (no held-out measure)")
        + f", {c['seconds']:.0f} s"
        for n in scenarios.SMALL if (c := rep.small_info.get(n))
    ]  # fmt: skip
    ft = [
        f"* `{n}`: task `{c['task']}`, {len(c['losses'])} steps, answer loss "
        f"{c['losses'][0]:.2f} → {c['losses'][-1]:.2f} nats (first → last step)"
        + (f", held-out KL(base ‖ tuned) {c['held_out_kl'][-1][1]:.2f} nats "
           f"({'target reached' if c['reached'] else 'target not reached'})"
           if c.get("held_out_kl") else "")
        + f", {c['seconds']:.0f} s"
        for n in scenarios.FINETUNES if (c := rep.ft_info.get(n))
    ]  # fmt: skip
    return "\n".join(small), "\n".join(ft)


def _fold(fold: dict[str, Any] | None) -> str:
    if not fold:
        return "not run yet."
    return (
        "SmolLM2-135M-Instruct folded (norm gains into readers, tied unembedding untied), "
        f"rotated and head-permuted: max |Δlogit| {fold['max_abs_logit_diff']:.2g} (max |logit| "
        f"{fold['max_abs_logit']:.1f}), top-1 unchanged: {fold['top1_unchanged']}; moved heads' "
        f"hook_z at layer {fold['layer']} equal to {fold['max_abs_z_diff']:.2g}; resid_post · R "
        f"equals the new residual to {fold['max_abs_resid_rotation_error']:.2g} (max |resid| "
        f"{fold['max_abs_resid']:.0f}, float32)."
    )


def _protocol_text(protocol: EquivalenceProtocol) -> str:
    paper = PROTOCOLS["paper"].to_json()
    d = protocol.to_json()
    return ", ".join(f"{k}={x}" for k, x in d.items() if x != paper[k]) or "the `paper` protocol"


def render_markdown(
    rep: EquivalenceReplication,
    results: dict[str, ModelComparison],
    fold: dict[str, Any] | None,
    source: str,
) -> str:
    """The scenario table, per-row details, settings and discussion, from the stage results."""
    verdicts = v.row_verdicts(results)
    lines = [
        _row(sc, results[sc.name], rep.seconds, verdicts[sc.name][0]) if sc.name in results
        else f"| {sc.group} | {sc.setting} | {v.PAPER[v.claim_id(sc.group)].text} | not run "
        "yet (rerun the script) |" + " |" * 11
        for sc in SCENARIOS if sc.name in results or sc.name in rep.s["scenarios"]
    ]  # fmt: skip
    train, ft = _training(rep)
    return TEMPLATE.read_text(encoding="utf-8").format(
        source=source, paper_source=v.PAPER_SOURCE, paper_models=v.PAPER_MODELS,
        fold=_fold(fold), discussion=discussion(rep, results),
        disagree=disagreements(results), table="\n".join([HEADER, *lines]),
        detail="\n".join(_detail(sc, results[sc.name]) for sc in SCENARIOS
                         if sc.name in results),
        train=train, ft=ft, small_cfg=json.dumps(dataclasses.asdict(rep.s["small"]["L4-s0"])),
        smol_cfg=_protocol_text(PROTOCOLS["paper-subset"]),
        small_cmp=_protocol_text(rep.s["small_protocol"]),
        enc_cfg=_protocol_text(PROTOCOLS["paper-sentence"]),
        smol_probe=PROTOCOLS["paper-subset"].probe_prompts, ft_kl=scenarios.FT_TARGET_KL,
        ft_n=scenarios.FT_PROMPTS, ft_train=scenarios.FT_TRAIN,
    )  # fmt: skip


def claims(
    rep: EquivalenceReplication, results: dict[str, ModelComparison], source: str
) -> ClaimsDocument:
    """The claims and blocks of :mod:`structlens.equivalence.verdicts`."""
    n_boot = {name: p.pool_resamples for name, p in rep.protocols.items()}
    found = v.claims(results, rep.sanity, n_boot)
    return ClaimsDocument(METHOD, source, found, v.blocks(results, rep.sanity, rep.protocols))


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
    md = write_text(
        doc_dir / f"{METHOD}.md",
        with_calibration(render_markdown(rep, results, fold, source), "equivalence"),
    )
    return md, claims(rep, results, source).write(doc_dir / f"{METHOD}.json")


TEMPLATE = Path(__file__).with_name("template.md")
HEADER = (
    "| scenario | pair | paper (summary) | our score [95 % CI] (method) | heads validated | "
    "null score [95 % CI] | partner passes where the null fails | whole-layer head groups: "
    "score / null | layer score | CONGRUITY decision rate A→B / B→A | decisions: matched / "
    "CONGRUITY | agree | verdict vs paper | caveats | s |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)

"""Markdown and claims JSON of the interpretive-equivalence replication.

:func:`write` renders ``equivalence.md`` (the blocks of ``template.md`` filled in) and
``equivalence.json`` (:class:`~structlens.replication.claims.ClaimsDocument`) from one run's
typed stage results:
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
from structlens.equivalence.stages import (
    CongruityEstimate,
    CongruityScores,
    FoldCheck,
    ModelComparison,
)
from structlens.replication.claims import ClaimsDocument
from structlens.replication.equivalence.run import METHOD, EquivalenceReplication
from structlens.replication.markdown import Template, ci, fmt, with_calibration, write_text


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
        _rates(cg) if cg else "—",
        f"{r.decision} / {cg.decision if cg else '—'}",
        {True: "yes", False: "**no**", None: "—"}[r.agree], verdict,
        ", ".join(c.kind for c in v.row_caveats(r)) or "—",
        f"{seconds[sc.name]:.0f}" if sc.name in seconds else "?",
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def _rates(cg: CongruityScores) -> str:
    """CONGRUITY's decision rates A→B / B→A, uniform R² (deciding), then variance-weighted."""
    w = cg.variance_weighted
    text = f"{cg.decision_rate_ab:.2f} / {cg.decision_rate_ba:.2f}"
    return text + (f" ({w.decision_rate_ab:.2f} / {w.decision_rate_ba:.2f})" if w else " (—)")


def _estimate(e: CongruityEstimate) -> str:
    return (
        f"decision rates {e.decision_rate_ab:.2f} / {e.decision_rate_ba:.2f}, mean p "
        f"{e.mean_p_ab:.2f} / {e.mean_p_ba:.2f}, clean-run R² {e.base_r2_ab:.3f} / "
        f"{e.base_r2_ba:.3f} → {e.decision}"
    )


def sanity_congruity(t: Template, rep: EquivalenceReplication) -> str:
    """One bullet per sanity copy that ran CONGRUITY (rotated, unrotated), each estimator's
    statistics beside the other's; the copies compute the model's function."""
    lines = [
        t.blocks["row sanity congruity"].format(
            name=name, pair=pair, decision=c.decision, uniform=_estimate(c.uniform),
            weighted=_estimate(w) if (w := c.variance_weighted) else "not measured",
        )
        for name, check in rep.sanity.items()
        for pair, c in v.sanity_copies(check)
    ]  # fmt: skip
    return "\n".join(lines) or "No sanity row ran CONGRUITY."


def _choices(r: ModelComparison) -> str:
    """The row's stated choices: the layers compared (a fine-tune's trained ones), the
    whole-layer map with its reason and how capped validation chose its heads."""
    parts = []
    if (layers := r.compared_layers) and (layers["a"][0] or layers["b"][0]):
        a, b = layers["a"], layers["b"]
        parts.append(f"layers compared: A {a[0]}–{a[-1]}, B {b[0]}–{b[-1]}")
    if (m := r.layer_map) is not None:
        parts.append(f"layer map: {m.method or 'none'} ({m.reason})")
    if sel := r.head_selection:
        parts.append(f"validated heads: {sel['reason']}")
    return "".join(f"; {p}" for p in parts)


def _detail(t: Template, sc: Scenario, r: ModelComparison) -> str:
    cg, sim = r.congruity, r.matched_layer_similarity
    return t.blocks["row detail"].format(
        sc=sc, r=r, rs=r.representational, rs_ci=ci(r.representational.score_ci),
        # the scenario's names of trained models (small:…, finetune:…), not their cache paths
        a=sc.model_a, b=sc.model_b or r.model_b,
        choices=_choices(r),
        sim_mean=np.mean(sim), sim_min=np.min(sim), heads=np.mean(r.matched_head_similarity),
        kl=f"; median head KL {np.median(r.heads.kl):.3g} nats" if r.heads.kl else "",
        score_ci=ci(r.heads.score_ci),
        score_kind="behavioural" if r.heads.method == "patching" else "similarity score",
        congruity=(
            f"; CONGRUITY mean p A→B {cg.mean_p_ab:.2f}, selectivity {cg.selectivity_ab:.2f}"
            + (
                f" (variance-weighted R²: mean p A→B {w.mean_p_ab:.2f}, selectivity "
                f"{w.selectivity_ab:.2f})" if (w := cg.variance_weighted) else ""
            )
            if cg else ""
        ), caveats="".join(f"; caveat ({c.kind}): {c.message}" for c in v.row_caveats(r)),
    )  # fmt: skip


def _pooled(p: v.Pooled | None, group: str | None = None) -> str:
    if p is None:
        return "—"
    text = f"{p.k}/{p.n} = {p.rate:.2f} {ci(p.ci)} ({p.how})"
    return text + (f" ({v.vs_paper(group, p.ci)} vs paper)" if group else "")


def _group_line(t: Template, s: v.GroupSummary) -> str:
    """The ``group`` blocks that apply to the group's summary ``s``, filled in."""
    f = dict(
        s=s, n=len(s.rows), paper=v.PAPER[v.claim_id(s.group)].text, score=_pooled(s.score),
        null=_pooled(s.null), informative=_pooled(s.informative, s.group),
        hg=_pooled(s.head_groups), hg_null=_pooled(s.head_groups_null),
        hg_informative=_pooled(s.head_groups_informative, s.group),
        verdicts=", ".join(sorted({x for x, _ in s.verdicts})),
    )  # fmt: skip
    parts = [""]
    if s.n_patched:
        parts += [" null", " informative" if s.informative else " uninformative"]
        if s.head_groups:
            parts += [
                " head_groups",
                *[" head_groups_informative"] * bool(s.head_groups_informative),
            ]
        parts.append(" claimed")
    return "".join(t.blocks[f"group{p}"].format_map(f) for p in [*parts, " verdict"])


def discussion(
    t: Template, rep: EquivalenceReplication, results: dict[str, ModelComparison]
) -> str:
    """Per group, the pooled scores against the paper; then every row's layer-map caveat."""
    out = []
    for group in dict.fromkeys(sc.group for sc in SCENARIOS):
        if rows := v.rows_of(group, results):
            n_boot = rep.protocols[next(iter(rows))].pool_resamples
            out.append(_group_line(t, v.summarize_group(group, rows, n_boot)))
    for name, r in results.items():
        for c in v.row_caveats(r):
            if c.kind == "layer_map_fails":
                out.append(f"* Layer map check (`{name}`): {c.message}.")
    return "\n".join(out)


def disagreements(t: Template, results: dict[str, ModelComparison]) -> str:
    """One bullet per row where the matched-component and CONGRUITY decisions differ."""
    dis = {name: r for name, r in results.items() if r.agree is False and r.congruity}
    lines = [f"The decisions differ on {len(dis)} of {len(results)} row(s)" + (":" if dis else ".")]
    for name, r in dis.items():
        cg, i = r.congruity, r.heads.informative
        assert cg is not None
        lines.append(t.blocks["row disagree"].format(
            name=name, r=r, cg=cg, null=fmt(r.heads.null_score), passed=i.n_passed if i else 0,
            n=i.n if i else 0, kl_a=_kl(cg.top_kl_a), kl_b=_kl(cg.top_kl_b),
        ))  # fmt: skip
    return "\n".join(lines)


def _kl(values: Any) -> str:
    return ", ".join(f"{x:.3f}" for x in values)


def _training(t: Template, rep: EquivalenceReplication) -> tuple[str, str]:
    """The small LMs' and the fine-tunes' training records, one bullet each."""
    small = [
        dict(n=n, c=c, loss=c.loss[-1][1], held=(
            f"and held-out loss {c.held_out_loss[-1][1]:.2f} nats/byte, "
            f"{'converged' if c.plateaued else 'stopped at the step budget'}"
            if c.held_out_loss else "nats/byte (no held-out measure)"
        ))
        for n in scenarios.SMALL if (c := rep.small_info.get(n))
    ]  # fmt: skip
    ft = [
        dict(n=n, c=tune, steps=len(tune.losses), first=tune.losses[0], last=tune.losses[-1], kl=(
            f", held-out KL(base ‖ tuned) {tune.held_out_kl[-1][1]:.2f} nats "
            f"({'target reached' if tune.reached else 'target not reached'})"
            if tune.held_out_kl else ""
        ))
        for n in scenarios.FINETUNES if (tune := rep.ft_info.get(n))
    ]  # fmt: skip
    return t.rows("small", small), t.rows("finetune", ft)


def _protocol_text(protocol: EquivalenceProtocol) -> str:
    paper = PROTOCOLS["paper"].to_json()
    d = protocol.to_json()
    return ", ".join(f"{k}={x}" for k, x in d.items() if x != paper[k]) or "the `paper` protocol"


def render_markdown(
    rep: EquivalenceReplication,
    results: dict[str, ModelComparison],
    fold: FoldCheck | None,
    source: str,
) -> str:
    """The scenario table, per-row details, settings and discussion, from the stage results."""
    t = Template(Path(__file__).with_name("template.md"))
    verdicts = v.row_verdicts(results)
    lines = [
        _row(sc, results[sc.name], rep.seconds, verdicts[sc.name][0]) if sc.name in results
        else f"| {sc.group} | {sc.setting} | {v.PAPER[v.claim_id(sc.group)].text} | not run "
        "yet (rerun the script) |" + " |" * 11
        for sc in SCENARIOS if sc.name in results or sc.name in rep.s.scenarios
    ]  # fmt: skip
    train, finetunes = _training(t, rep)
    return t.section("doc", dict(
        source=source, v=v, P=PROTOCOLS, scenarios=scenarios, train=train, finetunes=finetunes,
        fold=t.blocks["fold"].format_map(dataclasses.asdict(fold)) if fold else "not run yet.",
        discussion=discussion(t, rep, results), disagree=disagreements(t, results),
        sanity_congruity=sanity_congruity(t, rep),
        table="\n".join([t.blocks["table"], *lines]),
        detail="\n".join(_detail(t, sc, results[sc.name]) for sc in SCENARIOS
                         if sc.name in results),
        small_cfg=json.dumps(dataclasses.asdict(rep.s.small["L4-s0"])),
        smol_cfg=_protocol_text(PROTOCOLS["paper-subset"]),
        small_cmp=_protocol_text(rep.s.small_protocol),
        enc_cfg=_protocol_text(PROTOCOLS["paper-sentence"]),
    )) + "\n"  # fmt: skip


def write(
    rep: EquivalenceReplication,
    results: dict[str, ModelComparison],
    fold: FoldCheck | None,
    doc_dir: str | Path,
) -> tuple[Path, Path]:
    """Write ``equivalence.md`` and ``equivalence.json`` into ``doc_dir``: the markdown, and
    the claims and blocks of :mod:`structlens.equivalence.verdicts`."""
    from structlens.replication import command

    doc_dir, source = Path(doc_dir), command(METHOD, rep.s.profile)
    text = with_calibration(render_markdown(rep, results, fold, source), METHOD)
    md = write_text(doc_dir / f"{METHOD}.md", text)
    n_boot = {name: p.pool_resamples for name, p in rep.protocols.items()}
    found = v.claims(results, rep.sanity, n_boot)
    doc = ClaimsDocument(METHOD, source, found, v.blocks(results, rep.sanity, rep.protocols))
    return md, doc.write(doc_dir / f"{METHOD}.json")

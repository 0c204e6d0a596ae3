"""Markdown and claims JSON of the NDM replication: templates over the claims of
:mod:`structlens.ndm.verdicts` and the run's stage records.

:func:`write` renders ``ndm.md`` (verdicts, settings against the paper, training, the
patching and Gini tables, knowledge conflict, the preimage browser, notes) and ``ndm.json``
(:class:`~structlens.replication.claims.ClaimsDocument`, with the per-test whole-space share
and screen of the protocol).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from structlens.ndm.verdicts import PAPER, claims, conflict_routing
from structlens.replication.claims import ClaimsDocument
from structlens.replication.markdown import ci, value_ci, with_calibration, write_text
from structlens.replication.ndm.run import METHOD
from structlens.verdicts import Claim

BASELINES = {
    "identity": "identity",
    "random": "Haar-random rotation",
    "pca": "PCA (covariance eigenvectors ascending, as in the reference code)",
    "sae": "SAE clustering (TopK SAE trained on the same activations, decoder directions "
    "clustered into subspaces of the partition's sizes by K-subspaces, orthonormalised)",
}


def _ci(entry: dict) -> str:
    return value_ci(entry["value"], entry["ci"])


def _measured(c: Claim, R: dict[str, Any]) -> str:
    """The "our measurement" cell of claim ``c``."""
    ev = R["evaluate"]
    if c.id == "mean_gini_ndm_vs_baselines":
        n_tests, screened = len(ev["screen"]), c.settings["screened_tests"]
        if c.ours is None:
            return (f"no signal: none of the {n_tests} tests passes the screen (whole-space "
                    f"effect ≥ {ev['min_share']:.0%} of the clean metric), so no Gini is "
                    "reported")  # fmt: skip
        best = c.settings.get("best_baseline")
        return (f"NDM {_ci(ev['gini_mean']['ndm']['dimension'])}; best baseline "
                f"{_ci(best) if best else 'none'} (95% bootstrap CIs over prompts; "
                f"{len(screened)} of {n_tests} tests pass the screen)")  # fmt: skip
    if c.id == "toy_recovery":
        guard = "".join(f"; with `{k}`: partition {v['partition']}, overlap {v['overlap']:.3f}"
                        for k, v in c.per_setting.items())  # fmt: skip
        return (f"merging to the threshold: partition {c.settings['partition']} (truth "
                f"{c.settings['truth']}), min matched overlap {c.ours:.3f}{guard}")  # fmt: skip
    if c.id == "planted_partition_recovery":
        return "; ".join(f"{k}: {v['recovered']}/{v['n']} {ci(v['ci'])}"
                         for k, v in c.per_setting.items())  # fmt: skip
    if c.id == "knowledge_conflict_single_subspace":
        parts = [f"`{r['corruption']}`: whole space moves context-rate {r['clean']:.2f} → "
                 f"{r['full']:.2f}, best single subspace ({r['best']}) → {r['best_rate']:.2f}"
                 for r in conflict_routing(ev["conflict"])]  # fmt: skip
        return "; ".join(parts) + f" (layer {c.settings['layer']}, n = {c.settings['n']})"
    if c.ours is None:
        return "not run"
    return (f"{c.ours:,} activations indexed (training activations of the layer plus the "
            "rest of the bundled corpus)")  # fmt: skip


def verdicts(R: dict[str, Any], found: list[Claim]) -> list[str]:
    """The verdicts table: the paper's claim, our measurement, the verdict and its reason."""
    lines = ["## Verdicts", "", "| claim (paper) | our measurement | verdict |", "|---|---|---|"]
    for c in found:
        model = PAPER[c.id].get("model")
        paper = f"{c.paper} ({model})" if model else c.paper
        reason = c.note or (c.ci_reason if c.verdict == "not tested" else None)
        verdict = f"{c.verdict} ({reason})" if reason else c.verdict
        lines.append(f"| {paper} | {_measured(c, R)} | {verdict} |")
    return lines


def settings(R: dict[str, Any]) -> list[str]:
    """Our settings beside the paper's (:data:`structlens.ndm.verdicts.PAPER`)."""
    tr, ev, layers = R["train"], R["evaluate"], R["settings"]["layers"]
    cfg = next(iter(tr["results"].values()))["config"]  # the layers share their settings
    p = tr["protocol"]
    subset = (f"{tr['results'][str(layers[0])]['n_activations']:,} of "
              if R["device_run"] else "")  # fmt: skip
    ours = {
        "layers (resid_post)": ", ".join(map(str, layers))
        + " of 30: `round((l+1)·30/12) − 1`, halves up",
        "training data": f"{subset}{tr['data']['n_tokens_captured']:,} captured activations "
        f"(bundled Austen corpus: {p['corpus_prompts']} windows of {p['corpus_tokens']} "
        f"tokens; {p['task_prompts']} prompts each of IOI, greater-than, knowledge conflict, "
        "none of them an evaluation prompt; first position skipped)",
        "bank / batch": f"{cfg['bank_size']} keys / {cfg['batch_size']}, refreshed every "
        f"{cfg['refresh_interval']} steps",
        "initial subspaces": f"{cfg['unit_size']} dims ({576 // cfg['unit_size']})",
        "steps, merges": f"{cfg['max_steps']}; merges every {cfg['merge_interval']} from "
        f"{cfg['merge_start']} (≤ max(1, S // 8) disjoint pairs per round, S = current number "
        "of subspaces); stop when no pair exceeds the threshold",
        "optimiser": f"Adam {cfg['lr']:g}",
        "KSG": f"k = {cfg['mi_k']}, {cfg['mi_samples']} rows, threshold {cfg['merge_threshold']}",
        "patching prompts": f"{ev['n_prompts']} per test, {ev['n_boot']} bootstrap resamples",
    }
    return [
        "## Settings and distance from the paper", "",
        "| | paper (GPT-2 small) | here (SmolLM2-135M, d = 576, 30 layers) |", "|---|---|---|",
        *(f"| {k} | {v} | {ours[k]} |" for k, v in PAPER["settings"].items()), "",
    ]  # fmt: skip


def training(R: dict[str, Any]) -> list[str]:
    """How training ran, and each layer's partition, merges and distance from the identity."""
    from structlens.ndm.experiment import load_rotation

    tr, tdir = R["train"], Path(R["train_dir"])
    first = tr["results"][str(R["settings"]["layers"][0])]
    if R["device_run"]:
        how = (f"Trained with `structlens.ndm.device_train` on "
               f"{tr.get('device', 'a GPU')} from a seeded subset of "
               f"{first['n_activations']:,} of the captured activations per layer (float16 "
               f"transfer), the layers in parallel processes. {tr.get('note', '')}.")  # fmt: skip
    else:
        cfg = first["config"]
        how = (f"Trained on the CPU for at most {cfg['max_steps']} steps (the paper: 100,000), "
               "each step over a far smaller bank; `--device cuda` trains to the stopping rule "
               "on a GPU.")  # fmt: skip
    lines = [how, "", "How far R moved from the identity start: the mean over columns of the "
             "largest squared coordinate (1 for the identity or any permutation, ≈ 2 ln d / d "
             "≈ 0.02 for a random rotation).", "",
             "| layer | final partition | steps | stopped by the rule | merges (normalised MI "
             "of the merged pair) | seconds | max coord² |", "|---" * 7 + "|"]  # fmt: skip
    for layer in R["settings"]["layers"]:
        r = tr["results"][str(layer)]
        own = R["per_layer"].get(layer, {}) if not R["device_run"] else {}
        rot, _ = load_rotation(tdir / f"R-L{layer}.safetensors")
        mis = ", ".join(f"{h['mi'][0]:.3f}" for h in r["merge_history"])
        lines.append(f"| {layer} | {r['partition']} | {r['steps']} | "
                     f"{'yes' if r['converged'] else 'no'} | {len(r['merge_history'])} ({mis}) "
                     f"| {own.get('seconds', r['seconds']):.0f} | "
                     f"{float((rot**2).max(0).mean()):.2f} |")  # fmt: skip
    return lines


def patching(ev: dict[str, Any]) -> list[str]:
    """The screen per test, then the Gini tables over the screened tests."""
    lines = [
        "", "## Subspace patching (Gini of per-subspace effects)", "",
        "Effect of a patch = clean metric − patched metric, mean over prompts; every method uses "
        "NDM's partition at that layer. Baselines: "
        + ", ".join(BASELINES.get(m, m) for m in ev["methods"] if m != "ndm") + ".", "",
        f"The screen: a test's subspaces are patched, and its Gini reported, only where patching "
        f"the whole space removes at least {ev['min_share']:.0%} of the clean metric (share = "
        "whole-space effect / clean metric, NaN when the clean metric is ≤ 0); below that the "
        "per-subspace effects are mostly noise, whose Gini is ≈ 0.41 whatever the rotation. The "
        "last columns: the sum and the largest of the NDM subspaces' effects as fractions of the "
        "whole-space effect.", "",
        "| test | layer | positions | corruption | clean metric | whole-space effect | share | "
        "screen | Σ NDM / whole | max NDM / whole |", "|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for row in ev["screen"]:
        e = ev["effects"][row["test"]]
        norm = e["methods"]["ndm"]["normalized"] if row["screened"] else None
        pos = ", ".join("TENS, END" if p == "METRIC" else p for p in e["positions"])
        tail = (
            f"passes | {sum(norm):.2f} | {max(norm, key=abs):.2f}" if norm else "no signal | — | —"
        )
        lines.append(f"| {row['test']} | {e['layer']} | {pos} | {e['corruption']} | "
                     f"{e['clean_metric_mean']:+.3f} | {e['full_effect_mean']:+.3f} | "
                     f"{float(row['whole_space_share']):.3f} | {tail} |")  # fmt: skip
    if ev["gini_mean"] == "no signal":
        return lines
    methods, gm = ev["methods"], ev["gini_mean"]
    for variant in ("dimension", "unnormalized", "variance"):
        lines += ["", f"**Gini, {variant}** (value [95% CI])", "", "| test | "
                  + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]  # fmt: skip
        for t, by in ev["gini"].items():
            cells = [("no signal" if by == "no signal" else _ci(by[m][variant])) for m in methods]
            lines.append(f"| {t} | " + " | ".join(cells) + " |")
        lines.append("| **mean (screened)** | " + " | ".join(_ci(gm[m][variant]) for m in methods)
                     + " |")  # fmt: skip
    if diffs := ev.get("gini_mean_diff"):
        lines += ["", "Paired bootstrap difference of the mean dimension-normalised Gini, NDM − "
                  "baseline (one-sided bootstrap p of NDM above it; the verdict adjusts these by "
                  "Holm over the baselines): "
                  + "; ".join(f"{m} {_ci(d['dimension'])} (p {d['dimension']['p_above']:.3f})"
                              for m, d in diffs.items())
                  + "."]  # fmt: skip
    return lines


def comparison(R: dict[str, Any]) -> list[str]:
    """A device-trained run's CPU-trained counterpart, for comparison."""
    sm = R.get("evaluate_cpu")
    if not (R["device_run"] and sm and isinstance(sm["gini_mean"], dict)):
        return []
    return ["", f"For comparison, the CPU-trained run (n = {sm['n_prompts']} per test, its own "
            "partition): mean dimension-normalised Gini "
            + "; ".join(f"{m} {_ci(v['dimension'])}" for m, v in sm["gini_mean"].items())
            + "."]  # fmt: skip


def conflict(ev: dict[str, Any]) -> list[str]:
    """Context and parametric rates, clean, with the whole space and each subspace patched."""
    c = ev.get("conflict") or {}
    if not c.get("corruptions"):
        return []
    cs = list(c["corruptions"].values())

    def row(name: str, pick: Any) -> str:
        rates = (pick(v) for v in cs)
        return f"| {name} | " + " | ".join(f"{r['context_rate']:.2f} / {r['param_rate']:.2f}"
                                           for r in rates) + " |"  # fmt: skip

    part = ev["partition"][str(c["layer"])]
    return [
        "", "## Knowledge conflict routing", "",
        f"Layer {c['layer']} (the paper: {PAPER['knowledge_conflict_single_subspace']['model']} "
        f"layer {PAPER['knowledge_conflict_single_subspace']['layer']}), NDM subspaces, the "
        "whole sequence patched from a corrupted prompt. `true_answer`: the context states the "
        "true (parametric) answer; `other_answer`: the context states a third answer. "
        "context-rate / param-rate = share of prompts whose top-1 token is the clean prompt's "
        "context / parametric answer. (The paper's corruptions replace the entity instead; "
        "our task provides answer-side corruptions.)", "",
        "| patched | " + " | ".join(f"{k} ctx / param" for k in c["corruptions"]) + " |",
        "|---|" + "---|" * len(cs), row("none (clean)", lambda v: v["clean"]),
        row("whole space", lambda v: v["full"]),
        *(row(f"subspace {s} ({part[s]}d)", lambda v, s=s: v["subspaces"][s])
          for s in range(len(cs[0]["subspaces"]))),
    ]  # fmt: skip


def browser(R: dict[str, Any]) -> list[str]:
    lines = ["", "## Preimage browser", ""]
    for b in R["browse"]:
        lines += [f"Query `{b['query']['context']}` at layer {b['layer']} over "
                  f"{b['n_activations']:,} indexed activations (cosine, top 3 per subspace):",
                  ""]  # fmt: skip
        for sub in b["subspaces"]:
            hits = "; ".join(f"`{h['context']}` ({h['similarity']:.2f})" for h in sub["hits"][:3])
            lines.append(f"- subspace {sub['subspace']} ({sub['dim']}d): {hits}")
        lines.append("")
    return lines


def notes(ev: dict[str, Any]) -> list[str]:
    null_tests = [row["test"] for row in ev["screen"] if not row["screened"]]
    toy = ev["toy"]
    return [
        "## Honest notes", "",
        f"- Toy: the run stopped at {toy['partition']} (truth {toy['truth_dims']}) "
        + ("by the merge rule." if toy["converged"] else "by running out of steps.")
        + " Without read-out noise KSG on the toy's exact zeros and rays exceeds the merge "
        "threshold after a fraction of a degree of leakage (docs/ndm.md); a `min_subspaces` "
        "guard (the authors' fork's fix) is available.",
        "- Tests without signal: " + (", ".join(null_tests) + f" remove less than "
        f"{ev['min_share']:.0%} of the clean metric when the whole space is patched at the "
        "mapped layer: no signal, no Gini." if null_tests else "none."),
        "- Greater-than on SmolLM2 uses the digit-wise adaptation of the task (docs/tasks.md); "
        "the patched positions are the two positions its metric reads (TENS, END).",
        "- S-inhibition with name corruption uses the paper's S_name swap (S1, S2 → IO; "
        "IO → S), built from the clean prompts.", "",
    ]  # fmt: skip


def render(R: dict[str, Any], source: str, found: list[Claim]) -> str:
    """The markdown of one run over its claims ``found``."""
    train = f"Training: {R['train'].get('device', 'a GPU')}, see below." if R["device_run"] else (
        "Training: the same CPU, no GPU.")  # fmt: skip
    lines = [
        "# NDM replication on SmolLM2-135M-Instruct", "",
        f"Produced by `{source}` (stages cached under `results/replication/ndm/`). Paper: Huang "
        "& Hahn, *Decomposing Representation Space into Interpretable Subspaces with "
        "Unsupervised Learning* (ICLR 2026). Evaluation: 2 CPU cores. " + train, "",
        *verdicts(R, found), "", *settings(R), *training(R), *patching(R["evaluate"]),
        *comparison(R), *conflict(R["evaluate"]), *browser(R), *notes(R["evaluate"]),
    ]  # fmt: skip
    return "\n".join(lines)


def tests_block(ev: dict[str, Any]) -> list[dict[str, Any]]:
    """Per patching test, the run's screen row (``whole_space_share``, ``screened``, see
    :class:`structlens.ndm.stages.Screen`) with the clean metric, the whole-space effect
    and the dimension-normalised Gini per method (``"no signal"`` for an unscreened test)."""
    rows = []
    for row in ev["screen"]:
        e, gini = ev["effects"][row["test"]], ev["gini"][row["test"]]
        share = float(row["whole_space_share"])  # NaN is written "nan" in the stage JSON
        rows.append(row | {
            "whole_space_share": share if math.isfinite(share) else None,
            "clean_metric": e["clean_metric_mean"], "whole_space_effect": e["full_effect_mean"],
            "gini_dimension": gini if gini == "no signal"
            else {m: v["dimension"] for m, v in gini.items()},
        })  # fmt: skip
    return rows


def write(R: dict[str, Any], doc_dir: str | Path) -> tuple[Path, Path]:
    """Write ``ndm.md`` and ``ndm.json`` into ``doc_dir``."""
    from structlens.replication import command

    doc_dir = Path(doc_dir)
    source = command(METHOD, R["settings"]["profile"])
    found = claims(R)
    md = write_text(doc_dir / f"{METHOD}.md", with_calibration(render(R, source, found), "ndm"))
    blocks = {
        "tests": tests_block(R["evaluate"]),
        "screen": {"min_whole_space_share": R["evaluate"]["min_share"], "applied_to_gini": True},
        "settings": {k: R["settings"][k] for k in ("model", "layers", "protocol")}
        | {"device_run": R["device_run"]},
    }
    doc = ClaimsDocument(METHOD, source, tuple(found), blocks)
    return md, doc.write(doc_dir / f"{METHOD}.json")

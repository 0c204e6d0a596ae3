"""Markdown and claims JSON of the NDM replication: ``template.md`` filled from the claims of
:mod:`structlens.ndm.verdicts` and the run's typed stage Results.

:func:`write` renders ``ndm.md`` (verdicts, settings against the paper, training, the
tests' layer sweep, the patching and Gini tables, knowledge conflict, the preimage browser,
notes) and ``ndm.json`` (:class:`~structlens.replication.claims.ClaimsDocument`, with the
per-test whole-space share and screen of the protocol and the whole layer sweep).  Verdicts
are the Claims'; nothing here decides one.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from structlens.ndm.runs import EvaluationRun, TrainingRun
from structlens.ndm.verdicts import PAPER, claims, conflict_routing
from structlens.replication.claims import ClaimsDocument
from structlens.replication.markdown import Template, ci, value_ci, with_calibration, write_text
from structlens.replication.ndm.run import METHOD, Run
from structlens.verdicts import Claim

#: How the documents name ``NDMConfig.retraction``'s maps (the reference code's is the
#: exponential).
RETRACTION_NAMES = {"exp": "matrix-exponential", "cayley": "Cayley"}

TEMPLATE = Path(__file__).with_name("template.md")
BASELINES = {
    "identity": "identity",
    "random": "Haar-random rotation",
    "pca": "PCA (covariance eigenvectors ascending, as in the reference code)",
    "sae": "SAE clustering (TopK SAE trained on the same activations, decoder directions "
    "clustered into subspaces of the partition's sizes by K-subspaces, orthonormalised)",
}


def _ci(entry: dict) -> str:
    return value_ci(entry["value"], entry["ci"])


def claims_of(R: Run) -> list[Claim]:
    """The run's claims, in the table's order."""
    return claims(R.evaluate, R.train, R.toy, R.planted, R.browse)


def _measured(t: Template, c: Claim, ev: EvaluationRun) -> str:
    """The "our measurement" cell of claim ``c``: its template filled from the claim."""
    values = {"ours": c.ours, "n_tests": len(ev.screen), "min_share": ev.min_share}
    if c.id == "mean_gini_ndm_vs_baselines":
        if c.ours is None:
            return t.blocks["measured no_gini"].format_map(values)
        assert ev.gini_mean is not None  # a measured Gini has its table
        best = c.settings.get("best_baseline")
        values |= {"ndm": _ci(ev.gini_mean["ndm"]["dimension"]),
                   "best": _ci(best) if best else "none",
                   "n_screened": len(c.settings["screened_tests"])}  # fmt: skip
    if c.id == "toy_recovery":
        assert c.ci is not None  # a profile runs at least one seed
        ((guard, g),) = c.per_setting.items()
        runs = c.settings["partitions"]
        values |= {"k": c.settings["recovered"], "n": len(runs), "ci": ci(c.ci),
                   "truth": c.settings["truth"], "guard": guard.split(" ")[0],
                   "k_guard": g["recovered"], "ci_guard": ci(g["ci"]),
                   "partitions": ", ".join(f"{p}" for p in runs.values())}  # fmt: skip
    if c.id == "planted_partition_recovery":
        return "; ".join(f"{k}: {v['recovered']}/{v['n']} {ci(v['ci'])}"
                         for k, v in c.per_setting.items())  # fmt: skip
    if c.id == "knowledge_conflict_single_subspace":
        assert ev.conflict is not None  # the claim is made only where routing ran
        parts = (t.blocks["measured conflict"].format_map(r)
                 for r in conflict_routing(ev.conflict))  # fmt: skip
        return "; ".join(parts) + f" (layer {c.settings['layer']}, n = {c.settings['n']})"
    if c.ours is None:
        return "not run"
    return t.blocks[f"measured {c.id}"].format_map(values)


def _verdict_row(t: Template, c: Claim, ev: EvaluationRun) -> dict[str, str]:
    model = PAPER[c.id].get("model")
    reason = c.note or (c.ci_reason if c.verdict == "not tested" else None)
    return {"paper": f"{c.paper} ({model})" if model else c.paper, "measured": _measured(t, c, ev),
            "verdict": f"{c.verdict} ({reason})" if reason else c.verdict}  # fmt: skip


def _settings(t: Template, R: Run) -> str:
    """Our settings beside the paper's (:data:`structlens.ndm.verdicts.PAPER`)."""
    tr, ev, layers = R.train, R.evaluate, R.sweep.layers
    cfg = next(iter(tr.results.values()))["config"]  # the layers share their settings
    rule = t.blocks[f"layer_rule {R.sweep.rule}"].format_map(R.sweep.selection)
    values = tr.protocol | cfg | {
        "retraction_name": RETRACTION_NAMES[cfg.get("retraction", "exp")],
        "layers": ", ".join(map(str, layers)), "layer_rule": rule,
        "n_units": 576 // cfg["unit_size"],
        "subset": f"{tr.layer(layers[0])['n_activations']:,} of " if R.device_run else "",
        "n_tokens_captured": tr.data["n_tokens_captured"], "n_prompts": ev.n_prompts,
        "n_boot": ev.n_boot,
    }  # fmt: skip
    rows = [{"name": k, "paper": v, "ours": t.blocks[f"setting {k}"].format_map(values)}
            for k, v in PAPER["settings"].items()]  # fmt: skip
    return t.section("settings", {}, rows)


def _device(tr: TrainingRun) -> str:
    """Where a device run trained, as the documents name it."""
    return "the CPU" if tr.device == "cpu" else tr.device or "a GPU"


def _training(t: Template, R: Run) -> list[str]:
    """How training ran, and each layer's partition, merges and distance from the identity."""
    from structlens.ndm.experiment import load_rotation

    tr, layers = R.train, R.sweep.layers
    first = tr.layer(layers[0])
    cfg, paper = first["config"], PAPER["schedule"]
    schedule = {f"paper_{k}": v for k, v in paper.items()} | {
        "steps_share": cfg["max_steps"] / paper["steps"],
        "bank_share": cfg["bank_size"] / paper["bank"],
        "retraction_name": RETRACTION_NAMES[cfg.get("retraction", "exp")],
    }  # fmt: skip
    if R.device_run:
        seconds = R.settings.get("device_seconds")
        how = t.section("training_device", cfg | schedule | {
            "device": _device(tr),
            "limit": f", each stopped after {seconds / 60:.0f} min if not done" if seconds else "",
            "note": f" {tr.note}." if tr.note else "", "n_activations": first["n_activations"],
        })  # fmt: skip
    else:
        how = t.section("training_cpu", cfg | schedule)
    rows = []
    for layer in layers:
        r = tr.layer(layer)
        own = R.per_layer.get(layer, {}) if not R.device_run else {}
        rot, _ = load_rotation(R.train_dir / f"R-L{layer}.safetensors")
        rows.append(r | {
            "layer": layer, "stopped": "yes" if r["converged"] else "no",
            "n_merges": len(r["merge_history"]),
            "mis": ", ".join(f"{h['mi'][0]:.3f}" for h in r["merge_history"]),
            "seconds": own.get("seconds", r["seconds"]),
            "max_coord": float((rot**2).max(0).mean()),
        })  # fmt: skip
    return [how, t.section("training", {}, rows)]


def _sweep(t: Template, R: Run, ev: EvaluationRun) -> str:
    """How the tests' layers were chosen: every candidate's share, standard error and the
    paired p-value of its gain over the mapped layer, the chosen one marked."""
    sweep = R.sweep
    if sweep.rule == "depth":
        return t.section("sweep_depth", {"layers": ", ".join(
            f"{c.test} {c.chosen}" for c in sweep.choices)})  # fmt: skip

    def cell(layer: int, share: float, error: float, p: float, chosen: int) -> str:
        text = f"{layer}: {share:.3f} ± {error:.3f}" + (f" (p {p:.3g})" if math.isfinite(p) else "")
        return f"**{text}**" if layer == chosen else text

    rows = [{
        "test": c.test, "paper": ev.tests[c.test]["gpt2_layer"], "mapped": c.mapped,
        "chosen": c.chosen, "shares": " · ".join(
            cell(*found, c.chosen)
            for found in zip(c.candidates, c.shares, c.errors, c.p_values, strict=True)),
    } for c in sweep.choices]  # fmt: skip
    return t.section("sweep", sweep.selection, rows)


def _patching(t: Template, ev: EvaluationRun) -> list[str]:
    """The screen per test, then the Gini tables over the screened tests."""
    rows = []
    for row in ev.screen:
        e = ev.effects[row["test"]]
        norm = e["methods"]["ndm"]["normalized"] if row["screened"] else None
        rows.append(e | {
            "test": row["test"], "share": float(row["whole_space_share"]),
            "positions": ", ".join("TENS, END" if p == "METRIC" else p for p in e["positions"]),
            "tail": f"passes | {sum(norm):.2f} | {max(norm, key=abs):.2f}" if norm
            else "no signal | — | —",
        })  # fmt: skip
    baselines = ", ".join(BASELINES.get(m, m) for m in ev.methods if m != "ndm")
    out = [t.section("patching", {"baselines": baselines, "min_share": ev.min_share}, rows)]
    if ev.gini_mean is None:
        return out
    methods, gm = ev.methods, ev.gini_mean
    for variant in ("dimension", "unnormalized", "variance"):
        rows = [{"test": test, "cells": " | ".join(
                    "no signal" if by == "no signal" else _ci(by[m][variant]) for m in methods)}
                for test, by in ev.gini.items()]  # fmt: skip
        out.append(t.section("gini", {
            "variant": variant, "methods": " | ".join(methods), "columns": "---|" * len(methods),
            "mean": " | ".join(_ci(gm[m][variant]) for m in methods),
        }, rows))  # fmt: skip
    if diffs := ev.gini_mean_diff:
        out.append(t.section("gini_diff", {"diffs": "; ".join(
            f"{m} {_ci(d['dimension'])} (p {d['dimension']['p_above']:.3f})"
            for m, d in diffs.items())}))  # fmt: skip
    return out


def _comparison(t: Template, R: Run) -> list[str]:
    """A device-trained run's CPU-trained counterpart, for comparison."""
    sm = R.evaluate_cpu
    if not (R.device_run and sm and sm.gini_mean is not None):
        return []
    ginis = "; ".join(f"{m} {_ci(v['dimension'])}" for m, v in sm.gini_mean.items())
    steps = max(r["steps"] for r in R.per_layer.values())
    return [t.section("comparison", {"n_prompts": sm.n_prompts, "ginis": ginis, "steps": steps})]


def _subspace(s: int, rates: dict[str, Any]) -> Any:
    return rates["subspaces"][s]


def _conflict(t: Template, ev: EvaluationRun) -> list[str]:
    """Context and parametric rates, clean, with the whole space and each subspace patched."""
    c = ev.conflict or {}
    if not c.get("corruptions"):
        return []
    cs, part = list(c["corruptions"].values()), ev.partition[str(c["layer"])]
    picks: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
        ("none (clean)", operator.itemgetter("clean")),
        ("whole space", operator.itemgetter("full")),
    ]
    picks += [(f"subspace {s} ({part[s]}d)", partial(_subspace, s))
              for s in range(len(cs[0]["subspaces"]))]  # fmt: skip
    rows = [{"patched": name, "rates": " | ".join(
                f"{r['context_rate']:.2f} / {r['param_rate']:.2f}" for r in map(pick, cs))}
            for name, pick in picks]  # fmt: skip
    paper = PAPER["knowledge_conflict_single_subspace"]
    return [t.section("conflict", {
        "layer": c["layer"], "paper_model": paper["model"], "paper_layer": paper["layer"],
        "columns": " | ".join(f"{k} ctx / param" for k in c["corruptions"]),
        "separators": "---|" * len(cs),
    }, rows)]  # fmt: skip


def _browser(t: Template, R: Run) -> list[str]:
    out = [t.section("browser", {})]
    for b in R.browse:
        rows = [{"subspace": sub["subspace"], "dim": sub["dim"], "hits": "; ".join(
                    f"`{h['context']}` ({h['similarity']:.2f})" for h in sub["hits"][:3])}
                for sub in b.subspaces]  # fmt: skip
        values = {"context": b.query["context"], "layer": b.layer, "n_activations": b.n_activations}
        out.append(t.section("query", values, rows))
    return out


def _notes(t: Template, ev: EvaluationRun) -> str:
    null_tests = [row["test"] for row in ev.screen if not row["screened"]]
    return t.section("notes", {
        "null_tests": ", ".join(null_tests) + f" remove less than {ev.min_share:.0%} of the "
        "clean metric when the whole space is patched at their layers: no signal, no Gini."
        if null_tests else "none.",
    })  # fmt: skip


def render(R: Run, source: str, found: list[Claim]) -> str:
    """The markdown of one run over its claims ``found``."""
    t, ev = Template(TEMPLATE), R.evaluate
    training = (f"Training: {_device(R.train)}, see below." if R.device_run
                else "Training: the same CPU, no GPU.")  # fmt: skip
    head = {"source": source, "training": training}
    parts = [
        t.section("header", head, (_verdict_row(t, c, ev) for c in found)), _settings(t, R),
        *_training(t, R), _sweep(t, R, ev), *_patching(t, ev), *_comparison(t, R),
        *_conflict(t, ev),
        *_browser(t, R), _notes(t, ev),
    ]  # fmt: skip
    return "\n\n".join(parts) + "\n"


def tests_block(ev: EvaluationRun) -> list[dict[str, Any]]:
    """Per patching test, the run's screen row (``whole_space_share``, ``screened``, see
    :class:`structlens.ndm.stages.Screen`) with the clean metric, the whole-space effect
    and the dimension-normalised Gini per method (``"no signal"`` for an unscreened test)."""
    rows = []
    for row in ev.screen:
        e, gini = ev.effects[row["test"]], ev.gini[row["test"]]
        share = float(row["whole_space_share"])
        rows.append(row | {
            "whole_space_share": share if math.isfinite(share) else None,
            "clean_metric": e["clean_metric_mean"], "whole_space_effect": e["full_effect_mean"],
            "gini_dimension": gini if gini == "no signal"
            else {m: v["dimension"] for m, v in gini.items()},
        })  # fmt: skip
    return rows


def write(R: Run, doc_dir: str | Path) -> tuple[Path, Path]:
    """Write ``ndm.md`` and ``ndm.json`` into ``doc_dir``."""
    from structlens.replication import command

    doc_dir = Path(doc_dir)
    source = command(METHOD, R.settings["profile"])
    found = claims_of(R)
    md = write_text(doc_dir / f"{METHOD}.md", with_calibration(render(R, source, found), "ndm"))
    blocks = {
        "tests": tests_block(R.evaluate),
        "screen": {"min_whole_space_share": R.evaluate.min_share, "applied_to_gini": True},
        "settings": {k: R.settings[k] for k in ("model", "protocol")}
        | {"layers": R.sweep.layers, "device_run": R.device_run},
        "layer_sweep": R.sweep.to_json(),
    }
    doc = ClaimsDocument(METHOD, source, tuple(found), blocks)
    return md, doc.write(doc_dir / f"{METHOD}.json")

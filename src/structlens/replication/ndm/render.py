"""Markdown and claims JSON of the NDM replication.

:func:`write` renders ``ndm.md`` (verdicts, settings against the paper, training, the
patching and Gini tables, knowledge conflict, the preimage browser, notes) and ``ndm.json``
(:class:`~structlens.replication.claims.ClaimsDocument`, with the per-test whole-space share
and screen of the protocol) from one run's stage results.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from structlens.replication.claims import ClaimsDocument
from structlens.replication.markdown import (
    ci,
    count_verdict,
    finite_ci,
    value_ci,
    verdict_moves,
    write_text,
)
from structlens.replication.ndm.run import METHOD
from structlens.stats.intervals import wilson_interval
from structlens.verdicts import Claim

# The previous protocol's claims (docs/replication/ndm.json at PREVIOUS_COMMIT), kept as
# history for the table of moves; nothing here enters a verdict.  Those came from NDM trained
# on an H200 to the paper's stopping rule (the gpu profile), not from the cpu profile's 60 steps.
PREVIOUS_COMMIT = "ba7413f"
PREVIOUS = {
    "mean_gini_ndm_vs_baselines": ("0.44 (H200-trained; all tests, no screen)", "partly"),
    "toy_recovery": ("1.0", "reproduced"),
    "knowledge_conflict_single_subspace": ("2 of 2 corruptions (H200-trained)", "reproduced"),
    "preimage_browser_scale": ("127868", "reproduced"),
}


def _ci(entry: dict) -> str:
    return value_ci(entry["value"], entry["ci"])


def render(R: dict[str, Any], source: str, claims: list[Claim]) -> str:
    """The markdown of one run; each verdict is also appended to ``claims``."""
    LAYERS = R["settings"]["layers"]
    tdir = Path(R["train_dir"])
    tr, ev, toy2, per_layer = R["train"], R["evaluate"], R["toy2"], R["per_layer"]
    methods = ev["methods"]
    cfg = next(iter(tr["results"].values()))["config"]  # the layers share their settings
    device_run = R["device_run"]
    lines = [
        "# NDM replication on SmolLM2-135M-Instruct",
        "",
        f"Produced by `{source}` (stages cached under "
        "`results/replication/ndm/`). Paper: Huang & Hahn, "
        "*Decomposing Representation Space into Interpretable Subspaces with Unsupervised "
        "Learning* (ICLR 2026). Evaluation: 2 CPU cores, shared with the other replication "
        "runs. "
        + (
            f"Training: {tr.get('device', 'a GPU')}, see below."
            if device_run
            else "Training: the same CPU, no GPU."
        ),
        "",
        "## Verdicts",
        "",
        "| claim (paper) | our measurement | verdict |",
        "|---|---|---|",
    ]
    gm = ev["gini_mean"]
    screened = [row["test"] for row in ev["screen"] if row["screened"]]
    n_tests = len(ev["screen"])
    paper_gini = "mean dimension-normalised Gini over 5 tests: NDM 0.71 vs baselines 0.21–0.38"
    gini_settings = {"methods": methods, "n_prompts": ev["n_prompts"], "n_boot": ev["n_boot"],
                     "screened_tests": screened, "min_share": ev["min_share"]}  # fmt: skip
    verdict_gini, reason_gini = gini_verdict(ev, tr)
    if gm == "no signal":
        gini_cell = (
            f"no signal: none of the {n_tests} tests passes the screen (whole-space effect "
            f"≥ {ev['min_share']:.0%} of the clean metric), so no Gini is reported"
        )
        claims.append(
            Claim(
                "mean_gini_ndm_vs_baselines", paper_gini, None, None, verdict_gini,
                gini_settings, ci_reason=reason_gini,
            )
        )  # fmt: skip
    else:
        ndm_dim = gm["ndm"]["dimension"]
        best_base = max(
            (gm[m]["dimension"] for m in methods if m != "ndm"), key=lambda e: e["value"]
        )
        gini_cell = (
            f"NDM {_ci(ndm_dim)}; best baseline {_ci(best_base)} (95% bootstrap CIs over "
            f"prompts; {len(screened)} of {n_tests} tests pass the screen)"
        )
        claims.append(
            Claim(
                "mean_gini_ndm_vs_baselines", paper_gini, ndm_dim["value"],
                finite_ci(ndm_dim["ci"]), verdict_gini, gini_settings,
                ci_reason=None if finite_ci(ndm_dim["ci"]) else "no finite bootstrap interval",
                note=f"{reason_gini}; best baseline {_ci(best_base)}",
            )
        )  # fmt: skip
    toy = ev["toy"]
    toy_ok = toy["right_number_of_subspaces"] and toy["overlap"] > 0.9
    claims.append(
        Claim(
            "toy_recovery",
            "toy: one subspace per mutually exclusive feature group",
            toy["overlap"],
            None,
            "reproduced" if toy_ok else "partly" if toy2 and toy2["overlap"] > 0.9 else
            "not reproduced",
            {"partition": toy["partition"], "truth": toy["truth_dims"]},
            ci_reason="one seeded toy run (min matched overlap)",
        )
    )  # fmt: skip
    lines += [
        f"| {paper_gini} (GPT-2 small) | {gini_cell} | {verdict_gini} ({reason_gini}) |",
        f"| toy: one subspace per mutually exclusive feature group | merging to the threshold: "
        f"partition {toy['partition']} (truth {toy['truth_dims']}), min matched overlap "
        f"{toy['overlap']:.3f}"
        + (
            f"; with `min_subspaces=2`: partition {toy2['partition']}, overlap "
            f"{toy2['overlap']:.3f}"
            if toy2
            else ""
        )
        + " | "
        + (
            "reproduced"
            if toy["right_number_of_subspaces"] and toy["overlap"] > 0.9
            else "partly (groups recovered only with the stop guard)"
            if toy2 and toy2["overlap"] > 0.9
            else "not reproduced"
        )
        + " |",
    ]
    planted = R.get("planted") or []
    if planted:
        best = max(p["restarts"] for p in planted)
        with_restarts = [p for p in planted if p["restarts"] == best]
        k = sum(p["recovered"] for p in with_restarts)
        n = sum(p["n"] for p in with_restarts)
        planted_cells = "; ".join(
            f"{p['sizes']}, {p['restarts']} run(s): {p['recovered']}/{p['n']} {ci(p['ci'])}"
            for p in planted
        )
        lines.append(
            "| planted rotated partitions are recovered over seeds (restarts against merges "
            f"after swapped dimensions) | {planted_cells} | {count_verdict(k, n)} |"
        )
        claims.append(
            Claim(
                "planted_partition_recovery",
                "the toy's groups are recovered (here: planted rotated partitions, over seeds)",
                k / n,
                wilson_interval(k, n),
                count_verdict(k, n),
                {"restarts": best, "partitions": [p["sizes"] for p in with_restarts],
                 "seeds": with_restarts[0]["n"], "min_overlap": with_restarts[0]["min_overlap"]},
                note=planted_cells,
            )
        )  # fmt: skip
    if (ev.get("conflict") or {}).get("corruptions"):
        c = ev["conflict"]
        parts, close = [], []
        for name, v in c["corruptions"].items():
            base = v["clean"]["context_rate"]
            full_drop = base - v["full"]["context_rate"]
            drops = [base - sub["context_rate"] for sub in v["subspaces"]]
            best = int(max(range(len(drops)), key=lambda i: drops[i]))
            parts.append(
                f"`{name}`: whole space moves context-rate {base:.2f} → "
                f"{v['full']['context_rate']:.2f}, best single subspace ({best}) → "
                f"{v['subspaces'][best]['context_rate']:.2f}"
            )
            close.append(full_drop > 0 and drops[best] >= 0.8 * full_drop)
        lines.append(
            "| knowledge conflict: a single subspace nearly matches whole-space patching of "
            "the context/parametric routing (Qwen2.5-1.5B) | "
            + "; ".join(parts)
            + f" (layer {c['layer']}, n = {c['n']}) | "
            + ("reproduced" if all(close) else "partly" if any(close) else "not reproduced")
            + " |"
        )
        claims.append(
            Claim(
                "knowledge_conflict_single_subspace",
                "a single subspace nearly matches whole-space patching of the routing",
                f"{sum(close)} of {len(close)} corruptions",
                None,
                count_verdict(sum(close), len(close)),
                {"layer": c["layer"], "n": c["n"], "corruptions": list(c["corruptions"])},
                ci_reason="a count of corruptions where the best subspace reaches 80% of the "
                "whole-space drop; rates over one prompt set",
            )
        )
    b0 = R["browse"][0] if R["browse"] else None
    lines.append(
        "| preimage browser over ≥ 100,000 activations (authors: ≈ 1M) | "
        + (f"{b0['n_activations']:,} activations indexed" if b0 else "not run")
        + " (training activations of the layer plus the rest of the bundled corpus) | "
        + ("reproduced" if b0 and b0["n_activations"] >= 100_000 else "partly")
        + " |"
    )
    if b0:
        claims.append(
            Claim(
                "preimage_browser_scale",
                "preimage browser over ≥ 100,000 activations (authors: ≈ 1M)",
                b0["n_activations"],
                None,
                "reproduced" if b0["n_activations"] >= 100_000 else "partly",
                {"layer": b0["layer"]},
                ci_reason="a count of indexed activations",
            )
        )
    lines += [
        "",
        "## Settings and distance from the paper",
        "",
        "| | paper (GPT-2 small) | here (SmolLM2-135M, d = 576, 30 layers) |",
        "|---|---|---|",
        "| layers (resid_post) | 4, 6, 8, 9 of 12 | "
        + ", ".join(str(v) for v in LAYERS)
        + " of 30: `round((l+1)·30/12) − 1`, halves up |",
        "| training data | MiniPile, ≈ 400k-key bank per step | "
        + (f"{tr['results'][str(LAYERS[0])]['n_activations']:,} of " if device_run else "")
        + f"{tr['data']['n_tokens_captured']:,} captured "
        f"activations (bundled Austen corpus: {tr['protocol']['corpus_prompts']} windows of "
        f"{tr['protocol']['corpus_tokens']} tokens; {tr['protocol']['task_prompts']} prompts "
        "each of IOI, greater-than, knowledge conflict, none of them an evaluation prompt; "
        "first position skipped) |",
        f"| bank / batch | 409,600 keys / 128 | {cfg['bank_size']} keys / {cfg['batch_size']}, "
        f"refreshed every {cfg['refresh_interval']} steps |",
        f"| initial subspaces | 32 dims (24) | {cfg['unit_size']} dims "
        f"({576 // cfg['unit_size']}) |",
        f"| steps, merges | 100k; merges every 8k from 20k | {cfg['max_steps']}; merges every "
        f"{cfg['merge_interval']} from {cfg['merge_start']} (≤ max(1, S // 8) disjoint pairs "
        "per round, S = current number of subspaces); stop when no pair exceeds the threshold |",
        f"| optimiser | Adam 3e-4 | Adam {cfg['lr']:g} |",
        f"| KSG | k = 1, 98,304 reference keys | k = {cfg['mi_k']}, {cfg['mi_samples']} rows, "
        f"threshold {cfg['merge_threshold']} |",
        f"| patching prompts | 1000 per test | {ev['n_prompts']} per test, "
        f"{ev['n_boot']} bootstrap resamples |",
        "",
        (
            "Trained with `structlens.replication.ndm.device_train` on "
            f"{tr.get('device', 'a GPU')} from "
            f"a seeded subset of {tr['results'][str(LAYERS[0])]['n_activations']:,} of the "
            "captured activations per layer (float16 transfer), four layers in parallel "
            "processes. " + tr.get("note", "") + ". Every layer stopped by the paper's rule "
            "(a merge round found no pair above the threshold), after 6–10 % of the paper's "
            "step budget; the bank is ~40× smaller than the paper's, because the bundled corpus "
            "is small. The earlier 60-step CPU run (results/ndm/train, bank 8,192, units of "
            "48, lr 3e-3) is kept for comparison below."
            if device_run
            else "Training is ~1,700× shorter than the paper's (60 vs 100,000 steps) and each "
            "step searches a 50× smaller bank: one step costs ≈ 1 CPU-second here (dominated "
            "by the 576×576 float64 matrix exponential and its gradient). This is a smoke-scale "
            "replication, not a converged one: every merge round still found a pair above the "
            "threshold, so training did not reach the paper's stopping point. "
            "`--device cuda` trains to the stopping rule on a GPU."
        ),
        "",
        "How far R moved from the identity start: the mean over columns of the largest "
        "squared coordinate (1 for the identity or any permutation, ≈ 2 ln d / d ≈ 0.02 for a "
        "random rotation).",
        "",
        "| layer | final partition | steps | merges (normalised MI of the merged pair) | "
        "seconds | max coord² |",
        "|---|---|---|---|---|---|",
    ]
    from structlens.ndm.experiment import load_rotation

    for layer in LAYERS:
        r = tr["results"][str(layer)]
        sec = (per_layer.get(layer, {}) if not device_run else {}).get("seconds", r["seconds"])
        rot, _ = load_rotation(tdir / f"R-L{layer}.safetensors")
        mis = ", ".join(f"{h['mi'][0]:.3f}" for h in r["merge_history"])
        lines.append(
            f"| {layer} | {r['partition']} | {r['steps']} | {len(r['merge_history'])} ({mis}) | "
            f"{sec:.0f} | {float((rot**2).max(0).mean()):.2f} |"
        )
    lines += [
        "",
        "## Subspace patching (Gini of per-subspace effects)",
        "",
        "Effect of a patch = clean metric − patched metric, mean over prompts; every method "
        "uses NDM's partition at that layer. Baselines: identity, Haar-random rotation, PCA "
        "(covariance eigenvectors ascending, as in the reference code), SAE clustering (TopK "
        "SAE trained on the same activations, decoder directions clustered into subspaces of "
        "the partition's sizes by K-subspaces, orthonormalised).",
        "",
        f"The screen: a test's subspaces are patched, and its Gini reported, only where "
        f"patching the whole space removes at least {ev['min_share']:.0%} of the clean metric "
        "(share = whole-space effect / clean metric, NaN when the clean metric is ≤ 0); below "
        "that the per-subspace effects are mostly noise, whose Gini is ≈ 0.41 whatever the "
        "rotation. The last columns: the sum and the largest of the NDM subspaces' effects as "
        "fractions of the whole-space effect (1 and ≈ 1 would mean additive and concentrated).",
        "",
        "| test | layer | positions | corruption | clean metric | whole-space effect | share | "
        "screen | Σ NDM / whole | max NDM / whole |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    null_tests = [row["test"] for row in ev["screen"] if not row["screened"]]
    for row in ev["screen"]:
        t, e = row["test"], ev["effects"][row["test"]]
        norm = e["methods"]["ndm"]["normalized"] if row["screened"] else None
        pos = ", ".join("TENS, END" if p == "METRIC" else p for p in e["positions"])
        lines.append(
            f"| {t} | {e['layer']} | {pos} | {e['corruption']} | "
            f"{e['clean_metric_mean']:+.3f} | {e['full_effect_mean']:+.3f} | "
            f"{float(row['whole_space_share']):.3f} | "
            + ("passes | " if norm else "no signal | ")
            + (f"{sum(norm):.2f} | {max(norm, key=abs):.2f} |" if norm else "— | — |")
        )
    for variant in ("dimension", "unnormalized", "variance") if screened else ():
        lines += [
            "",
            f"**Gini, {variant}** (value [95% CI])",
            "",
            "| test | " + " | ".join(methods) + " |",
            "|---|" + "---|" * len(methods),
        ]
        for t, by in ev["gini"].items():
            cells = ["no signal"] * len(methods) if by == "no signal" else [
                _ci(by[m][variant]) for m in methods
            ]  # fmt: skip
            lines.append(f"| {t} | " + " | ".join(cells) + " |")
        lines.append(
            "| **mean (screened)** | " + " | ".join(_ci(gm[m][variant]) for m in methods) + " |"
        )
    diffs = ev.get("gini_mean_diff", {}) if screened else {}
    if diffs:
        lines += [
            "",
            "Paired bootstrap difference of the mean dimension-normalised Gini, NDM − baseline: "
            + "; ".join(f"{m} {_ci(d['dimension'])}" for m, d in diffs.items())
            + ".",
        ]
    sm = R.get("evaluate_cpu")
    if device_run and sm and isinstance(sm["gini_mean"], dict):
        lines += [
            "",
            f"For comparison, the 60-step CPU run (n = {sm['n_prompts']} per test, its own "
            "partition): mean dimension-normalised Gini "
            + "; ".join(f"{m} {_ci(v['dimension'])}" for m, v in sm["gini_mean"].items())
            + ".",
        ]
    if (ev.get("conflict") or {}).get("corruptions"):
        c = ev["conflict"]
        lines += [
            "",
            "## Knowledge conflict routing",
            "",
            f"Layer {c['layer']} (the Qwen2.5-1.5B layer 11 of 28 at ≈ 0.4 depth), NDM "
            "subspaces, the whole sequence patched from a corrupted prompt. `true_answer`: the "
            "context states the true (parametric) answer; `other_answer`: the context states a "
            "third answer. context-rate / param-rate = share of prompts whose top-1 token is "
            "the clean prompt's context / parametric answer. (The paper's corruptions replace "
            "the entity instead; our task provides answer-side corruptions.)",
            "",
            "| patched | " + " | ".join(f"{k} ctx / param" for k in c["corruptions"]) + " |",
            "|---|" + "---|" * len(c["corruptions"]),
        ]
        first = next(iter(c["corruptions"].values()))

        def cell(r: dict) -> str:
            return f"{r['context_rate']:.2f} / {r['param_rate']:.2f}"

        lines.append(
            "| none (clean) | " + " | ".join(cell(v["clean"]) for v in c["corruptions"].values())
            + " |"
        )  # fmt: skip
        lines.append(
            "| whole space | " + " | ".join(cell(v["full"]) for v in c["corruptions"].values())
            + " |"
        )  # fmt: skip
        part = ev["partition"][str(c["layer"])]
        for s in range(len(first["subspaces"])):
            lines.append(
                f"| subspace {s} ({part[s]}d) | "
                + " | ".join(cell(v["subspaces"][s]) for v in c["corruptions"].values())
                + " |"
            )
    lines += what_changed(R)
    lines += ["How each verdict moved:", "", *verdict_moves(PREVIOUS, claims, PREVIOUS_COMMIT)]
    lines += ["", "## Preimage browser", ""]
    for b in R["browse"]:
        lines += [
            f"Query `{b['query']['context']}` at layer {b['layer']} over "
            f"{b['n_activations']:,} indexed activations (cosine, top 3 per subspace):",
            "",
        ]
        for sub in b["subspaces"]:
            hits = "; ".join(f"`{h['context']}` ({h['similarity']:.2f})" for h in sub["hits"][:3])
            lines.append(f"- subspace {sub['subspace']} ({sub['dim']}d): {hits}")
        lines.append("")
    toy_cfg = toy["ndm_config"]
    lines += [
        "## Honest notes",
        "",
        f"- Toy: this run (read-out noise 0.02, units of {toy_cfg['unit_size']}, "
        f"{toy['steps']} steps, merges every {toy_cfg['merge_interval']} from "
        f"{toy_cfg['merge_start']}) "
        + (
            "stopped merging at the ground-truth split"
            + (
                " (the next merge round found no pair above the threshold). "
                if toy["converged"]
                else " (by running out of steps, not by convergence). "
            )
            if toy["right_number_of_subspaces"]
            else f"did not stop at the ground-truth split (ended at {toy['partition']}). "
        )
        + "The core engineer's runs (docs/ndm.md, tests/subspaces) found the merge rule "
        "fragile: without read-out noise KSG on the toy's exact zeros and rays exceeds the "
        "0.04 threshold after a fraction of a degree of leakage, so merging continues past "
        "the right partition, and starting from 1-dimensional units merged everything into "
        "one subspace; a `min_subspaces` guard (the authors' fork's fix) is available.",
        "- Tests without signal: "
        + (
            ", ".join(null_tests)
            + f" remove less than {ev['min_share']:.0%} of the clean metric when the whole "
            "space is patched at the mapped layer, so they are reported as no signal (no Gini)."
            if null_tests
            else "none."
        ),
        "- Greater-than on SmolLM2 uses the digit-wise adaptation of the task (docs/tasks.md); "
        "the patched positions are the two positions its metric reads (TENS, END).",
        "- S-inhibition with name corruption uses the paper's S_name swap (S1, S2 → IO; "
        "IO → S), built from the clean prompts.",
        "",
    ]
    return "\n".join(lines)


def what_changed(R: dict[str, Any]) -> list[str]:
    """The "what changed and why" section: the protocol changes since the previous
    claims document, with this run's settings."""
    ev, s = R["evaluate"], R["settings"]
    sae = next((v["sae"] for v in ev["baselines"].values() if "sae" in v), None)
    sae_line = (
        f"trained until an epoch improves the FVU by less than {sae['tol']:.0%} (at most "
        f"{s['protocol']['sae_epochs']} epochs); "
        f"here {sae['epochs']} epochs, final FVU {sae['fvu_history'][-1]:.3f}, "
        + ("converged" if sae["converged"] else "stopped at the epoch limit before the plateau")
        if sae and "fvu_history" in sae
        else "not run"
    )
    return [
        "",
        "## What changed and why",
        "",
        "- **Screen.** Every test is first run with the whole space patched; only where that "
        f"removes ≥ {ev['min_share']:.0%} of the clean metric are its subspaces patched and "
        "its Gini reported, otherwise it is reported as no signal. Earlier runs reported a "
        "Gini for every test, including tests whose whole-space effect was ≈ 0 on SmolLM2 "
        "(previous_token −0.018 to −0.005 at every layer, duplicate_token ≈ 0, "
        "s_inhibition_name 3.6 % of clean): a Gini over pure noise is ≈ 0.41, exactly where "
        "the baselines sit, so those numbers could not separate NDM from them.",
        "- **Tests that transfer to RoPE.** SmolLM2 encodes positions by rotary embeddings, "
        "so the IOI position-swap tests (previous_token, duplicate_token, "
        "s_inhibition_position) look for an absolute-position subspace that does not exist. "
        "They are replaced by relative tests on repeated random word sequences: "
        "previous_token_relative (the first-copy token before the continuation is swapped, "
        "patched at A+1) and induction (the first copy resampled, patched at END).",
        f"- **Restarts.** {s['protocol']['restarts']} training run(s) per layer, the "
        "finest converged partition kept: on a synthetic rotated partition a single run can "
        "merge whole groups after settling with dimensions swapped between them, and merges "
        "cannot be undone. The claims table reports the recovery rate over seeds on two "
        "planted rotated partitions with one run and with restarts.",
        f"- **SAE baseline from a converged SAE**: {sae_line}. Earlier the SAE had one epoch.",
        "",
    ]


#: The paper's mean dimension-normalised Gini of NDM over its five tests.
PAPER_GINI_NDM = 0.71


def gini_verdict(ev: dict[str, Any], tr: dict[str, Any]) -> tuple[str, str]:
    """The verdict on NDM's mean Gini against the baselines, and its reason.

    Not tested when no test passes the screen or when a screened test's layer was not trained
    to the stopping rule (a partition mid-training is not the method's answer); otherwise
    reproduced when NDM is significantly above every baseline (paired bootstrap CI of the
    difference above 0) at a Gini within 0.1 of the paper's, partly when above some or all of
    them, not reproduced when above none.
    """
    screened = [row["test"] for row in ev["screen"] if row["screened"]]
    if not screened:
        return "not tested", "no patching test passes the whole-space-effect screen"
    layers = sorted({int(ev["layers"][t]) for t in screened})
    open_layers = [layer for layer in layers if not tr["results"][str(layer)]["converged"]]
    if open_layers:
        steps = tr["results"][str(open_layers[0])]["steps"]
        return "not tested", (
            f"training not converged at layer(s) {open_layers}: the stopping rule (no pair "
            f"above the MI threshold) was not reached in {steps} steps"
        )
    diffs = ev["gini_mean_diff"]
    above = sorted(m for m, d in diffs.items() if d["dimension"]["ci"][0] > 0)
    below = sorted(set(diffs) - set(above))
    value = ev["gini_mean"]["ndm"]["dimension"]["value"]
    if not above:
        return "not reproduced", f"NDM is not significantly above any baseline ({below})"
    if below:
        return "partly", f"NDM is significantly above {above}, not above {below}"
    if value >= PAPER_GINI_NDM - 0.1:
        return "reproduced", f"NDM {value:.2f} is significantly above every baseline"
    return "partly", (
        f"NDM is significantly above every baseline but {value:.2f} is far below the paper's "
        f"{PAPER_GINI_NDM}"
    )


def tests_block(ev: dict[str, Any]) -> list[dict[str, Any]]:
    """Per patching test, the run's screen row (``whole_space_share``, ``screened``, see
    :class:`structlens.ndm.stages.Screen`) with the clean metric, the whole-space effect
    and the dimension-normalised Gini per method (``"no signal"`` for an unscreened test)."""
    rows = []
    for row in ev["screen"]:
        e, gini = ev["effects"][row["test"]], ev["gini"][row["test"]]
        share = float(row["whole_space_share"])  # NaN is written "nan" in the stage JSON
        rows.append(
            row
            | {
                "whole_space_share": share if math.isfinite(share) else None,
                "clean_metric": e["clean_metric_mean"],
                "whole_space_effect": e["full_effect_mean"],
                "gini_dimension": gini
                if gini == "no signal"
                else {m: v["dimension"] for m, v in gini.items()},
            }
        )
    return rows


def write(R: dict[str, Any], doc_dir: str | Path) -> tuple[Path, Path]:
    """Write ``ndm.md`` and ``ndm.json`` into ``doc_dir``."""
    from structlens.replication import command

    doc_dir = Path(doc_dir)
    source = command(METHOD, R["settings"]["profile"])
    found: list[Claim] = []
    md = write_text(doc_dir / f"{METHOD}.md", render(R, source, found))
    blocks = {
        "tests": tests_block(R["evaluate"]),
        "screen": {"min_whole_space_share": R["evaluate"]["min_share"], "applied_to_gini": True},
        "settings": {k: R["settings"][k] for k in ("model", "layers", "protocol")}
        | {"device_run": R["device_run"]},
    }
    doc = ClaimsDocument(METHOD, source, tuple(found), blocks)
    return md, doc.write(doc_dir / f"{METHOD}.json")

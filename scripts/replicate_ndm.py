"""Reproduce the NDM paper's claims on SmolLM2-135M-Instruct and write docs/replication/ndm.md.

    .venv/bin/python scripts/replicate_ndm.py            # everything (cached stages are reused)
    .venv/bin/python scripts/replicate_ndm.py --render   # only rewrite the markdown

    .venv/bin/python scripts/replicate_ndm.py --device cuda   # converged training on a GPU

Stages (each a ``structlens ndm`` command run as a subprocess, single-threaded, several in
parallel because this 2-core machine is shared and oversubscribed):

1. training at layers 12, 17, 22, 24 (the paper's GPT-2 layers 4, 6, 8, 9 at the same relative
   depth).  The CPU stage (``ndm train`` once per layer, then a collecting run that reuses the
   checkpoints) is a 60-step smoke run into ``results/ndm/train``; ``--device cuda`` packs the
   same activations and trains them to the paper's stopping rule with
   ``scripts/ndm_device_train.py`` into ``results/ndm/train-device``.  Later stages use the
   device run when it exists (it can be trained on a GPU host and copied here);
2. ``ndm evaluate`` once per patching test, then one run that reuses the cached patch runs and
   adds the Gini summary, knowledge conflict and the toy recovery; a second toy variant with
   the ``min_subspaces`` guard runs alongside;
3. ``ndm browse`` for two queries;
4. the markdown, from the JSON files only.

Results go under ``results/ndm/`` (git-ignored); the markdown to ``docs/replication/ndm.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "ndm"
CPU_TRAIN = RESULTS / "train"
DEVICE_TRAIN = RESULTS / "train-device"
DOC = ROOT / "docs" / "replication" / "ndm.md"
LAYERS = (12, 17, 22, 24)
TESTS = (
    "previous_token",
    "duplicate_token",
    "s_inhibition_position",
    "s_inhibition_name",
    "greater_than",
)
TRAIN_ARGS = [
    "--capture-layers", ",".join(map(str, LAYERS)), "--corpus-prompts", "150",
    "--task-prompts", "40", "--unit-size", "48", "--steps", "60", "--bank-size", "8192",
    "--batch-size", "128", "--refresh-interval", "20", "--lr", "3e-3", "--merge-start", "20",
    "--merge-interval", "20", "--merge-threshold", "0.04", "--mi-samples", "2048",
]  # fmt: skip
EVAL_ARGS = [
    "-n", "48", "--batch-size", "16", "--n-boot", "1000", "--sae-width", "512", "--sae-k", "32",
    "--sae-epochs", "1", "--conflict-n", "32",
]  # fmt: skip
DEVICE_ROWS = 12_416  # activations per layer sent to the device (float16, under 64 MiB)
QUERIES = [
    ("When Mary and John went to the store, John gave a drink to", -1),
    ("It is a truth universally acknowledged, that a single man in possession", -1),
]
PAPER_GINI = {"ndm": 0.71, "baselines": (0.21, 0.38)}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from structlens.cli.ndm import app; app()", *args]


def _run_parallel(commands: list[tuple[list[str], Path]]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs = []
    for cmd, log in commands:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as fh:
            procs.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=fh), log))
    failed = [str(log) for p, log in procs if p.wait() != 0]
    if failed:
        raise SystemExit(f"stage failed; see {failed}")


def train() -> None:
    ckpt = RESULTS / "train" / "checkpoints"
    _run_parallel(
        [
            (
                _cli("train", "--layers", str(layer), *TRAIN_ARGS, "--checkpoints", str(ckpt),
                     "--out", str(RESULTS / f"train-L{layer}"), "-q"),
                RESULTS / "logs" / f"train-L{layer}.log",
            )
            for layer in LAYERS
            # a finished per-layer run keeps its JSON (and its honest timing)
            if not (RESULTS / f"train-L{layer}" / "ndm_train.json").exists()
        ]
    )  # fmt: skip
    _run_parallel(
        [
            (
                _cli("train", "--layers", ",".join(map(str, LAYERS)), *TRAIN_ARGS,
                     "--checkpoints", str(ckpt), "--out", str(RESULTS / "train"), "-q"),
                RESULTS / "logs" / "train.log",
            )
        ]
    )  # fmt: skip


def train_device(device: str) -> None:
    if (DEVICE_TRAIN / "ndm_train.json").exists():
        return
    script = str(ROOT / "scripts" / "ndm_device_train.py")
    packed = RESULTS / "device-activations.safetensors"
    layers = ",".join(map(str, LAYERS))
    subprocess.run(
        [sys.executable, script, "pack", str(CPU_TRAIN), "--layers", layers,
         "--rows", str(DEVICE_ROWS), "--out", str(packed)],
        cwd=ROOT, check=True,
    )  # fmt: skip
    subprocess.run(
        [sys.executable, script, "train", str(packed), "--device", device, "--seconds", "1e9",
         "--out", str(DEVICE_TRAIN)],
        cwd=ROOT, check=True,
    )  # fmt: skip


def train_dir() -> Path:
    return DEVICE_TRAIN if (DEVICE_TRAIN / "ndm_train.json").exists() else CPU_TRAIN


def eval_dir() -> Path:
    return RESULTS / ("eval-device" if train_dir() == DEVICE_TRAIN else "eval")


def evaluate() -> None:
    common = ["--train", str(train_dir()), *EVAL_ARGS, "--out", str(eval_dir())]
    toy2 = [
        sys.executable,
        "-c",
        "import json,sys; from structlens.ndm import NDMConfig, ToyConfig; "
        "from structlens.ndm.pipeline import toy_recovery; "
        "from structlens.results import atomic_write_json; "
        "c = NDMConfig(unit_size=2, lr=1e-3, max_steps=3000, bank_size=8192, "
        "refresh_interval=50, merge_start=1000, merge_interval=500, mi_samples=2000, "
        "min_subspaces=2, seed=0); "
        "atomic_write_json(sys.argv[1], toy_recovery(ToyConfig(seed=0), c, seed=0))",
        str(RESULTS / "toy_min_subspaces_2.json"),
    ]
    jobs = [
        (
            _cli("evaluate", "--tests", t, "--no-conflict", "--no-toy", *common, "-q"),
            RESULTS / "logs" / f"eval-{t}.log",
        )
        for t in TESTS
    ]
    if not (RESULTS / "toy_min_subspaces_2.json").exists():
        jobs.append((toy2, RESULTS / "logs" / "toy-min2.log"))
    _run_parallel(jobs)
    _run_parallel([(_cli("evaluate", *common), RESULTS / "logs" / "eval.log")])


def _browse_one(i: int, text: str, pos: int) -> None:
    _run_parallel(
        [
            (
                _cli("browse", "--train", str(train_dir()), "--prompt", text,
                     "--position", str(pos), "--k", "5", "--out", str(RESULTS / f"browse-{i}"),
                     "-q"),
                RESULTS / "logs" / f"browse-{i}.log",
            )
        ]
    )  # fmt: skip


def browse() -> None:
    # sequential: the first query captures the whole corpus once, the second reuses that store
    for i, (text, pos) in enumerate(QUERIES):
        _browse_one(i, text, pos)


def _ci(entry: dict) -> str:
    return f"{entry['value']:.2f} [{entry['ci'][0]:.2f}, {entry['ci'][1]:.2f}]"


def render() -> str:
    tdir = train_dir()
    tr = json.loads((tdir / "ndm_train.json").read_text())
    ev = json.loads((eval_dir() / "ndm_evaluate.json").read_text())
    toy2_path = RESULTS / "toy_min_subspaces_2.json"
    toy2 = json.loads(toy2_path.read_text()) if toy2_path.exists() else None
    per_layer = {}
    for layer in LAYERS:
        p = RESULTS / f"train-L{layer}" / "ndm_train.json"
        if p.exists():
            per_layer[layer] = json.loads(p.read_text())["results"][str(layer)]
    methods = ev["methods"]
    cfg = tr["config"]
    device_run = tdir == DEVICE_TRAIN
    lines = [
        "# NDM replication on SmolLM2-135M-Instruct",
        "",
        "Produced by `.venv/bin/python scripts/replicate_ndm.py` (stages cached under "
        "`results/ndm/`; `--render` only rewrites this file). Paper: Huang & Hahn, "
        "*Decomposing Representation Space into Interpretable Subspaces with Unsupervised "
        "Learning* (ICLR 2026). Evaluation: 2 shared CPU cores (load average ≈ 10–14 from "
        "other jobs). "
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
    ndm_dim = gm["ndm"]["dimension"]
    base_dims = {m: gm[m]["dimension"] for m in methods if m != "ndm"}
    best_base = max(base_dims.values(), key=lambda e: e["value"])
    diffs = ev.get("gini_mean_diff", {})
    above = [m for m, d in diffs.items() if d["dimension"]["ci"][0] > 0]
    if len(above) == len(diffs) and diffs:
        verdict_gini = "reproduced" if ndm_dim["value"] >= 0.6 else "partly: NDM above every "
        verdict_gini += "" if ndm_dim["value"] >= 0.6 else "baseline, far below 0.71"
    elif above:
        verdict_gini = (
            f"partly: NDM significantly above {len(above)} of {len(diffs)} baselines "
            f"({', '.join(sorted(above))}), not above "
            + ", ".join(sorted(set(diffs) - set(above)))
            + "; far below 0.71"
        )
    else:
        verdict_gini = "not reproduced"
    toy = ev["toy"]
    lines += [
        f"| mean Gini (dimension-normalised) over 5 tests: NDM 0.71 vs baselines 0.21–0.38 "
        f"(GPT-2 small) | NDM {_ci(ndm_dim)}; best baseline {_ci(best_base)} "
        f"(95% bootstrap CIs over prompts) | {verdict_gini} |",
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
    if ev.get("conflict"):
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
    lines.append(
        "| preimage browser over ≥ 100,000 activations (authors: ≈ 1M) | "
        + (
            f"{json.loads(p.read_text())['n_activations']:,} activations indexed"
            if (p := RESULTS / "browse-0" / "ndm_browse.json").exists()
            else "not run"
        )
        + " (training activations of the layer plus the rest of the bundled corpus) | "
        + (
            "reproduced"
            if p.exists() and json.loads(p.read_text())["n_activations"] >= 100_000
            else "partly"
        )
        + " |"
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
        f"activations (bundled Austen corpus: {tr['data']['corpus_prompts']} windows of 128 "
        f"tokens; {tr['data']['task_prompts']} prompts each of IOI, greater-than, knowledge "
        "conflict; first position skipped) |",
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
            f"Trained with `scripts/ndm_device_train.py` on {tr.get('device', 'a GPU')} from "
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
    from structlens.cli.ndm import load_rotation

    for layer in LAYERS:
        r = tr["results"][str(layer)]
        sec = (per_layer.get(layer, {}) if tdir == CPU_TRAIN else {}).get("seconds", r["seconds"])
        R, _ = load_rotation(tdir / f"R-L{layer}.safetensors")
        mis = ", ".join(f"{h['mi'][0]:.3f}" for h in r["merge_history"])
        lines.append(
            f"| {layer} | {r['partition']} | {r['steps']} | {len(r['merge_history'])} ({mis}) | "
            f"{sec:.0f} | {float((R**2).max(0).mean()):.2f} |"
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
        "The last columns: the whole-space effect, and the sum and the largest of the NDM "
        "subspaces' effects as fractions of it (1 and ≈ 1 would mean additive and "
        "concentrated).",
        "",
        "| test | layer | positions | corruption | clean metric | whole-space effect | "
        "Σ NDM / whole | max NDM / whole |",
        "|---|---|---|---|---|---|---|---|",
    ]
    null_tests = []
    for t, e in ev["effects"].items():
        norm = e["methods"]["ndm"]["normalized"]
        pos = ", ".join("TENS, END" if p == "METRIC" else p for p in e["positions"])
        lines.append(
            f"| {t} | {e['layer']} | {pos} | {e['corruption']} | "
            f"{e['clean_metric_mean']:+.3f} | {e['full_effect_mean']:+.3f} | "
            f"{sum(norm):.2f} | {max(norm, key=abs):.2f} |"
        )
        if abs(e["full_effect_mean"]) < 0.05 * abs(e["clean_metric_mean"]):
            null_tests.append(t)
    for variant in ("dimension", "unnormalized", "variance"):
        lines += [
            "",
            f"**Gini, {variant}** (value [95% CI])",
            "",
            "| test | " + " | ".join(methods) + " |",
            "|---|" + "---|" * len(methods),
        ]
        for t in ev["gini"]:
            lines.append(
                f"| {t} | " + " | ".join(_ci(ev["gini"][t][m][variant]) for m in methods) + " |"
            )
        lines.append("| **mean** | " + " | ".join(_ci(gm[m][variant]) for m in methods) + " |")
    if diffs:
        lines += [
            "",
            "Paired bootstrap difference of the mean dimension-normalised Gini, NDM − baseline: "
            + "; ".join(f"{m} {_ci(d['dimension'])}" for m, d in diffs.items())
            + ".",
        ]
    smoke = RESULTS / "eval" / "ndm_evaluate.json"
    if device_run and smoke.exists():
        sm = json.loads(smoke.read_text())
        lines += [
            "",
            f"For comparison, the 60-step CPU run (n = {sm['n_prompts']} per test, its own "
            "partition): mean dimension-normalised Gini "
            + "; ".join(f"{m} {_ci(v['dimension'])}" for m, v in sm["gini_mean"].items())
            + ".",
        ]
    if ev.get("conflict"):
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
    lines += ["", "## Preimage browser", ""]
    for i in range(len(QUERIES)):
        p = RESULTS / f"browse-{i}" / "ndm_browse.json"
        if not p.exists():
            continue
        b = json.loads(p.read_text())
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
        "- Null tests: "
        + (
            ", ".join(null_tests)
            + " have a whole-space effect below 5 % of the clean metric on SmolLM2 at the "
            "mapped layer, so their Gini values rank noise (wide CIs). For previous_token this "
            "suggests SmolLM2's heads that read previous-token information at IO+1/S+1 act "
            "before layer 12."
            if null_tests
            else "none."
        ),
        "- Large whole-space effects with tiny per-subspace effects (duplicate_token, "
        "s_inhibition_position: the subspace effects sum to a small fraction of the whole) "
        "mean the information is carried redundantly across subspaces of this partition, "
        "for NDM and for every baseline alike: no single subspace of this partition isolates "
        "it.",
        "- Greater-than on SmolLM2 uses the digit-wise adaptation of the task (docs/tasks.md); "
        "the patched positions are the two positions its metric reads (TENS, END).",
        "- S-inhibition with name corruption uses the paper's S_name swap (S1, S2 → IO; "
        "IO → S), built from the clean prompts.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--render", action="store_true", help="only rewrite the markdown")
    ap.add_argument(
        "--device", default="cpu", help="'cuda': converged training on a GPU (see module doc)"
    )
    args = ap.parse_args()
    t0 = time.time()
    if not args.render:
        train()
        if args.device != "cpu":
            train_device(args.device)
        evaluate()
        browse()
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(render())
    print(f"wrote {DOC} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()

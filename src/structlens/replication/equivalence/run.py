"""Rebuild docs/replication/equivalence.md: the interpretive-equivalence scenario table.

    python -m structlens.replication equivalence [--profile cpu|smoke]

Trains the small byte-level LMs (seeds, depth), fine-tunes SmolLM2-135M-Instruct twice, runs
the stages of :mod:`structlens.equivalence.stages` on every scenario pair (the sanity rows as
:func:`~structlens.equivalence.stages.sanity`) under the protocol of the pair's model family
(:data:`structlens.equivalence.protocol.PROFILES`) and writes the doc.  Every step is a cached
stage: small LMs and fine-tunes keyed by their settings (and the base model's fingerprint),
comparisons' model runs by the protocol, the probe texts and both models' fingerprints.
CPU-only sizes; see the doc.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from structlens.equivalence.compare import ComparisonResult
from structlens.equivalence.probes import Probe
from structlens.equivalence.protocol import PROFILES as PROTOCOLS
from structlens.equivalence.protocol import EquivalenceProtocol
from structlens.equivalence.stages import ModelComparison, SanityCheck
from structlens.equivalence.train_small import SmallLMConfig
from structlens.replication.stage import Record, Stage, StageCache, data_digest

METHOD = "equivalence"

# Trained to convergence: at most 2000 steps of 8 × 64 bytes (~2 passes over the training
# bytes), stopped once three held-out evaluations in a row (every 100 steps, on the corpus'
# last tenth) improved by < 0.5 % (SmallLMConfig's stopping rule).
_CONVERGED: dict[str, Any] = dict(steps=2000, eval_every=100, converge_tol=0.005, patience=3)
SMALL = {
    "L4-s0": SmallLMConfig(n_layers=4, seed=0, **_CONVERGED),
    "L4-s1": SmallLMConfig(n_layers=4, seed=1, **_CONVERGED),
    "L4-s2": SmallLMConfig(n_layers=4, seed=2, **_CONVERGED),
    "L2-s0": SmallLMConfig(n_layers=2, seed=0, **_CONVERGED),
    "L8-s0": SmallLMConfig(n_layers=8, seed=0, **_CONVERGED),
    # an encoder–decoder on the same bytes: T5, 2 encoder + 4 decoder layers, run as an LM
    # over its decoder with an empty source (SmallLMConfig.encoder_layers)
    "ED-s0": SmallLMConfig(n_layers=4, encoder_layers=2, seed=0, **_CONVERGED),
}
# A few dozen steps of narrow models: enough to exercise every stage in seconds.
SMALL_SMOKE = {
    n: dataclasses.replace(c, d_model=32, d_mlp=64, n_heads=2, steps=8, seq_len=32, eval_every=4)
    for n, c in SMALL.items()
}
FINETUNES = {
    # name: (task, answer key): the probe's own task (similar) and factual recall (dissimilar)
    "smollm2-ft-ioi": ("ioi", "IO"),
    "smollm2-ft-facts": ("factual_recall", "answer"),
}
# Fine-tuned until the behaviour has changed: AdamW on layers 15-29 until the mean KL(base ‖
# tuned) at the end of held-out prompts of the same task reaches FT_TARGET_KL nats (checked
# every 10 steps), at most 300 steps.  FT_PROMPTS task prompts (seed 1; the IOI probe uses
# seed 0): the first FT_TRAIN train, the rest are held out (factual recall has 85 facts).
FT_TARGET_KL = 0.5
FT_PROMPTS, FT_TRAIN = 80, 56
FT_SETTINGS: dict[str, Any] = dict(
    steps=300, lr=2e-4, batch_size=8, train_layers=list(range(15, 30)), eval_every=10, seed=0
)

# The SmolLM2 rows run the "paper-subset" protocol: 96 IOI prompts, half fit, half held out;
# 48 fit prompts of ~16 tokens give ~700 token rows, more than d = 576, as a whole-layer map
# needs (equivalence.layer_map).
SMOL_PROTOCOL = PROTOCOLS["paper-subset"]
ENC_PROTOCOL = PROTOCOLS["paper-sentence"]

PAPER = {
    "sanity": ("1 (by construction)", 1.0, 1.0),
    "seeds": ("≈ 0.85", 0.85, 0.85),
    "depth": ("≈ 0.6 (12 vs 24 layers)", 0.6, 0.6),
    "finetune": ("0.4–0.9", 0.4, 0.9),
    "encoder-decoder": ("≈ 0.3", 0.3, 0.3),
    # MiniLM is an encoder trained on other data: the summary's row is about encoder–decoders
    "encoder-other-data": ("≈ 0.3 (for enc–dec vs dec)", 0.3, 0.3),
}


@dataclasses.dataclass
class Scenario:
    """One row: ``build(rep)`` gives ``(model_a, model_b, protocol)``; a sanity row's
    ``model_b`` is ``None`` (the stage builds the rotated copy)."""

    name: str
    group: str
    build: Callable[[EquivalenceReplication], tuple]
    setting: str


def _sanity_tiny(rep: EquivalenceReplication) -> tuple:
    from structlens.models import load_model

    # the tiny model at the protocol's seed: what `analyze` and `equiv sanity` load
    protocol = rep.s["small_protocol"]
    return load_model("tiny-llama", seed=protocol.seed), None, protocol


def _sanity_smol(rep: EquivalenceReplication) -> tuple:
    from structlens.models import load_model

    return load_model("smollm2-135m"), None, SMOL_PROTOCOL


def _small_pair(x: str, y: str) -> Callable[[EquivalenceReplication], tuple]:
    def build(rep: EquivalenceReplication) -> tuple:
        return rep.small_model(x), rep.small_model(y), rep.s["small_protocol"]

    return build


def _ft_pair(name: str) -> Callable[[EquivalenceReplication], tuple]:
    def build(rep: EquivalenceReplication) -> tuple:
        from structlens.models import load_model

        b = rep.finetuned(name)
        return load_model("smollm2-135m"), b, SMOL_PROTOCOL

    return build


def _enc_dec(rep: EquivalenceReplication) -> tuple:
    from structlens.models import load_model

    return load_model("minilm-l6"), load_model("smollm2-135m"), ENC_PROTOCOL


SCENARIOS = [
    Scenario("sanity-tiny", "sanity", _sanity_tiny, "tiny-llama vs rotated+permuted copy, corpus"),
    Scenario("sanity-smollm2", "sanity", _sanity_smol, "SmolLM2 vs rotated+permuted copy, IOI"),
    Scenario(
        "enc-dec-same-data",
        "encoder-decoder",
        _small_pair("ED-s0", "L4-s0"),
        "T5 enc–dec (2 + 4 layers) vs 4L decoder, same bytes",
    ),
    Scenario("enc-dec", "encoder-other-data", _enc_dec, "MiniLM-L6 vs SmolLM2, sentences"),
    Scenario("seeds-s0-s1", "seeds", _small_pair("L4-s0", "L4-s1"), "4L seed 0 vs 1"),
    Scenario("seeds-s0-s2", "seeds", _small_pair("L4-s0", "L4-s2"), "4L seed 0 vs 2"),
    Scenario("seeds-s1-s2", "seeds", _small_pair("L4-s1", "L4-s2"), "4L seed 1 vs 2"),
    Scenario("depth-2-4", "depth", _small_pair("L2-s0", "L4-s0"), "2L vs 4L"),
    Scenario("depth-4-8", "depth", _small_pair("L4-s0", "L8-s0"), "4L vs 8L"),
    Scenario("depth-2-8", "depth", _small_pair("L2-s0", "L8-s0"), "2L vs 8L"),
    Scenario("ft-ioi", "finetune", _ft_pair("smollm2-ft-ioi"), "SmolLM2 vs IOI fine-tune"),
    Scenario("ft-facts", "finetune", _ft_pair("smollm2-ft-facts"), "SmolLM2 vs facts fine-tune"),
]

CPU: dict[str, Any] = {
    "profile": "cpu",
    "small": SMALL,
    "small_protocol": PROTOCOLS["paper"],
    # MiniLM vs SmolLM2 (an encoder on other data, sentence similarity only) is superseded by
    # the same-data encoder–decoder row; `only=["enc-dec"]` still runs it.
    "scenarios": [sc.name for sc in SCENARIOS if sc.name != "enc-dec"],
    "fold_check": True,
}
GPU = CPU | {"profile": "gpu"}  # the CPU sizes; nothing here needs an accelerator
SMOKE = CPU | {
    "profile": "smoke",
    "small": SMALL_SMOKE,
    "small_protocol": PROTOCOLS["smoke"],
    "scenarios": ["sanity-tiny", "seeds-s0-s1"],
    "fold_check": False,
}
PROFILES = {"cpu": CPU, "gpu": GPU, "smoke": SMOKE}


def _small_stage(config: SmallLMConfig) -> Stage:
    return Stage("small-lm", config.key())


def model_dirs(profile: str = "cpu", out: str | Path | None = None) -> dict[str, Path | None]:
    """The small LMs and fine-tunes this replication has trained (``None`` where not yet),
    for the Koopman replication's universality section.  Trains and creates nothing."""
    from structlens.replication import repo_root

    out = Path(out) if out is not None else repo_root() / "results" / "replication" / METHOD
    out = out / profile if out.name == METHOD else out
    cache = StageCache(out / "stages")
    found: dict[str, Path | None] = {}
    for name, cfg in PROFILES[profile]["small"].items():
        path = cache.path(_small_stage(cfg)) / "model"
        found[name] = path if (path / "config.json").exists() else None
    for name in FINETUNES:
        hits = sorted((out / "stages" / "finetune").glob(f"*/{name}/config.json"))
        found[name] = hits[0].parent if hits else None
    return found


class EquivalenceReplication:
    """Models, fine-tunes and comparisons of one profile, each a cached stage."""

    def __init__(self, s: dict[str, Any], out: Path) -> None:
        self.s, self.out = s, out
        self.cache = StageCache(out / "stages")
        self.small_info: dict[str, dict[str, Any]] = {}
        self.ft_info: dict[str, dict[str, Any]] = {}
        self.seconds: dict[str, float] = {}
        self.protocols: dict[str, EquivalenceProtocol] = {}
        self.sanity: dict[str, SanityCheck] = {}

    def small_model(self, name: str) -> Any:
        from structlens.equivalence.train_small import train_small_lm
        from structlens.models import load_model

        stage = _small_stage(self.s["small"][name])

        def compute(folder: Path) -> Record:
            path = train_small_lm(self.s["small"][name], folder / "model")
            return Record.of(json.loads((path / "train.json").read_text()))

        self.small_info[name] = self.cache.run(stage, Record, compute).data
        return load_model(str(self.cache.path(stage) / "model"))

    def finetuned(self, name: str) -> Any:
        from structlens.data.tasks import make_task
        from structlens.equivalence.scenarios import finetune_on_task
        from structlens.models import load_model

        base = load_model("smollm2-135m")
        task_name, key = FINETUNES[name]
        stage = Stage(
            "finetune",
            {"name": name, "task": task_name, "answer": key, "n": FT_PROMPTS, "n_train": FT_TRAIN,
             "seed": 1, "target_kl": FT_TARGET_KL, **FT_SETTINGS},
            model=base.fingerprint(),
        )  # fmt: skip

        def compute(folder: Path) -> Record:
            task = make_task(task_name, base.tokenizer, n=FT_PROMPTS, seed=1)
            clean, answers = task.clean, task.answers[key]
            t0 = time.perf_counter()
            run = finetune_on_task(
                base, clean[:FT_TRAIN], answers[:FT_TRAIN], held_out=clean[FT_TRAIN:],
                target_kl=FT_TARGET_KL, **FT_SETTINGS,
            )  # fmt: skip
            hf: Any = run.model.hf
            hf.save_pretrained(folder / name, safe_serialization=True)
            base.tokenizer.save_pretrained(folder / name)
            info = dict(task=task_name, n_prompts=len(task), n_train=FT_TRAIN, **FT_SETTINGS)
            info |= dict(losses=run.losses, held_out_kl=run.held_out_kl, target_kl=FT_TARGET_KL,
                         steps_run=run.steps_run, reached=run.reached)  # fmt: skip
            info["seconds"] = time.perf_counter() - t0
            return Record.of(info)

        self.ft_info[name] = self.cache.run(stage, Record, compute).data
        return load_model(str(self.cache.path(stage) / name))

    def fold_check(self) -> dict[str, Any]:
        """SmolLM2 against its rotated, head-permuted copy on one IOI-style prompt: logits,
        hook_z of the moved heads and the rotated residual stream."""
        from structlens.equivalence.scenarios import rotate_and_permute
        from structlens.interventions import run_with_cache
        from structlens.models import load_model

        a = load_model("smollm2-135m")
        prompt = "When Mary and John went to the store, John gave a drink to"
        stage = Stage("fold-check", {"seed": 3, "prompt": prompt}, model=a.fingerprint())

        def compute(_: Path) -> Record:
            b, head_map, r = rotate_and_permute(a, seed=3)
            ids, mask = a.tokenize([prompt])
            sites = ["blocks.12.attn.hook_z", "blocks.12.hook_resid_post"]
            la, ca = run_with_cache(a, ids, mask, sites)
            lb, cb = run_with_cache(b, ids, mask, sites)
            za, zb = ca[sites[0]], cb[sites[0]]
            return Record.of(
                {
                    "max_abs_logit_diff": float((la - lb).abs().max()),
                    "max_abs_logit": float(la.abs().max()),
                    "top1_unchanged": bool((la.argmax(-1) == lb.argmax(-1)).all()),
                    "max_abs_z_diff_layer12": max(
                        float((za[:, :, h] - zb[:, :, head_map[12][h]]).abs().max())
                        for h in range(a.n_heads)
                    ),
                    "max_abs_resid_rotation_error_layer12": float(
                        (ca[sites[1]] @ r - cb[sites[1]]).abs().max()
                    ),
                    "max_abs_resid_layer12": float(ca[sites[1]].abs().max()),
                }
            )

        return self.cache.run(stage, Record, compute).data

    def _measure(self, name: str) -> Callable[..., ComparisonResult]:
        """The stages' model runs of scenario ``name``, each a cached stage keyed by the
        protocol, the probe texts and both models' fingerprints."""
        from structlens.equivalence.stages import measure

        def run(protocol: EquivalenceProtocol, a: Any, b: Any, probe: Probe) -> ComparisonResult:
            stage = Stage(
                "compare",
                {"scenario": name, "protocol": protocol.to_json()},
                model=f"{a.fingerprint()}:{b.fingerprint()}",
                data=data_digest(probe.texts),
            )

            def compute(folder: Path) -> ComparisonResult:
                t0 = time.perf_counter()
                res = measure(protocol, a, b, probe)
                (folder / "seconds.txt").write_text(f"{time.perf_counter() - t0:.0f}")
                return res

            res = self.cache.run(stage, ComparisonResult, compute)
            secs = self.cache.path(stage) / "seconds.txt"
            if secs.exists():
                self.seconds[name] = float(secs.read_text())
            return res

        return run

    def scenario(self, sc: Scenario) -> ModelComparison:
        """One row: the comparison stage (the sanity stage for the sanity rows, whose checks
        are kept in ``self.sanity``) under the row's protocol."""
        from structlens.equivalence.stages import compare_models, sanity

        a, b, protocol = sc.build(self)
        self.protocols[sc.name] = protocol
        if b is None:
            check = self.sanity[sc.name] = sanity(protocol, a, measure=self._measure(sc.name))
            return check.comparison
        return compare_models(protocol, a, b, measure=self._measure(sc.name))


def run(
    profile: str = "cpu",
    out: str | Path | None = None,
    doc_dir: str | Path | None = None,
    device: str = "cpu",
    only: list[str] | None = None,
) -> tuple[dict[str, ModelComparison], StageCache]:
    """Run (or resume) the scenarios of ``profile`` (``only``: a subset, in that order) and
    write the markdown and claims JSON."""
    from structlens.replication import default_paths
    from structlens.replication.equivalence.render import write

    s = PROFILES[profile]
    names = only if only is not None else s["scenarios"]
    unknown = set(names) - {sc.name for sc in SCENARIOS}
    if unknown:
        raise ValueError(
            f"unknown scenario(s) {sorted(unknown)}; choose from {[x.name for x in SCENARIOS]}"
        )
    out, doc_dir = default_paths(METHOD, profile, out, doc_dir)
    rep = EquivalenceReplication(s, out)
    fold = rep.fold_check() if s["fold_check"] else None
    by_name = {sc.name: sc for sc in SCENARIOS}
    results = {}
    for name in names:
        t0 = time.perf_counter()
        r = results[name] = rep.scenario(by_name[name])
        print(
            f"{name}: score {r.heads.score:.3f} {list(r.heads.score_ci)} null "
            f"{r.heads.null_score} layers {r.layers.score if r.layers else None} decision "
            f"{r.decision} ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    md, js = write(rep, results, fold, doc_dir)
    print(f"wrote {md} and {js}", flush=True)
    return results, rep.cache

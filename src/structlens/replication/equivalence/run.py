"""Rebuild docs/replication/equivalence.md: the interpretive-equivalence scenario table.

    python -m structlens.replication equivalence [--profile cpu|smoke]

Trains the small byte-level LMs, fine-tunes SmolLM2-135M-Instruct twice, runs the stages of
:mod:`structlens.equivalence.stages` on every row of
:data:`~structlens.equivalence.scenarios.SCENARIOS` (the sanity rows as
:func:`~structlens.equivalence.stages.sanity`) under the row's protocol and writes the doc.
Every step is a cached stage: small LMs and fine-tunes keyed by their settings (and the base
model's fingerprint), comparisons' model runs by the protocol, the probe texts and both
models' fingerprints.  CPU-only sizes; see the doc.
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
from structlens.equivalence.scenarios import FINETUNES, SCENARIOS, SMALL, Scenario
from structlens.equivalence.stages import ModelComparison, SanityCheck
from structlens.equivalence.train_small import SmallLMConfig
from structlens.pipeline.cache import Stage, StageCache, data_digest
from structlens.replication.stage import Record

__all__ = ["METHOD", "PROFILES", "SCENARIOS", "EquivalenceReplication", "model_dirs", "run"]

METHOD = "equivalence"
# A few dozen steps of narrow models: enough to exercise every stage in seconds.
SMALL_SMOKE = {
    n: dataclasses.replace(c, d_model=32, d_mlp=64, n_heads=2, steps=8, seq_len=32, eval_every=4)
    for n, c in SMALL.items()
}
FOLD_PROMPT = "When Mary and John went to the store, John gave a drink to"
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

    def protocol(self, sc: Scenario) -> EquivalenceProtocol:
        """The row's protocol: its own, or this profile's protocol of the small LMs."""
        return PROTOCOLS[sc.protocol] if sc.protocol else self.s["small_protocol"]

    def model(self, spec: str, seed: int) -> Any:
        """A scenario's model: ``small:NAME``, ``finetune:NAME`` or a loadable name (the tiny
        model at the protocol's seed, as ``analyze`` and ``equiv sanity`` load it)."""
        from structlens.models import load_model

        kind, _, name = spec.partition(":")
        if kind == "small":
            return self.small_model(name)
        if kind == "finetune":
            return self.finetuned(name)
        return load_model(spec, seed=seed)

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
        from structlens.equivalence.scenarios import finetune_scenario, finetune_settings
        from structlens.models import load_model

        base = load_model("smollm2-135m")
        stage = Stage("finetune", finetune_settings(name), model=base.fingerprint())

        def compute(folder: Path) -> Record:
            run, info = finetune_scenario(base, name)
            hf: Any = run.model.hf
            hf.save_pretrained(folder / name, safe_serialization=True)
            base.tokenizer.save_pretrained(folder / name)
            return Record.of(info)

        self.ft_info[name] = self.cache.run(stage, Record, compute).data
        return load_model(str(self.cache.path(stage) / name))

    def fold_check(self) -> dict[str, Any]:
        """SmolLM2 against its rotated, head-permuted copy on one IOI-style prompt
        (:func:`~structlens.equivalence.stages.fold_check` at layer 12)."""
        from structlens.equivalence.stages import fold_check
        from structlens.models import load_model

        a = load_model("smollm2-135m")
        settings = {"seed": 3, "prompt": FOLD_PROMPT, "layer": 12}
        stage = Stage("fold-check", settings, model=a.fingerprint())

        def compute(_: Path) -> Record:
            return Record.of(dataclasses.asdict(fold_check(a, FOLD_PROMPT, seed=3, layer=12)))

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

        protocol = self.protocols[sc.name] = self.protocol(sc)
        a = self.model(sc.model_a, protocol.seed)
        if sc.model_b is None:
            check = self.sanity[sc.name] = sanity(protocol, a, measure=self._measure(sc.name))
            return check.comparison
        b = self.model(sc.model_b, protocol.seed)
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
    by_name = {sc.name: sc for sc in SCENARIOS}
    if unknown := set(names) - set(by_name):
        raise ValueError(f"unknown scenario(s) {sorted(unknown)}; choose from {list(by_name)}")
    out, doc_dir = default_paths(METHOD, profile, out, doc_dir)
    rep = EquivalenceReplication(s, out)
    fold = rep.fold_check() if s["fold_check"] else None
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

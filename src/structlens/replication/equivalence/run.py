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

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from structlens.equivalence import stages as es
from structlens.equivalence.compare import ComparisonResult
from structlens.equivalence.probes import Probe
from structlens.equivalence.protocol import PROFILES as PROTOCOLS
from structlens.equivalence.protocol import EquivalenceProtocol
from structlens.equivalence.scenarios import FINETUNES, SCENARIOS, ReplicationProfile, Scenario
from structlens.equivalence.scenarios import REPLICATION_PROFILES as PROFILES
from structlens.equivalence.train_small import SmallLMConfig
from structlens.errors import InputError
from structlens.pipeline.cache import Stage, StageCache, data_digest
from structlens.pipeline.progress import log

__all__ = ["METHOD", "PROFILES", "SCENARIOS", "EquivalenceReplication", "model_dirs", "run"]

METHOD = "equivalence"
FOLD_PROMPT = "When Mary and John went to the store, John gave a drink to"
# The version of the training and fold-check stages' Result layout, in their keys, so that a
# stage cached in an older layout recomputes.
RECORD = 2
# The version of what a comparison stage computes beyond its protocol, probe and models (3:
# validated heads chosen on the fit prompts by the null's intervention, the layer map by the
# pair's relation, an encoder–decoder's encoder reading the text before each sentence).
COMPARE_RECORD = 3


def _small_stage(config: SmallLMConfig) -> Stage:
    return Stage("small-lm", config.key() | {"record": RECORD})


def model_dirs(profile: str = "cpu", out: str | Path | None = None) -> dict[str, Path | None]:
    """The small LMs and fine-tunes this replication has trained (``None`` where not yet),
    for the Koopman replication's universality section.  Trains and creates nothing."""
    from structlens.replication import repo_root

    out = Path(out) if out is not None else repo_root() / "results" / "replication" / METHOD
    out = out / profile if out.name == METHOD else out
    cache = StageCache(out / "stages")
    found: dict[str, Path | None] = {}
    for name, cfg in PROFILES[profile].small.items():
        path = cache.path(_small_stage(cfg)) / "model"
        found[name] = path if (path / "config.json").exists() else None
    for name in FINETUNES:
        hits = sorted((out / "stages" / "finetune").glob(f"*/{name}/config.json"))
        found[name] = hits[0].parent if hits else None
    return found


class EquivalenceReplication:
    """Models, fine-tunes and comparisons of one profile, each a cached stage."""

    def __init__(self, s: ReplicationProfile, out: Path) -> None:
        self.s, self.out = s, out
        self.cache = StageCache(out / "stages")
        self.small_info: dict[str, es.SmallLMTraining] = {}
        self.ft_info: dict[str, es.FineTuneTraining] = {}
        self.seconds: dict[str, float] = {}
        self._stage_seconds: dict[tuple[str, str], float] = {}
        self.protocols: dict[str, EquivalenceProtocol] = {}
        self.sanity: dict[str, es.SanityCheck] = {}

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
        from structlens.models import load_model

        stage = _small_stage(self.s.small[name])
        compute = partial(es.small_lm, self.s.small[name])
        self.small_info[name] = self.cache.run(stage, es.SmallLMTraining, compute)
        return load_model(str(self.cache.path(stage) / "model"))

    def finetuned(self, name: str) -> Any:
        from structlens.equivalence.scenarios import finetune_settings
        from structlens.models import load_model

        base = load_model("smollm2-135m")
        config = finetune_settings(name) | {"record": RECORD}
        stage = Stage("finetune", config, model=base.fingerprint())
        self.ft_info[name] = self.cache.run(
            stage, es.FineTuneTraining, partial(es.finetune, base, name)
        )
        return load_model(str(self.cache.path(stage) / name))

    def fold_check(self) -> es.FoldCheck:
        """SmolLM2 against its rotated, head-permuted copy on one IOI-style prompt
        (:func:`~structlens.equivalence.stages.fold_check` at layer 12)."""
        from structlens.models import load_model

        a = load_model("smollm2-135m")
        settings = {"seed": 3, "prompt": FOLD_PROMPT, "layer": 12, "record": RECORD}
        stage = Stage("fold-check", settings, model=a.fingerprint())
        compute = partial(es.fold_check, a, FOLD_PROMPT, seed=3, layer=12)
        return self.cache.run(stage, es.FoldCheck, lambda _: compute())

    def _measure(self, name: str) -> Callable[..., ComparisonResult]:
        """The stages' model runs of scenario ``name``, each a cached stage keyed by the
        protocol, the probe texts and both models' fingerprints, with its seconds beside it."""

        def run(protocol: EquivalenceProtocol, a: Any, b: Any, probe: Probe) -> ComparisonResult:
            config = {"scenario": name, "protocol": protocol.to_json(), "record": COMPARE_RECORD}
            models = f"{a.fingerprint()}:{b.fingerprint()}"
            data = data_digest(probe.texts, probe.context_a, probe.context_b)
            stage = Stage("compare", config, model=models, data=data)

            def compute(folder: Path) -> ComparisonResult:
                t0 = time.perf_counter()
                res = es.measure(protocol, a, b, probe)
                (folder / "seconds.txt").write_text(f"{time.perf_counter() - t0:.0f}")
                return res

            res = self.cache.run(stage, ComparisonResult, compute)
            # a sanity row measures two copies (the unrotated one for CONGRUITY only): its
            # seconds are the sum over its distinct stages
            path = self.cache.path(stage)
            self._stage_seconds[name, str(path)] = float((path / "seconds.txt").read_text())
            self.seconds[name] = sum(
                v for (row, _), v in self._stage_seconds.items() if row == name
            )
            return res

        return run

    def scenario(self, sc: Scenario) -> es.ModelComparison:
        """One row: the comparison stage (the sanity stage for the sanity rows, whose checks
        are kept in ``self.sanity``) under the row's protocol (its own, or this profile's
        protocol of the small LMs, with the row's relation and first layer)."""
        base = PROTOCOLS[sc.protocol] if sc.protocol else self.s.small_protocol
        protocol = self.protocols[sc.name] = sc.protocol_for(base)
        self._check_context(sc, protocol)
        a = self.model(sc.model_a, protocol.seed)
        if sc.model_b is None:
            check = self.sanity[sc.name] = es.sanity(protocol, a, measure=self._measure(sc.name))
            return check.comparison
        b = self.model(sc.model_b, protocol.seed)
        self._check_trained_layers(sc, b)
        return es.compare_models(protocol, a, b, measure=self._measure(sc.name))

    def _check_context(self, sc: Scenario, protocol: EquivalenceProtocol) -> None:
        """An encoder–decoder of the row reads no more context than it was trained on."""
        for spec in (sc.model_a, sc.model_b or ""):
            kind, _, name = spec.partition(":")
            if kind == "small" and (most := self.s.small[name].max_context):
                if protocol.encoder_context > most:
                    raise InputError(
                        f"{sc.name}: encoder_context={protocol.encoder_context} tokens, but "
                        f"{name}'s encoder was trained on at most {most}; lower it."
                    )

    def _check_trained_layers(self, sc: Scenario, b: Any) -> None:
        """A fine-tune row compares exactly the layers the fine-tune trained."""
        kind, _, name = (sc.model_b or "").partition(":")
        if kind != "finetune":
            return
        trained = self.ft_info[name].train_layers
        if trained != list(range(sc.first_layer, b.n_layers)):
            raise InputError(
                f"{sc.name} compares layers {sc.first_layer}–{b.n_layers - 1}, but {name} "
                f"trained layers {trained}: set the row's first_layer to its lowest trained "
                "layer (the fine-tunes train the top layers)."
            )


def run(
    profile: str = "cpu",
    out: str | Path | None = None,
    doc_dir: str | Path | None = None,
    device: str = "cpu",
    only: list[str] | None = None,
) -> tuple[dict[str, es.ModelComparison], StageCache]:
    """Run (or resume) the scenarios of ``profile`` (``only``: a subset, in that order) and
    write the markdown and claims JSON."""
    from structlens.replication import default_paths
    from structlens.replication.equivalence.render import write

    s = PROFILES[profile]
    names = only if only is not None else s.scenarios
    by_name = {sc.name: sc for sc in SCENARIOS}
    if unknown := set(names) - set(by_name):
        raise ValueError(f"unknown scenario(s) {sorted(unknown)}; choose from {list(by_name)}")
    out, doc_dir = default_paths(METHOD, profile, out, doc_dir)
    rep = EquivalenceReplication(s, out)
    fold = rep.fold_check() if s.fold_check else None
    results = {}
    for name in names:
        t0 = time.perf_counter()
        r = results[name] = rep.scenario(by_name[name])
        layers = r.layers.score if r.layers else None
        log(f"{name}: score {r.heads.score:.3f} {list(r.heads.score_ci)} null "
              f"{r.heads.null_score} layers {layers} decision {r.decision} "
              f"({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    md, js = write(rep, results, fold, doc_dir)
    log(f"wrote {md} and {js}")
    return results, rep.cache

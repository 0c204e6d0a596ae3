"""Reproduce the NDM paper's claims on SmolLM2-135M-Instruct and write docs/replication/ndm.md.

    python -m structlens.replication ndm                    # CPU: to the stopping rule or 20k steps
    python -m structlens.replication ndm --profile gpu --device cuda   # the paper's schedule

Each stage is cached and calls the ``structlens ndm`` commands' library functions: the tests'
layers under the protocol's layer rule (the share sweep on selection prompts, a typed
:class:`~structlens.ndm.stages.LayerSweep`), training at those layers
(one stage per layer for its honest timing, then one collecting their checkpoints; the cpu
and gpu profiles then train the same activations on ``--device`` to the stopping rule with
:mod:`structlens.ndm.device_train`, a run later stages use whenever it is in the cache), the
patching tests with knowledge conflict, the toy recovery over seeds, the planted
partitions, and the preimage browser; :mod:`structlens.ndm.verdicts` judges them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from structlens.ndm.protocol import REPLICATION_PROFILES as PROFILES
from structlens.ndm.protocol import ReplicationProfile
from structlens.ndm.runs import BrowseRun, EvaluationRun, TrainingRun
from structlens.ndm.stages import LayerSweep, PlantedRecovery, ToySeeds
from structlens.pipeline.cache import Stage, StageCache
from structlens.pipeline.progress import log
from structlens.results import write_results

METHOD = "ndm"


@dataclasses.dataclass
class Run:
    """What the render step reads: the typed Result of every stage of one profile.

    ``sweep`` chose the tests' layers, where NDM is trained; ``train`` is the run the
    evaluation used (device-trained when ``device_run``), in ``train_dir``; ``per_layer`` the
    CPU training stages' records by layer (their own timings); ``evaluate_cpu`` the
    CPU-trained run's evaluation beside a device run's.
    """

    settings: dict[str, Any]
    sweep: LayerSweep
    device_run: bool
    train: TrainingRun
    train_dir: Path
    per_layer: dict[int, dict[str, Any]]
    evaluate: EvaluationRun
    evaluate_cpu: EvaluationRun | None
    toy: ToySeeds
    planted: list[PlantedRecovery]
    browse: list[BrowseRun]


# Every stage returns a typed Result; "record": 2 marks the stages that stored a JSON record
# before, so those caches recompute instead of failing to load.
RECORD = 2


class NDMReplication:
    """The stages of one profile; model loading happens inside the commands' functions."""

    def __init__(self, s: ReplicationProfile, out: Path, device: str = "cpu") -> None:
        self.s, self.out, self.device = s, out, device
        self.cache = StageCache(out / "stages")
        self.activations = out / "activations"
        self.checkpoints = out / "checkpoints"
        self.model = s.model
        self.fp = self._model().fingerprint()

    def _model(self, device: str = "cpu") -> Any:
        from structlens.models import load_model

        return load_model(self.model, device=device)

    def _trained(self, stage: Stage, fit: Callable[[Path], None]) -> TrainingRun:
        """``stage``'s training run: ``fit(folder)`` writes an ``ndm train`` directory."""

        def compute(folder: Path) -> TrainingRun:
            fit(folder)
            return TrainingRun.of(json.loads((folder / "ndm_train.json").read_text()))

        return self.cache.run(stage, TrainingRun, compute)

    # 1. the tests' layers
    def sweep(self) -> tuple[Stage, LayerSweep]:
        """The profile's tests' layers under the protocol's layer rule, measured on
        ``self.device`` (where the evaluation runs); NDM is trained at them.

        Raises
        ------
        InputError
            This tokenizer builds none of the profile's tests: there is no layer to train.
        """
        from structlens.errors import InputError
        from structlens.ndm.stages import plan_tests

        s = self.s

        def compute(_: Path) -> LayerSweep:
            return plan_tests(s.protocol, self._model(self.device), list(s.tests)).sweep

        # record 2: the sweep leaves a mapped layer only on a significant paired gain
        config = {"tests": list(s.tests), "protocol": s.protocol.to_json(), "record": 2}
        stage = Stage("layer-sweep", config, model=self.fp)
        found = self.cache.run(stage, LayerSweep, compute)
        if not found.layers:
            raise InputError(f"{s.model}'s tokenizer builds none of the tests {list(s.tests)}.")
        for c in found.choices:
            log(f"{c.test}: layer {c.chosen} (mapped {c.mapped}, {found.rule})")
        return stage, found

    # 2. training
    def _train(self, layers: list[int], capture: list[int], folder: Path) -> None:
        from structlens.ndm.experiment import run

        report = run(
            self.s.protocol, self._model(), layers=layers, capture_layers=capture, out=folder,
            activations=self.activations, checkpoints=self.checkpoints,
        )  # fmt: skip
        write_results(folder, "ndm_train", report.payload(), command="ndm train")

    def train(self, layers: list[int]) -> tuple[Stage, TrainingRun, dict[int, dict[str, Any]]]:
        """One stage per layer of ``layers`` (its honest timing), then one collecting their
        checkpoints."""
        s = self.s
        config = {"protocol": s.protocol.to_json(), "record": RECORD}
        per_layer: dict[int, dict[str, Any]] = {}
        keys: list[str] = []
        for layer in layers:
            stage = Stage("train-layer", config | {"layer": layer}, model=self.fp)
            run = self._trained(stage, partial(self._train, [layer], layers))
            per_layer[layer], keys = run.layer(layer), [*keys, stage.key]
            log(f"trained layer {layer}")
        config |= {"layers": layers}
        stage = Stage("train", config, model=self.fp, inputs=tuple(keys))
        return stage, self._trained(stage, partial(self._train, layers, layers)), per_layer

    def device_stage(self, cpu_train: Stage) -> Stage:
        from structlens.ndm import device_train

        # the settings the run trains with, defaults included, so that a changed default
        # is a new stage rather than a reused run
        config = {"rows": self.s.device_rows,
                  "settings": device_train.settings(dict(self.s.device_config))}  # fmt: skip
        if self.s.device_seconds is not None:  # a limit can decide how many steps are taken
            config["seconds"] = self.s.device_seconds
        return Stage("train-device", config | {"record": RECORD}, inputs=(cpu_train.key,))

    def train_device(self, cpu_train: Stage, layers: list[int]) -> tuple[Stage, TrainingRun]:
        """Pack the CPU run's activations of ``layers`` and train them on ``self.device`` to
        convergence."""
        from structlens.ndm import device_train

        def fit(folder: Path) -> None:
            packed = folder / "device-activations.safetensors"
            device_train.pack(self.cache.path(cpu_train), layers, packed, self.s.device_rows)
            device_train.train(packed, self.device, self.s.device_seconds, folder,
                               dict(self.s.device_config))  # fmt: skip
            packed.unlink()

        stage = self.device_stage(cpu_train)
        return stage, self._trained(stage, fit)

    # 3. evaluation
    def evaluate(self, train_stage: Stage, sweep_stage: Stage, sweep: LayerSweep) -> EvaluationRun:
        """The tests at the layers of ``sweep`` (made by ``sweep_stage``), never swept again."""
        from structlens.ndm.experiment import evaluate as run_evaluation
        from structlens.report.ndm import plot_evaluation

        s = self.s

        def run(folder: Path) -> EvaluationRun:
            # on --device: the gpu profile patches 512 prompts per test
            report = run_evaluation(
                s.protocol, self._model(self.device), self.cache.path(train_stage),
                out=folder, tests=list(s.tests), batch_size=16, sweep=sweep, toy=False,
            )  # fmt: skip
            plot_evaluation(report.meta, folder)
            return EvaluationRun.of(report.payload())

        # "record" changes with what the stored run holds (5: no toy run, which has its own
        # stage over seeds); older records recompute
        config = {"tests": list(s.tests), "protocol": s.protocol.to_json(), "record": 5}
        stage = Stage("evaluate", config, model=self.fp, inputs=(train_stage.key, sweep_stage.key))
        return self.cache.run(stage, EvaluationRun, run)

    def toy(self) -> ToySeeds:
        """The toy recovery over the profile's ``toy_seeds`` seeds, with the stop guard
        where the merge rule misses the groups."""
        from structlens.ndm.stages import toy_seeds
        from structlens.ndm.verdicts import TOY_OVERLAP, toy_recovers

        p, seeds = self.s.protocol, self.s.toy_seeds
        config = {"toy": [dataclasses.asdict(c) for c in p.toy()], "seeds": seeds,
                  "overlap": TOY_OVERLAP, "record": 1}  # fmt: skip
        found = self.cache.run(Stage("toy-seeds", config), ToySeeds,
                               lambda _: toy_seeds(p, seeds, toy_recovers))  # fmt: skip
        log(f"toy: {sum(map(toy_recovers, found.runs))}/{seeds} seeds recover the groups")
        return found

    def planted(self) -> list[PlantedRecovery]:
        """The recovery rate over seeds on planted rotated partitions, one restart against
        several (a single run can merge groups after settling with dimensions swapped
        between them)."""
        from structlens.ndm.stages import planted

        p, found = self.s.planted, []

        def compute(sizes: list[int], cfg: dict[str, Any], _: Path) -> PlantedRecovery:
            return planted(sizes, p["seeds"], cfg)

        for sizes in p["sizes"]:
            for restarts in p["restarts"]:
                cfg = p["ndm"] | {"restarts": restarts}
                config = {"sizes": sizes, "seeds": p["seeds"], "ndm": cfg, "record": RECORD}
                found.append(self.cache.run(
                    Stage("planted-recovery", config), PlantedRecovery,
                    partial(compute, sizes, cfg),
                ))  # fmt: skip
                log(f"planted {sizes}, {restarts} restart(s): {found[-1].recovered}/"
                    f"{p['seeds']} recovered")  # fmt: skip
        return found

    # 4. preimage browser
    def browse(self, train_stage: Stage) -> list[BrowseRun]:
        from structlens.ndm.experiment import browse

        found = []
        # in order: the first query captures the whole corpus once, the second reuses it
        for text, pos in self.s.queries:

            def run(folder: Path, text: str = text, pos: int = pos) -> BrowseRun:
                # the index goes into this stage's own folder: the training stage's folder
                # is verified against its digests and must not change
                return BrowseRun.of(browse(
                    self._model(), self.cache.path(train_stage), text, position=pos,
                    activations=self.activations, index_dir=folder / "browse-index",
                    **self.s.browse,
                ))  # fmt: skip

            config = {"prompt": text, "position": pos, **self.s.browse, "record": RECORD}
            stage = Stage("browse", config, model=self.fp, inputs=(train_stage.key,))
            found.append(self.cache.run(stage, BrowseRun, run))
        return found


def run(
    profile: str = "cpu",
    out: str | Path | None = None,
    doc_dir: str | Path | None = None,
    device: str = "cpu",
) -> tuple[Run, StageCache]:
    """Run (or resume) every stage of ``profile``; write the markdown and claims JSON."""
    from structlens.replication import default_paths
    from structlens.replication.ndm.render import write

    s = PROFILES[profile]
    out, doc_dir = default_paths(METHOD, profile, out, doc_dir)
    rep = NDMReplication(s, out, device)
    sweep_stage, sweep = rep.sweep()
    cpu_train, train, per_layer = rep.train(sweep.layers)
    train_stage = cpu_train
    if s.device_training or rep.cache.has(rep.device_stage(cpu_train)):
        train_stage, train = rep.train_device(cpu_train, sweep.layers)
    device_run = train_stage is not cpu_train
    R = Run(
        settings=s.to_json(),
        sweep=sweep,
        device_run=device_run,
        train=train,
        train_dir=rep.cache.path(train_stage),
        per_layer=per_layer,
        toy=rep.toy(),
        planted=rep.planted(),
        evaluate=rep.evaluate(train_stage, sweep_stage, sweep),
        # the CPU run's evaluation, for comparison with the device-trained one
        evaluate_cpu=rep.evaluate(cpu_train, sweep_stage, sweep) if device_run else None,
        browse=rep.browse(train_stage),
    )
    md, js = write(R, doc_dir)
    log(f"wrote {md} and {js}")
    return R, rep.cache

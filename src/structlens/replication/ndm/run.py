"""Reproduce the NDM paper's claims on SmolLM2-135M-Instruct and write docs/replication/ndm.md.

    python -m structlens.replication ndm                    # CPU: 60-step smoke-scale training
    python -m structlens.replication ndm --profile gpu --device cuda   # converged training

Stages (each a cached stage calling the ``structlens ndm`` commands' library functions):

1. training at layers 12, 17, 22, 24 (the paper's GPT-2 layers 4, 6, 8, 9 at the same relative
   depth): one stage per layer (its honest timing), then a collecting stage that reuses their
   checkpoints.  ``--profile gpu`` packs the same activations and trains them on ``--device``
   to the paper's stopping rule (:mod:`structlens.ndm.device_train`); later
   stages use that run whenever its stage is in the cache (it can be trained on a GPU host
   and copied here);
2. the patching tests with the Gini summary, knowledge conflict and the toy recovery; a second
   toy variant with the ``min_subspaces`` guard;
3. the preimage browser for two queries;
4. the claims (:mod:`structlens.ndm.verdicts`) of the stage results, rendered as markdown and JSON.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from structlens.ndm.protocol import PROFILES as NDM_PROFILES
from structlens.ndm.runs import BrowseRun, EvaluationRun, TrainingRun
from structlens.ndm.stages import PlantedRecovery, ToyRecovery
from structlens.pipeline.cache import Stage, StageCache
from structlens.results import Result, write_results

METHOD = "ndm"

CPU: dict[str, Any] = {
    "profile": "cpu",
    "model": "smollm2-135m",
    "layers": [12, 17, 22, 24],
    # SmolLM2 has rotary position embeddings: the IOI position-swap tests (previous_token,
    # duplicate_token, s_inhibition_position) need an absolute-position subspace it lacks,
    # so the relative tests on repeated sequences replace them (ndm.evaluate.patch_tests_for).
    "tests": ["previous_token_relative", "induction", "s_inhibition_name", "greater_than"],
    # every scientific choice of training and evaluation (screen, baselines, SAE baseline)
    "protocol": NDM_PROFILES["paper"],
    "toy2": {
        "unit_size": 2, "lr": 1e-3, "max_steps": 3000, "bank_size": 8192,
        "refresh_interval": 50, "merge_start": 1000, "merge_interval": 500, "mi_samples": 2000,
        "min_subspaces": 2, "seed": 0,
    },
    "toy2_model": {},  # ToyConfig overrides of the toy autoencoder
    # Recovery rate over seeds on planted rotated partitions (2-d units, random init), with
    # one run and with restarts.
    "planted": {
        "sizes": [[4, 4], [4, 4, 8]], "seeds": 10, "restarts": [1, 3],
        "ndm": {"unit_size": 2, "lr": 2e-2, "batch_size": 64, "max_steps": 1500,
                "bank_size": 1024, "refresh_interval": 30, "reproject_interval": 10,
                "merge_start": 300, "merge_interval": 100, "mi_samples": 800, "init": "random",
                "log_interval": 50},
    },
    "browse": {"k": 5, "extra_corpus_prompts": None},
    # Train on the device to the paper's stopping rule (the CPU profile still uses such a run
    # when its stage is in the cache, e.g. copied from a GPU host).
    "device_training": False,
    "device_rows": 12_416,  # activations per layer sent to the device (float16, < 64 MiB)
    "device_config": {},  # overrides of device_train.DEVICE_CONFIG
    "queries": [
        ["When Mary and John went to the store, John gave a drink to", -1],
        ["It is a truth universally acknowledged, that a single man in possession", -1],
    ],
}  # fmt: skip
# The paper's merge schedule on the device, restarts against merges of whole swapped
# dimensions, >= 10^5 distinct activations per layer (1000 of the bundled corpus' 1082 windows of
# <= 128 tokens, ~117k rows; the device run keeps 102,400 of them: a bank of 99,840 plus 20 x 128
# queries per refresh), and >= 500 prompts per test (Gini CI width about +-0.03).
GPU_ROWS = 102_400
GPU = CPU | {
    "profile": "gpu",
    "device_training": True,
    "device_rows": GPU_ROWS,
    "device_config": {"max_steps": 100_000, "merge_start": 20_000, "merge_interval": 8_000,
                      "bank_size": GPU_ROWS - 20 * 128},
    "protocol": NDM_PROFILES["paper"].replace(restarts=3, corpus_prompts=1000, patch_prompts=512),
}  # fmt: skip
SMOKE = CPU | {
    "profile": "smoke",
    "model": "tiny-smol",  # a random 3-layer Llama with SmolLM2's tokenizer (built as a stage)
    "layers": [0, 1, 2],
    # the smoke protocol with the SAE baseline and two restarts, so that both reach the run
    "protocol": NDM_PROFILES["smoke"].replace(
        restarts=2, baselines=("identity", "random", "pca", "sae")
    ),
    "toy2": CPU["toy2"] | {"max_steps": 40, "merge_start": 20, "merge_interval": 10,
                           "bank_size": 512, "mi_samples": 300, "refresh_interval": 10},
    "toy2_model": {"steps": 50},
    "planted": {"sizes": [[2, 2]], "seeds": 2, "restarts": [1, 2],
                "ndm": CPU["planted"]["ndm"] | {"max_steps": 40, "merge_start": 20,
                                                 "merge_interval": 10, "bank_size": 256,
                                                 "mi_samples": 200}},
    "browse": {"k": 3, "extra_corpus_prompts": 3},
    "device_rows": 2_000,
    "device_config": {"max_steps": 20, "merge_start": 10, "merge_interval": 10, "batch_size": 16,
                      "refresh_interval": 5, "bank_size": 512, "mi_samples": 300,
                      "unit_size": 8, "chunk_steps": 10},
}  # fmt: skip
PROFILES = {"cpu": CPU, "gpu": GPU, "smoke": SMOKE}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclasses.dataclass(frozen=True)
class TinyModel(Result):
    """The smoke profile's random 3-layer Llama with SmolLM2's tokenizer (saved in ``model/``
    of its stage)."""

    hidden_size: int
    layers: int
    tokenizer: str


@dataclasses.dataclass
class Run:
    """What the render step reads: the typed Result of every stage of one profile.

    ``train`` is the run the evaluation used (device-trained when ``device_run``), in
    ``train_dir``; ``per_layer`` the CPU training stages' records by layer (their own
    timings); ``evaluate_cpu`` the CPU-trained run's evaluation beside a device run's.
    """

    settings: dict[str, Any]
    device_run: bool
    train: TrainingRun
    train_dir: Path
    per_layer: dict[int, dict[str, Any]]
    evaluate: EvaluationRun
    evaluate_cpu: EvaluationRun | None
    toy2: ToyRecovery
    planted: list[PlantedRecovery]
    browse: list[BrowseRun]


# Every stage returns a typed Result; "record": 2 marks the stages that stored a JSON record
# before, so those caches recompute instead of failing to load.
RECORD = 2


class NDMReplication:
    """The stages of one profile; model loading happens inside the commands' functions."""

    def __init__(self, s: dict[str, Any], out: Path, device: str = "cpu") -> None:
        self.s, self.out, self.device = s, out, device
        self.cache = StageCache(out / "stages")
        self.activations = out / "activations"
        self.checkpoints = out / "checkpoints"
        self.model = self.model_path()
        from structlens.models import load_model

        self.fp = load_model(self.model).fingerprint()

    def model_path(self) -> str:
        """The model name, or for the smoke profile the directory of the tiny model stage."""
        if self.s["model"] != "tiny-smol":
            return self.s["model"]

        def build(folder: Path) -> TinyModel:
            import torch
            from transformers import LlamaConfig, LlamaForCausalLM

            from structlens.models import load_model

            tok = load_model("smollm2-135m").tokenizer
            torch.manual_seed(0)
            cfg = LlamaConfig(
                vocab_size=len(tok), hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
            )  # fmt: skip
            LlamaForCausalLM(cfg).save_pretrained(folder / "model")
            tok.save_pretrained(folder / "model")
            return TinyModel(hidden_size=32, layers=3, tokenizer="smollm2-135m")

        stage = Stage("tiny-model", {"name": "tiny-smol", "seed": 0, "record": RECORD})
        self.cache.run(stage, TinyModel, build)
        return str(self.cache.path(stage) / "model")

    def _model(self, device: str = "cpu") -> Any:
        from structlens.models import load_model

        return load_model(self.model, device=device)

    def _trained(self, stage: Stage, fit: Callable[[Path], None]) -> TrainingRun:
        """``stage``'s training run: ``fit(folder)`` writes an ``ndm train`` directory."""

        def compute(folder: Path) -> TrainingRun:
            fit(folder)
            return TrainingRun.of(json.loads((folder / "ndm_train.json").read_text()))

        return self.cache.run(stage, TrainingRun, compute)

    # 1. training
    def _train(self, layers: list[int], folder: Path) -> None:
        from structlens.ndm.experiment import run

        report = run(
            self.s["protocol"], self._model(), layers=layers, capture_layers=self.s["layers"],
            out=folder, activations=self.activations, checkpoints=self.checkpoints,
        )  # fmt: skip
        write_results(folder, "ndm_train", report.payload(), command="ndm train")

    def train(self) -> tuple[Stage, TrainingRun, dict[int, dict[str, Any]]]:
        """One stage per layer (its honest timing), then one collecting their checkpoints."""
        s = self.s
        config = {"protocol": s["protocol"].to_json(), "record": RECORD}
        per_layer: dict[int, dict[str, Any]] = {}
        keys: list[str] = []
        for layer in s["layers"]:
            stage = Stage("train-layer", config | {"layer": layer}, model=self.fp)
            run = self._trained(stage, partial(self._train, [layer]))
            per_layer[layer], keys = run.layer(layer), [*keys, stage.key]
            log(f"trained layer {layer}")
        config |= {"layers": s["layers"]}
        stage = Stage("train", config, model=self.fp, inputs=tuple(keys))
        return stage, self._trained(stage, partial(self._train, list(s["layers"]))), per_layer

    def device_stage(self, cpu_train: Stage) -> Stage:
        config = {"rows": self.s["device_rows"], "overrides": self.s["device_config"]}
        return Stage("train-device", config | {"record": RECORD}, inputs=(cpu_train.key,))

    def train_device(self, cpu_train: Stage) -> tuple[Stage, TrainingRun]:
        """Pack the CPU run's activations and train them on ``self.device`` to convergence."""
        from structlens.ndm import device_train

        def fit(folder: Path) -> None:
            packed = folder / "device-activations.safetensors"
            device_train.pack(
                self.cache.path(cpu_train), self.s["layers"], packed, self.s["device_rows"]
            )
            device_train.train(packed, self.device, 1e9, folder, dict(self.s["device_config"]))
            packed.unlink()

        stage = self.device_stage(cpu_train)
        return stage, self._trained(stage, fit)

    # 2. evaluation
    def evaluate(self, train_stage: Stage) -> EvaluationRun:
        from structlens.ndm.experiment import evaluate as run_evaluation
        from structlens.report.ndm import plot_evaluation

        s = self.s

        def run(folder: Path) -> EvaluationRun:
            # on --device: the gpu profile patches 512 prompts per test
            report = run_evaluation(
                s["protocol"], self._model(self.device), self.cache.path(train_stage),
                out=folder, tests=s["tests"], batch_size=16,
            )  # fmt: skip
            plot_evaluation(report.meta, folder)
            return EvaluationRun.of(report.payload())

        # record 3: a typed Result (2: the Gini differences carry their one-sided bootstrap
        # p-values, which the verdict reads); older records recompute
        config = {"tests": s["tests"], "protocol": s["protocol"].to_json(), "record": 3}
        stage = Stage("evaluate", config, model=self.fp, inputs=(train_stage.key,))
        return self.cache.run(stage, EvaluationRun, run)

    def toy2(self) -> ToyRecovery:
        """The toy recovery with the ``min_subspaces`` stop guard."""
        from structlens.ndm.stages import toy_guarded

        cfg, toy = self.s["toy2"], self.s["toy2_model"]
        stage = Stage("toy-min-subspaces", {"ndm": cfg, "toy": toy, "record": RECORD})
        return self.cache.run(stage, ToyRecovery, lambda _: toy_guarded(toy, cfg))

    def planted(self) -> list[PlantedRecovery]:
        """The recovery rate over seeds on planted rotated partitions, one restart against
        several (a single run can merge groups after settling with dimensions swapped
        between them)."""
        from structlens.ndm.stages import planted

        p, found = self.s["planted"], []

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

    # 3. preimage browser
    def browse(self, train_stage: Stage) -> list[BrowseRun]:
        from structlens.ndm.experiment import browse

        found = []
        # in order: the first query captures the whole corpus once, the second reuses it
        for text, pos in self.s["queries"]:

            def run(folder: Path, text: str = text, pos: int = pos) -> BrowseRun:
                # the index goes into this stage's own folder: the training stage's folder
                # is verified against its digests and must not change
                return BrowseRun.of(browse(
                    self._model(), self.cache.path(train_stage), text, position=pos,
                    activations=self.activations, index_dir=folder / "browse-index",
                    **self.s["browse"],
                ))  # fmt: skip

            config = {"prompt": text, "position": pos, **self.s["browse"], "record": RECORD}
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
    cpu_train, train, per_layer = rep.train()
    train_stage = cpu_train
    if s["device_training"] or rep.cache.has(rep.device_stage(cpu_train)):
        train_stage, train = rep.train_device(cpu_train)
    device_run = train_stage is not cpu_train
    R = Run(
        settings=s | {"protocol": s["protocol"].to_json()},
        device_run=device_run,
        train=train,
        train_dir=rep.cache.path(train_stage),
        per_layer=per_layer,
        toy2=rep.toy2(),
        planted=rep.planted(),
        evaluate=rep.evaluate(train_stage),
        # the CPU run's evaluation, for comparison with the device-trained one
        evaluate_cpu=rep.evaluate(cpu_train) if device_run else None,
        browse=rep.browse(train_stage),
    )
    md, js = write(R, doc_dir)
    log(f"wrote {md} and {js}")
    return R, rep.cache

"""The NDM protocol: every scientific choice of the subspace decomposition and its
evaluation, in one place.

An :class:`NDMProtocol` is frozen and validated at construction.  ``structlens ndm train`` /
``evaluate``, ``structlens analyze`` and the NDM replication each build one instance (the CLI
from ``--protocol`` and its options, the others from their profiles, :data:`PROFILES`) and
hand it to the stages of :mod:`structlens.ndm.stages`, the only code that turns activations
and patching runs into NDM numbers.

Training data
    ``corpus_prompts`` windows of ``corpus_tokens`` tokens of the bundled corpus plus
    ``task_prompts`` clean prompts of each of ``training_tasks``, none of which is an
    evaluation prompt (the evaluation sets are built first and removed); position 0 of every
    prompt is left out (an attention-sink outlier).
Training
    The :class:`~structlens.ndm.NDMConfig` of :meth:`NDMProtocol.ndm_config`: the protocol's
    sizes, shrunk by one stated rule when a layer has fewer activations than they need.
Evaluation
    Each patching test runs on ``patch_prompts`` prompts at a layer chosen by ``layer_rule``:
    ``"depth"``, the paper's GPT-2 layer mapped to the same relative depth, or
    ``"share_sweep"``, among the layers within ``sweep_window`` of that depth, the one
    nearest it whose whole-space patch removes, on ``sweep_prompts`` selection prompts that
    are never evaluation prompts, a share of the clean metric within one standard error of
    the largest.  A test enters the Gini only if patching the whole space at its layer
    removes at least ``min_share`` of the clean metric on the evaluation prompts (the
    screen).  NDM is trained at the tests' layers.  Baselines use NDM's partition; intervals
    are percentile bootstraps over prompts (``gini_bootstrap`` resamples).

>>> NDMProtocol(unit_size=16).ndm_config(n_rows=10_000, d=64).unit_size
16
>>> NDMProtocol(min_share=1.5)
Traceback (most recent call last):
...
structlens.errors.InputError: min_share must be in [0, 1]; got 1.5.
>>> NDMProtocol(layer_rule="best")
Traceback (most recent call last):
...
structlens.errors.InputError: layer_rule must be one of 'depth', 'share_sweep'; got 'best'.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from structlens.config import Protocol, Settings, described
from structlens.errors import InputError

__all__ = [
    "NDMProtocol", "PROFILES", "BASELINES", "LAYER_RULES", "REPLICATION_PROFILES",
    "ReplicationProfile", "TRAINING_TASKS",
]  # fmt: skip

#: Baseline decompositions the Gini compares NDM with (each given NDM's partition).
BASELINES = ("identity", "random", "pca", "sae")
#: Circuit tasks whose clean prompts may join the training activations.
TRAINING_TASKS = ("ioi", "greater_than", "knowledge_conflict")
#: How a patching test's layer is chosen (see the module docstring).
LAYER_RULES = ("depth", "share_sweep")


@dataclass(frozen=True)
class NDMProtocol(Protocol):
    """Every scientific choice of NDM (see the module docstring).

    Each field's ``metadata["help"]`` says what it sets; :meth:`key` is a digest of the
    canonical JSON, the part of a stage's cache key that the protocol contributes.
    """

    corpus_prompts: int = described(150, "Corpus windows in the training activations.")
    corpus_tokens: int = described(128, "Tokens per corpus window.")
    task_prompts: int = described(
        40, "Clean prompts of each training task (never an evaluation prompt)."
    )
    training_tasks: tuple[str, ...] = described(
        TRAINING_TASKS, "Tasks whose clean prompts join the training activations."
    )
    unit_size: int = described(
        48, "Initial subspace size (the gcd with d where it does not divide d)."
    )
    # the patching tests patch every subspace (with each baseline) and a merge round scores
    # every pair: both grow with d / unit, which a unit sized for a tiny model makes large
    max_units: int | None = described(
        None,
        "Most initial subspaces: where d / unit exceeds it, the unit is the smallest divisor "
        "of d that gives at most this many (null: no bound).",
    )
    steps: int = described(600, "Most optimisation steps per layer.")
    bank_size: int = described(8192, "Keys in the neighbour memory bank (at most half the rows).")
    batch_size: int = described(128, "Queries per optimisation step.")
    refresh_interval: int = described(20, "Steps served by one memory-bank refresh.")
    lr: float = described(1e-3, "Adam learning rate of the rotation.")
    merge_start: int = described(200, "First step at which subspaces may merge.")
    merge_interval: int = described(200, "Steps between merge rounds.")
    merge_threshold: float = described(0.04, "Merge above this KSG MI / (d_a + d_b), nats.")
    mi_samples: int = described(2048, "Rows of the KSG estimate (at most half the rows).")
    restarts: int = described(1, "Training runs per layer; the best is kept.")
    patch_prompts: int = described(24, "Prompts per patching test.")
    min_share: float = described(
        0.3, "Screen: least whole-space effect / clean metric for a test's Gini."
    )
    # the screen can only pass a test the model carries at the layer patched; the paper's
    # depth, mapped from GPT-2's 12 layers, need not be where another model carries it
    layer_rule: str = described(
        "share_sweep",
        "A test's layer: 'depth' (the paper's GPT-2 layer at the same relative depth) or "
        "'share_sweep' (of the layers near it, the nearest whose whole-space share on "
        "selection prompts is within one standard error of the largest).",
    )
    sweep_window: int = described(
        2, "Share sweep: candidate layers within this many layers of the mapped depth."
    )
    sweep_prompts: int = described(
        24, "Share sweep: selection prompts per test (never an evaluation prompt)."
    )
    baselines: tuple[str, ...] = described(
        BASELINES, "Decompositions compared with NDM (each with NDM's partition)."
    )
    gini_bootstrap: int = described(1000, "Bootstrap resamples of the prompts for Gini CIs.")
    sae_width: int = described(2048, "Latents of the SAE baseline (TopK).")
    sae_k: int = described(32, "TopK k of the SAE baseline.")
    sae_epochs: int = described(50, "Most SAE epochs (training stops at the FVU plateau).")
    sae_tol: float = described(0.01, "SAE plateau: relative FVU gain per epoch.")
    conflict_prompts: int = described(24, "Knowledge-conflict prompts of the routing test.")
    toy_steps: int = described(3000, "NDM steps on the toy model.")
    toy_ae_steps: int = described(10_000, "Training steps of the toy autoencoder.")
    browser_top: int = described(8, "Top contexts per subspace in the report's browser.")
    browser_pool: int = described(240, "Entries of the report's preimage index.")
    browser_neighbours: int = described(8, "Precomputed neighbours per index entry.")
    seed: int = described(0, "Seed of prompts, rotations, baselines and bootstraps.")

    def __post_init__(self) -> None:
        self.check_types()
        self.check_counts(
            {
                "corpus_prompts": 0, "corpus_tokens": 2, "task_prompts": 0, "unit_size": 1,
                "steps": 1, "bank_size": 1, "batch_size": 1, "refresh_interval": 1,
                "merge_start": 0, "merge_interval": 1, "mi_samples": 2, "restarts": 1,
                "patch_prompts": 2, "sweep_window": 0, "sweep_prompts": 2, "gini_bootstrap": 1,
                "sae_width": 1, "sae_k": 1, "sae_epochs": 1, "conflict_prompts": 2, "toy_steps": 1,
                "toy_ae_steps": 1, "browser_top": 1, "browser_pool": 2, "browser_neighbours": 1,
                "seed": 0,
            }
        )  # fmt: skip
        if self.max_units is not None and self.max_units < 1:
            raise InputError(f"max_units must be >= 1 or null; got {self.max_units}.")
        if self.corpus_prompts + self.task_prompts == 0:
            raise InputError("corpus_prompts and task_prompts must not both be 0.")
        for name, known in (("training_tasks", TRAINING_TASKS), ("baselines", BASELINES)):
            bad = [v for v in getattr(self, name) if v not in known]
            if bad:
                raise InputError(f"{name}: unknown {bad[0]!r}; choose from {', '.join(known)}.")
        if self.layer_rule not in LAYER_RULES:
            raise InputError(
                f"layer_rule must be one of {', '.join(map(repr, LAYER_RULES))}; got "
                f"{self.layer_rule!r}."
            )
        if not 0.0 <= self.min_share <= 1.0:
            raise InputError(f"min_share must be in [0, 1]; got {self.min_share}.")
        if self.lr <= 0 or self.merge_threshold < 0 or self.sae_tol < 0:
            raise InputError("lr must be > 0, merge_threshold and sae_tol >= 0.")

    def ndm_config(self, n_rows: int, d: int, device: str = "cpu") -> Any:
        """The :class:`~structlens.ndm.NDMConfig` of a layer with ``n_rows`` activations of
        width ``d``.

        The one rule that adapts the protocol to small data: the unit is the gcd of
        ``unit_size`` and ``d`` when it does not divide ``d``; the bank and the MI sample hold
        at most half the rows, and a bank refresh serves no more steps than the other half
        holds queries for.  A layer with the protocol's sizes is trained with them unchanged.
        With ``max_units``, a unit that would give more subspaces grows to the smallest
        divisor of ``d`` that gives at most ``max_units``.

        >>> NDMProtocol(unit_size=8, max_units=16).ndm_config(n_rows=1000, d=640).unit_size
        40
        >>> NDMProtocol(unit_size=8, max_units=16).ndm_config(n_rows=1000, d=64).unit_size
        8
        """
        from structlens.ndm.ndm import NDMConfig

        if n_rows < 4:
            raise InputError(f"NDM needs at least 4 activations per layer; got {n_rows}.")
        bank = min(self.bank_size, n_rows // 2)
        unit = self.unit_size if d % self.unit_size == 0 else math.gcd(d, self.unit_size)
        if self.max_units is not None and d // unit > self.max_units:
            unit = next(u for u in range(-(-d // self.max_units), d + 1) if d % u == 0)
        return NDMConfig(
            unit_size=unit,
            lr=self.lr, batch_size=self.batch_size, max_steps=self.steps, bank_size=bank,
            refresh_interval=max(1, min(self.refresh_interval, (n_rows - bank) // self.batch_size)),
            merge_start=self.merge_start, merge_interval=self.merge_interval,
            merge_threshold=self.merge_threshold, mi_samples=min(self.mi_samples, n_rows // 2),
            restarts=self.restarts, log_interval=min(50, self.steps), seed=self.seed,
            device=device,
        )  # fmt: skip

    def layer_selection(self) -> dict[str, Any]:
        """The fields that decide the patching tests' layers (the selection prompts follow
        the evaluation prompts of ``patch_prompts`` and ``seed``): a layer sweep recorded
        under equal ones is this protocol's choice.  ``sweep_alpha`` is the level of the
        sweep's paired test (:data:`~structlens.ndm.evaluate.SWEEP_ALPHA`)."""
        from structlens.ndm.evaluate import SWEEP_ALPHA

        names = ("layer_rule", "sweep_window", "sweep_prompts", "patch_prompts", "seed")
        return {name: getattr(self, name) for name in names} | {"sweep_alpha": SWEEP_ALPHA}

    def sae_baseline(self) -> Any:
        """The SAE of the SAE-clustering baseline."""
        from structlens.ndm.pipeline import SAEBaselineConfig

        return SAEBaselineConfig(
            width=self.sae_width, k=self.sae_k, epochs=self.sae_epochs, tol=self.sae_tol,
            seed=self.seed,
        )  # fmt: skip

    def toy(self) -> tuple[Any, Any]:
        """The toy autoencoder's :class:`~structlens.ndm.ToyConfig` and the NDM settings of
        its recovery run (2-d units, merges from a third of the steps)."""
        from structlens.ndm.ndm import NDMConfig
        from structlens.ndm.toy import ToyConfig

        steps = self.toy_steps
        ndm = NDMConfig(
            unit_size=2, lr=1e-3, max_steps=steps, bank_size=8192, refresh_interval=50,
            merge_start=max(1, steps // 3), merge_interval=max(1, steps // 6), mi_samples=2000,
            seed=self.seed,
        )  # fmt: skip
        return ToyConfig(steps=self.toy_ae_steps, seed=self.seed), ndm


#: The protocol instances the drivers start from.  ``paper`` follows the paper's rules at
#: CPU-feasible sizes (the replication's and the CLI's defaults); ``cpu`` is the main job's
#: budget on a laptop; ``smoke`` shrinks every size for tiny test models and keeps every rule.
PROFILES: dict[str, NDMProtocol] = {
    "paper": NDMProtocol(
        steps=60, lr=3e-3, merge_start=20, merge_interval=20, patch_prompts=48,
        sae_width=512, conflict_prompts=32,
    ),
    # NDM steps at d = 576 are dominated by the backward of the rotation's matrix
    # exponential: 200 steps keep two merge rounds; results flag non-convergence
    "cpu": NDMProtocol(
        corpus_prompts=160, corpus_tokens=96, task_prompts=0, unit_size=32, steps=200,
        refresh_interval=25, merge_start=100, merge_interval=100, mi_samples=2000,
        baselines=("identity", "random", "pca"), gini_bootstrap=500,
    ),
    # 8-dimensional units for the tiny models (d = 64: 8 subspaces); at most 16 subspaces
    # (Gemma 3 270M: 40-dimensional units, not 80 units to patch and pair)
    "smoke": NDMProtocol(
        corpus_prompts=64, corpus_tokens=64, task_prompts=4, unit_size=8, max_units=16,
        steps=30,
        bank_size=2048, batch_size=64, refresh_interval=20, merge_start=10, merge_interval=10,
        mi_samples=1000, patch_prompts=16, sweep_window=1, sweep_prompts=8,
        baselines=("identity", "random", "pca"),
        gini_bootstrap=200, sae_width=64, sae_k=4, sae_epochs=3, conflict_prompts=8,
        toy_steps=30, toy_ae_steps=50, browser_top=6, browser_pool=96, browser_neighbours=5,
    ),
}  # fmt: skip


@dataclass(frozen=True)
class ReplicationProfile(Settings):
    """One profile of the NDM replication: its model, the protocol of training and evaluation
    (the tests' layer rule, screen, baselines, SAE baseline), the patching tests, and the
    sizes of the sections only the replication runs.  Frozen and checked at construction.
    NDM is trained at the layers the protocol's layer rule chooses for the tests.

    ``toy_seeds`` is the number of seeds of the toy recovery (the protocol's toy, with the
    ``min_subspaces`` guard where the merge rule misses the groups); ``planted`` the
    planted-partition recovery (``sizes``, ``seeds``, the ``restarts`` compared and the
    ``ndm`` config); ``browse`` the preimage browser's arguments at every
    ``(text, position)`` of ``queries``.  ``device_training`` trains on the device to the
    paper's stopping rule (``device_rows`` activations per layer, ``device_config`` over
    :data:`structlens.ndm.device_train.DEVICE_CONFIG`, at most ``device_seconds`` of wall
    time per layer, ``None`` for no limit) on ``--device``, the CPU included; without it a
    device run found in the cache (e.g. copied from a GPU host) is still used.
    """

    profile: str
    model: str
    tests: tuple[str, ...]
    protocol: NDMProtocol
    toy_seeds: int
    planted: Mapping[str, Any]
    browse: Mapping[str, Any]
    device_training: bool
    device_rows: int
    device_config: Mapping[str, Any]
    queries: tuple[tuple[str, int], ...]
    device_seconds: float | None = None

    def __post_init__(self) -> None:
        if not self.tests:
            raise InputError("tests must be non-empty: NDM is trained at the tests' layers.")
        missing = sorted({"sizes", "seeds", "restarts", "ndm"} - set(self.planted))
        if missing:
            raise InputError(f"planted needs the keys {missing}.")
        if self.toy_seeds < 1:
            raise InputError(f"toy_seeds must be >= 1, got {self.toy_seeds}.")
        if self.device_rows < 1 or not self.queries:
            raise InputError(
                f"device_rows must be >= 1 and queries non-empty; got {self.device_rows} and "
                f"{len(self.queries)} queries."
            )


_PLANTED_NDM = {
    "unit_size": 2, "lr": 2e-2, "batch_size": 64, "max_steps": 1500, "bank_size": 1024,
    "refresh_interval": 30, "reproject_interval": 10, "merge_start": 300, "merge_interval": 100,
    "mi_samples": 800, "init": "random", "log_interval": 50,
}  # fmt: skip
_REPLICATION_CPU = ReplicationProfile(
    profile="cpu", model="smollm2-135m",
    # SmolLM2 has rotary position embeddings: the IOI position-swap tests need an
    # absolute-position subspace it lacks, so the relative tests on repeated sequences
    # replace them (ndm.evaluate.patch_tests_for)
    tests=("previous_token_relative", "induction", "s_inhibition_name", "greater_than"),
    # a seeded toy run flips between CPUs: its recovery is a rate over seeds
    protocol=PROFILES["paper"], toy_seeds=8,
    # recovery over seeds on planted rotated partitions, one run against restarts
    planted={"sizes": [[4, 4], [4, 4, 8]], "seeds": 10, "restarts": [1, 3],
             "ndm": _PLANTED_NDM},
    browse={"k": 5, "extra_corpus_prompts": None},
    # trained to the stopping rule on the CPU: DEVICE_CONFIG's unit, batch, threshold and
    # merge schedule, the protocol's 8k bank, the Cayley map (its step costs half the
    # exponential's), at most 20,000 steps, one process per layer; no wall-time limit, so
    # that the steps taken, and the partitions, do not depend on the machine's load
    device_training=True,
    device_rows=12_416,  # activations per layer packed for training (float16, < 64 MiB)
    device_config={"retraction": "cayley", "max_steps": 20_000, "bank_size": 8192},
    queries=(("When Mary and John went to the store, John gave a drink to", -1),
             ("It is a truth universally acknowledged, that a single man in possession", -1)),
)  # fmt: skip
# >= 10^5 distinct activations per layer on the device: 1000 of the bundled corpus' 1082
# windows of <= 128 tokens (~117k rows), of which the device run keeps a bank of 99,840 plus
# 20 x 128 queries per refresh; >= 500 prompts per test (Gini CI width about +-0.03)
_GPU_ROWS = 102_400

#: The replication's profiles: ``cpu`` trains 60 steps per layer with the protocol, then to
#: the stopping rule (or 20,000 steps) on the CPU; ``gpu`` trains on the device to the
#: paper's stopping rule with the paper's merge schedule and restarts;
#: ``smoke`` runs every section on a random 3-layer Llama with SmolLM2's tokenizer.
REPLICATION_PROFILES: dict[str, ReplicationProfile] = {
    "cpu": _REPLICATION_CPU,
    "gpu": _REPLICATION_CPU.replace(
        profile="gpu", device_rows=_GPU_ROWS,
        device_config={"max_steps": 100_000, "merge_start": 20_000, "merge_interval": 8_000,
                       "bank_size": _GPU_ROWS - 20 * 128},
        # on the device the sweep costs little: more selection prompts, a less noisy choice
        protocol=PROFILES["paper"].replace(
            restarts=3, corpus_prompts=1000, patch_prompts=512, sweep_prompts=128
        ),
    ),
    "smoke": _REPLICATION_CPU.replace(
        profile="smoke", model="tiny-smol",
        # the SAE baseline and two restarts, so that both reach the run
        protocol=PROFILES["smoke"].replace(
            restarts=2, baselines=("identity", "random", "pca", "sae")
        ),
        toy_seeds=2,
        planted={"sizes": [[2, 2]], "seeds": 2, "restarts": [1, 2],
                 "ndm": _PLANTED_NDM | {"max_steps": 40, "merge_start": 20,
                                        "merge_interval": 10, "bank_size": 256,
                                        "mi_samples": 200}},
        # the device path has its own (slow) test
        browse={"k": 3, "extra_corpus_prompts": 3}, device_training=False, device_rows=2_000,
        device_config={"max_steps": 20, "merge_start": 10, "merge_interval": 10,
                       "batch_size": 16, "refresh_interval": 5, "bank_size": 512,
                       "mi_samples": 300, "unit_size": 8, "chunk_steps": 10},
    ),
}  # fmt: skip

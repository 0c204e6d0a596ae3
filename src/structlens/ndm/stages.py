"""The stages of the NDM analysis: the only code that turns a model and activations into NDM
numbers under an :class:`~structlens.ndm.protocol.NDMProtocol`.

``ndm train`` / ``evaluate``, ``structlens analyze`` and the NDM replication call these
functions and only render what they return, so equal protocols give equal results:

* :func:`training_prompts`: the training activations' prompts (evaluation prompts left out);
* :func:`plan_tests`: the patching tests this model and tokenizer support, with their layers
  chosen by the protocol's layer rule (:func:`layer_sweep`, :class:`LayerSweep`);
* :func:`screen`: a test's whole-space effect and whether it passes the screen (:class:`Screen`);
* :func:`train`: NDM at one layer (:class:`~structlens.ndm.NDMResult`);
* :func:`decompose`: NDM's rotation beside the baselines' with its partition
  (:class:`Decomposition`);
* :func:`patch`: every subspace of every decomposition patched for one test;
* :func:`gini`: the Gini table over the screened tests (:class:`GiniSummary`);
* :func:`conflict`: knowledge-conflict routing (:class:`ConflictRouting`);
* :func:`toy`, :func:`toy_seeds`: recovery of the toy model's feature groups
  (:class:`ToyRecovery`, over seeds :class:`ToySeeds`);
* :func:`planted`: recovery of planted rotated partitions over seeds (:class:`PlantedRecovery`);
* :func:`preimage_index`: the bounded preimage index embedded in the report;
* :func:`analysis`: the stages above composed for ``structlens analyze`` (:class:`Analysis`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from structlens.data.tasks import TaskDataset
from structlens.ndm.evaluate import (
    PatchRun,
    PatchTest,
    choose_layer,
    corrupted_prompts,
    make_test_task,
    map_layer,
    patch_positions,
    patch_subspaces,
    patch_tests_for,
    share_gain_p,
    summarize_gini,
    sweep_candidates,
    whole_space_run,
    whole_space_share,
    whole_space_share_error,
)
from structlens.ndm.protocol import NDMProtocol
from structlens.results import Result

__all__ = [
    "TestPlan", "LayerChoice", "LayerSweep", "Screen", "Decomposition", "Estimate",
    "GiniSummary", "ConflictRouting", "ToyRecovery", "ToySeeds", "PlantedRecovery", "ScreenRow",
    "TrainedLayer", "Analysis", "training_prompts", "evaluation_prompts", "selection_task",
    "layer_sweep", "plan_tests", "screen", "train", "decompose", "patch", "gini", "conflict",
    "toy", "toy_seeds", "planted", "preimage_index", "analysis",
]  # fmt: skip

Prompts = list[tuple[str, list[int]]]


def _task(name: str, model: Any, n: int, seed: int) -> Any | None:
    """The task's dataset, or ``None`` when this tokenizer cannot build it (its words must be
    single tokens)."""
    from structlens.data.tasks import make_task

    try:
        return make_task(name, model.tokenizer, n=n, seed=seed)
    except ValueError:
        return None


def evaluation_prompts(protocol: NDMProtocol, model: Any) -> dict[str, set[tuple[int, ...]]]:
    """The clean prompts every evaluation of ``protocol`` runs on, by task: the patching
    tests' (``patch_prompts``) and knowledge conflict's (``conflict_prompts``)."""
    out: dict[str, set[tuple[int, ...]]] = {}
    for name in protocol.training_tasks:
        n = protocol.conflict_prompts if name == "knowledge_conflict" else protocol.patch_prompts
        task = _task(name, model, n, protocol.seed)
        out[name] = set() if task is None else {tuple(t) for t in task.clean}
    return out


def training_prompts(protocol: NDMProtocol, model: Any) -> Prompts:
    """``(id, token_ids)`` of the training activations: corpus windows ``[0,
    corpus_prompts)`` of ``corpus_tokens`` tokens, then ``task_prompts`` clean prompts of
    each training task this tokenizer can build.

    Task prompts are drawn from a seed stream of their own and any that is also an evaluation
    prompt (:func:`evaluation_prompts`) is dropped, so no test scores a prompt NDM was trained
    on.
    """
    from structlens.ndm.data import training_prompts as corpus_windows

    out = corpus_windows(
        model, corpus_prompts=protocol.corpus_prompts, max_tokens=protocol.corpus_tokens
    )
    if protocol.task_prompts == 0:
        return out
    held_out = evaluation_prompts(protocol, model)
    for name in protocol.training_tasks:
        # drawn beyond task_prompts by the held-out count, so removals still leave enough
        n = protocol.task_prompts + len(held_out[name])
        task = _task(name, model, n, protocol.seed + 1)
        if task is None:
            continue
        kept = [
            (pid, list(t))
            for pid, t in zip(task.prompt_ids, task.clean, strict=True)
            if tuple(t) not in held_out[name]
        ]
        out += kept[: protocol.task_prompts]
    return out


@dataclass(frozen=True)
class LayerChoice(Result):
    """How one patching test's layer was chosen.

    ``mapped`` is the paper's GPT-2 layer at the same relative depth.  Under the share sweep
    ``shares[i]`` is the whole-space share (:func:`~structlens.ndm.evaluate.whole_space_share`)
    at layer ``candidates[i]`` on the selection prompts ``prompt_ids`` (never evaluation
    prompts, :func:`selection_task`), ``errors[i]`` its standard error over those prompts,
    ``p_values[i]`` the one-sided paired p-value of its gain over ``mapped``
    (:func:`~structlens.ndm.evaluate.share_gain_p`), and ``chosen`` the candidate
    :func:`~structlens.ndm.evaluate.choose_layer` picks; under the depth rule nothing is
    measured (no candidates) and ``chosen`` is ``mapped``.
    """

    test: str
    mapped: int
    candidates: tuple[int, ...]
    shares: tuple[float, ...]
    errors: tuple[float, ...]
    chosen: int
    prompt_ids: tuple[str, ...] = ()
    p_values: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        # a saved result reads its tuples back as JSON lists
        for name in ("candidates", "shares", "errors", "prompt_ids", "p_values"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        n = len(self.candidates)
        if not n == len(self.shares) == len(self.errors) == len(self.p_values):
            raise ValueError(
                f"{n} candidates for {len(self.shares)} shares, {len(self.errors)} standard "
                f"errors and {len(self.p_values)} p-values."
            )


@dataclass(frozen=True)
class LayerSweep(Result):
    """The layers of the patching tests: one :class:`LayerChoice` per test, made under
    ``selection`` (:meth:`NDMProtocol.layer_selection`: the layer rule, the window, the
    selection and evaluation prompt counts and the seed).  Every candidate's share is kept,
    so a reader sees the whole sweep and not only the layer it chose."""

    selection: dict[str, Any]
    choices: list[LayerChoice]

    @property
    def rule(self) -> str:
        return str(self.selection["layer_rule"])

    @property
    def chosen(self) -> dict[str, int]:
        """Each test's chosen layer."""
        return {c.test: c.chosen for c in self.choices}

    @property
    def layers(self) -> list[int]:
        """The distinct chosen layers, ascending: where NDM is trained."""
        return sorted(set(self.chosen.values()))

    def restricted(self, protocol: NDMProtocol, tests: Sequence[PatchTest]) -> LayerSweep:
        """This sweep's choices for ``tests``, in their order.

        Raises
        ------
        InputError
            The sweep was made under another layer selection than ``protocol``'s, or lacks
            one of the tests.
        """
        from structlens.errors import InputError

        if self.selection != protocol.layer_selection():
            raise InputError(
                f"the layer sweep was made under {self.selection}, the protocol chooses layers "
                f"under {protocol.layer_selection()}; sweep again with this protocol."
            )
        by_test = {c.test: c for c in self.choices}
        if missing := [t.name for t in tests if t.name not in by_test]:
            raise InputError(f"the layer sweep has no choice for the tests {missing}.")
        return LayerSweep(dict(self.selection), [by_test[t.name] for t in tests])


def selection_task(protocol: NDMProtocol, model: Any, test: PatchTest) -> TaskDataset:
    """The prompts on which the share sweep chooses ``test``'s layer.

    They are drawn from the evaluation prompts' own stream after its first ``patch_prompts``
    (so their ids never coincide), any whose tokens equal an evaluation prompt's is dropped,
    and the first ``sweep_prompts`` that remain are kept.  The layer is chosen on other
    prompts than those that measure the effect, so the choice cannot select on the
    evaluated effect's noise.

    Raises
    ------
    InputError
        Fewer than ``sweep_prompts`` drawn prompts differ from the evaluation prompts.
    """
    from structlens.errors import InputError

    n_eval, n = protocol.patch_prompts, protocol.sweep_prompts
    held_out = {tuple(t) for t in _inputs(protocol, model, test)[0].clean}
    # twice the prompts needed after the evaluation ones, so duplicates dropped leave enough
    drawn = make_test_task(test, model.tokenizer, n=n_eval + 2 * n, seed=protocol.seed)
    kept = [i for i in range(n_eval, len(drawn)) if tuple(drawn.clean[i]) not in held_out]
    if len(kept) < n:
        raise InputError(
            f"{test.name}: only {len(kept)} of {2 * n} drawn selection prompts differ from the "
            f"evaluation prompts; lower sweep_prompts (now {n})."
        )
    return drawn.subset(kept[:n])


def _choice(protocol: NDMProtocol, model: Any, test: PatchTest, batch_size: int) -> LayerChoice:
    mapped = map_layer(test.gpt2_layer, model.n_layers)
    if protocol.layer_rule == "depth":
        return LayerChoice(test.name, mapped, (), (), (), mapped)
    task = selection_task(protocol, model, test)
    corrupted = corrupted_prompts(task, test.corruption)
    positions = patch_positions(task, test.positions)
    candidates = sweep_candidates(mapped, model.n_layers, protocol.sweep_window)
    runs = [
        whole_space_run(model, task, corrupted, layer, positions, batch_size=batch_size)
        for layer in candidates
    ]
    shares = tuple(whole_space_share(r) for r in runs)
    errors = tuple(whole_space_share_error(r) for r in runs)
    p_values = share_gain_p(runs, candidates.index(mapped))
    chosen = choose_layer(mapped, candidates, shares, errors, p_values)
    return LayerChoice(
        test.name, mapped, candidates, shares, errors, chosen, tuple(task.prompt_ids), p_values
    )


def layer_sweep(
    protocol: NDMProtocol, model: Any, tests: Sequence[PatchTest], *, batch_size: int = 16
) -> LayerSweep:
    """Each test's layer under the protocol's ``layer_rule``.

    ``"depth"`` measures nothing.  ``"share_sweep"`` patches the whole space at every layer
    within ``sweep_window`` of the mapped depth on the test's selection prompts
    (:func:`selection_task`), two truncated forward passes and one resumed pass of three
    stacked copies per batch and candidate, and keeps the layer nearest the mapped one among
    those within one standard error of the largest share
    (:func:`~structlens.ndm.evaluate.choose_layer`).
    """
    choices = [_choice(protocol, model, t, batch_size) for t in tests]
    return LayerSweep(protocol.layer_selection(), choices)


@dataclass(frozen=True)
class TestPlan:
    """The patching tests a model supports: ``tests`` with their ``layers`` (chosen by the
    protocol's layer rule, as recorded in ``sweep``) and the tests ``skipped`` because this
    tokenizer cannot build their task."""

    tests: tuple[PatchTest, ...]
    layers: Mapping[str, int]
    skipped: tuple[str, ...]
    sweep: LayerSweep


def plan_tests(
    protocol: NDMProtocol,
    model: Any,
    names: Sequence[str] = (),
    *,
    sweep: LayerSweep | None = None,
    batch_size: int = 16,
) -> TestPlan:
    """The paper's tests (on rotary models the position-swap tests replaced by
    :data:`~structlens.ndm.evaluate.ROPE_TESTS`), restricted to ``names`` when given, at the
    layers of :func:`layer_sweep`, or of ``sweep`` when given (a sweep already made under
    this protocol, e.g. where NDM was trained: reused, never measured again on another
    device whose round-off could choose another layer).

    Raises
    ------
    InputError
        A name is not a test of this model, or ``sweep`` is not this protocol's
        (:meth:`LayerSweep.restricted`).
    """
    from structlens.errors import InputError
    from structlens.ndm.evaluate import PAPER_TESTS, ROPE_TESTS

    known = [t.name for t in (*PAPER_TESTS, *ROPE_TESTS)]
    if unknown := sorted(set(names) - set(known)):
        raise InputError(f"unknown tests {unknown}; choose from {known} or 'all'")
    suitable = patch_tests_for(model)
    unknown = sorted(set(names) - {t.name for t in suitable})
    if unknown:
        raise InputError(
            f"tests {unknown} do not suit {model.name} (rotary position embeddings have no "
            f"absolute-position subspace); choose from {[t.name for t in suitable]}"
        )
    chosen = [t for t in suitable if not names or t.name in names]
    buildable, skipped = [], []
    for t in chosen:
        try:
            make_test_task(t, model.tokenizer, n=2, seed=protocol.seed)
            buildable.append(t)
        except ValueError:
            skipped.append(t.name)
    sweep = (
        layer_sweep(protocol, model, buildable, batch_size=batch_size)
        if sweep is None
        else sweep.restricted(protocol, buildable)
    )
    return TestPlan(tuple(buildable), sweep.chosen, tuple(skipped), sweep)


def _inputs(protocol: NDMProtocol, model: Any, test: PatchTest) -> tuple[Any, Any, Any]:
    task = make_test_task(test, model.tokenizer, n=protocol.patch_prompts, seed=protocol.seed)
    return task, corrupted_prompts(task, test.corruption), patch_positions(task, test.positions)


@dataclass(frozen=True)
class Screen:
    """One test's whole-space patch at its layer.

    ``whole_space_share`` is the mean whole-space effect over the mean clean metric (NaN when
    the model does not do the task); the test passes the screen (``screened``) at a share of
    at least the protocol's ``min_share``.  Below it the subspace effects are mostly noise
    (noise alone gives a Gini near 0.41), so the test's subspaces are never patched.
    """

    test: PatchTest
    layer: int
    run: PatchRun
    whole_space_share: float
    screened: bool

    @property
    def name(self) -> str:
        return self.test.name

    @classmethod
    def of(cls, protocol: NDMProtocol, test: PatchTest, layer: int, run: PatchRun) -> Screen:
        """The screen of a whole-space ``run`` of ``test`` at ``layer``."""
        share = whole_space_share(run)
        return cls(
            test, int(layer), run, share, bool(np.isfinite(share) and share >= protocol.min_share)
        )


def screen(
    protocol: NDMProtocol, model: Any, test: PatchTest, layer: int, *, batch_size: int = 16
) -> Screen:
    """Patch the whole space of ``test`` at ``layer`` (three forward passes per batch)."""
    task, corrupted, positions = _inputs(protocol, model, test)
    run = whole_space_run(model, task, corrupted, layer, positions, batch_size=batch_size)
    return Screen.of(protocol, test, layer, run)


def train(
    protocol: NDMProtocol,
    h: Any,
    *,
    checkpoint_dir: Any = None,
    model_digest: str | None = None,
    device: str = "cpu",
    progress: Callable[[int, float, list[int]], None] | None = None,
) -> Any:
    """NDM on one layer's activations ``h`` ``(n, d)`` under
    :meth:`NDMProtocol.ndm_config` (checkpointed under ``checkpoint_dir`` when given)."""
    from structlens.ndm.ndm import NDM

    cfg = protocol.ndm_config(int(h.shape[0]), int(h.shape[1]), device)
    return NDM(cfg).fit(
        h, checkpoint_dir=checkpoint_dir, model_digest=model_digest, progress=progress
    )


@dataclass(frozen=True)
class Decomposition:
    """NDM's rotation at one layer beside the baselines' with its partition.

    ``rotations[method]`` is ``(d, d)`` orthogonal with subspace ``s`` its column block
    ``partition[s]``; ``variances[method]`` the activation variance in each subspace (the
    variance-normalised Gini's weights); ``baseline_info`` the baselines' diagnostics (the
    SAE's fit).
    """

    layer: int
    partition: tuple[int, ...]
    rotations: Mapping[str, np.ndarray]
    variances: Mapping[str, list[float]]
    baseline_info: Mapping[str, Any] = field(default_factory=dict)

    def bases(self, methods: Sequence[str] | None = None) -> dict[str, list[np.ndarray]]:
        """Each method's subspace bases ``(d, d_s)``."""
        bounds = np.concatenate([[0], np.cumsum(self.partition)]).astype(int)
        return {
            m: [self.rotations[m][:, a:b] for a, b in zip(bounds[:-1], bounds[1:])]
            for m in (self.rotations if methods is None else methods)
        }


def decompose(
    protocol: NDMProtocol,
    h: np.ndarray,
    layer: int,
    rotation: np.ndarray,
    partition: Sequence[int],
    *,
    executor: Any = None,
) -> Decomposition:
    """NDM's ``(rotation, partition)`` at ``layer`` and the protocol's baselines with the same
    partition, fitted on the same activations ``h`` (the SAE baseline trains its SAE here)."""
    from structlens.ndm import subspace_variances
    from structlens.ndm.pipeline import baseline_rotations

    h = np.asarray(h, dtype=np.float64)
    base, info = baseline_rotations(
        h, list(partition), protocol.baselines, seed=protocol.seed,
        sae=protocol.sae_baseline(), executor=executor,
    )  # fmt: skip
    rotations = {"ndm": np.asarray(rotation, dtype=np.float64), **base}
    variances = {m: subspace_variances(h, r, list(partition)) for m, r in rotations.items()}
    return Decomposition(int(layer), tuple(int(k) for k in partition), rotations, variances, info)


def patch(
    protocol: NDMProtocol,
    model: Any,
    test: PatchTest,
    decomposition: Decomposition,
    *,
    batch_size: int = 16,
) -> dict[str, PatchRun]:
    """Every subspace of every decomposition of ``decomposition``'s layer patched from the
    corrupted run, per prompt (:func:`~structlens.ndm.evaluate.patch_subspaces`)."""
    task, corrupted, positions = _inputs(protocol, model, test)
    return patch_subspaces(
        model, task, corrupted, decomposition.layer, positions, decomposition.bases(),
        batch_size=batch_size,
    )  # fmt: skip


@dataclass(frozen=True)
class Estimate:
    """A point estimate and its 95% percentile-bootstrap interval over prompts; for a
    difference of NDM and a baseline, ``p_above`` is the one-sided bootstrap p-value of
    "NDM above the baseline" (None elsewhere)."""

    value: float
    ci: tuple[float, float]
    p_above: float | None = None


Variants = Mapping[str, Estimate]  # unnormalized, dimension, variance


def _estimate_json(e: Estimate) -> dict[str, Any]:
    doc: dict[str, Any] = {"value": e.value, "ci": list(e.ci)}
    return doc if e.p_above is None else doc | {"p_above": e.p_above}


@dataclass(frozen=True)
class GiniSummary:
    """The Gini coefficients of the mean subspace effects, over the tests that pass the screen.

    ``per_test[test][method]`` and ``mean[method]`` hold the three variants
    (:data:`~structlens.ndm.evaluate.GINI_VARIANTS`); ``ndm_minus[method]`` NDM's mean minus
    the method's (paired bootstrap).  With no screened test, ``mean`` and ``ndm_minus`` are
    ``None``: there is no signal to measure.
    """

    min_share: float
    screens: tuple[Screen, ...]
    per_test: Mapping[str, Mapping[str, Variants]]
    mean: Mapping[str, Variants] | None
    ndm_minus: Mapping[str, Variants] | None

    def to_json(self) -> dict[str, Any]:
        """The ``screen``, ``min_share``, ``gini``, ``gini_mean`` and ``gini_mean_diff`` keys
        of ``ndm_evaluate.json`` (``"no signal"`` where a test or the mean has none)."""

        def table(by: Mapping[str, Variants]) -> dict[str, Any]:
            return {m: {k: _estimate_json(e) for k, e in v.items()} for m, v in by.items()}

        return {
            "screen": [
                {
                    "test": s.name,
                    "layer": s.layer,
                    "whole_space_share": s.whole_space_share,
                    "screened": s.screened,
                }
                for s in self.screens
            ],  # fmt: skip
            "min_share": self.min_share,
            "gini": {
                s.name: table(self.per_test[s.name]) if s.name in self.per_test else "no signal"
                for s in self.screens
            },
            "gini_mean": "no signal" if self.mean is None else table(self.mean),
            "gini_mean_diff": "no signal" if self.ndm_minus is None else table(self.ndm_minus),
        }


def gini(
    protocol: NDMProtocol,
    screens: Sequence[Screen],
    runs: Mapping[str, Mapping[str, PatchRun]],
    decompositions: Mapping[int, Decomposition],
) -> GiniSummary:
    """:func:`~structlens.ndm.evaluate.summarize_gini` over the screened tests of ``screens``
    (``runs[test]``: :func:`patch` of each), in their order (bootstrap seeds follow it)."""
    passed = [s for s in screens if s.screened]
    if not passed:
        return GiniSummary(protocol.min_share, tuple(screens), {}, None, None)
    raw = summarize_gini(
        {s.name: runs[s.name] for s in passed},
        {s.name: decompositions[s.layer].partition for s in passed},
        {s.name: decompositions[s.layer].variances for s in passed},
        n_boot=protocol.gini_bootstrap,
        seed=protocol.seed,
    )

    def typed(by: Mapping[str, Any]) -> dict[str, Variants]:
        return {
            m: {k: Estimate(float(e["value"]), (float(e["ci"][0]), float(e["ci"][1])),
                            None if "p_above" not in e else float(e["p_above"]))
                for k, e in v.items()}
            for m, v in by.items()
        }  # fmt: skip

    return GiniSummary(
        protocol.min_share,
        tuple(screens),
        {t: typed(by) for t, by in raw["gini"].items()},
        typed(raw["gini_mean"]),
        typed(raw["gini_mean_diff"]) if "gini_mean_diff" in raw else None,
    )


@dataclass(frozen=True)
class ConflictRouting:
    """Knowledge-conflict routing at ``layer``: for each corruption (the true answer or
    another answer in the context), the share of prompts whose top-1 token is the context's
    or the parametric answer, clean, per NDM subspace patched and with the whole space
    patched, with the normalised subspace effects."""

    layer: int
    n: int
    corruptions: Mapping[str, Mapping[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"layer": self.layer, "positions": "all", "n": self.n,
                "corruptions": dict(self.corruptions)}  # fmt: skip


def conflict(
    protocol: NDMProtocol, model: Any, decomposition: Decomposition, *, batch_size: int = 16
) -> ConflictRouting | None:
    """Patch every NDM subspace at all positions of the knowledge-conflict prompts (``None``
    when this tokenizer cannot build the task)."""
    from structlens.ndm.evaluate import routing_rates

    n = protocol.conflict_prompts
    task = _task("knowledge_conflict", model, n, protocol.seed)
    if task is None:
        return None
    out = {}
    for corruption in ("true_answer", "other_answer"):
        run = patch_subspaces(
            model, task, corrupted_prompts(task, corruption), decomposition.layer, None,
            decomposition.bases(["ndm"]), batch_size=batch_size,
        )["ndm"]  # fmt: skip
        rates = routing_rates(run, task)
        rates["effects_normalized"] = run.normalized_effects().tolist()
        out[corruption] = rates
    return ConflictRouting(decomposition.layer, n, out)


@dataclass(frozen=True)
class ToyRecovery(Result):
    """NDM on the paper's toy autoencoder: the ``partition`` found, the feature groups'
    dimensions (``truth``), ``overlap`` (smallest matched subspace overlap with the feature
    groups, 1 = exact), whether the number of subspaces equals the number of groups, and the
    full ``record`` of :func:`~structlens.ndm.pipeline.toy_recovery`."""

    partition: tuple[int, ...]
    truth: tuple[int, ...]
    overlap: float
    right_number_of_subspaces: bool
    converged: bool
    record: Mapping[str, Any]

    def __post_init__(self) -> None:
        # a saved result reads its tuples back as JSON lists
        object.__setattr__(self, "partition", tuple(self.partition))
        object.__setattr__(self, "truth", tuple(self.truth))

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> ToyRecovery:
        """The recovery of a :func:`~structlens.ndm.pipeline.toy_recovery` record."""
        return cls(
            tuple(record["partition"]), tuple(record["truth_dims"]), float(record["overlap"]),
            bool(record["right_number_of_subspaces"]), bool(record["converged"]), record,
        )  # fmt: skip


def toy(protocol: NDMProtocol) -> ToyRecovery:
    """Train the toy autoencoder and recover its feature groups with NDM."""
    from structlens.ndm.pipeline import toy_recovery

    toy_cfg, ndm_cfg = protocol.toy()
    return ToyRecovery.of(toy_recovery(toy_cfg, ndm_cfg, seed=protocol.seed))


@dataclass(frozen=True)
class ToySeeds(Result):
    """The toy recovery over seeds: ``runs[i]`` is :func:`toy` at seed ``seeds[i]`` (the
    autoencoder, its samples and NDM all drawn from it); ``guarded[j]`` the same run with
    the ``min_subspaces`` stop guard at the number of feature groups, at ``guarded_seeds[j]``,
    run only where the unguarded run misses the groups (the fallback a user would try)."""

    seeds: list[int]
    runs: list[ToyRecovery]
    guarded_seeds: list[int]
    guarded: list[ToyRecovery]


def toy_seeds(
    protocol: NDMProtocol, seeds: int, recovers: Callable[[ToyRecovery], bool]
) -> ToySeeds:
    """:func:`toy` at seeds ``protocol.seed .. protocol.seed + seeds - 1``; where a run does
    not ``recovers`` the groups, again with the stop guard."""
    from structlens.ndm.pipeline import toy_recovery

    toy_cfg, ndm_cfg = protocol.toy()
    chosen = list(range(protocol.seed, protocol.seed + seeds))
    runs, guarded, guarded_seeds = [], [], []
    for seed in chosen:
        toy_s, ndm_s = replace(toy_cfg, seed=seed), replace(ndm_cfg, seed=seed)
        run = ToyRecovery.of(toy_recovery(toy_s, ndm_s, seed=seed))
        runs.append(run)
        if not recovers(run):
            guard = replace(ndm_s, min_subspaces=len(run.truth))
            guarded.append(ToyRecovery.of(toy_recovery(toy_s, guard, seed=seed)))
            guarded_seeds.append(seed)
    return ToySeeds(chosen, runs, guarded_seeds, guarded)


@dataclass(frozen=True)
class PlantedRecovery(Result):
    """How often NDM (with ``restarts`` runs per fit) recovers a planted rotated partition of
    group ``sizes``: ``recovered`` of ``n`` seeds, the rate's 95% Wilson interval ``ci``, the
    overlap a recovery needs, and the full ``record`` of
    :func:`~structlens.ndm.pipeline.planted_recovery`."""

    sizes: tuple[int, ...]
    restarts: int
    recovered: int
    n: int
    ci: tuple[float, float]
    min_overlap: float
    record: Mapping[str, Any]

    def __post_init__(self) -> None:
        # a saved result reads its tuples back as JSON lists
        object.__setattr__(self, "sizes", tuple(self.sizes))
        object.__setattr__(self, "ci", tuple(self.ci))

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> PlantedRecovery:
        """The recovery rate of a :func:`~structlens.ndm.pipeline.planted_recovery` record."""
        lo, hi = record["ci"]
        return cls(
            tuple(record["sizes"]), int(record["restarts"]), int(record["recovered"]),
            int(record["n"]), (float(lo), float(hi)), float(record["min_overlap"]), record,
        )  # fmt: skip


def planted(sizes: Sequence[int], seeds: int, ndm: Mapping[str, Any]) -> PlantedRecovery:
    """NDM (``ndm``: an :class:`~structlens.ndm.NDMConfig`) on planted rotated partitions of
    ``sizes``, seeds ``0 .. seeds - 1``."""
    from structlens.ndm import NDMConfig
    from structlens.ndm.pipeline import planted_recovery

    return PlantedRecovery.of(planted_recovery(sizes, list(range(seeds)), NDMConfig(**ndm)))


def preimage_index(
    protocol: NDMProtocol,
    tokenizer: Any,
    h: np.ndarray,
    prompts: Sequence[tuple[str, Sequence[int]]],
    prompt_index: np.ndarray,
    position: np.ndarray,
    rotation: np.ndarray,
    partition: Sequence[int],
) -> dict[str, Any]:
    """A bounded preimage index for the report.

    For each subspace ``s`` the ``browser_top`` stored activations with the largest norm of
    their projection ``|h R_s|`` (at most one per prompt) are its top activating contexts.
    The union of those, topped up with random rows to ``browser_pool`` entries, is the
    embedded index; for every entry and subspace the ``browser_neighbours`` nearest other
    entries by cosine similarity of the projections are precomputed with
    :class:`structlens.ndm.SubspaceIndex`, so the page answers "nearest stored activations to
    this context" without any computation.  Contexts are ``[before, token, after]``
    (:func:`structlens.ndm.browse.context_parts`).
    """
    from structlens.ndm.browse import context_parts
    from structlens.ndm.preimage import SubspaceIndex

    bounds = np.concatenate([[0], np.cumsum(partition)])
    chosen: list[int] = []
    tops: list[list[int]] = []
    for s in range(len(partition)):
        norm = np.linalg.norm(h @ rotation[:, bounds[s] : bounds[s + 1]], axis=1)
        rows: list[int] = []
        seen: set[int] = set()
        for r in np.argsort(-norm, kind="stable"):
            if int(prompt_index[r]) in seen:
                continue
            seen.add(int(prompt_index[r]))
            rows.append(int(r))
            if len(rows) == protocol.browser_top:
                break
        tops.append(rows)
        chosen += rows
    chosen = list(dict.fromkeys(chosen))
    rng = np.random.default_rng(protocol.seed)
    rest = np.setdiff1d(np.arange(h.shape[0]), chosen)
    extra = max(0, protocol.browser_pool - len(chosen))
    chosen += rng.choice(rest, min(len(rest), extra), replace=False).tolist()
    slot = {r: i for i, r in enumerate(chosen)}
    index = SubspaceIndex(rotation, partition)
    index.add(h[chosen])
    k = min(protocol.browser_neighbours, len(chosen) - 1)
    near = []
    for s in range(len(partition)):
        idx, sims = index.query(h[chosen], s, k=k, exclude=range(len(chosen)))
        near.append(
            [[[int(i), round(float(v), 4)] for i, v in zip(a, b)] for a, b in zip(idx, sims)]
        )
    entries = []
    for r in chosen:
        pid, toks = prompts[int(prompt_index[r])]
        pos = int(position[r])
        entries.append(
            {"prompt": pid, "position": pos, "context": list(context_parts(tokenizer, toks, pos))}
        )
    return {
        "entries": entries,
        "top": [[slot[r] for r in rows] for rows in tops],
        "neighbours": near,
        "partition": list(map(int, partition)),
    }


@dataclass(frozen=True)
class ScreenRow:
    """One patching test in :func:`analysis`: its screen with the whole-space effect's mean
    and 95% t-interval over prompts (NaN with fewer than two) and, for a test that passes the
    screen, each method's normalised subspace effects (``None`` otherwise: never patched)."""

    test: str
    layer: int
    full_effect: float
    full_effect_ci: tuple[float, float]
    whole_space_share: float
    screened: bool
    normalized: Mapping[str, list[float]] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"test": self.test, "layer": self.layer, "full_effect": self.full_effect,
               "full_effect_ci": list(self.full_effect_ci),
               "whole_space_share": self.whole_space_share, "screened": self.screened}  # fmt: skip
        if self.normalized is not None:
            out["normalized"] = dict(self.normalized)
        return out


@dataclass(frozen=True)
class TrainedLayer:
    """NDM's training at one layer in :func:`analysis`: the partition it stopped at, whether
    it stopped by the method's rule (``converged``) or at ``max_steps``, and its merge rounds
    (``step``, ``max_mi``, ``n_subspaces`` after the round)."""

    layer: int
    partition: tuple[int, ...]
    steps: int
    converged: bool
    max_steps: int
    threshold: float
    merge_history: tuple[Mapping[str, Any], ...]
    n_activations: int

    @classmethod
    def of(cls, layer: int, res: Any, n_rows: int) -> TrainedLayer:
        """The record of :func:`train`'s ``res`` on ``n_rows`` activations at ``layer``."""
        history = tuple(
            {"step": m["step"], "max_mi": m["max_mi"], "n_subspaces": len(m["partition_after"])}
            for m in res.merge_history
        )
        return cls(
            int(layer), tuple(res.partition), int(res.steps), bool(res.converged),
            res.config["max_steps"], res.config["merge_threshold"], history, int(n_rows),
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "partition": list(self.partition),
            "steps": self.steps,
            "converged": self.converged,
            "stop_reason": (
                "no subspace pair above the MI threshold"
                if self.converged
                else f"step limit {self.max_steps} reached with pairs above the MI threshold"
            ),
            "merge_history": [dict(m) for m in self.merge_history],
            "threshold": self.threshold,
            "n_activations": self.n_activations,
        }


@dataclass(frozen=True)
class Analysis:
    """:func:`analysis`'s result: the protocol it ran, the tests ``skipped`` (tasks this
    tokenizer cannot build), every planned test's :class:`ScreenRow`, NDM's training at each
    trained layer (``trained``, ascending; the first is the browser's), the Gini table over
    the screened tests, the preimage index at the first trained layer and how the tests'
    layers were chosen (``sweep``)."""

    protocol: NDMProtocol
    skipped: tuple[str, ...]
    tests: tuple[ScreenRow, ...]
    trained: tuple[TrainedLayer, ...]
    gini: GiniSummary
    browser: Mapping[str, Any]
    sweep: LayerSweep

    @property
    def browser_only(self) -> bool:
        """No test passes the screen: NDM was trained at one layer for the browser only."""
        return not any(t.screened for t in self.tests)


class Progress(Protocol):
    """A stage's progress callback: ``step(what)`` per step, ``step.loop(name, total)`` a bar
    for a long loop inside it."""

    def __call__(self, what: str) -> None: ...

    def loop(self, name: str, total: int) -> AbstractContextManager[Callable[[int], None]]: ...


def _row(sc: Screen, normalized: Mapping[str, list[float]] | None = None) -> ScreenRow:
    from structlens.stats.intervals import t_interval

    full = sc.run.full_effect
    # a test with one prompt has no interval, which the report shows as such
    ci = t_interval(full) if np.asarray(full).size >= 2 else (float("nan"), float("nan"))
    return ScreenRow(sc.name, sc.layer, float(full.mean()), (float(ci[0]), float(ci[1])),
                   sc.whole_space_share, sc.screened, normalized)  # fmt: skip


def analysis(
    protocol: NDMProtocol, model: Any, *, root: Path, executor: Any, step: Progress
) -> Analysis:
    """The patching tests (the paper's, with RoPE-transferable ones on rotary models) this
    tokenizer supports, at the layers of the protocol's layer rule (:func:`plan_tests`), each
    screened first by its whole-space effect (:func:`screen`); NDM
    trained at the layers of the tests that pass (at the first test layer, for the browser
    only, when none does), checkpointed under ``root/cache``, on activations captured under
    ``root/activations``; for those tests, the Gini of NDM against the baseline rotations
    (:func:`gini`); the preimage index at the first trained layer."""
    from structlens.ndm.data import capture_residuals
    from structlens.sites import site_name

    step("layer sweep")
    plan = plan_tests(protocol, model)
    screens = []
    for test in plan.tests:
        step(f"screen {test.name}")
        screens.append(screen(protocol, model, test, plan.layers[test.name]))
    candidate_layers = sorted(set(plan.layers.values())) or [model.n_layers // 2]
    layers = sorted({sc.layer for sc in screens if sc.screened}) or candidate_layers[:1]
    step("capture")
    prompts = training_prompts(protocol, model)
    store = capture_residuals(model, prompts, layers, root / "activations",
                              progress=executor.progress)  # fmt: skip
    index = store.load_index()
    trained, decompositions, hs = [], {}, {}
    for layer in layers:
        step(f"train layer {layer}")
        h = store.load(site_name("resid_post", layer)).double().numpy()
        hs[layer] = h
        with step.loop(f"NDM steps, layer {layer}", protocol.steps) as done:
            res = train(
                protocol, h, checkpoint_dir=root / "cache" / f"ndm-ckpt-L{layer}",
                # mypy cannot infer a lambda whose defaults bind loop variables
                progress=lambda n, loss, partition, done=done: done(n),  # type: ignore[misc]
            )  # fmt: skip
        trained.append(TrainedLayer.of(layer, res, h.shape[0]))
        decompositions[layer] = decompose(
            protocol, h, layer, res.rotation, res.partition, executor=executor
        )
    runs: dict[str, Any] = {}
    rows = []
    for sc in screens:
        if not sc.screened:
            runs[sc.name] = {"whole": sc.run}
            rows.append(_row(sc))
            continue
        step(f"patch {sc.name}")
        runs[sc.name] = patch(protocol, model, sc.test, decompositions[sc.layer])
        rows.append(
            _row(sc, {m: r.normalized_effects().tolist() for m, r in runs[sc.name].items()})
        )
    summary = gini(protocol, screens, runs, decompositions)
    step("preimage index")
    first = layers[0]
    browser = preimage_index(
        protocol, model.tokenizer, hs[first], prompts, index["prompt_index"].numpy(),
        index["position"].numpy(), decompositions[first].rotations["ndm"],
        decompositions[first].partition,
    ) | {"layer": int(first)}  # fmt: skip
    return Analysis(
        protocol, plan.skipped, tuple(rows), tuple(trained), summary, browser, plan.sweep
    )

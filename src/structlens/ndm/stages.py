"""The stages of the NDM analysis: the only code that turns a model and activations into NDM
numbers under an :class:`~structlens.ndm.protocol.NDMProtocol`.

``ndm train`` / ``evaluate``, ``structlens analyze`` and the NDM replication call these
functions and only render what they return, so equal protocols give equal results:

* :func:`training_prompts`: the training activations' prompts (evaluation prompts left out);
* :func:`plan_tests`: the patching tests this model and tokenizer support, with their layers;
* :func:`screen`: a test's whole-space effect and whether it passes the screen (:class:`Screen`);
* :func:`train`: NDM at one layer (:class:`~structlens.ndm.NDMResult`);
* :func:`decompose`: NDM's rotation beside the baselines' with its partition
  (:class:`Decomposition`);
* :func:`patch`: every subspace of every decomposition patched for one test;
* :func:`gini`: the Gini table over the screened tests (:class:`GiniSummary`);
* :func:`conflict`: knowledge-conflict routing (:class:`ConflictRouting`);
* :func:`toy`: recovery of the toy model's feature groups (:class:`ToyRecovery`);
* :func:`preimage_index`: the bounded preimage index embedded in the report.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from structlens.ndm.evaluate import (
    PatchRun,
    PatchTest,
    corrupted_prompts,
    make_test_task,
    map_layer,
    patch_positions,
    patch_subspaces,
    patch_tests_for,
    summarize_gini,
    whole_space_run,
    whole_space_share,
)
from structlens.ndm.protocol import NDMProtocol

__all__ = [
    "TestPlan", "Screen", "Decomposition", "Estimate", "GiniSummary", "ConflictRouting",
    "ToyRecovery", "training_prompts", "evaluation_prompts", "plan_tests", "screen", "train",
    "decompose", "patch", "gini", "conflict", "toy", "preimage_index",
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
class TestPlan:
    """The patching tests a model supports: ``tests`` with their ``layers`` (the paper's
    GPT-2 layer at the same relative depth) and the tests ``skipped`` because this tokenizer
    cannot build their task."""

    tests: tuple[PatchTest, ...]
    layers: Mapping[str, int]
    skipped: tuple[str, ...]


def plan_tests(protocol: NDMProtocol, model: Any, names: Sequence[str] = ()) -> TestPlan:
    """The paper's tests (on rotary models the position-swap tests replaced by
    :data:`~structlens.ndm.evaluate.ROPE_TESTS`), restricted to ``names`` when given.

    Raises
    ------
    InputError
        A name is not a test of this model.
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
    layers = {t.name: map_layer(t.gpt2_layer, model.n_layers) for t in buildable}
    return TestPlan(tuple(buildable), layers, tuple(skipped))


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
    """A point estimate and its 95% percentile-bootstrap interval over prompts."""

    value: float
    ci: tuple[float, float]


Variants = Mapping[str, Estimate]  # unnormalized, dimension, variance


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
            return {
                m: {k: {"value": e.value, "ci": list(e.ci)} for k, e in v.items()}
                for m, v in by.items()
            }

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
            m: {k: Estimate(float(e["value"]), (float(e["ci"][0]), float(e["ci"][1])))
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
class ToyRecovery:
    """NDM on the paper's toy autoencoder: the ``partition`` found, ``overlap`` (smallest
    matched subspace overlap with the feature groups, 1 = exact), whether the number of
    subspaces equals the number of groups, and the full ``record`` of
    :func:`~structlens.ndm.pipeline.toy_recovery`."""

    partition: tuple[int, ...]
    overlap: float
    right_number_of_subspaces: bool
    converged: bool
    record: Mapping[str, Any]


def toy(protocol: NDMProtocol) -> ToyRecovery:
    """Train the toy autoencoder and recover its feature groups with NDM."""
    from structlens.ndm.pipeline import toy_recovery

    toy_cfg, ndm_cfg = protocol.toy()
    record = toy_recovery(toy_cfg, ndm_cfg, seed=protocol.seed)
    return ToyRecovery(
        tuple(record["partition"]), float(record["overlap"]),
        bool(record["right_number_of_subspaces"]), bool(record["converged"]), record,
    )  # fmt: skip


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

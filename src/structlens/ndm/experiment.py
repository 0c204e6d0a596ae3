"""NDM experiments on a model: train NDM per layer on residual activations (:func:`run`), and
evaluate the decompositions by subspace patching (:func:`evaluate`), both under an
:class:`~structlens.ndm.protocol.NDMProtocol` and through the stages of
:mod:`structlens.ndm.stages`.

``run(protocol, model, layers=..., out=..., activations=...)`` captures ``resid_post`` at the
layers (by default those the protocol's layer rule chooses for the patching tests) over the
protocol's training prompts (cached store), trains NDM per layer, writes ``ndm-L{layer}/``
(the full :class:`~structlens.ndm.NDMResult`) and ``R-L{layer}.safetensors`` to ``out``, and
returns the ``ndm_train`` report.  ``evaluate(protocol, model, train_dir, out=...)`` screens
the patching tests (the paper's, with RoPE-transferable ones on rotary models, at the layers
of the protocol's layer rule) by their whole-space effect, patches the screened ones for NDM
and the baselines with NDM's partition, reports Gini coefficients with bootstrap CIs for
those (``"no signal"`` for the others), knowledge-conflict routing and the toy recovery, and
returns the ``ndm_evaluate`` report.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from structlens.config import ExperimentReport
from structlens.ndm.protocol import NDMProtocol
from structlens.results import atomic_write_bytes

if TYPE_CHECKING:
    from structlens.ndm.stages import LayerSweep

__all__ = [
    "NDMReport",
    "run",
    "evaluate",
    "browse",
    "browse_queries",
    "save_rotation",
    "load_rotation",
    "chosen_layers",
    "DEFAULT_GPT2_LAYERS",
]

DEFAULT_GPT2_LAYERS = (4, 6, 8, 9)


def save_rotation(
    path: Path, rotation: np.ndarray, partition: list[int], provenance: dict[str, str] | None = None
) -> None:
    """Write ``R`` and the partition as ``R-L{layer}.safetensors`` (atomic), with the
    :func:`~structlens.provenance.provenance` of the model and site it was trained on."""
    from safetensors.numpy import save

    meta = {"partition": json.dumps(partition), **(provenance or {})}
    atomic_write_bytes(path, save({"R": np.ascontiguousarray(rotation)}, metadata=meta))


def load_rotation(
    path: str | Path, *, model: Any = None, site: str | None = None, allow_foreign: bool = False
) -> tuple[np.ndarray, list[int]]:
    """``R`` and the partition from an ``R-L{layer}.safetensors`` written by ``ndm train``.

    Given the ``model`` and ``site`` it will be used with, the recorded provenance must match
    (:class:`~structlens.errors.ForeignResultError`, or a warning with ``allow_foreign``).
    """
    from safetensors import safe_open

    from structlens.errors import InputError, reading
    from structlens.provenance import check_provenance

    if not Path(path).is_file():
        raise InputError(f"{path} not found; run `structlens ndm train` for this layer first")
    with reading(path, "NDM rotation (safetensors with 'R' and a partition)"):
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            R = f.get_tensor("R")
        partition = json.loads(meta["partition"])
    check_provenance(
        meta, what=f"the rotation in {path}", model=model, site=site, allow_foreign=allow_foreign
    )
    return R, partition


def chosen_layers(layers: Sequence[int], n_layers: int, capture: Sequence[int] = ()) -> list[int]:
    """The trained layers of an ``n_layers`` model: ``layers``, or (empty) the paper's GPT-2
    layers 4, 6, 8, 9 mapped to the same relative depth (the depth rule's layers).

    Raises
    ------
    InputError
        A layer (of ``layers`` or ``capture``) is outside ``[0, n_layers)``.
    """
    from structlens.errors import InputError
    from structlens.ndm.evaluate import map_layer

    chosen = list(layers) or sorted({map_layer(g, n_layers) for g in DEFAULT_GPT2_LAYERS})
    if any(not 0 <= layer < n_layers for layer in (*chosen, *capture)):
        raise InputError(
            f"layers and capture_layers must lie in [0, {n_layers}), got {chosen} and "
            f"{list(capture)}"
        )
    return chosen


@dataclass(frozen=True)
class NDMReport(ExperimentReport):
    """Results of an NDM experiment; ``payload()`` is the ``<analysis>.json`` document."""

    def payload(self) -> dict[str, Any]:
        doc = {"model": self.model, **self.meta}
        return doc if self.analysis == "ndm_evaluate" else doc | {"results": self.results}


def run(
    protocol: NDMProtocol,
    model: Any,
    *,
    out: Path,
    activations: Path,
    layers: Sequence[int] = (),
    capture_layers: Sequence[int] = (),
    checkpoints: Path | None = None,
    device: str = "cpu",
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> NDMReport:
    """Capture the residual stream and train NDM at each layer (see module doc).

    Without ``layers``, under the share sweep NDM is trained where the sweep puts the
    patching tests (:func:`structlens.ndm.stages.plan_tests`, recorded as ``layer_sweep``
    for ``ndm evaluate`` to reuse), under the depth rule at :func:`chosen_layers`.
    ``capture_layers`` (a superset of ``layers``) are captured, so parallel runs naming the
    same set share one cached store.  Checkpoints go to ``checkpoints/L{layer}`` (default
    ``out/checkpoints``); a finished checkpoint is reused, so layers can be trained by
    parallel runs and collected by one.
    """
    from structlens.ndm import stages
    from structlens.ndm.data import capture_residuals
    from structlens.provenance import provenance
    from structlens.sites import site_name

    sweep = None
    if not layers and protocol.layer_rule == "share_sweep":
        sweep = stages.plan_tests(protocol, model).sweep
    # a tokenizer that builds no test leaves nothing to sweep: the depth rule's layers
    chosen = chosen_layers(layers or (sweep.layers if sweep else ()), model.n_layers,
                           capture_layers)  # fmt: skip
    prompts = stages.training_prompts(protocol, model)
    t0 = time.perf_counter()
    captured = sorted(set(capture_layers) | set(chosen))
    store = capture_residuals(model, prompts, captured, activations, progress=progress)
    capture_s = time.perf_counter() - t0
    results: dict[str, Any] = {}
    for layer in chosen:
        site = site_name("resid_post", layer)
        h = store.load(site).float()
        t1 = time.perf_counter()
        ckpt = (checkpoints or out / "checkpoints") / f"L{layer}"
        res = stages.train(
            protocol, h, checkpoint_dir=ckpt, model_digest=model.fingerprint(), device=device
        )
        seconds = time.perf_counter() - t1
        res.save(out / f"ndm-L{layer}")
        save_rotation(
            out / f"R-L{layer}.safetensors", res.rotation, res.partition, provenance(model, site)
        )
        results[str(layer)] = res.training_record(h.shape[0], seconds)
        if res.restarts:  # which run was kept, and why (see NDMConfig.restarts)
            results[str(layer)]["restarts"] = res.restarts
        if log is not None:
            log(f"layer {layer}: {res.steps} steps in {seconds:.0f} s, partition {res.partition}")
    meta = {
        **provenance(model),
        "layers": chosen,
        "partition": {k: v["partition"] for k, v in results.items()},
        "store": str(store.path),
        "protocol": protocol.to_json(),
        "data": {
            "n_prompts": len(prompts),
            "n_tokens_captured": int(store.load_index()["position"].numel()),
            "positions": "skip-first",
        },
        "capture_seconds": capture_s,
    }
    if sweep is not None:
        meta["layer_sweep"] = sweep.to_json()
    return NDMReport(analysis="ndm_train", model=model.name, results=results, meta=meta)


def _check_held_out(protocol: NDMProtocol, model: Any, trained_on: Sequence[Any]) -> None:
    """Refuse an evaluation whose prompts NDM was trained on."""
    from structlens.errors import InputError
    from structlens.ndm.stages import evaluation_prompts

    seen = {tuple(t) for _, t in trained_on}
    leaked = {task: len(p & seen) for task, p in evaluation_prompts(protocol, model).items()}
    leaked = {task: n for task, n in leaked.items() if n}
    if leaked:
        raise InputError(
            f"{leaked} evaluation prompts (by task) are among the training prompts of this "
            "run; evaluate with the run's own protocol or retrain with this one."
        )


def evaluate(
    protocol: NDMProtocol,
    model: Any,
    train: Path,
    *,
    out: Path,
    tests: Sequence[str] = (),
    conflict: bool = True,
    conflict_layer: int | None = None,
    toy: bool = True,
    batch_size: int = 16,
    executor: Any = None,
    log: Callable[[str], None] | None = None,
    allow_foreign: bool = False,
    sweep: LayerSweep | None = None,
) -> NDMReport:
    """Subspace-patching Gini table (NDM vs baselines), knowledge conflict and toy recovery
    for the decompositions of the ``ndm train`` run in ``train`` (see module doc).

    ``tests`` names tests of :func:`structlens.ndm.stages.plan_tests` (empty: all that suit
    the model), at the layers of ``sweep`` (a :class:`~structlens.ndm.stages.LayerSweep`),
    else of the sweep the training run recorded under this protocol's layer selection, else
    of a sweep made here.  The run must have been trained on ``model`` (its recorded
    digest), unless ``allow_foreign`` (a :class:`~structlens.provenance.ForeignResultWarning`
    then), and none of the evaluation prompts may be among its training prompts.
    ``executor`` computes the baseline rotations (SAE training among them) in parallel.
    """
    from structlens.errors import InputError
    from structlens.ndm import stages
    from structlens.ndm.collect import train_context

    meta, store, trained_on = train_context(model, train)
    trained = [int(k) for k in meta["partition"]]
    _check_rotations(model, train, trained, allow_foreign)  # before any work
    _check_held_out(protocol, model, trained_on)
    plan = stages.plan_tests(protocol, model, tests, batch_size=batch_size,
                             sweep=sweep or _recorded_sweep(meta, protocol))  # fmt: skip
    missing = sorted(set(plan.layers.values()) - set(trained))
    if missing:
        raise InputError(f"the tests use untrained layer(s) {missing} (trained: {trained}); "
                         "rerun `ndm train`")  # fmt: skip
    conflict_layer = trained[0] if conflict_layer is None else conflict_layer
    if conflict and conflict_layer not in trained:
        raise InputError(f"--conflict-layer {conflict_layer} was not trained (trained: {trained})")
    needed = sorted(set(plan.layers.values()) | ({conflict_layer} if conflict else set()))
    t0 = time.perf_counter()
    decompositions = _decompositions(protocol, train, store, needed, executor)
    timings: dict[str, float] = {"baselines": time.perf_counter() - t0}
    screens, runs, effects = _patch_tests(
        protocol, model, plan, decompositions, batch_size, timings, log
    )
    summary = stages.gini(protocol, screens, runs, decompositions)
    conflict_out = (
        _conflict(protocol, model, decompositions[conflict_layer], batch_size, timings)
        if conflict
        else None
    )
    t1 = time.perf_counter()
    toy_out = dict(stages.toy(protocol).record) if toy else None
    if toy:
        timings["toy"] = time.perf_counter() - t1

    doc = {
        "protocol": protocol.to_json(),
        "partition": {str(k): list(v.partition) for k, v in decompositions.items()},
        "layers": {t.name: plan.layers[t.name] for t in plan.tests},
        "layer_sweep": plan.sweep.to_json(),
        "tests": {t.name: dataclasses.asdict(t) for t in plan.tests},
        "skipped_tests": list(plan.skipped),
        "methods": ["ndm", *protocol.baselines],
        "n_prompts": protocol.patch_prompts,
        "n_boot": protocol.gini_bootstrap,
        **summary.to_json(),
        "effects": effects,
        "variances": {str(k): dict(v.variances) for k, v in decompositions.items()},
        "baselines": {str(k): dict(v.baseline_info) for k, v in decompositions.items()},
        "conflict": conflict_out,
        "toy": toy_out,
        "train": str(train),
        "seconds": timings,
    }
    return NDMReport(analysis="ndm_evaluate", model=model.name, results={}, meta=doc)


def _recorded_sweep(meta: dict[str, Any], protocol: NDMProtocol) -> LayerSweep | None:
    """The layer sweep an ``ndm train`` run recorded, when it was made under ``protocol``'s
    layer selection (``None`` otherwise: the evaluation sweeps itself)."""
    from structlens.ndm.stages import LayerSweep

    doc = meta.get("layer_sweep")
    # compared before loading: a sweep recorded under another rule may lack its fields
    if doc is None or doc.get("selection") != protocol.layer_selection():
        return None
    return LayerSweep.from_dict(doc)


def _check_rotations(model: Any, train: Path, layers: Sequence[int], allow_foreign: bool) -> None:
    """Every rotation of the run in ``train`` must be ``model``'s own (unless
    ``allow_foreign``)."""
    from structlens.sites import site_name

    for layer in layers:
        load_rotation(
            Path(train) / f"R-L{layer}.safetensors", model=model,
            site=site_name("resid_post", layer), allow_foreign=allow_foreign,
        )  # fmt: skip


def _decompositions(
    protocol: NDMProtocol, train: Path, store: Any, layers: Sequence[int], executor: Any
) -> dict[int, Any]:
    """NDM's rotation of the run in ``train`` beside the baselines', at each of ``layers``."""
    from structlens.ndm import stages
    from structlens.sites import site_name

    out = {}
    for layer in layers:
        R, partition = load_rotation(Path(train) / f"R-L{layer}.safetensors")
        h = store.load(site_name("resid_post", layer)).double().numpy()
        out[layer] = stages.decompose(protocol, h, layer, R, partition, executor=executor)
    return out


def _conflict(
    protocol: NDMProtocol,
    model: Any,
    decomposition: Any,
    batch_size: int,
    timings: dict[str, float],
) -> dict[str, Any]:
    """Knowledge-conflict routing's record in ``ndm_evaluate.json`` (``timings``: its
    seconds)."""
    from structlens.ndm import stages

    t1 = time.perf_counter()
    routing = stages.conflict(protocol, model, decomposition, batch_size=batch_size)
    timings["knowledge_conflict"] = time.perf_counter() - t1
    if routing is None:
        return {"skipped": "this tokenizer cannot build the knowledge-conflict task"}
    return routing.to_json()


def _patch_tests(
    protocol: NDMProtocol,
    model: Any,
    plan: Any,
    decompositions: dict[int, Any],
    batch_size: int,
    timings: dict[str, float],
    log: Callable[[str], None] | None,
) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    """Screen each test of ``plan`` and patch the subspaces of those that pass: the screens,
    the runs :func:`structlens.ndm.stages.gini` reads and each test's ``effects`` record
    (``timings[test]``: its seconds)."""
    from structlens.ndm import stages

    screens, runs, effects = [], {}, {}
    for test in plan.tests:
        t1 = time.perf_counter()
        layer = plan.layers[test.name]
        sc = stages.screen(protocol, model, test, layer, batch_size=batch_size)
        screens.append(sc)
        patched = (
            stages.patch(protocol, model, test, decompositions[layer], batch_size=batch_size)
            if sc.screened
            else {}
        )
        runs[test.name] = patched or {"whole": sc.run}
        timings[test.name] = time.perf_counter() - t1
        effects[test.name] = _effects(sc, patched)
        if log is not None:
            verdict = "screened" if sc.screened else "no signal"
            log(f"{test.name}: layer {layer}, whole-space share {sc.whole_space_share:+.3f} "
                f"({verdict})")  # fmt: skip
    return screens, runs, effects


def _effects(sc: Any, runs: dict[str, Any]) -> dict[str, Any]:
    """One test's record in ``ndm_evaluate.json``: its screen and each method's effects."""
    whole = sc.run
    return {
        "layer": sc.layer,
        "positions": list(sc.test.positions),
        "corruption": sc.test.corruption,
        "clean_metric_mean": float(whole.clean_metric.mean()),
        "corrupt_metric_mean": float(whole.corrupt_metric.mean()),
        "full_effect_mean": float(whole.full_effect.mean()),
        "whole_space_share": sc.whole_space_share,
        "screened": sc.screened,
        "methods": {
            m: {"mean": r.mean_effects().tolist(), "normalized": r.normalized_effects().tolist()}
            for m, r in runs.items()
        },
    }


def browse(
    model: Any,
    train: Path,
    prompt: str,
    *,
    position: int = -1,
    **settings: Any,
) -> dict[str, Any]:
    """Nearest stored contexts of ``prompt`` at ``position`` inside each subspace of the NDM
    run saved in ``train``: :func:`browse_queries` for one query, with its ``query`` and
    ``subspaces`` at the top level of the document."""
    doc = browse_queries(model, train, [prompt], position=position, **settings)
    (query,) = doc.pop("queries")
    return doc | query


def browse_queries(
    model: Any,
    train: Path,
    prompts: Sequence[str],
    *,
    position: int = -1,
    subspace: int | None = None,
    layer: int | None = None,
    k: int = 10,
    min_similarity: float | None = None,
    extra_corpus_prompts: int | None = None,
    activations: Path = Path("results/ndm/activations"),
    allow_foreign: bool = False,
    index_dir: Path | None = None,
) -> dict[str, Any]:
    """Nearest stored contexts of each of ``prompts`` at token ``position`` inside each
    subspace of the NDM run saved in ``train`` (the document ``structlens ndm browse``
    writes: ``queries[i]`` holds ``query`` and ``subspaces`` of ``prompts[i]``).

    The index is built once per run, layer and indexed corpus and saved next to the run, or
    in ``index_dir`` (:func:`structlens.ndm.collect.browse_index`); ``index`` says where and
    whether it was built by this call.  The rotation must have been trained on ``model`` at
    the layer's ``resid_post`` (:class:`~structlens.errors.ForeignResultError` otherwise, a
    warning with ``allow_foreign``).
    """
    from structlens.errors import InputError
    from structlens.ndm.browse import highlight_context
    from structlens.ndm.collect import browse_index, load_train_meta, query_activation
    from structlens.sites import site_name

    if not prompts or not all(p.strip() for p in prompts):
        raise InputError("give each query as non-empty text with --prompt 'some text'")
    trained = list(load_train_meta(train)["partition"])
    layer = layer if layer is not None else int(trained[0])
    if str(layer) not in trained:
        raise InputError(f"layer {layer} was not trained (trained: {trained})")
    R, partition = load_rotation(
        Path(train) / f"R-L{layer}.safetensors", model=model,
        site=site_name("resid_post", layer), allow_foreign=allow_foreign,
    )  # fmt: skip
    if subspace is not None and not 0 <= subspace < len(partition):
        raise InputError(f"--subspace must be in [0, {len(partition)}), got {subspace}")
    browser, path, built = browse_index(
        model, train, layer, R, partition,
        extra_corpus_prompts=extra_corpus_prompts, activations=activations, index_dir=index_dir,
    )  # fmt: skip
    queries = []
    for prompt in prompts:
        query, ids, pos = query_activation(model, layer, prompt, position)
        results = []
        for s in range(len(partition)) if subspace is None else [subspace]:
            hits = browser.query(model.tokenizer, query, s, k=k, min_similarity=min_similarity)
            results.append({"subspace": s, "dim": partition[s], "hits": hits})
        query_doc = {
            "prompt": prompt,
            "position": pos,
            "token": model.tokenizer.decode([ids[pos]]),
            "context": highlight_context(model.tokenizer, ids, pos),
        }
        queries.append({"query": query_doc, "subspaces": results})
    return {
        "model": model.name,
        "layer": layer,
        "partition": partition,
        "n_activations": len(browser),
        "index": {"path": str(path), "built": built},
        "queries": queries,
    }

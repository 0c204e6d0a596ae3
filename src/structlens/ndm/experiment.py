"""NDM experiments on a model: train NDM per layer on residual activations (:func:`run`), and
evaluate the decompositions by subspace patching (:func:`evaluate`).

``run(NDMExperimentConfig(...), model, out=..., activations=...)`` captures ``resid_post`` at
the chosen layers over corpus windows and task prompts (cached store), trains NDM per layer,
writes ``ndm-L{layer}/`` (the full :class:`~structlens.ndm.NDMResult`) and
``R-L{layer}.safetensors`` to ``out``, and returns the ``ndm_train`` report.
``evaluate(NDMEvaluationConfig(...), model, train_dir, out=...)`` screens the patching tests
(the paper's, with RoPE-transferable ones on rotary models) by their whole-space effect, runs
the screened ones for NDM and the baselines with NDM's partition, reports Gini coefficients
with bootstrap CIs for those (``"no signal"`` for the others), knowledge-conflict routing and
the toy recovery, and returns the ``ndm_evaluate`` report.

Example
-------
>>> from structlens.ndm.experiment import NDMEvaluationConfig
>>> NDMEvaluationConfig(methods=("ndm", "pca")).methods
('ndm', 'pca')
>>> NDMEvaluationConfig(n=1)
Traceback (most recent call last):
...
ValueError: n must be at least 2 (bootstrap over prompts), got 1
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from structlens.config import ExperimentReport, check_choices
from structlens.ndm.ndm import NDM, NDMConfig
from structlens.results import atomic_write_bytes, atomic_write_json

__all__ = [
    "NDMExperimentConfig",
    "NDMEvaluationConfig",
    "NDMReport",
    "run",
    "evaluate",
    "browse",
    "browse_queries",
    "save_rotation",
    "load_rotation",
    "DEFAULT_GPT2_LAYERS",
]

DEFAULT_GPT2_LAYERS = (4, 6, 8, 9)
Method = Literal["ndm", "identity", "random", "pca", "sae"]


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


@dataclass(frozen=True)
class NDMExperimentConfig:
    """Data and NDM settings of ``ndm train``.

    ``layers`` (``resid_post``; empty: the paper's GPT-2 layers 4, 6, 8, 9 mapped to the same
    relative depth) are trained; ``capture_layers`` (a superset) are captured, so parallel
    runs naming the same set share one cached store.  Data: ``corpus_prompts`` windows of 128
    tokens plus ``task_prompts`` clean prompts of each of the three tasks.  The other fields
    are those of :class:`~structlens.ndm.NDMConfig` (``steps`` is ``max_steps``; ``restarts``
    independent runs per layer, the best kept).
    """

    layers: tuple[int, ...] = ()
    capture_layers: tuple[int, ...] = ()
    corpus_prompts: int = 150
    task_prompts: int = 40
    unit_size: int = 48
    steps: int = 600
    bank_size: int = 8192
    batch_size: int = 128
    refresh_interval: int = 20
    lr: float = 1e-3
    merge_start: int = 200
    merge_interval: int = 200
    merge_threshold: float = 0.04
    mi_samples: int = 2048
    restarts: int = 1
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.corpus_prompts < 0 or self.task_prompts < 0:
            raise ValueError("corpus_prompts and task_prompts must be >= 0.")
        self.ndm.validate()

    @property
    def ndm(self) -> NDMConfig:
        """The :class:`NDMConfig` every layer is trained with."""
        return NDMConfig(
            unit_size=self.unit_size, lr=self.lr, batch_size=self.batch_size,
            max_steps=self.steps, bank_size=self.bank_size,
            refresh_interval=self.refresh_interval, merge_start=self.merge_start,
            merge_interval=self.merge_interval, merge_threshold=self.merge_threshold,
            mi_samples=self.mi_samples, restarts=self.restarts,
            log_interval=min(50, self.steps), seed=self.seed, device=self.device,
        )  # fmt: skip

    def chosen_layers(self, n_layers: int) -> list[int]:
        """The trained layers of an ``n_layers`` model (``ValueError`` if out of range)."""
        from structlens.ndm.evaluate import map_layer

        chosen = list(self.layers) or sorted({map_layer(g, n_layers) for g in DEFAULT_GPT2_LAYERS})
        if any(not 0 <= layer < n_layers for layer in (*chosen, *self.capture_layers)):
            raise ValueError(
                f"layers and capture_layers must lie in [0, {n_layers}), got "
                f"{chosen} and {list(self.capture_layers)}"
            )
        return chosen


@dataclass(frozen=True)
class NDMReport(ExperimentReport):
    """Results of an NDM experiment; ``payload()`` is the ``<analysis>.json`` document."""

    def payload(self) -> dict[str, Any]:
        doc = {"model": self.model, **self.meta}
        return doc if self.analysis == "ndm_evaluate" else doc | {"results": self.results}


def run(
    cfg: NDMExperimentConfig,
    model: Any,
    *,
    out: Path,
    activations: Path,
    checkpoints: Path | None = None,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> NDMReport:
    """Capture the residual stream and train NDM at each layer of ``cfg`` (see module doc).

    Checkpoints go to ``checkpoints/L{layer}`` (default ``out/checkpoints``); a finished
    checkpoint is reused, so layers can be trained by parallel runs and collected by one.
    """
    from structlens.ndm.data import capture_residuals, training_prompts
    from structlens.provenance import provenance
    from structlens.sites import site_name

    chosen = cfg.chosen_layers(model.n_layers)
    ndm_cfg = cfg.ndm
    prompts = training_prompts(
        model, corpus_prompts=cfg.corpus_prompts, task_prompts=cfg.task_prompts, seed=cfg.seed
    )
    t0 = time.perf_counter()
    captured = sorted(set(cfg.capture_layers) | set(chosen))
    store = capture_residuals(model, prompts, captured, activations, progress=progress)
    capture_s = time.perf_counter() - t0
    results: dict[str, Any] = {}
    for layer in chosen:
        h = store.load(site_name("resid_post", layer)).float()
        t1 = time.perf_counter()
        try:
            ckpt = (checkpoints or out / "checkpoints") / f"L{layer}"
            res = NDM(ndm_cfg).fit(h, checkpoint_dir=ckpt, model_digest=model.fingerprint())
        except ValueError as err:
            raise ValueError(f"layer {layer}: {err}") from err
        seconds = time.perf_counter() - t1
        res.save(out / f"ndm-L{layer}")
        site = site_name("resid_post", layer)
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
        "data": {
            "corpus_prompts": cfg.corpus_prompts,
            "task_prompts": cfg.task_prompts,
            "seed": cfg.seed,
            "n_prompts": len(prompts),
            "n_tokens_captured": int(store.load_index()["position"].numel()),
            "positions": "skip-first",
        },
        "config": ndm_cfg.to_dict(),
        "capture_seconds": capture_s,
    }
    return NDMReport(analysis="ndm_train", model=model.name, results=results, meta=meta)


@dataclass(frozen=True)
class NDMEvaluationConfig:
    """Settings of ``ndm evaluate``.

    ``tests`` are names of :data:`~structlens.ndm.evaluate.PAPER_TESTS` or
    :data:`~structlens.ndm.evaluate.ROPE_TESTS` (empty: those that suit the model, see
    :func:`~structlens.ndm.evaluate.patch_tests_for`), run on ``n`` prompts each; a test
    whose whole-space effect is below ``min_share`` of the clean metric at its layer is
    reported as ``"no signal"`` instead of a Gini.  ``methods`` must include ``ndm``; the SAE
    baseline trains a TopK SAE of ``sae_width``/``sae_k`` until its epoch FVU improves by
    less than ``sae_tol`` (relative), at most ``sae_epochs`` epochs.  ``conflict`` adds
    knowledge-conflict routing at ``conflict_layer`` (default: the first trained), ``toy``
    the toy recovery.
    """

    n: int = 24
    tests: tuple[str, ...] = ()
    min_share: float = 0.3
    methods: tuple[Method, ...] = ("ndm", "identity", "random", "pca", "sae")
    batch_size: int = 12
    n_boot: int = 1000
    sae_width: int = 2048
    sae_k: int = 32
    sae_epochs: int = 50
    sae_tol: float = 0.01
    conflict: bool = True
    conflict_n: int = 24
    conflict_layer: int | None = None
    toy: bool = True
    toy_steps: int = 3000
    toy_ae_steps: int = 10000
    seed: int = 0

    def __post_init__(self) -> None:
        from structlens.ndm.evaluate import PAPER_TESTS, ROPE_TESTS

        if "ndm" not in self.methods or any(m not in get_args(Method) for m in self.methods):
            raise ValueError(
                f"methods must include ndm and only name {list(get_args(Method))}, "
                f"got {list(self.methods)}"
            )
        check_choices(self)
        known = [t.name for t in (*PAPER_TESTS, *ROPE_TESTS)]
        unknown = [t for t in self.tests if t not in known]
        if unknown:
            raise ValueError(f"unknown tests {unknown}; choose from {known} or 'all'")
        if self.n < 2:
            raise ValueError(f"n must be at least 2 (bootstrap over prompts), got {self.n}")
        if not 0.0 <= self.min_share <= 1.0:
            raise ValueError(f"min_share must be in [0, 1], got {self.min_share}")
        if self.sae_epochs < 1 or self.sae_tol < 0:
            raise ValueError("sae_epochs must be >= 1 and sae_tol >= 0.")


def _cache_key(**parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def _load_npz(path: Path, key: str) -> dict[str, np.ndarray] | None:
    """Arrays cached at ``path`` if they were computed under ``key`` (else None)."""
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as f:
        if str(f["key"]) != key:
            return None
        return {k: f[k] for k in f.files if k != "key"}


def _save_npz(path: Path, key: str, arrays: dict[str, Any]) -> None:
    buf = io.BytesIO()
    np.savez(buf, key=np.asarray(key), **arrays)
    atomic_write_bytes(path, buf.getvalue())


def _cached_runs(path: Path, key: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Per-method :class:`PatchRun` s, from ``path`` when computed under ``key``."""
    from structlens.ndm.evaluate import PatchRun

    fields = [f.name for f in dataclasses.fields(PatchRun)]
    cached = _load_npz(path, key)
    if cached is not None:
        methods = sorted({k.split("/")[0] for k in cached})
        return {m: PatchRun(**{f: cached[f"{m}/{f}"] for f in fields}) for m in methods}
    runs = compute()
    _save_npz(path, key, {f"{m}/{f}": getattr(r, f) for m, r in runs.items() for f in fields})
    return runs


def _baselines(
    cfg: NDMEvaluationConfig,
    meta: dict[str, Any],
    store: Any,
    train: Path,
    out: Path,
    layers: list[int],
    executor: Any,
) -> tuple[dict[int, Any], dict[int, list[int]], dict[int, Any], dict[str, Any]]:
    """Rotations (NDM's and the baselines' with its partition), partitions, per-subspace
    variances and baseline diagnostics of every layer; baselines cached under ``out/cache``."""
    from structlens.ndm import subspace_variances
    from structlens.ndm.pipeline import SAEBaselineConfig, baseline_rotations
    from structlens.sites import site_name

    rotations, partitions, variances, info_out = {}, {}, {}, {}
    sae_cfg = SAEBaselineConfig(
        width=cfg.sae_width, k=cfg.sae_k, epochs=cfg.sae_epochs, tol=cfg.sae_tol, seed=cfg.seed
    )
    others = [m for m in cfg.methods if m != "ndm"]
    for layer in layers:
        R, partition = load_rotation(train / f"R-L{layer}.safetensors")
        h = store.load(site_name("resid_post", layer)).double().numpy()
        key = _cache_key(
            store=meta["store"], layer=layer, partition=partition, methods=others, seed=cfg.seed,
            sae=dataclasses.asdict(sae_cfg), with_info=True,  # older caches lack the SAE fit
        )  # fmt: skip
        cached = _load_npz(out / "cache" / f"baselines-L{layer}.npz", key)
        if cached is None:
            base, info = baseline_rotations(
                h, partition, others, seed=cfg.seed, sae=sae_cfg, executor=executor
            )
            info_json = np.asarray(json.dumps(info))
            _save_npz(out / "cache" / f"baselines-L{layer}.npz", key, base | {"info": info_json})
        else:
            base = {m: cached[m] for m in others}
            info = json.loads(str(cached["info"]))
        rotations[layer] = {"ndm": R, **base}
        partitions[layer] = partition
        variances[layer] = {
            m: subspace_variances(h, r, partition) for m, r in rotations[layer].items()
        }
        info_out[str(layer)] = info
    return rotations, partitions, variances, info_out


def _toy(cfg: NDMEvaluationConfig, out: Path) -> dict[str, Any]:
    """The toy recovery run, cached in ``out/cache/toy.json`` under its settings."""
    from structlens.ndm import ToyConfig
    from structlens.ndm.pipeline import toy_recovery

    toy_cfg = ToyConfig(steps=cfg.toy_ae_steps, seed=cfg.seed)
    toy_ndm = NDMConfig(
        unit_size=2, lr=1e-3, max_steps=cfg.toy_steps, bank_size=8192, refresh_interval=50,
        merge_start=max(1, cfg.toy_steps // 3), merge_interval=max(1, cfg.toy_steps // 6),
        mi_samples=2000, seed=cfg.seed,
    )  # fmt: skip
    toy_key = _cache_key(toy=dataclasses.asdict(toy_cfg), ndm=toy_ndm.to_dict())
    toy_path = out / "cache" / "toy.json"
    cached = json.loads(toy_path.read_text()) if toy_path.exists() else {}
    if cached.get("key") == toy_key:
        return cached["toy"]
    toy_out = toy_recovery(toy_cfg, toy_ndm, seed=cfg.seed)
    atomic_write_json(toy_path, {"key": toy_key, "toy": toy_out})
    return toy_out


def evaluate(
    cfg: NDMEvaluationConfig,
    model: Any,
    train: Path,
    *,
    out: Path,
    executor: Any = None,
    log: Callable[[str], None] | None = None,
    allow_foreign: bool = False,
) -> NDMReport:
    """Subspace-patching Gini table (NDM vs baselines), knowledge conflict and toy recovery
    for the decompositions of the ``ndm train`` run in ``train`` (see module doc).

    The run must have been trained on ``model`` (its recorded digest), unless
    ``allow_foreign`` (a :class:`~structlens.provenance.ForeignResultWarning` then).

    Baselines, patching runs and the toy are cached under ``out/cache`` by content keys;
    ``executor`` computes the baseline rotations (SAE training among them) in parallel.
    """
    from structlens.data.tasks import make_task
    from structlens.ndm.collect import train_context
    from structlens.ndm.evaluate import (
        corrupted_prompts,
        make_test_task,
        map_layer,
        patch_positions,
        patch_subspaces,
        patch_tests_for,
        routing_rates,
        screen_table,
        screened_summary,
        whole_space_run,
    )
    from structlens.sites import site_name

    meta, store, _ = train_context(model, train)
    trained = [int(k) for k in meta["partition"]]
    for layer in trained:  # before any work: every rotation must be this model's own
        load_rotation(
            Path(train) / f"R-L{layer}.safetensors", model=model,
            site=site_name("resid_post", layer), allow_foreign=allow_foreign,
        )  # fmt: skip
    suitable = patch_tests_for(model)
    unsuitable = sorted(set(cfg.tests) - {t.name for t in suitable})
    if unsuitable:
        raise ValueError(
            f"tests {unsuitable} do not suit {model.name} (rotary position embeddings have no "
            f"absolute-position subspace); choose from {[t.name for t in suitable]}"
        )
    chosen_tests = [t for t in suitable if not cfg.tests or t.name in cfg.tests]
    layer_of = {t.name: map_layer(t.gpt2_layer, model.n_layers) for t in chosen_tests}
    missing = sorted(set(layer_of.values()) - set(trained))
    if missing:
        raise ValueError(f"the tests use untrained layer(s) {missing} (trained: {trained}); "
                         "rerun `ndm train`")  # fmt: skip
    conflict_layer = cfg.conflict_layer or trained[0]
    needed = sorted(set(layer_of.values()) | ({conflict_layer} if cfg.conflict else set()))
    t0 = time.perf_counter()
    rotations, partitions, variances, baseline_info = _baselines(
        cfg, meta, store, train, out, needed, executor
    )
    timings: dict[str, float] = {"baselines": time.perf_counter() - t0}

    def bases(layer: int, which: Sequence[str]) -> dict[str, list[np.ndarray]]:
        bounds = np.concatenate([[0], np.cumsum(partitions[layer])])
        return {
            m: [rotations[layer][m][:, bounds[s] : bounds[s + 1]] for s in range(len(bounds) - 1)]
            for m in which
        }

    methods = list(cfg.methods)
    tasks: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    effects_out: dict[str, Any] = {}
    for test in chosen_tests:
        if test.task not in tasks:
            tasks[test.task] = make_test_task(test, model.tokenizer, n=cfg.n, seed=cfg.seed)
        task = tasks[test.task]
        layer = layer_of[test.name]
        corrupted = corrupted_prompts(task, test.corruption)
        positions = patch_positions(task, test.positions)
        key = dict(test=dataclasses.asdict(test), layer=layer, n=cfg.n, seed=cfg.seed,
                   model=model.name)  # fmt: skip
        t1 = time.perf_counter()
        # The screen first (three forward passes per batch): a test without signal at its
        # layer never has its subspaces patched.
        whole = _cached_runs(
            out / "cache" / f"whole-{test.name}.npz",
            _cache_key(**key),
            # mypy cannot infer a lambda whose defaults bind loop variables
            lambda task=task, corrupted=corrupted, positions=positions, layer=layer: {  # type: ignore[misc]
                "whole": whole_space_run(
                    model, task, corrupted, layer, positions, batch_size=cfg.batch_size
                )
            },
        )["whole"]
        screened = screen_table({test.name: whole}, {test.name: layer}, cfg.min_share)[0]
        if screened["screened"]:
            runs[test.name] = _cached_runs(
                out / "cache" / f"run-{test.name}.npz",
                _cache_key(
                    **key,
                    rotations={m: _digest(rotations[layer][m]) for m in methods},
                    partition=partitions[layer],
                ),
                # mypy cannot infer a lambda whose defaults bind loop variables
                lambda task=task, corrupted=corrupted, positions=positions, layer=layer: (  # type: ignore[misc]
                    patch_subspaces(
                        model,
                        task,
                        corrupted,
                        layer,
                        positions,
                        bases(layer, methods),
                        batch_size=cfg.batch_size,
                    )  # fmt: skip
                ),
            )
        else:
            runs[test.name] = {"whole": whole}
        timings[test.name] = time.perf_counter() - t1
        effects_out[test.name] = {
            "layer": layer,
            "positions": list(test.positions),
            "corruption": test.corruption,
            "clean_metric_mean": float(whole.clean_metric.mean()),
            "corrupt_metric_mean": float(whole.corrupt_metric.mean()),
            "full_effect_mean": float(whole.full_effect.mean()),
            "whole_space_share": screened["whole_space_share"],
            "screened": screened["screened"],
            "methods": {
                m: {
                    "mean": r.mean_effects().tolist(),
                    "normalized": r.normalized_effects().tolist(),
                }
                for m, r in runs[test.name].items()
                if m != "whole"
            },
        }
        if log is not None:
            share = screened["whole_space_share"]
            verdict = "screened" if screened["screened"] else "no signal"
            log(f"{test.name}: layer {layer}, whole-space share {share:+.3f} ({verdict})")
    summary = screened_summary(
        runs,
        {t: partitions[layer_of[t]] for t in runs},
        {t: variances[layer_of[t]] for t in runs},
        layer_of,
        min_share=cfg.min_share,
        n_boot=cfg.n_boot,
        seed=cfg.seed,
    )

    conflict_out: dict[str, Any] | None = None
    if cfg.conflict:
        layer = conflict_layer
        task = make_task("knowledge_conflict", model.tokenizer, n=cfg.conflict_n, seed=cfg.seed)
        conflict_out = {"layer": layer, "positions": "all", "n": cfg.conflict_n, "corruptions": {}}
        t1 = time.perf_counter()
        for corruption in ("true_answer", "other_answer"):
            run_ = _cached_runs(
                out / "cache" / f"run-conflict-{corruption}.npz",
                _cache_key(
                    corruption=corruption,
                    layer=layer,
                    n=cfg.conflict_n,
                    seed=cfg.seed,
                    model=model.name,
                    rotation=_digest(rotations[layer]["ndm"]),
                ),  # fmt: skip
                # mypy cannot infer a lambda whose defaults bind loop variables
                lambda corruption=corruption: patch_subspaces(  # type: ignore[misc]
                    model,
                    task,
                    corrupted_prompts(task, corruption),
                    layer,
                    None,
                    bases(layer, ["ndm"]),
                    batch_size=cfg.batch_size,
                ),  # fmt: skip
            )["ndm"]
            rates = routing_rates(run_, task)
            rates["effects_normalized"] = run_.normalized_effects().tolist()
            conflict_out["corruptions"][corruption] = rates
        timings["knowledge_conflict"] = time.perf_counter() - t1

    toy_out: dict[str, Any] | None = None
    if cfg.toy:
        t1 = time.perf_counter()
        toy_out = _toy(cfg, out)
        timings["toy"] = time.perf_counter() - t1

    doc = {
        "partition": {str(k): v for k, v in partitions.items()},
        "layers": {t: layer_of[t] for t in runs},
        "tests": {t.name: dataclasses.asdict(t) for t in chosen_tests},
        "methods": methods,
        "n_prompts": cfg.n,
        "n_boot": cfg.n_boot,
        **summary,
        "effects": effects_out,
        "variances": {str(k): v for k, v in variances.items()},
        "baselines": baseline_info,
        "conflict": conflict_out,
        "toy": toy_out,
        "train": str(train),
        "seconds": timings,
    }
    return NDMReport(analysis="ndm_evaluate", model=model.name, results={}, meta=doc)


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

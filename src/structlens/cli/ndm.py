"""``structlens ndm``: train NDM on residual activations, evaluate it by subspace patching,
browse subspace preimages.

* ``train``: capture ``resid_post`` at the chosen layers over corpus windows and task prompts
  (cached store), train NDM per layer; writes ``ndm_train.json``, ``R-L{layer}.safetensors``,
  ``ndm-L{layer}/`` (the full result) and ``merge_history.png``.
* ``evaluate``: the paper's subspace patching tests (previous token, duplicate token,
  S-inhibition x2, greater-than) for NDM and the baselines with NDM's partition, Gini
  coefficients with bootstrap CIs, knowledge-conflict routing, the toy recovery; writes
  ``ndm_evaluate.json`` and ``effects-<test>.png``.
* ``browse``: nearest stored contexts of (prompt, position) in every subspace; writes
  ``ndm_browse.json``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from structlens.cli.common import (
    Address,
    Device,
    Dtype,
    ExecutorName,
    ModelArg,
    Out,
    Quiet,
    Seed,
    console,
    executor_or_fail,
    fail,
    load_model_or_fail,
    write_results,
)

app = typer.Typer(help="NDM subspace decomposition: train, evaluate, browse.", no_args_is_help=True)

TrainDir = Annotated[
    Path, typer.Option("--train", help="Output directory of `ndm train` (ndm_train.json).")
]
DEFAULT_GPT2_LAYERS = (4, 6, 8, 9)


def _parse_ints(spec: str, what: str) -> list[int]:
    try:
        return [int(p) for p in spec.split(",") if p.strip()]
    except ValueError:
        fail(f"{what} must be comma-separated integers, got {spec!r}")
    return []


def save_rotation(path: Path, rotation: np.ndarray, partition: list[int]) -> None:
    from safetensors.numpy import save

    from structlens.results import atomic_write_bytes

    atomic_write_bytes(
        path,
        save({"R": np.ascontiguousarray(rotation)}, metadata={"partition": json.dumps(partition)}),
    )


def load_rotation(path: str | Path) -> tuple[np.ndarray, list[int]]:
    """``R`` and the partition from an ``R-L{layer}.safetensors`` written by ``ndm train``."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return f.get_tensor("R"), json.loads(f.metadata()["partition"])


def _cache_key(**parts: Any) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _digest(a: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def _load_npz(path: Path, key: str) -> dict[str, np.ndarray] | None:
    """Arrays cached at ``path`` if they were computed under ``key`` (else None)."""
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as f:
        if str(f["key"]) != key:
            return None
        return {k: f[k] for k in f.files if k != "key"}


def _save_npz(path: Path, key: str, arrays: dict[str, np.ndarray]) -> None:
    import io

    from structlens.results import atomic_write_bytes

    buf = io.BytesIO()
    np.savez(buf, key=np.asarray(key), **arrays)
    atomic_write_bytes(path, buf.getvalue())


def _load_train(train: Path) -> dict[str, Any]:
    meta = train / "ndm_train.json"
    if not meta.exists():
        fail(f"{meta} not found; run `structlens ndm train ... --out {train}` first")
    return json.loads(meta.read_text())


@app.command()
def train(
    model_name: ModelArg = "smollm2-135m",
    layers: Annotated[
        str,
        typer.Option(
            help="Comma-separated layers (resid_post). Default: the paper's GPT-2 layers "
            "4,6,8,9 mapped to the same relative depth."
        ),
    ] = "",
    capture_layers: Annotated[
        str,
        typer.Option(
            help="Layers to capture (a superset of --layers; default: the same). Parallel runs "
            "that name the same set share one cached store."
        ),
    ] = "",
    corpus_prompts: Annotated[int, typer.Option(help="Corpus windows of 128 tokens.")] = 150,
    task_prompts: Annotated[int, typer.Option(help="Clean prompts per task (3 tasks).")] = 40,
    unit_size: Annotated[int, typer.Option(help="Initial subspace size (divides d).")] = 48,
    steps: Annotated[int, typer.Option(help="Maximum optimisation steps per layer.")] = 600,
    bank_size: Annotated[int, typer.Option(help="Keys in the neighbour memory bank.")] = 8192,
    batch_size: Annotated[int, typer.Option(help="Queries per step.")] = 128,
    refresh_interval: Annotated[int, typer.Option(help="Steps per bank refresh.")] = 20,
    lr: Annotated[float, typer.Option(help="Adam learning rate.")] = 1e-3,
    merge_start: Annotated[int, typer.Option(help="First merge step.")] = 200,
    merge_interval: Annotated[int, typer.Option(help="Steps between merge rounds.")] = 200,
    merge_threshold: Annotated[float, typer.Option(help="Normalised MI threshold.")] = 0.04,
    mi_samples: Annotated[int, typer.Option(help="Rows for the KSG estimate.")] = 2048,
    activations: Annotated[Path, typer.Option(help="Root of the activation store cache.")] = Path(
        "results/ndm/activations"
    ),
    checkpoints: Annotated[
        Path | None,
        typer.Option(
            help="Checkpoint root (default: OUT/checkpoints); a finished checkpoint is reused, "
            "so layers can be trained by parallel runs and collected by a final one."
        ),
    ] = None,
    out: Out = Path("results/ndm"),
    device: Device = "cpu",
    dtype: Dtype = "float32",
    seed: Seed = 0,
    quiet: Quiet = False,
) -> None:
    """Capture residual activations and train NDM at each layer."""
    from structlens.ndm import NDM, NDMConfig
    from structlens.ndm.data import capture_residuals, training_prompts
    from structlens.ndm.evaluate import map_layer
    from structlens.report.ndm import plot_merge_history
    from structlens.sites import site_name

    model = load_model_or_fail(model_name, device, dtype, seed)
    chosen = (
        _parse_ints(layers, "--layers")
        if layers
        else sorted({map_layer(g, model.n_layers) for g in DEFAULT_GPT2_LAYERS})
    )
    if not chosen or any(not 0 <= layer < model.n_layers for layer in chosen):
        fail(f"--layers must lie in [0, {model.n_layers}), got {chosen}")
    cfg = NDMConfig(
        unit_size=unit_size,
        lr=lr,
        batch_size=batch_size,
        max_steps=steps,
        bank_size=bank_size,
        refresh_interval=refresh_interval,
        merge_start=merge_start,
        merge_interval=merge_interval,
        merge_threshold=merge_threshold,
        mi_samples=mi_samples,
        log_interval=min(50, steps),
        seed=seed,
        device=device,
    )
    try:
        cfg.validate()
    except ValueError as err:
        fail(str(err))
    try:
        prompts = training_prompts(
            model, corpus_prompts=corpus_prompts, task_prompts=task_prompts, seed=seed
        )
    except ValueError as err:
        fail(str(err))
    t0 = time.perf_counter()
    captured = sorted(set(_parse_ints(capture_layers, "--capture-layers")) | set(chosen))
    if any(not 0 <= layer < model.n_layers for layer in captured):
        fail(f"--capture-layers must lie in [0, {model.n_layers}), got {captured}")
    store = capture_residuals(model, prompts, captured, activations, progress=not quiet)
    capture_s = time.perf_counter() - t0
    results: dict[str, Any] = {}
    for layer in chosen:
        h = store.load(site_name("resid_post", layer)).float()
        t1 = time.perf_counter()
        try:
            res = NDM(cfg).fit(h, checkpoint_dir=(checkpoints or out / "checkpoints") / f"L{layer}")
        except ValueError as err:
            fail(f"layer {layer}: {err}")
        seconds = time.perf_counter() - t1
        res.save(out / f"ndm-L{layer}")
        save_rotation(out / f"R-L{layer}.safetensors", res.rotation, res.partition)
        results[str(layer)] = res.training_record(h.shape[0], seconds)
        if not quiet:
            console.print(
                f"layer {layer}: {res.steps} steps in {seconds:.0f} s, partition {res.partition}"
            )
    plot_merge_history({f"L{k}": v for k, v in results.items()}, out / "merge_history.png")
    path = write_results(
        out,
        "ndm_train",
        {
            "model": model.name,
            "layers": chosen,
            "partition": {k: v["partition"] for k, v in results.items()},
            "store": str(store.path),
            "data": {
                "corpus_prompts": corpus_prompts,
                "task_prompts": task_prompts,
                "seed": seed,
                "n_prompts": len(prompts),
                "n_tokens_captured": int(store.load_index()["position"].numel()),
                "positions": "skip-first",
            },
            "config": cfg.to_dict(),
            "capture_seconds": capture_s,
            "results": results,
        },
        command="ndm train",
    )
    if not quiet:
        console.print(f"wrote {path}")


def _train_context(model: Any, train: Path) -> tuple[dict[str, Any], Any, list[Any]]:
    from structlens.capture.store import ActivationStore, StoreError
    from structlens.ndm.data import training_prompts

    meta = _load_train(train)
    try:
        store = ActivationStore(meta["store"])
    except (StoreError, FileNotFoundError) as err:
        fail(f"activation store of {train} unavailable: {err}")
    data = meta["data"]
    prompts = training_prompts(
        model,
        corpus_prompts=data["corpus_prompts"],
        task_prompts=data["task_prompts"],
        seed=data["seed"],
    )
    return meta, store, prompts


def _cached_runs(path: Path, key: str, compute: Any) -> dict[str, Any]:
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


@app.command()
def evaluate(
    model_name: ModelArg = "smollm2-135m",
    train: TrainDir = Path("results/ndm"),
    n: Annotated[int, typer.Option("-n", help="Prompts per test.")] = 24,
    tests: Annotated[str, typer.Option(help="Comma-separated test names, or 'all'.")] = "all",
    methods: Annotated[
        str, typer.Option(help="Comma-separated: ndm,identity,random,pca,sae.")
    ] = "ndm,identity,random,pca,sae",
    batch_size: Annotated[int, typer.Option(help="Prompts per forward pass.")] = 12,
    n_boot: Annotated[int, typer.Option(help="Bootstrap resamples over prompts.")] = 1000,
    sae_width: Annotated[int, typer.Option(help="SAE width for the SAE baseline.")] = 2048,
    sae_k: Annotated[int, typer.Option(help="SAE TopK k.")] = 32,
    sae_epochs: Annotated[int, typer.Option(help="SAE training epochs.")] = 4,
    conflict: Annotated[bool, typer.Option(help="Knowledge-conflict routing.")] = True,
    conflict_n: Annotated[int, typer.Option(help="Knowledge-conflict prompts.")] = 24,
    conflict_layer: Annotated[
        int | None, typer.Option(help="Layer for knowledge conflict (default: first trained).")
    ] = None,
    toy: Annotated[bool, typer.Option(help="Run the toy recovery experiment.")] = True,
    toy_steps: Annotated[int, typer.Option(help="NDM steps on the toy.")] = 3000,
    toy_ae_steps: Annotated[int, typer.Option(help="Toy autoencoder training steps.")] = 10000,
    out: Out = Path("results/ndm"),
    device: Device = "cpu",
    dtype: Dtype = "float32",
    seed: Seed = 0,
    quiet: Quiet = False,
    executor: ExecutorName = "local",
    address: Address = None,
) -> None:
    """Subspace patching Gini table (NDM vs baselines), knowledge conflict, toy recovery.

    With --executor ray the baseline rotations (SAE training among them) run as Ray tasks.
    """
    from structlens.data.tasks import make_task
    from structlens.ndm import subspace_variances
    from structlens.ndm.evaluate import (
        PAPER_TESTS,
        corrupted_prompts,
        map_layer,
        patch_positions,
        patch_subspaces,
        routing_rates,
        summarize_gini,
    )
    from structlens.ndm.pipeline import (
        METHODS,
        SAEBaselineConfig,
        baseline_rotations,
        toy_recovery,
    )
    from structlens.report.ndm import plot_effect_heatmap
    from structlens.results import atomic_write_json
    from structlens.sites import site_name

    _load_train(train)
    chosen_methods = [m.strip() for m in methods.split(",") if m.strip()]
    bad = [m for m in chosen_methods if m not in METHODS]
    if bad or "ndm" not in chosen_methods:
        fail(f"--methods must include ndm and only name {list(METHODS)}, got {chosen_methods}")
    by_name = {t.name: t for t in PAPER_TESTS}
    names = list(by_name) if tests == "all" else [t.strip() for t in tests.split(",")]
    unknown = [t for t in names if t not in by_name]
    if unknown:
        fail(f"unknown tests {unknown}; choose from {list(by_name)} or 'all'")
    if n < 2:
        fail(f"-n must be at least 2 (bootstrap over prompts), got {n}")
    runner = executor_or_fail(executor, address)
    model = load_model_or_fail(model_name, device, dtype, seed)
    meta, store, _ = _train_context(model, train)
    trained = [int(k) for k in meta["partition"]]
    chosen_tests = [by_name[t] for t in names]
    layer_of = {t.name: map_layer(t.gpt2_layer, model.n_layers) for t in chosen_tests}
    missing = sorted({v for v in layer_of.values()} - set(trained))
    if missing:
        fail(f"layers {missing} were not trained (trained: {trained}); rerun `ndm train`")

    t0 = time.perf_counter()
    rotations: dict[int, dict[str, np.ndarray]] = {}
    partitions: dict[int, list[int]] = {}
    variances: dict[int, dict[str, list[float]]] = {}
    baseline_info: dict[str, Any] = {}
    sae_cfg = SAEBaselineConfig(width=sae_width, k=sae_k, epochs=sae_epochs, seed=seed)
    needed = sorted(
        set(layer_of.values()) | ({conflict_layer or trained[0]} if conflict else set())
    )
    for layer in needed:
        R, partition = load_rotation(train / f"R-L{layer}.safetensors")
        h = store.load(site_name("resid_post", layer)).double().numpy()
        others = [m for m in chosen_methods if m != "ndm"]
        key = _cache_key(
            store=meta["store"], layer=layer, partition=partition, methods=others, seed=seed,
            sae=dataclasses.asdict(sae_cfg),
        )  # fmt: skip
        cached = _load_npz(out / "cache" / f"baselines-L{layer}.npz", key)
        if cached is None:
            base, info = baseline_rotations(
                h, partition, others, seed=seed, sae=sae_cfg, executor=runner
            )
            _save_npz(out / "cache" / f"baselines-L{layer}.npz", key, base)
        else:
            base = {m: cached[m] for m in others}
            info = {"sae": dataclasses.asdict(sae_cfg)} if "sae" in others else {}
        rotations[layer] = {"ndm": R, **base}
        partitions[layer] = partition
        variances[layer] = {
            m: subspace_variances(h, r, partition) for m, r in rotations[layer].items()
        }
        baseline_info[str(layer)] = info
    prep_s = time.perf_counter() - t0

    def bases(layer: int, which: list[str]) -> dict[str, list[np.ndarray]]:
        bounds = np.concatenate([[0], np.cumsum(partitions[layer])])
        return {
            m: [rotations[layer][m][:, bounds[s] : bounds[s + 1]] for s in range(len(bounds) - 1)]
            for m in which
        }

    tasks: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    effects_out: dict[str, Any] = {}
    timings: dict[str, float] = {"baselines": prep_s}
    for test in chosen_tests:
        if test.task not in tasks:
            tasks[test.task] = make_task(test.task, model.tokenizer, n=n, seed=seed)
        task = tasks[test.task]
        layer = layer_of[test.name]
        t1 = time.perf_counter()
        runs[test.name] = _cached_runs(
            out / "cache" / f"run-{test.name}.npz",
            _cache_key(
                test=dataclasses.asdict(test),
                layer=layer,
                n=n,
                seed=seed,
                model=model.name,
                rotations={m: _digest(rotations[layer][m]) for m in chosen_methods},
                partition=partitions[layer],
            ),  # fmt: skip
            lambda task=task, test=test, layer=layer: patch_subspaces(
                model,
                task,
                corrupted_prompts(task, test.corruption),
                layer,
                patch_positions(task, test.positions),
                bases(layer, chosen_methods),
                batch_size=batch_size,
            ),
        )
        timings[test.name] = time.perf_counter() - t1
        effects_out[test.name] = {
            "layer": layer,
            "positions": list(test.positions),
            "corruption": test.corruption,
            "clean_metric_mean": float(runs[test.name]["ndm"].clean_metric.mean()),
            "corrupt_metric_mean": float(runs[test.name]["ndm"].corrupt_metric.mean()),
            "full_effect_mean": float(runs[test.name]["ndm"].full_effect.mean()),
            "methods": {
                m: {
                    "mean": r.mean_effects().tolist(),
                    "normalized": r.normalized_effects().tolist(),
                }
                for m, r in runs[test.name].items()
            },
        }
        plot_effect_heatmap(
            {m: v["normalized"] for m, v in effects_out[test.name]["methods"].items()},
            partitions[layer],
            f"{test.name} (layer {layer}, {test.corruption})",
            out / f"effects-{test.name}.png",
        )
        if not quiet:
            full = effects_out[test.name]["full_effect_mean"]
            console.print(f"{test.name}: layer {layer}, whole-space effect {full:+.3f}")
    summary = summarize_gini(
        runs,
        {t: partitions[layer_of[t]] for t in runs},
        {t: variances[layer_of[t]] for t in runs},
        n_boot=n_boot,
        seed=seed,
    )

    conflict_out: dict[str, Any] | None = None
    if conflict:
        layer = conflict_layer or trained[0]
        task = make_task("knowledge_conflict", model.tokenizer, n=conflict_n, seed=seed)
        conflict_out = {"layer": layer, "positions": "all", "n": conflict_n, "corruptions": {}}
        t1 = time.perf_counter()
        for corruption in ("true_answer", "other_answer"):
            run = _cached_runs(
                out / "cache" / f"run-conflict-{corruption}.npz",
                _cache_key(
                    corruption=corruption,
                    layer=layer,
                    n=conflict_n,
                    seed=seed,
                    model=model.name,
                    rotation=_digest(rotations[layer]["ndm"]),
                ),  # fmt: skip
                lambda task=task, corruption=corruption, layer=layer: patch_subspaces(
                    model,
                    task,
                    corrupted_prompts(task, corruption),
                    layer,
                    None,
                    bases(layer, ["ndm"]),
                    batch_size=batch_size,
                ),
            )["ndm"]
            rates = routing_rates(run, task)
            rates["effects_normalized"] = run.normalized_effects().tolist()
            conflict_out["corruptions"][corruption] = rates
        timings["knowledge_conflict"] = time.perf_counter() - t1

    toy_out: dict[str, Any] | None = None
    if toy:
        from structlens.ndm import NDMConfig, ToyConfig

        toy_cfg = ToyConfig(steps=toy_ae_steps, seed=seed)
        toy_ndm = NDMConfig(
            unit_size=2,
            lr=1e-3,
            max_steps=toy_steps,
            bank_size=8192,
            refresh_interval=50,
            merge_start=max(1, toy_steps // 3),
            merge_interval=max(1, toy_steps // 6),
            mi_samples=2000,
            seed=seed,
        )
        toy_key = _cache_key(toy=dataclasses.asdict(toy_cfg), ndm=toy_ndm.to_dict())
        toy_path = out / "cache" / "toy.json"
        cached_toy = json.loads(toy_path.read_text()) if toy_path.exists() else {}
        t1 = time.perf_counter()
        if cached_toy.get("key") == toy_key:
            toy_out = cached_toy["toy"]
        else:
            toy_out = toy_recovery(toy_cfg, toy_ndm, seed=seed)
            atomic_write_json(toy_path, {"key": toy_key, "toy": toy_out})
        timings["toy"] = time.perf_counter() - t1

    payload = {
        "model": model.name,
        "partition": {str(k): v for k, v in partitions.items()},
        "layers": {t: layer_of[t] for t in runs},
        "tests": {t.name: dataclasses.asdict(t) for t in chosen_tests},
        "methods": chosen_methods,
        "n_prompts": n,
        "n_boot": n_boot,
        **summary,
        "effects": effects_out,
        "variances": {str(k): v for k, v in variances.items()},
        "baselines": baseline_info,
        "conflict": conflict_out,
        "toy": toy_out,
        "train": str(train),
        "seconds": timings,
    }
    path = write_results(out, "ndm_evaluate", payload, command="ndm evaluate")
    if not quiet:
        console.print("mean Gini (dimension-normalised) [95% CI]:")
        for m, v in summary["gini_mean"].items():
            g = v["dimension"]
            console.print(f"  {m:9s} {g['value']:.3f} [{g['ci'][0]:.3f}, {g['ci'][1]:.3f}]")
        if toy_out is not None:
            console.print(
                f"toy: partition {toy_out['partition']}, overlap {toy_out['overlap']:.3f}"
            )
        console.print(f"wrote {path}")


@app.command()
def browse(
    model_name: ModelArg = "smollm2-135m",
    train: TrainDir = Path("results/ndm"),
    prompt: Annotated[str, typer.Option(help="Query text.")] = "",
    position: Annotated[int, typer.Option(help="Token position (negative from the end).")] = -1,
    subspace: Annotated[
        int | None, typer.Option(help="Subspace index (default: every subspace).")
    ] = None,
    layer: Annotated[int | None, typer.Option(help="Layer (default: first trained).")] = None,
    k: Annotated[int, typer.Option(help="Neighbours per subspace.")] = 10,
    min_similarity: Annotated[
        float | None, typer.Option(help="Drop hits below this cosine (authors: 0.85).")
    ] = None,
    extra_corpus_prompts: Annotated[
        int | None,
        typer.Option(
            help="Corpus windows beyond the training ones to add to the index "
            "(captured once, cached; default: all remaining)."
        ),
    ] = None,
    activations: Annotated[Path, typer.Option(help="Root of the activation store cache.")] = Path(
        "results/ndm/activations"
    ),
    out: Out = Path("results/ndm"),
    device: Device = "cpu",
    dtype: Dtype = "float32",
    seed: Seed = 0,
    quiet: Quiet = False,
) -> None:
    """Nearest stored contexts of one (prompt, position) inside each subspace."""
    import torch

    from structlens.interventions import run_with_cache
    from structlens.interventions.fastrun import truncated
    from structlens.ndm.browse import PreimageBrowser, highlight_context
    from structlens.ndm.data import capture_residuals, training_prompts
    from structlens.sites import site_name

    if not prompt:
        fail("give a query with --prompt 'some text'")
    model = load_model_or_fail(model_name, device, dtype, seed)
    meta, store, prompts = _train_context(model, train)
    layer = layer if layer is not None else int(next(iter(meta["partition"])))
    if str(layer) not in meta["partition"]:
        fail(f"layer {layer} was not trained (trained: {list(meta['partition'])})")
    R, partition = load_rotation(train / f"R-L{layer}.safetensors")
    if subspace is not None and not 0 <= subspace < len(partition):
        fail(f"--subspace must be in [0, {len(partition)}), got {subspace}")
    site = site_name("resid_post", layer)
    corpus_done = meta["data"]["corpus_prompts"]
    extra = training_prompts(
        model,
        corpus_prompts=extra_corpus_prompts,
        corpus_offset=corpus_done,
    )
    stores = [(store, prompts)]
    if extra:
        stores.append((capture_residuals(model, extra, [layer], activations), extra))
    all_prompts = prompts + extra
    browser = PreimageBrowser(R, partition, all_prompts)
    offset = 0
    for st, ps in stores:
        index = st.load_index()
        browser.add([(st.load(site).float(), index["prompt_index"] + offset, index["position"])])
        offset += len(ps)

    ids = model.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if not ids:
        fail("the prompt tokenizes to nothing")
    pos = position if position >= 0 else len(ids) + position
    if not 0 <= pos < len(ids):
        fail(f"--position {position} is outside the prompt's {len(ids)} tokens")
    t = torch.tensor([ids], device=model.device)
    with truncated(model, layer):
        _, cache = run_with_cache(model, t, torch.ones_like(t), [site])
    query = cache[site][0, pos].float()
    which = range(len(partition)) if subspace is None else [subspace]
    results = []
    for s in which:
        hits = browser.query(model.tokenizer, query, s, k=k, min_similarity=min_similarity)
        results.append({"subspace": s, "dim": partition[s], "hits": hits})
        if not quiet:
            console.print(f"[bold]subspace {s}[/] ({partition[s]} dims)")
            for hit in hits[:k]:
                console.print(f"  {hit['similarity']:.3f}  {hit['context']!r}", markup=False)
    path = write_results(
        out,
        "ndm_browse",
        {
            "model": model.name,
            "layer": layer,
            "partition": partition,
            "n_activations": len(browser),
            "query": {
                "prompt": prompt,
                "position": pos,
                "token": model.tokenizer.decode([ids[pos]]),
                "context": highlight_context(model.tokenizer, ids, pos),
            },
            "subspaces": results,
        },
        command="ndm browse",
    )
    if not quiet:
        console.print(f"{len(browser)} activations indexed; wrote {path}")

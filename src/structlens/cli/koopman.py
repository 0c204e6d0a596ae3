"""``structlens koopman``: EDMDc over depth on a real model (fit, convergence, modes,
invariance, reduce).

Every command captures (or reuses, content-hashed) ``resid_pre(l)``, ``attn_out(l)`` and
``resid_pre(l+1)`` over the bundled corpus plus task prompts, fits per-layer operators (or one
pooled operator with ``--pooled``), and writes ``<command>.json`` and figures to ``--out``.
Results are nested ``results[<layers>][<dictionary>]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from structlens.cli.common import (
    Address,
    Device,
    Dtype,
    ExecutorName,
    Out,
    Quiet,
    Seed,
    console,
    executor_or_fail,
    fail,
    load_model_or_fail,
    write_results,
)

app = typer.Typer(help="Koopman spectral analysis of depth dynamics (EDMDc over layers).")

ModelOpt = Annotated[str, typer.Argument(help="Model alias, HF name or local path.")]
Layers = Annotated[
    str, typer.Option("--layers", help="Layers: '8', '4,8,12' or a range '6-10' (inclusive).")
]
Pooled = Annotated[
    bool, typer.Option("--pooled", help="One operator pooled over all --layers (else per layer).")
]
Dicts = Annotated[
    str,
    typer.Option(
        "--dictionary",
        help="Comma list of identity, pca, rff, relu, spectral, sae.",
    ),
]
Size = Annotated[int, typer.Option("--size", help="PCA k / RFF, ReLU D / spectral modes.")]
SAEPath = Annotated[
    Path | None, typer.Option("--sae", help="SAELens-format SAE directory (for 'sae').")
]
NCorpus = Annotated[int, typer.Option("--n-corpus", help="Corpus chunks (prompts).")]
PromptTokens = Annotated[int, typer.Option("--prompt-tokens", help="Tokens per corpus chunk.")]
NTask = Annotated[int, typer.Option("--n-task", help="IOI prompts added to the data (0: none).")]
Alpha = Annotated[float, typer.Option("--alpha", help="Relative ridge of the EDMDc solve.")]
Energy = Annotated[
    float, typer.Option("--control-energy", help="Fraction of Var(attn_out) kept in u.")
]
Rank = Annotated[
    int | None,
    typer.Option("--control-rank", help="Keep this many PCs of u (overrides --control-energy)."),
]


def parse_layers(spec: str, n_layers: int) -> list[int]:
    """``'8'``, ``'4,8,12'`` or ``'6-10'`` (inclusive) to a sorted list of valid layers."""
    try:
        if "-" in spec:
            lo, hi = (int(s) for s in spec.split("-", 1))
            layers = list(range(lo, hi + 1))
        else:
            layers = [int(s) for s in spec.split(",") if s.strip()]
    except ValueError:
        fail(f"--layers {spec!r} is not '8', '4,8,12' or '6-10'.")
    if not layers:
        fail("--layers names no layer.")
    bad = [layer for layer in layers if not 0 <= layer < n_layers]
    if bad:
        fail(f"layers {bad} out of range; the model has layers 0..{n_layers - 1}.")
    return sorted(set(layers))


def _dict_names(spec: str) -> list[str]:
    from structlens.koopman.pipeline import DICTIONARIES

    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if n not in DICTIONARIES]
    if bad or not names:
        fail(f"unknown dictionary {bad or spec!r}; choose from {', '.join(DICTIONARIES)}.")
    return names


def _setup(
    model_name: str,
    layers_spec: str,
    pooled: bool,
    out: Path,
    n_corpus: int,
    prompt_tokens: int,
    n_task: int,
    device: str,
    dtype: str,
    seed: int,
    quiet: bool,
    executor: Any = None,
) -> tuple[Any, list[int], dict[str, tuple[np.ndarray, ...]], Any]:
    """Load the model, capture the depth sites and return the streams by label and the store."""
    from structlens.koopman.data import capture_depth, depth_prompts, load_layer, load_layers

    model = load_model_or_fail(model_name, device, dtype, seed)
    layers = parse_layers(layers_spec, model.n_layers)
    try:
        prompts = depth_prompts(
            model.tokenizer,
            n_corpus=n_corpus,
            max_tokens=prompt_tokens,
            task="ioi" if n_task else None,
            n_task=n_task,
            seed=seed,
        )
    except ValueError as err:
        fail(str(err))
    store = capture_depth(
        model,
        prompts,
        layers,
        root=Path(out) / "activations",
        progress=not quiet,
        executor=executor,
    )
    if pooled:
        label = f"{layers[0]}-{layers[-1]}" if len(layers) > 1 else str(layers[0])
        streams = {label: load_layers(store, layers)}
    else:
        streams = {str(layer): load_layer(store, layer) for layer in layers}
    return model, layers, streams, store


def _fitted(
    name: str, size: int, seed: int, sae: Path | None, X: np.ndarray, U: np.ndarray, Y: np.ndarray
) -> Any:
    from structlens.koopman.pipeline import make_dictionary

    try:
        dic = make_dictionary(name, size, seed=seed, sae_path=sae)
    except ValueError as err:
        fail(str(err))
    try:
        return dic.fit(X, U, Y)
    except ValueError as err:
        fail(f"{name} dictionary: {err}")


@dataclass
class _SplitHalfPoint:
    """One (layer label, dictionary) point of the convergence grid; picklable for executors.

    Returns the split-half result, or the error message of bad input.
    """

    streams: dict[str, tuple[np.ndarray, ...]]
    size: int
    seed: int
    sae: Path | None
    config: Any
    n_blocks: int
    n_repeats: int

    def __call__(self, point: tuple[str, str]) -> Any:
        from structlens.koopman import EDMDc, split_half_convergence
        from structlens.koopman.pipeline import make_dictionary

        label, name = point
        X, U, Y, pid = self.streams[label]
        try:
            dic = make_dictionary(name, self.size, seed=self.seed, sae_path=self.sae)
        except ValueError as err:
            return str(err)
        try:
            dic.fit(X, U, Y)
        except ValueError as err:
            return f"{name} dictionary: {err}"
        try:
            blocks = EDMDc(dic, self.config).statistics(
                X, U, Y, pid, n_blocks=self.n_blocks, seed=self.seed
            )
            return split_half_convergence(
                blocks, self.config, n_repeats=self.n_repeats, seed=self.seed
            )
        except ValueError as err:
            return f"layer {label}, {name}: {err}"


def _config(alpha: float, energy: float, rank: int | None = None) -> Any:
    from structlens.koopman import EDMDcConfig

    try:
        if rank is not None:
            return EDMDcConfig(alpha=alpha, control_rank=rank)
        return EDMDcConfig(alpha=alpha, control_energy=energy)
    except ValueError as err:
        fail(str(err))


@app.command("fit")
def fit_cmd(
    model: ModelOpt = "smollm2-135m",
    layers: Layers = "8",
    pooled: Pooled = False,
    dictionary: Dicts = "identity,pca",
    size: Size = 64,
    sae: SAEPath = None,
    n_corpus: NCorpus = 200,
    prompt_tokens: PromptTokens = 64,
    n_task: NTask = 50,
    alpha: Alpha = 1e-6,
    control_energy: Energy = 0.99,
    control_rank: Rank = None,
    mom_blocks: Annotated[
        int, typer.Option("--mom-blocks", help="Also fit median-of-means with this many blocks.")
    ] = 0,
    out: Out = Path("koopman-out"),
    device: Device = "cpu",
    dtype: Dtype = "float32",
    seed: Seed = 0,
    quiet: Quiet = False,
    executor: ExecutorName = "local",
    address: Address = None,
) -> None:
    """Fit EDMDc per layer (or pooled): spectrum, non-normality, dissociation, tails.

    The EDMDc statistics are accumulated per store shard and merged; with --executor ray the
    capture and the shard statistics run on Ray (the store must be on shared storage).
    """
    from structlens.koopman import EDMDc, solve
    from structlens.koopman.data import store_statistics
    from structlens.koopman.pipeline import complex_list, summarise_fit
    from structlens.report.koopman import plot_eigenvalues
    from structlens.stats.robust import tail_diagnostic

    names = _dict_names(dictionary)
    cfg = _config(alpha, control_energy, control_rank)
    runner = executor_or_fail(executor, address)
    _, layer_list, streams, store = _setup(
        model,
        layers,
        pooled,
        out,
        n_corpus,
        prompt_tokens,
        n_task,
        device,
        dtype,
        seed,
        quiet,
        runner,
    )
    results: dict[str, dict[str, Any]] = {}
    spectra: dict[str, np.ndarray] = {}
    for label, (X, U, Y, pid) in streams.items():
        results[label] = {}
        raw_tail = tail_diagnostic(X)
        for name in names:
            dic = _fitted(name, size, seed, sae, X, U, Y)
            est = EDMDc(dic, cfg)
            try:
                stats = store_statistics(
                    store, dic, layer_list if pooled else [int(label)], executor=runner
                )
                res = solve(stats, cfg, dic)
            except ValueError as err:
                fail(f"layer {label}, {name}: {err}")
            entry = summarise_fit(res)
            lifted = tail_diagnostic(stats.tails)
            entry["tails"] = {
                "raw_state_p95_kurtosis": raw_tail.p95_kurtosis,
                "raw_state_heavy": raw_tail.heavy,
                "lifted_p95_kurtosis": lifted.p95_kurtosis,
                "lifted_heavy": lifted.heavy,
            }
            if mom_blocks:
                try:
                    mom = est.fit_median_of_means(X, U, Y, pid, n_blocks=mom_blocks, seed=seed)
                except ValueError as err:
                    fail(f"layer {label}, {name}, median of means: {err}")
                entry["median_of_means"] = {"eigenvalues": complex_list(mom.eigenvalues)}
            results[label][name] = entry
            spectra[f"L{label} {name}"] = res.eigenvalues
    fig = plot_eigenvalues(spectra, Path(out) / "eigenvalues.png")
    path = write_results(
        out,
        "fit",
        {"model": model, "results": results, "figures": [fig.name]},
        command="koopman fit",
    )
    if not quiet:
        for label, per in results.items():
            for name, e in per.items():
                nn = e["non_normality"]
                console.print(
                    f"layer {label} {name}: ρ(A) = {e['spectral_radius']:.3f}, "
                    f"Henrici rel = {nn['henrici_relative']:.3f}, κ(V) = {nn['kappa_V']:.3g}"
                )
        console.print(f"wrote {path}")


@app.command("convergence")
def convergence_cmd(
    model: ModelOpt = "smollm2-135m",
    layers: Layers = "8",
    pooled: Pooled = False,
    dictionary: Dicts = "pca",
    size: Size = 32,
    sae: SAEPath = None,
    n_corpus: NCorpus = 200,
    prompt_tokens: PromptTokens = 64,
    n_task: NTask = 50,
    alpha: Alpha = 1e-6,
    control_energy: Energy = 0.99,
    control_rank: Rank = None,
    n_blocks: Annotated[int, typer.Option("--n-blocks", help="Prompt blocks (>= 4).")] = 32,
    n_repeats: Annotated[int, typer.Option("--n-repeats", help="Half pairs per size.")] = 10,
    out: Out = Path("koopman-out"),
    device: Device = "cpu",
    dtype: Dtype = "float32",
    seed: Seed = 0,
    quiet: Quiet = False,
    executor: ExecutorName = "local",
    address: Address = None,
) -> None:
    """Split-half W∞ distance against M and its log-log slope (claim: −1/2).

    With --executor ray the capture and every (layer, dictionary) point run on Ray.
    """
    from structlens.report.koopman import plot_split_half

    names = _dict_names(dictionary)
    cfg = _config(alpha, control_energy, control_rank)
    if n_blocks < 4 or n_repeats < 2:
        fail(f"need --n-blocks >= 4 and --n-repeats >= 2; got {n_blocks}, {n_repeats}.")
    runner = executor_or_fail(executor, address)
    _, _, streams, _ = _setup(
        model,
        layers,
        pooled,
        out,
        n_corpus,
        prompt_tokens,
        n_task,
        device,
        dtype,
        seed,
        quiet,
        runner,
    )
    results: dict[str, dict[str, Any]] = {label: {} for label in streams}
    curves: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
    grid = [(label, name) for label in streams for name in names]
    job = _SplitHalfPoint(streams, size, seed, sae, cfg, n_blocks, n_repeats)
    outcomes = list(runner.map(job, grid, desc="split-half grid", progress=not quiet))
    for (label, name), sh in zip(grid, outcomes, strict=True):
        if isinstance(sh, str):
            fail(sh)
        results[label][name] = {
            "split_half": {
                "slope": sh.slope,
                "slope_ci": sh.slope_ci,
                "slope_last4": sh.slope_last4,
                "slope_w2": sh.slope_w2,
                "n_samples": sh.n_samples.tolist(),
                "w_inf_mean": sh.w_inf_mean.tolist(),
                "w2_mean": sh.w2_mean.tolist(),
                "eig_condition_max": sh.eig_condition_max,
                "eig_condition_median": float(np.median(sh.eig_condition)),
                "n_blocks": n_blocks,
                "n_repeats": n_repeats,
            }
        }
        curves[f"L{label} {name}"] = (sh.n_samples, sh.w_inf_mean, sh.slope)
    fig = plot_split_half(curves, Path(out) / "split_half.png")
    path = write_results(
        out,
        "convergence",
        {"model": model, "results": results, "figures": [fig.name]},
        command="koopman convergence",
    )
    if not quiet:
        for label, per in results.items():
            for name, e in per.items():
                s = e["split_half"]
                console.print(
                    f"layer {label} {name}: slope {s['slope']:.3f} "
                    f"[{s['slope_ci'][0]:.3f}, {s['slope_ci'][1]:.3f}], "
                    f"max κ(λ) {s['eig_condition_max']:.3g}"
                )
        console.print(f"wrote {path}")


@app.command("invariance")
def invariance_cmd(
    model: ModelOpt = "smollm2-135m",
    layers: Layers = "8",
    pooled: Pooled = False,
    dictionary: Dicts = "spectral,rff,relu",
    size: Size = 64,
    sae: SAEPath = None,
    n_corpus: NCorpus = 200,
    prompt_tokens: PromptTokens = 64,
    n_task: NTask = 50,
    alpha: Alpha = 1e-6,
    control_energy: Energy = 0.99,
    control_rank: Rank = None,
    out: Out = Path("koopman-out"),
    device: Device = "cpu",
    dtype: Dtype = "float32",
    seed: Seed = 0,
    quiet: Quiet = False,
) -> None:
    """Held-out one-step invariance residual (1 − R², by prompt split) per dictionary."""
    from structlens.koopman import invariance_residual_split

    names = _dict_names(dictionary)
    cfg = _config(alpha, control_energy, control_rank)
    _, _, streams, _ = _setup(
        model, layers, pooled, out, n_corpus, prompt_tokens, n_task, device, dtype, seed, quiet
    )
    results: dict[str, dict[str, Any]] = {}
    for label, (X, U, Y, pid) in streams.items():
        results[label] = {}
        for name in names:
            dic = _fitted(name, size, seed, sae, X, U, Y)
            try:
                inv = invariance_residual_split(dic, X, U, Y, pid, cfg, seed=seed)
            except ValueError as err:
                fail(f"layer {label}, {name}: {err}")
            results[label][name] = {
                "invariance_residual": {
                    "pooled": inv.pooled,
                    "mean": inv.mean,
                    "median": inv.median,
                    "n_dead": inv.n_dead,
                    "n_features": int(len(inv.per_feature)),
                }
            }
    path = write_results(
        out, "invariance", {"model": model, "results": results}, command="koopman invariance"
    )
    if not quiet:
        for label, per in results.items():
            for name, e in per.items():
                r = e["invariance_residual"]
                console.print(f"layer {label} {name}: pooled 1−R² = {r['pooled']:.4f}")
        console.print(f"wrote {path}")


@app.command("modes")
def modes_cmd(
    model: ModelOpt = "smollm2-135m",
    layers: Layers = "8",
    k: Annotated[int, typer.Option("--k", help="Real dimension ablated.")] = 4,
    size: Annotated[int, typer.Option("--size", help="PCA dictionary size k_pca.")] = 32,
    positions: Annotated[
        str, typer.Option("--positions", help="'all' or an IOI position, e.g. END.")
    ] = "all",
    n_ioi: Annotated[int, typer.Option("--n-ioi", help="IOI prompts scored.")] = 50,
    n_random: Annotated[int, typer.Option("--n-random", help="Random bases averaged.")] = 5,
    n_corpus: NCorpus = 200,
    prompt_tokens: PromptTokens = 64,
    n_task: NTask = 50,
    alpha: Alpha = 1e-6,
    control_energy: Energy = 0.99,
    control_rank: Rank = None,
    out: Out = Path("koopman-out"),
    device: Device = "cpu",
    dtype: Dtype = "float32",
    seed: Seed = 0,
    quiet: Quiet = False,
) -> None:
    """IOI: ablate k Koopman modes vs k PCA vs k random directions at resid_pre(l)."""
    from structlens.data.tasks import make_task
    from structlens.koopman import EDMDc
    from structlens.koopman.interventions import compare_ablations
    from structlens.report.koopman import plot_ablation

    cfg = _config(alpha, control_energy, control_rank)
    if k < 1 or k > size:
        fail(f"--k must be in [1, --size={size}]; got {k}.")
    m, _, streams, _ = _setup(
        model, layers, False, out, n_corpus, prompt_tokens, n_task, device, dtype, seed, quiet
    )
    try:
        task = make_task("ioi", m.tokenizer, n=n_ioi, seed=seed + 1)
    except ValueError as err:
        fail(f"IOI prompts cannot be built for {model}: {err}")
    results: dict[str, Any] = {}
    rows = []
    for label, (X, U, Y, _) in streams.items():
        dic = _fitted("pca", size, seed, None, X, U, Y)
        try:
            res = EDMDc(dic, cfg).fit(X, U, Y)
            cmp = compare_ablations(
                m, task, int(label), res, dic, k, positions=positions, n_random=n_random, seed=seed
            )
        except ValueError as err:
            fail(f"layer {label}: {err}")
        results[label] = {
            "dimension": cmp.dimension,
            "positions": positions,
            "clean_logit_diff": cmp.clean_metric_mean,
            "mode_eigenvalues": cmp.mode_eigenvalues.tolist(),
            **{
                meth: {"mean": float(cmp.mean[j]), "ci": cmp.ci[j].tolist()}
                for j, meth in enumerate(cmp.methods)
            },
        }
        rows.append((f"L{label}", cmp.methods, cmp.mean, cmp.ci))
    fig = plot_ablation(rows, Path(out) / "ioi_ablation.png")
    path = write_results(
        out,
        "modes",
        {"model": model, "k": k, "results": results, "figures": [fig.name]},
        command="koopman modes",
    )
    if not quiet:
        for label, r in results.items():
            console.print(
                f"layer {label} (dim {r['dimension']}): modes {r['modes']['mean']:+.3f}, "
                f"pca {r['pca']['mean']:+.3f}, random {r['random']['mean']:+.3f}"
            )
        console.print(f"wrote {path}")


@app.command("reduce")
def reduce_cmd(
    model: ModelOpt = "smollm2-135m",
    layers: Layers = "4-12",
    dictionary: Annotated[str, typer.Option("--dictionary", help="One dictionary.")] = "pca",
    size: Size = 32,
    sae: SAEPath = None,
    order: Annotated[str, typer.Option("--order", help="Comma list of reduced orders.")] = "4,8,16",
    n_corpus: NCorpus = 200,
    prompt_tokens: PromptTokens = 64,
    n_task: NTask = 50,
    alpha: Alpha = 1e-6,
    control_energy: Energy = 0.99,
    control_rank: Rank = None,
    out: Out = Path("koopman-out"),
    device: Device = "cpu",
    dtype: Dtype = "float32",
    seed: Seed = 0,
    quiet: Quiet = False,
) -> None:
    """Balanced truncation of the pooled depth operator over --layers (horizon = #layers):
    actual error vs Enns–Glover vs the instance bound (attention-write covariance)."""
    from structlens.koopman import EDMDc, balanced_truncation

    names = _dict_names(dictionary)
    if len(names) != 1:
        fail("reduce takes one --dictionary.")
    try:
        orders = [int(s) for s in order.split(",") if s.strip()]
    except ValueError:
        fail(f"--order {order!r} is not a comma list of integers.")
    cfg = _config(alpha, control_energy, control_rank)
    _, layer_list, streams, _ = _setup(
        model, layers, True, out, n_corpus, prompt_tokens, n_task, device, dtype, seed, quiet
    )
    ((label, (X, U, Y, _)),) = streams.items()
    dic = _fitted(names[0], size, seed, sae, X, U, Y)
    res = EDMDc(dic, cfg).fit(X, U, Y)
    n = res.A.shape[0]
    bad = [r for r in orders if not 1 <= r < n]
    if bad or not orders:
        fail(f"--order values must be in [1, {n - 1}]; got {orders}.")
    horizon = len(layer_list)
    rows: dict[str, Any] = {}
    for r in orders:
        red = balanced_truncation(res.A, res.B, res.C, r, horizon, input_cov=res.control_cov)
        rows[str(r)] = {
            "error": red.error,
            "enns_glover": red.enns_glover,
            "certified": red.certified,
            "markov_bound": red.markov_bound,
            "instance_error": red.instance_error,
            "instance_bound": red.instance_bound,
            "effective_rank": red.effective_rank,
            "rho0": red.rho0,
        }
    path = write_results(
        out,
        "reduce",
        {
            "model": model,
            "layers": label,
            "horizon": horizon,
            "dictionary": names[0],
            "results": rows,
        },
        command="koopman reduce",
    )
    if not quiet:
        for r, e in rows.items():
            console.print(
                f"order {r}: error {e['error']:.3g} ≤ Enns–Glover {e['enns_glover']:.3g}; "
                f"instance error {e['instance_error']:.3g} ≤ bound {e['instance_bound']:.3g}"
            )
        console.print(f"wrote {path}")

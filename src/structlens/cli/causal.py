"""``structlens causal-dim``: exact κ = erank(E[JᵀJ]) by layer, the SAE width sweep (N_repr,
N_causal, wedge, κ̂ with bootstrap CI) and the four-cell encoder/decoder ablation."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

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
from structlens.cli.sae import (
    Arch,
    Batch,
    Epochs,
    EvalPrompts,
    K,
    Layer,
    LrBase,
    Prompts,
    TargetL0,
    Tokens,
    _config,
    corpus_prompts,
    load_sae_for_model,
    parse_widths,
)

app = typer.Typer(
    help="Causal dimensionality: exact κ, width-sweep wedge, controls.", no_args_is_help=True
)

JacPrompts = Annotated[
    int, typer.Option("--jacobian-prompts", help="Residual vectors (one per prompt) for Σ.")
]
JacTokens = Annotated[int, typer.Option("--jacobian-tokens", help="Tokens per Σ prompt.")]
Output = Annotated[str, typer.Option("--output", help="Σ of 'log_probs' or 'raw' logits.")]
Positions = Annotated[
    str, typer.Option("--positions", help="'same' (last position) or 'downstream' outputs.")
]


def _kappa(
    m: Any, layers: list[int], n: int, tokens: int, output: str, outputs: str
) -> dict[str, Any]:
    from structlens.causal_dim import JacobianConfig
    from structlens.causal_dim.experiment import kappa_by_layer

    if outputs not in ("same", "downstream"):
        fail(f"--positions must be 'same' or 'downstream', got {outputs!r}.")
    if output not in ("raw", "log_probs"):
        fail(f"--output must be 'raw' or 'log_probs', got {output!r}.")
    if n < 1:
        fail("--jacobian-prompts must be ≥ 1.")
    _, held = corpus_prompts(m, tokens, 1, n)
    cfg = JacobianConfig(output=output, n_groups=max(2, n), max_rows=max(2048, m.d_model))
    try:
        return kappa_by_layer(m, layers, held, cfg, outputs=outputs)
    except ValueError as err:
        fail(str(err))
    raise AssertionError  # fail() exits


def _layers(spec: str, n_layers: int) -> list[int]:
    try:
        layers = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        fail(f"--layers must be comma-separated integers, got {spec!r}.")
    bad = [x for x in layers if not 0 <= x < n_layers]
    if not layers or bad:
        fail(f"--layers must lie in [0, {n_layers}); got {spec!r}.")
    return layers


@app.command()
def jacobian(
    model: ModelArg,
    out: Out,
    layers: Annotated[str, typer.Option("--layers", help="Comma-separated layers.")] = "0",
    jacobian_prompts: JacPrompts = 4,
    jacobian_tokens: JacTokens = 24,
    output: Output = "log_probs",
    positions: Positions = "same",
    device: Device = "cpu",
    dtype: Dtype = "float32",
    seed: Seed = 0,
    quiet: Quiet = False,
) -> None:
    """Exact Σ = E[JᵀJ] at blocks.{l}.hook_resid_pre: κ (erank), κ_PR, ranks, spectrum."""
    from structlens.report.causal import plot_spectrum

    m = load_model_or_fail(model, device, dtype, seed)
    res = _kappa(
        m, _layers(layers, m.n_layers), jacobian_prompts, jacobian_tokens, output, positions
    )
    first = res["layers"][0]
    payload = {
        "model": m.name,
        "kappa": {
            "erank": first["erank"],
            "participation_ratio": first["participation_ratio"],
            "layer": first["layer"],
        },
        "by_layer": res,
    }
    write_results(out, "causal_jacobian", payload, command="causal-dim jacobian")
    plot_spectrum(res, Path(out) / "sigma_spectrum.png")
    if not quiet:
        for e in res["layers"]:
            console.print(
                f"layer {e['layer']}: κ = {e['erank']:.1f} (κ/d {e['kappa_over_d']:.3f})"
                f", κ_PR = {e['participation_ratio']:.1f}"
            )


def _train_saes(
    m: Any,
    layer: int,
    ws: list[int],
    cfg: Any,
    tr: list,
    epochs: int,
    batch_size: int,
    seed: int,
    executor: Any = None,
) -> dict[int, Any]:
    from structlens.causal_dim.experiment import collect_residuals, train_width_sweep

    acts = collect_residuals(m, layer, tr)
    if acts.shape[0] < batch_size:
        fail(f"only {acts.shape[0]} training tokens for --batch-size {batch_size}.")
    trained = train_width_sweep(
        acts, ws, cfg, batch_size=batch_size, epochs=epochs, seed=seed, executor=executor
    )
    return {w: r.sae for w, r in trained.items()}


@app.command()
def sweep(
    model: ModelArg,
    out: Out,
    layer: Layer = 0,
    widths: Annotated[str, typer.Option("--widths", help="Comma-separated widths (≥ 2).")] = (
        "512,1024,2048,4096,8192,16384"
    ),
    arch: Arch = "topk",
    k: K = 32,
    target_l0: TargetL0 = None,
    prompts: Prompts = 200,
    eval_prompts: EvalPrompts = 8,
    prompt_tokens: Tokens = 128,
    epochs: Epochs = 1,
    batch_size: Batch = 512,
    lr_base: LrBase = 2e-4,
    percentile: Annotated[float, typer.Option("--percentile", help="ε percentile.")] = 98.0,
    min_count: Annotated[int, typer.Option("--min-count", help="Firings for N_repr.")] = 1,
    n_bootstrap: Annotated[int, typer.Option("--bootstrap", help="Bootstrap resamples.")] = 200,
    n_blocks: Annotated[int, typer.Option("--blocks", help="Token blocks for bootstrap.")] = 64,
    jacobian_prompts: JacPrompts = 2,
    jacobian_tokens: JacTokens = 24,
    device: Device = "cpu",
    dtype: Dtype = "float32",
    seed: Seed = 0,
    quiet: Quiet = False,
    executor: ExecutorName = "local",
    address: Address = None,
) -> None:
    """Width sweep at one layer: train SAEs, AtP on the LM loss, N_repr/N_causal, κ̂.

    With --executor ray the widths train as parallel Ray tasks (same SAEs as locally).
    """
    from structlens.causal_dim.experiment import sweep_analysis
    from structlens.causal_dim.model import residual_grads
    from structlens.causal_dim.sweep import WidthSweepConfig
    from structlens.report.causal import plot_width_sweep

    ws = parse_widths(widths)
    if len(ws) < 2:
        fail("a width sweep needs at least two widths.")
    try:
        wcfg = WidthSweepConfig(
            percentile=percentile, min_count=min_count, n_bootstrap=n_bootstrap, seed=seed
        )
    except ValueError as err:
        fail(str(err))
    m = load_model_or_fail(model, device, dtype, seed)
    if not m.causal:
        fail(f"{m.name} is an encoder; the sweep's AtP metric is the LM loss.")
    _layers(str(layer), m.n_layers)
    tr, ev = corpus_prompts(m, prompt_tokens, prompts, eval_prompts)
    cfg = _config(arch, k, target_l0, lr_base, seed, ws[0])
    runner = executor_or_fail(executor, address)
    saes = _train_saes(m, layer, ws, cfg, tr, epochs, batch_size, seed, runner)
    kappa = _kappa(m, [layer], jacobian_prompts, jacobian_tokens, "log_probs", "same")
    pairs = list(residual_grads(m, layer, ev))
    erank = kappa["layers"][0]["erank"]
    res, _ = sweep_analysis(saes, pairs, wcfg, n_blocks=n_blocks, exact_erank=erank)
    sweep_json = res.to_json() | {
        "widths": res.widths.tolist(),
        "n_repr": res.n_repr.tolist(),
        "n_causal": res.n_causal.tolist(),
        "n_repr_growth": res.n_repr_growth.tolist(),
        "n_causal_growth": res.n_causal_growth.tolist(),
        "n_repr_ci": res.n_repr_ci.tolist(),
        "n_causal_ci": res.n_causal_ci.tolist(),
    }
    payload = {
        "model": m.name,
        "layer": layer,
        "kappa": {
            "erank": erank,
            "participation_ratio": kappa["layers"][0]["participation_ratio"],
            "by_layer": kappa,
        },
        "sweep": sweep_json,
    }
    from structlens.sae import save_sae

    for w, s in saes.items():
        save_sae(s, Path(out) / "saes" / str(w))
    write_results(out, "causal_sweep", payload, command="causal-dim sweep")
    plot_width_sweep(sweep_json, Path(out) / "width_sweep.png")
    if not quiet:
        console.print(
            f"N_repr {res.n_repr.tolist()}  N_causal {res.n_causal.tolist()}  "
            f"wedge {res.wedge:.2f}  κ̂ {res.kappa_hat:.0f} {res.kappa_hat_ci}  "
            f"exact κ {erank:.1f}"
        )


@app.command()
def ablate(
    model: ModelArg,
    sae: Annotated[Path, typer.Option("--sae", help="SAELens-format SAE directory.")],
    out: Out,
    layer: Layer = 0,
    eval_prompts: EvalPrompts = 8,
    prompt_tokens: Tokens = 128,
    device: Device = "cpu",
    dtype: Dtype = "float32",
    seed: Seed = 0,
    quiet: Quiet = False,
) -> None:
    """Four-cell encoder/decoder ablation (learned vs random orthonormal) with inflation."""
    from structlens.causal_dim.experiment import four_cell
    from structlens.causal_dim.model import residual_grads

    s, m = load_sae_for_model(sae, model, device, dtype, seed)
    _layers(str(layer), m.n_layers)
    _, ev = corpus_prompts(m, prompt_tokens, 1, eval_prompts)
    payload = {
        "model": m.name,
        "layer": layer,
        "sae": str(sae),
        "four_cell": four_cell(s, list(residual_grads(m, layer, ev)), seed=seed),
    }
    write_results(out, "causal_ablate", payload, command="causal-dim ablate")
    if not quiet:
        for cell, v in payload["four_cell"]["inflation"].items():
            console.print(f"{cell}: N_causal {payload['four_cell']['n_causal'][cell]} (×{v:.2f})")

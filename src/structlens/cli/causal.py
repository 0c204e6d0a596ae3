"""``structlens causal-dim``: exact κ = erank(E[JᵀJ]) by layer, the SAE width sweep (N_repr,
N_causal, wedge, κ̂ with bootstrap CI) and the four-cell encoder/decoder ablation; the
experiments are :func:`structlens.causal_dim.experiment.run`."""

from __future__ import annotations

from typing import Annotated, Any, cast

import typer

from structlens.cli.checks import Parsed, at_least, choice
from structlens.cli.common import Common, common_options, shared_settings
from structlens.cli.options import ModelArg, parse_ints
from structlens.cli.sae import EVALUATION, SWEEP_WIDTHS, load_sae_dir, parse_widths, training
from structlens.cli.sae import FLAGS as SAE_FLAGS

app = typer.Typer(
    help="Causal dimensionality: exact κ, width-sweep wedge, controls.", no_args_is_help=True
)

# the checks say what CausalDimExperimentConfig would (FLAGS turn its fields into options)
JacPrompts = Annotated[
    int,
    typer.Option("--jacobian-prompts", help="Residual vectors (one per prompt) for Σ."),
    at_least(1, "jacobian_prompts must be ≥ 1."),
]
JacTokens = Annotated[int, typer.Option("--jacobian-tokens", help="Tokens per Σ prompt.")]
Output = Annotated[
    str,
    typer.Option("--output", help="Σ of 'log_probs' or 'raw' logits."),
    choice("output", ("log_probs", "raw")),
]
Positions = Annotated[
    str,
    typer.Option("--positions", help="'same' (last position) or 'downstream' outputs."),
    choice("positions", ("same", "downstream")),
]
Layers = Annotated[
    str,
    typer.Option("--layers", help="Comma-separated layers."),
    Parsed(
        lambda spec: list(parse_ints(spec, "--layers")),
        lambda layers: min(layers) >= 0,
        "layers must name layers >= 0; got {parsed}.",
    ),
]
FLAGS = SAE_FLAGS | {
    "layers": "--layers",
    "jacobian_prompts": "--jacobian-prompts",
    "output": "--output",
    "positions": "--positions",
    "n_bootstrap": "--bootstrap",
}


def _run(common: Common, model: Any, sae: Any = None, **settings: Any) -> Any:
    """Run the experiment on ``model`` (a loaded model, or a name to load)."""
    from structlens.causal_dim.experiment import CausalDimExperimentConfig, run

    cfg = CausalDimExperimentConfig(seed=common.seed, **settings)
    runner = common.runner()
    m = common.load_model(model) if isinstance(model, str) else model
    return run(cfg, m, sae=sae, executor=runner)


@app.command()
@common_options(flags=FLAGS)
def jacobian(
    common: Common,
    model: ModelArg,
    layers: Layers = "0",
    jacobian_prompts: JacPrompts = 4,
    jacobian_tokens: JacTokens = 24,
    output: Output = "log_probs",
    positions: Positions = "same",
) -> None:
    """Exact Σ = E[JᵀJ] at blocks.{l}.hook_resid_pre: κ (erank), κ_PR, ranks, spectrum."""
    from structlens.report.causal import plot_spectra

    report, _ = _run(
        common, model, analysis="jacobian", layers=parse_ints(layers, "--layers"),
        jacobian_prompts=jacobian_prompts, jacobian_tokens=jacobian_tokens, output=output,
        positions=positions,
    )  # fmt: skip
    common.write("causal_jacobian", report.payload(), command="causal-dim jacobian")
    by_layer = report.results["by_layer"]
    plot_spectra(
        {e["layer"]: e["eigenvalues"] for e in by_layer["layers"]},
        common.out / "sigma_spectrum.png",
    )
    for e in by_layer["layers"]:
        common.say(
            f"layer {e['layer']}: κ = {e['erank']:.1f} (κ/d {e['kappa_over_d']:.3f})"
            f", κ_PR = {e['participation_ratio']:.1f}"
        )


@app.command()
@common_options(executor=True, flags=FLAGS)
@shared_settings(training(SWEEP_WIDTHS), first=True)
def sweep(
    common: Common,
    model: ModelArg,
    percentile: Annotated[float, typer.Option("--percentile", help="ε percentile.")] = 98.0,
    min_count: Annotated[int, typer.Option("--min-count", help="Firings for N_repr.")] = 1,
    n_bootstrap: Annotated[int, typer.Option("--bootstrap", help="Bootstrap resamples.")] = 200,
    n_blocks: Annotated[int, typer.Option("--blocks", help="Prompt blocks to resample.")] = 64,
    jacobian_prompts: JacPrompts = 2,
    jacobian_tokens: JacTokens = 24,
    **settings: Any,
) -> None:
    """Width sweep at one layer: train SAEs, AtP on the LM loss, N_repr/N_causal, κ̂.

    With --executor ray the widths train as parallel Ray tasks (same SAEs as locally).
    """
    from structlens.causal_dim.sweep import WidthSweepResult
    from structlens.provenance import provenance
    from structlens.report.causal import plot_width_sweep
    from structlens.sae import save_sae
    from structlens.sae.experiment import SAEExperimentConfig
    from structlens.sites import site_name

    widths = parse_widths(settings.pop("widths"))
    sae_cfg = SAEExperimentConfig(widths=widths, seed=common.seed, **settings)
    m = common.load_model(model)
    report, saes = _run(
        common, m, analysis="sweep", percentile=percentile, min_count=min_count,
        n_bootstrap=n_bootstrap, n_blocks=n_blocks, jacobian_prompts=jacobian_prompts,
        jacobian_tokens=jacobian_tokens, sae_config=sae_cfg,
    )  # fmt: skip
    site = site_name("resid_pre", sae_cfg.layer, n_layers=m.n_layers)
    for w, s in saes.items():
        # cast: the str fields go to save_sae's str keywords, never to ``metadata``
        save_sae(s, common.out / "saes" / str(w), **cast(dict[str, Any], provenance(m, site)))
    common.write("causal_sweep", report.payload(), command="causal-dim sweep")
    sw = report.results["sweep"]
    plot_width_sweep(WidthSweepResult.from_dict(sw), common.out / "width_sweep.png")
    kappa_hat = (
        f"κ̂ {sw['kappa_hat']:.0f} {sw['kappa_hat_ci']}"
        if sw["kappa_hat_status"] == "identified"  # never print a fit pinned at a bound
        else f"κ̂ {sw['kappa_hat_status']} ({sw['kappa_hat_reason'] or sw['sweep_reason']})"
    )
    common.say(
        f"N_repr {sw['n_repr']}  N_causal {sw['n_causal']}  wedge {sw['wedge']:.2f}  "
        f"{kappa_hat}  exact κ {report.results['kappa']['erank']:.1f}",
        markup=False,
    )


@app.command()
@common_options(flags=FLAGS)
@shared_settings(EVALUATION)
def ablate(common: Common, model: ModelArg, **settings: Any) -> None:
    """Four-cell encoder/decoder ablation (learned vs random orthonormal) with inflation."""
    from structlens.sae.experiment import SAEExperimentConfig

    sae, allow_foreign = settings.pop("sae"), settings.pop("allow_foreign")
    sae_cfg = SAEExperimentConfig(**settings)
    m = common.load_model(model)
    with common.foreign_uses() as foreign:
        loaded = load_sae_dir(sae, m, sae_cfg.layer, allow_foreign=allow_foreign)
    report, _ = _run(common, m, loaded, analysis="ablate", sae_config=sae_cfg)
    payload = report.payload() | {"sae": str(sae), "foreign": foreign}
    common.write("causal_ablate", payload, command="causal-dim ablate")
    table = report.results["four_cell"]
    for cell, v in table["inflation"].items():
        common.say(f"{cell}: N_causal {table['n_causal'][cell]} (×{v:.2f})")

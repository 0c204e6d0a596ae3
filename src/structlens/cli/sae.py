"""``structlens sae``: train, width-sweep and evaluate sparse autoencoders on a model's
residual stream (``blocks.{layer}.hook_resid_pre``) over the bundled corpus; the experiments
are :mod:`structlens.sae.experiment`."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from structlens.cli.checks import at_least
from structlens.cli.common import Common, common_options, shared_settings
from structlens.cli.options import AllowForeign, ModelArg
from structlens.cli.sae_options import (
    Arch,
    Batch,
    Epochs,
    EvalPrompts,
    K,
    Layer,
    LrBase,
    Prompts,
    SAEDir,
    TargetL0,
    Tokens,
    Widths,
    parse_widths,
)

app = typer.Typer(
    help="Sparse autoencoders: train, width sweeps, evaluation.", no_args_is_help=True
)

SWEEP_WIDTHS = {"widths": (Widths, "512,1024,2048,4096,8192,16384")}
# the options of a saved SAE's evaluation (`sae eval`, `causal-dim ablate`)
EVALUATION = {
    "sae": (SAEDir, inspect.Parameter.empty),
    "layer": (Layer, 0),
    "eval_prompts": (EvalPrompts, 8),
    "prompt_tokens": (Tokens, 128),
    "allow_foreign": (AllowForeign, False),
}
# config fields as the options that set them, in the messages of configs' errors
FLAGS = {
    "arch": "--arch",
    "widths": "--widths",
    "target_l0": "--target-l0",
    "lr_base": "--lr-base",
    "batch_size": "--batch-size",
}


def training(widths: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    """The SAE training options (``sae train``, ``sae sweep``, ``causal-dim sweep``):
    ``--layer``, then ``widths`` (the command's ``--width`` or ``--widths``), then the
    architecture, data and optimisation settings."""
    return (
        {"layer": (Layer, 0)}
        | widths
        | {
            "arch": (Arch, "topk"),
            "k": (K, 32),
            "target_l0": (TargetL0, None),
            "prompts": (Prompts, 200),
            "eval_prompts": (EvalPrompts, 8),
            "prompt_tokens": (Tokens, 128),
            "epochs": (Epochs, 1),
            "batch_size": (Batch, 512),
            "lr_base": (LrBase, 2e-4),
        }
    )


def load_sae_dir(sae: Path, model: Any, layer: int, *, allow_foreign: bool) -> Any:
    """The SAE saved at ``sae`` for ``model``'s ``blocks.{layer}.hook_resid_pre``; a user error
    if the directory holds none or the SAE was made from another model or site (unless
    ``allow_foreign``: then a :class:`~structlens.provenance.ForeignResultWarning`)."""
    from structlens.errors import InputError
    from structlens.sae import load_sae
    from structlens.sites import site_name

    if not (sae / "cfg.json").exists():
        raise InputError(f"{sae} is not an SAE directory (no cfg.json).")
    site = site_name("resid_pre", layer, n_layers=model.n_layers)
    return load_sae(sae, model=model, site=site, allow_foreign=allow_foreign)


def _train(common: Common, model: str, name: str, **settings: Any) -> None:
    from structlens.sae.experiment import SAEExperimentConfig, run

    cfg = SAEExperimentConfig(seed=common.seed, **settings)
    runner = common.runner()
    report = run(cfg, common.load_model(model), out=common.out, executor=runner)
    common.write(name, report.payload(), command=name.replace("_", " "))
    for w, v in report.results.items():
        # float(): an undefined CE recovered is the JSON string "nan" (its reason is saved)
        ce = float(v["ce"]["ce_loss_recovered"]) if v["ce"] else float("nan")
        common.say(
            f"width {w}: FVU {v['eval']['fvu']:.3f}, L0 {v['eval']['l0']:.1f}, "
            f"dead {v['eval']['dead_fraction']:.3f}, CE recovered {ce:.3f}"
        )


@app.command()
@common_options(flags=FLAGS)
@shared_settings(
    training(
        {
            "width": (
                Annotated[
                    int,
                    typer.Option("--width", help="Dictionary size."),
                    at_least(1, "widths must be positive integers; got [{value}]."),
                ],
                4096,
            )
        }
    )
)
def train(common: Common, model: ModelArg, **settings: Any) -> None:
    """Train one SAE on the residual stream at --layer; saves it in SAELens format."""
    widths = (settings.pop("width"),)
    _train(common, model, "sae_train", widths=widths, **settings)


@app.command()
@common_options(executor=True, flags=FLAGS)
@shared_settings(training(SWEEP_WIDTHS))
def sweep(common: Common, model: ModelArg, **settings: Any) -> None:
    """Train SAEs of several widths on ONE activation stream (same tokens, same order).

    With --executor ray the widths train as parallel Ray tasks (same SAEs as locally).
    """
    widths = parse_widths(settings.pop("widths"))
    _train(common, model, "sae_sweep", widths=widths, **settings)


@app.command("eval")
@common_options()
@shared_settings(EVALUATION)
def evaluate(common: Common, model: ModelArg, **settings: Any) -> None:
    """FVU, L0, dead fraction and CE loss recovered of a saved SAE at --layer."""
    from structlens.sae.experiment import SAEEvaluationConfig
    from structlens.sae.experiment import evaluate as run_evaluation

    sae, allow_foreign = settings.pop("sae"), settings.pop("allow_foreign")
    cfg = SAEEvaluationConfig(**settings)
    m = common.load_model(model)
    with common.foreign_uses() as foreign:
        s = load_sae_dir(sae, m, cfg.layer, allow_foreign=allow_foreign)
    report = run_evaluation(cfg, m, s, path=sae)
    common.write("sae_eval", report.payload() | {"foreign": foreign}, command="sae eval")
    e = report.results["eval"]
    common.say(f"FVU {e['fvu']:.3f}, L0 {e['l0']:.1f}, dead {e['dead_fraction']:.3f}")

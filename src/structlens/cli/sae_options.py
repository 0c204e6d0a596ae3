"""Options of the ``structlens sae`` commands (also used by ``structlens causal-dim``),
declared once with their checks, and the parser of ``--widths``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from structlens.cli.checks import SAE_ARCHITECTURE_NAMES, Holds, Parsed, above, at_least, one_of
from structlens.cli.options import parse_names
from structlens.cli.output import fail


def parse_widths(spec: str) -> tuple[int, ...]:
    """``'64,128'`` as a tuple of ints; exits 2 otherwise."""
    try:
        return tuple(int(w) for w in parse_names(spec))
    except ValueError:
        fail(f"--widths must be comma-separated integers, got {spec!r}.")


# the checks say what SAEExperimentConfig, SAEEvaluationConfig and SAETrainConfig would
WINDOWS = "--prompt-tokens must be ≥ 2 and --prompts/--eval-prompts ≥ 1."
EPOCHS = "epochs and batch_size must be ≥ 1; got {epochs}, {batch_size}."
Layer = Annotated[
    int, typer.Option("--layer", help="Residual stream blocks.{layer}.hook_resid_pre.")
]
Prompts = Annotated[
    int, typer.Option("--prompts", help="Corpus windows used for training."), at_least(1, WINDOWS)
]
EvalPrompts = Annotated[
    int,
    typer.Option("--eval-prompts", help="Held-out windows for eval."),
    at_least(1, WINDOWS.replace("--prompts/", "")),
]
Tokens = Annotated[
    int,
    typer.Option("--prompt-tokens", help="Tokens per corpus window."),
    at_least(2, WINDOWS),
]
Arch = Annotated[
    str,
    typer.Option("--arch", help="relu, topk, batchtopk or jumprelu."),
    one_of(
        SAE_ARCHITECTURE_NAMES,
        f"unknown architecture {{value!r}}; choose from: {', '.join(SAE_ARCHITECTURE_NAMES)}.",
    ),
]
K = Annotated[
    int,
    typer.Option("--k", help="TopK/BatchTopK k (the matched L0)."),
    at_least(1, "d_sae and k must be positive."),
]
TargetL0 = Annotated[
    float | None,
    typer.Option("--target-l0", help="Matched L0 for relu/jumprelu (controller)."),
    above(0, "target_l0 must lie in (0, d_sae], got {value}."),
]
Epochs = Annotated[
    int, typer.Option("--epochs", help="Passes over the training tokens."), at_least(1, EPOCHS)
]
Batch = Annotated[
    int, typer.Option("--batch-size", help="Tokens per training step."), at_least(1, EPOCHS)
]
LrBase = Annotated[float, typer.Option("--lr-base", help="Learning rate at width 2^14.")]
Widths = Annotated[
    str,
    typer.Option("--widths", help="Comma-separated widths."),
    Parsed(
        lambda spec: list(parse_widths(spec)),
        lambda ws: bool(ws) and min(ws) >= 1,
        "widths must be positive integers; got {parsed}.",
    ),
]
SAEDir = Annotated[
    Path,
    typer.Option("--sae", help="SAELens-format SAE directory."),
    # the words of load_sae_dir, which checks it again once the model is loaded
    Holds(lambda p: (p / "cfg.json").exists(), "{value} is not an SAE directory (no cfg.json)."),
]

"""Options of the ``structlens equiv`` commands, declared once with their checks."""

from __future__ import annotations

from typing import Annotated

import typer

from structlens.cli.checks import (
    METRIC_NAMES,
    MIN_PROBE_PROMPTS,
    Calls,
    at_least,
    check_task,
    choice,
    one_of,
)

# the checks say what EquivalenceExperimentConfig and CompareConfig would (FLAGS turn the
# fields into options)
Task = Annotated[
    str,
    typer.Option(
        "--task", help="Probe set: 'corpus' (bundled sentences) or a task name (ioi, ...)."
    ),
    Calls(lambda t: check_task(t, also=("corpus",))),
]
N = Annotated[
    int,
    typer.Option("-n", help="Number of probe prompts (half held out)."),
    at_least(
        MIN_PROBE_PROMPTS,
        f"too few probe prompts (-n {{value}}); compare needs at least {MIN_PROBE_PROMPTS} "
        "(half fit the similarities and maps, half validate).",
    ),
]
Metric = Annotated[
    str,
    typer.Option(
        "--metric",
        help="Similarity: linear_cka, linear_cka_debiased, rbf_cka, svcca, pwcca, procrustes, "
        "encoding, mutual_knn.",
    ),
    one_of(METRIC_NAMES, f"unknown metric {{value!r}}; choose one of {list(METRIC_NAMES)}."),
]
LayerMatching = Annotated[
    str,
    typer.Option("--layer-matching", help="monotone (depth-preserving) or hungarian."),
    choice("layer_matching", ("monotone", "hungarian")),
]
HeadMatching = Annotated[
    str,
    typer.Option("--head-matching", help="global or per_layer."),
    choice("head_matching", ("global", "per_layer")),
]
Representation = Annotated[
    str,
    typer.Option("--representation", help="auto, tokens or sentence (mean over tokens)."),
    choice("representation", ("auto", "tokens", "sentence")),
]
POSITIVE = "congruity_top_k and batch_size must be positive."
BatchSize = Annotated[int, typer.Option("--batch-size"), at_least(1, POSITIVE)]

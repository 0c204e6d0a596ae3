"""``structlens equiv compare|similarity``: interpretive equivalence of two models; the
experiment is :func:`structlens.equivalence.experiment.run`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from structlens.cli.checks import at_least, choice
from structlens.cli.common import Common, common_options, shared_settings
from structlens.cli.equiv_options import (
    POSITIVE,
    BatchSize,
    HeadMatching,
    LayerMatching,
    Metric,
    N,
    Representation,
    Task,
)
from structlens.cli.options import ModelArg

app = typer.Typer(
    help="Interpretive equivalence: do two models implement the same mechanism?",
    no_args_is_help=True,
)

# the probes and the matching, shared by both commands
PROBES = {
    "task": (Task, "corpus"),
    "n": (N, 64),
    "metric": (Metric, "linear_cka_debiased"),
    "layer_matching": (LayerMatching, "monotone"),
    "head_matching": (HeadMatching, "global"),
    "representation": (Representation, "auto"),
}
OUT = Path("results/equiv")
# config fields as the options that set them, in the messages of configs' errors
FLAGS = {
    "layer_matching": "--layer-matching",
    "head_matching": "--head-matching",
    "representation": "--representation",
    "map_method": "--map",
}


def _run(
    common: Common, model_a: str, model_b: str, name: str, *, task: str, n: int, **compare: Any
) -> None:
    from structlens.equivalence import Preprocess, ValidationCriterion
    from structlens.equivalence.compare import CompareConfig
    from structlens.equivalence.experiment import EquivalenceExperimentConfig, run
    from structlens.report.equivalence import plot_layer_matching

    criterion = ValidationCriterion(max_kl=compare.pop("max_kl"), min_top1=compare.pop("min_top1"))
    cmp = CompareConfig(
        preprocess=Preprocess(exclude_bos=True), criterion=criterion, seed=common.seed, **compare
    )
    cfg = EquivalenceExperimentConfig(task=task, n=n, compare=cmp)
    a = common.load_model(model_a)
    b = common.load_model(model_b, seed=common.seed + 1 if model_a == model_b else common.seed)
    result = run(cfg, a, b)
    out = common.out
    out.mkdir(parents=True, exist_ok=True)
    result.save(out / f"{name}_result")
    path = common.write(name, result.summary(), command=f"equiv {name}")
    plot_layer_matching(
        result, out / f"{name}_layers.png", label_a=model_a, label_b=model_b,
        title=f"{cmp.metric}, {result.matching['layers']['method']} matching",
    )  # fmt: skip
    common.say(
        f"{model_a} vs {model_b} on {result.probe} ({result.representation} rows): "
        f"score {result.score:.3f} [{result.score_ci[0]:.3f}, {result.score_ci[1]:.3f}] "
        f"({result.validation_method}), layers {result.layer_score:.3f}"
    )
    if inf := result.informative:
        common.say(
            f"null (mean ablation) score {result.null_score:.3f}; partner passes on "
            f"{inf['n_passed']} of the {inf['n_heads']} heads whose mean ablation fails"
        )
    if g := result.head_groups:
        common.say(f"whole-layer head groups: score {g['score']:.3f}, null {g['null_score']:.3f}")
    if c := result.congruity:
        common.say(
            f"congruity: point-test decision rate A->B {c['point_test_ab']['decision_rate']:.2f}, "
            f"B->A {c['point_test_ba']['decision_rate']:.2f}; verdicts {result.verdicts}"
        )
    common.say(f"wrote {path}")


@app.command("compare")
@common_options(out=OUT, flags=FLAGS)
@shared_settings(PROBES, first=True)
def compare_cmd(
    common: Common,
    model_a: ModelArg,
    model_b: ModelArg,
    map_method: Annotated[
        str,
        typer.Option("--map", help="Linear map for validation: ridge or procrustes."),
        choice("map_method", ("ridge", "procrustes")),
    ] = "ridge",
    max_kl: Annotated[float, typer.Option("--max-kl", help="Pass if KL <= this (nats).")] = 0.1,
    min_top1: Annotated[
        float, typer.Option("--min-top1", help="Pass if top-1 agreement >= this.")
    ] = 0.9,
    max_validate_heads: Annotated[
        int | None,
        typer.Option("--max-validate-heads", help="Validate a random subset of matched heads."),
    ] = None,
    head_groups: Annotated[
        bool,
        typer.Option(
            "--head-groups/--no-head-groups",
            help="Also replace all heads of each layer of B at once (and mean-ablate them).",
        ),
    ] = False,
    congruity: Annotated[
        bool, typer.Option("--congruity/--no-congruity", help="Run the CONGRUITY estimator.")
    ] = True,
    top_k: Annotated[
        int, typer.Option("--top-k", help="CONGRUITY heads per model."), at_least(1, POSITIVE)
    ] = 4,
    congruity_max_layers: Annotated[
        int | None,
        typer.Option("--congruity-max-layers", help="Rank heads of at most this many layers."),
    ] = None,
    batch_size: BatchSize = 8,
    **settings: Any,
) -> None:
    """Match layers and heads of MODEL_A and MODEL_B, validate by patching, run CONGRUITY.

    Writes compare.json (score, score_ci, matching, validation, congruity, verdicts),
    compare_result/ (arrays) and compare_layers.png. The same alias twice compares two
    seeds of a tiny model (B gets seed + 1).
    """
    _run(
        common, model_a, model_b, "compare", map_method=map_method, max_kl=max_kl,
        min_top1=min_top1, max_validate_heads=max_validate_heads, validate_head_groups=head_groups,
        congruity=congruity, congruity_top_k=top_k, congruity_max_layers=congruity_max_layers,
        batch_size=batch_size, **settings,
    )  # fmt: skip


@app.command("similarity")
@common_options(out=OUT, flags=FLAGS)
@shared_settings(PROBES, first=True)
def similarity_cmd(
    common: Common,
    model_a: ModelArg,
    model_b: ModelArg,
    threshold: Annotated[
        float, typer.Option("--threshold", help="Similarity a matched pair must reach.")
    ] = 0.5,
    batch_size: BatchSize = 8,
    **settings: Any,
) -> None:
    """Layer and head similarity matrices and matchings only (no patching, no CONGRUITY).

    Writes similarity.json (layer_similarity, matching, the similarity-only score) and
    similarity_layers.png.
    """
    _run(
        common, model_a, model_b, "similarity", similarity_threshold=threshold,
        validate=False, congruity=False, max_kl=0.1, min_top1=0.9, batch_size=batch_size,
        **settings,
    )  # fmt: skip

"""``structlens ndm``: train NDM on residual activations, evaluate it by subspace patching,
browse subspace preimages; the experiments are :mod:`structlens.ndm.experiment`.

* ``train`` writes ``ndm_train.json``, ``R-L{layer}.safetensors``, ``ndm-L{layer}/`` (the
  full result) and ``merge_history.png``.
* ``evaluate`` writes ``ndm_evaluate.json`` and ``effects-<test>.png``.
* ``browse`` writes ``ndm_browse.json`` (one entry of ``queries`` per query) and, on its
  first call for a run and layer, the saved index ``TRAIN/browse-index/L{layer}-<key>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, cast

import typer

from structlens.cli.checks import Holds, at_least, between
from structlens.cli.common import Common, common_options
from structlens.cli.ndm_browse import browse
from structlens.cli.ndm_options import FLAGS, OUT, Activations, TrainDir
from structlens.cli.options import AllowForeign, ModelArg, parse_ints, parse_names

# the words of NDMExperimentConfig, NDMConfig and NDMEvaluationConfig
PROMPTS = "corpus_prompts and task_prompts must be >= 0."


def positive(field: str) -> Holds:
    """The :class:`~structlens.ndm.NDMConfig` check of a count ``field`` (>= 1)."""
    return at_least(1, f"NDMConfig.{field} must be >= 1, got {{value}}.")


app = typer.Typer(help="NDM subspace decomposition: train, evaluate, browse.", no_args_is_help=True)


@app.command()
@common_options(out=OUT, flags=FLAGS)
def train(
    common: Common,
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
    corpus_prompts: Annotated[
        int, typer.Option(help="Corpus windows of 128 tokens."), at_least(0, PROMPTS)
    ] = 150,
    task_prompts: Annotated[
        int, typer.Option(help="Clean prompts per task (3 tasks)."), at_least(0, PROMPTS)
    ] = 40,
    unit_size: Annotated[
        int, typer.Option(help="Initial subspace size (divides d)."), positive("unit_size")
    ] = 48,
    steps: Annotated[
        int, typer.Option(help="Maximum optimisation steps per layer."), positive("max_steps")
    ] = 600,
    bank_size: Annotated[
        int, typer.Option(help="Keys in the neighbour memory bank."), positive("bank_size")
    ] = 8192,
    batch_size: Annotated[
        int, typer.Option(help="Queries per step."), positive("batch_size")
    ] = 128,
    refresh_interval: Annotated[
        int, typer.Option(help="Steps per bank refresh."), positive("refresh_interval")
    ] = 20,
    lr: Annotated[float, typer.Option(help="Adam learning rate.")] = 1e-3,
    merge_start: Annotated[int, typer.Option(help="First merge step.")] = 200,
    merge_interval: Annotated[int, typer.Option(help="Steps between merge rounds.")] = 200,
    merge_threshold: Annotated[float, typer.Option(help="Normalised MI threshold.")] = 0.04,
    mi_samples: Annotated[int, typer.Option(help="Rows for the KSG estimate.")] = 2048,
    restarts: Annotated[
        int, typer.Option(help="Training runs per layer; the best kept."), positive("restarts")
    ] = 1,
    activations: Activations = Path("results/ndm/activations"),
    checkpoints: Annotated[
        Path | None,
        typer.Option(
            help="Checkpoint root (default: OUT/checkpoints); a finished checkpoint is reused, "
            "so layers can be trained by parallel runs and collected by a final one."
        ),
    ] = None,
) -> None:
    """Capture residual activations and train NDM at each layer."""
    from structlens.ndm import NDMResult
    from structlens.ndm.experiment import NDMExperimentConfig, run
    from structlens.report.ndm import plot_merge_history

    cfg = NDMExperimentConfig(
        layers=parse_ints(layers, "--layers", allow_empty=True),
        capture_layers=parse_ints(capture_layers, "--capture-layers", allow_empty=True),
        corpus_prompts=corpus_prompts, task_prompts=task_prompts, unit_size=unit_size,
        steps=steps, bank_size=bank_size, batch_size=batch_size,
        refresh_interval=refresh_interval, lr=lr, merge_start=merge_start,
        merge_interval=merge_interval, merge_threshold=merge_threshold, mi_samples=mi_samples,
        restarts=restarts, seed=common.seed, device=common.device,
    )  # fmt: skip
    model = common.load_model(model_name)
    report = run(
        cfg, model, out=common.out, activations=activations, checkpoints=checkpoints,
        progress=not common.quiet, log=common.say,
    )  # fmt: skip
    history = {f"L{k}": NDMResult.load(common.out / f"ndm-L{k}") for k in report.results}
    plot_merge_history(history, common.out / "merge_history.png")
    common.say(f"wrote {common.write('ndm_train', report.payload(), command='ndm train')}")


@app.command()
@common_options(out=OUT, executor=True, flags=FLAGS)
def evaluate(
    common: Common,
    model_name: ModelArg = "smollm2-135m",
    train: TrainDir = Path("results/ndm"),
    n: Annotated[
        int,
        typer.Option("-n", help="Prompts per test."),
        at_least(2, "n must be at least 2 (bootstrap over prompts), got {value}"),
    ] = 24,
    tests: Annotated[str, typer.Option(help="Comma-separated test names, or 'all'.")] = "all",
    min_share: Annotated[
        float,
        typer.Option(help="Screen: least whole-space effect / clean metric for a Gini."),
        between(0.0, 1.0, "min_share must be in [0, 1], got {value}"),
    ] = 0.3,
    methods: Annotated[
        str, typer.Option(help="Comma-separated: ndm,identity,random,pca,sae.")
    ] = "ndm,identity,random,pca,sae",
    batch_size: Annotated[int, typer.Option(help="Prompts per forward pass.")] = 12,
    n_boot: Annotated[int, typer.Option(help="Bootstrap resamples over prompts.")] = 1000,
    sae_width: Annotated[int, typer.Option(help="SAE width for the SAE baseline.")] = 2048,
    sae_k: Annotated[int, typer.Option(help="SAE TopK k.")] = 32,
    sae_epochs: Annotated[int, typer.Option(help="Most SAE epochs (stops at FVU plateau).")] = 50,
    sae_tol: Annotated[float, typer.Option(help="SAE plateau: relative FVU gain/epoch.")] = 0.01,
    conflict: Annotated[bool, typer.Option(help="Knowledge-conflict routing.")] = True,
    conflict_n: Annotated[int, typer.Option(help="Knowledge-conflict prompts.")] = 24,
    conflict_layer: Annotated[
        int | None, typer.Option(help="Layer for knowledge conflict (default: first trained).")
    ] = None,
    toy: Annotated[bool, typer.Option(help="Run the toy recovery experiment.")] = True,
    toy_steps: Annotated[int, typer.Option(help="NDM steps on the toy.")] = 3000,
    toy_ae_steps: Annotated[int, typer.Option(help="Toy autoencoder training steps.")] = 10000,
    allow_foreign: AllowForeign = False,
) -> None:
    """Subspace patching Gini table (NDM vs baselines), knowledge conflict, toy recovery.

    With --executor ray the baseline rotations (SAE training among them) run as Ray tasks.
    """
    from structlens.ndm.collect import load_train_meta
    from structlens.ndm.experiment import Method, NDMEvaluationConfig
    from structlens.ndm.experiment import evaluate as run_evaluation

    load_train_meta(train)
    cfg = NDMEvaluationConfig(
        n=n, tests=() if tests == "all" else parse_names(tests), min_share=min_share,
        # cast: NDMEvaluationConfig checks the method names itself
        methods=cast("tuple[Method, ...]", parse_names(methods)), batch_size=batch_size,
        n_boot=n_boot, sae_width=sae_width,
        sae_k=sae_k, sae_epochs=sae_epochs, sae_tol=sae_tol, conflict=conflict,
        conflict_n=conflict_n, conflict_layer=conflict_layer, toy=toy, toy_steps=toy_steps,
        toy_ae_steps=toy_ae_steps, seed=common.seed,
    )  # fmt: skip
    runner = common.runner()
    model = common.load_model(model_name)
    with common.foreign_uses() as foreign:
        report = run_evaluation(
            cfg, model, train, out=common.out, executor=runner, log=common.say,
            allow_foreign=allow_foreign,
        )  # fmt: skip
    from structlens.report.ndm import plot_evaluation

    plot_evaluation(report.meta, common.out)
    payload = report.payload() | {"foreign": foreign}
    path = common.write("ndm_evaluate", payload, command="ndm evaluate")
    for row in report.meta["screen"]:
        flag = "" if row["screened"] else "  no signal"
        common.say(f"  {row['test']:24s} whole-space share {row['whole_space_share']:+.3f}{flag}")
    gm = report.meta["gini_mean"]
    common.say("mean Gini of screened tests (dimension-normalised) [95% CI]:" if gm != "no signal"
               else "no test passes the screen: no Gini")  # fmt: skip
    for m, v in (gm if isinstance(gm, dict) else {}).items():
        g = v["dimension"]
        common.say(f"  {m:9s} {g['value']:.3f} [{g['ci'][0]:.3f}, {g['ci'][1]:.3f}]")
    if (toy_out := report.meta["toy"]) is not None:
        common.say(f"toy: partition {toy_out['partition']}, overlap {toy_out['overlap']:.3f}")
    common.say(f"wrote {path}")


app.command()(browse)

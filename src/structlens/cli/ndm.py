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
from typing import Annotated, Any

import typer

from structlens.cli.common import Common, common_options, shared_settings
from structlens.cli.ndm_browse import browse
from structlens.cli.ndm_options import FLAGS, OUT, Activations, TrainDir
from structlens.cli.options import AllowForeign, ModelArg, parse_ints, parse_names
from structlens.cli.protocol_options import protocol_from, protocol_options
from structlens.ndm.protocol import PROFILES, NDMProtocol

#: The protocol fields each command sets from options (the others only by --protocol).
#: The fields that choose the patching tests' layers: ``train`` trains there by default.
LAYER_FIELDS = ("layer_rule", "sweep_window", "sweep_prompts")
TRAIN_FIELDS = (
    "corpus_prompts", "corpus_tokens", "task_prompts", "unit_size", "steps", "bank_size",
    "batch_size", "refresh_interval", "lr", "merge_start", "merge_interval", "merge_threshold",
    "mi_samples", "restarts", *LAYER_FIELDS,
)  # fmt: skip
EVALUATE_FIELDS = (
    "patch_prompts", "min_share", *LAYER_FIELDS, "baselines", "gini_bootstrap", "sae_width",
    "sae_k", "sae_epochs", "sae_tol", "conflict_prompts", "toy_steps", "toy_ae_steps",
)  # fmt: skip

# protocol fields as the options that set them, in the protocol's messages
OPTION_FLAGS = FLAGS | {f: "--" + f.replace("_", "-") for f in (*TRAIN_FIELDS, *EVALUATE_FIELDS)}

app = typer.Typer(help="NDM subspace decomposition: train, evaluate, browse.", no_args_is_help=True)


def _protocol(common: Common, settings: dict[str, Any]) -> NDMProtocol:
    return protocol_from(settings, NDMProtocol, PROFILES, what="NDM", seed=common.seed)


@app.command()
@common_options(out=OUT, flags=OPTION_FLAGS)
@shared_settings(protocol_options(NDMProtocol, TRAIN_FIELDS, PROFILES, what="NDM"))
def train(
    common: Common,
    model_name: ModelArg = "smollm2-135m",
    layers: Annotated[
        str,
        typer.Option(
            help="Comma-separated layers (resid_post). Default: the layers the protocol's "
            "layer rule chooses for the patching tests (recorded for `ndm evaluate`); with "
            "--layer-rule depth, the paper's GPT-2 layers 4,6,8,9 at the same relative depth."
        ),
    ] = "",
    capture_layers: Annotated[
        str,
        typer.Option(
            help="Layers to capture (a superset of --layers; default: the same). Parallel runs "
            "that name the same set share one cached store."
        ),
    ] = "",
    activations: Activations = Path("results/ndm/activations"),
    checkpoints: Annotated[
        Path | None,
        typer.Option(
            help="Checkpoint root (default: OUT/checkpoints); a finished checkpoint is reused, "
            "so layers can be trained by parallel runs and collected by a final one."
        ),
    ] = None,
    **settings: Any,
) -> None:
    """Capture residual activations and train NDM at each layer under the NDM protocol."""
    protocol = _protocol(common, settings)  # a bad value fails here, before torch is imported
    from structlens.ndm import NDMResult
    from structlens.ndm.experiment import run
    from structlens.report.ndm import plot_merge_history

    chosen = parse_ints(layers, "--layers", allow_empty=True)
    capture = parse_ints(capture_layers, "--capture-layers", allow_empty=True)
    model = common.load_model(model_name)
    report = run(
        protocol, model, layers=chosen, capture_layers=capture, out=common.out,
        activations=activations, checkpoints=checkpoints, device=common.device,
        progress=not common.quiet, log=common.say,
    )  # fmt: skip
    history = {f"L{k}": NDMResult.load(common.out / f"ndm-L{k}") for k in report.results}
    plot_merge_history(history, common.out / "merge_history.png")
    common.say(f"wrote {common.write('ndm_train', report.payload(), command='ndm train')}")


@app.command()
@common_options(out=OUT, executor=True, flags=OPTION_FLAGS)
@shared_settings(
    protocol_options(
        NDMProtocol, EVALUATE_FIELDS, PROFILES, what="NDM", default="train",
        default_help=" Default 'train': the training run's own protocol.",
    )
)  # fmt: skip
def evaluate(
    common: Common,
    model_name: ModelArg = "smollm2-135m",
    train: TrainDir = Path("results/ndm"),
    tests: Annotated[str, typer.Option(help="Comma-separated test names, or 'all'.")] = "all",
    batch_size: Annotated[int, typer.Option(help="Prompts per forward pass.")] = 16,
    conflict: Annotated[bool, typer.Option(help="Knowledge-conflict routing.")] = True,
    conflict_layer: Annotated[
        int | None, typer.Option(help="Layer for knowledge conflict (default: first trained).")
    ] = None,
    toy: Annotated[bool, typer.Option(help="Run the toy recovery experiment.")] = True,
    allow_foreign: AllowForeign = False,
    **settings: Any,
) -> None:
    """Subspace patching Gini table (NDM vs baselines), knowledge conflict, toy recovery.

    No evaluation prompt may be a training prompt of the run; --protocol defaults to the
    run's own ('train'). With --executor ray the baseline rotations (SAE training among them) run as
    Ray tasks.
    """
    from structlens.ndm.collect import load_train_meta, train_protocol

    meta = load_train_meta(train)
    if settings["protocol"] == "train":
        # the run's own protocol: its evaluation prompts are held out of its training data
        settings["protocol"] = "run"
        protocol = protocol_from(
            settings, NDMProtocol, {"run": train_protocol(meta)}, what="NDM", seed=common.seed
        )
    else:
        protocol = _protocol(common, settings)
    runner = common.runner()
    model = common.load_model(model_name)
    from structlens.ndm.experiment import evaluate as run_evaluation

    with common.foreign_uses() as foreign:
        report = run_evaluation(
            protocol, model, train, out=common.out, tests=() if tests == "all" else
            parse_names(tests), conflict=conflict, conflict_layer=conflict_layer, toy=toy,
            batch_size=batch_size, executor=runner, log=common.say, allow_foreign=allow_foreign,
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

"""``structlens koopman``: EDMDc over depth on a real model (fit, convergence, modes,
invariance, reduce); the experiments are :mod:`structlens.koopman.experiment`.

Every command writes ``<command>.json`` (``results[<layers>][<dictionary>]``) and figures to
``--out``; the activation store is cached under ``--out/activations``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from structlens.cli.checks import Holds, Parsed, at_least
from structlens.cli.common import Common, common_options, shared_settings
from structlens.cli.koopman_options import (
    DATA,
    FLAGS,
    OUT,
    REDUCE,
    ModelOpt,
    protocol_help,
    protocol_of,
    streams,
)
from structlens.cli.options import parse_ints, parse_names

if TYPE_CHECKING:
    from structlens.koopman.experiment import Analysis

# the words of KoopmanProtocol and KoopmanExperimentConfig
BLOCKS = "split_half_blocks must be an integer >= 4; got {value}."
REPEATS = "split_half_repeats must be an integer >= 2; got {value}."
MODES_K = "k must be in [1, size={size}]; got {value}."

app = typer.Typer(help="Koopman spectral analysis of depth dynamics (EDMDc over layers).")


def _run(common: Common, model: str, analysis: Analysis, **settings: Any) -> Any:
    """Build the protocol and the config from the options and run the experiment; return the
    report."""
    from structlens.koopman.experiment import KoopmanExperimentConfig, run

    settings["layers"] = parse_ints(settings["layers"], "--layers")
    if "dictionary" in settings:
        settings["dictionaries"] = parse_names(settings.pop("dictionary"))
    protocol = protocol_of(settings, analysis, common.seed)
    cfg = KoopmanExperimentConfig(analysis=analysis, protocol=protocol, **settings)
    m = common.load_model(model)
    root = common.out / "activations"
    with common.foreign_uses():  # printed here, recorded by run() in the report
        return run(cfg, m, root=root, executor=common.runner(), progress=not common.quiet)


def _write(common: Common, report: Any) -> None:
    """Draw the analysis' figure (if any), write ``<analysis>.json`` and say where."""
    from structlens.report.koopman import plot_report

    payload = report.payload()
    if (figure := plot_report(report, common.out)) is not None:
        payload["figures"] = [figure.name]
    path = common.write(report.analysis, payload, command=f"koopman {report.analysis}")
    common.say(f"wrote {path}")


@app.command("fit")
@common_options(out=OUT, executor=True, flags=FLAGS)
@shared_settings(streams("identity,pca", 64))
def fit_cmd(
    common: Common,
    model: ModelOpt = "smollm2-135m",
    mom_blocks: Annotated[
        int | None,
        typer.Option("--mom-blocks", help=protocol_help("mom_blocks")),
        at_least(0, "mom_blocks must be an integer >= 0; got {value}."),
    ] = None,
    **settings: Any,
) -> None:
    """Fit EDMDc per layer (or pooled): spectrum, non-normality, dissociation, tails.

    The EDMDc statistics are accumulated per store shard and merged; with --executor ray the
    capture and the shard statistics run on Ray (the store must be on shared storage).
    """
    report = _run(common, model, "fit", mom_blocks=mom_blocks, **settings)
    for label, per in report.results.items():
        for name, e in per.items():
            floor = e["henrici_noise_floor_relative"]
            noise = "no noise floor" if floor is None else f"noise floor {floor:.3f}"
            common.say(
                f"layer {label} {name}: ρ(A) = {e['spectral_radius']:.3f}, "
                f"Henrici rel = {e['henrici_relative']:.3f} ({noise}), κ(V) = {e['kappa_V']:.3g}"
            )
    _write(common, report)


@app.command("convergence")
@common_options(out=OUT, executor=True, flags=FLAGS)
@shared_settings(streams("pca", 32))
def convergence_cmd(
    common: Common,
    model: ModelOpt = "smollm2-135m",
    n_blocks: Annotated[
        int | None,
        typer.Option("--n-blocks", help=protocol_help("split_half_blocks")),
        at_least(4, BLOCKS),
    ] = None,
    n_repeats: Annotated[
        int | None,
        typer.Option("--n-repeats", help=protocol_help("split_half_repeats")),
        at_least(2, REPEATS),
    ] = None,
    **settings: Any,
) -> None:
    """Split-half W∞ distance against M and its log-log slope (claim: −1/2).

    With --executor ray the capture and every (layer, dictionary) point run on Ray.
    """
    report = _run(common, model, "convergence", n_blocks=n_blocks, n_repeats=n_repeats, **settings)
    for label, per in report.results.items():
        for name, s in per.items():
            common.say(
                f"layer {label} {name}: slope {s['slope']:.3f} "
                f"[{s['slope_ci'][0]:.3f}, {s['slope_ci'][1]:.3f}], "
                f"max κ(λ) {s['eig_condition_max']:.3g}"
            )
    _write(common, report)


@app.command("invariance")
@common_options(out=OUT, flags=FLAGS)
@shared_settings(streams("spectral,rff,relu", 64))
def invariance_cmd(common: Common, model: ModelOpt = "smollm2-135m", **settings: Any) -> None:
    """Held-out one-step invariance residual (1 − R², by prompt split) per dictionary."""
    report = _run(common, model, "invariance", **settings)
    for label, per in report.results.items():
        for name, e in per.items():
            common.say(f"layer {label} {name}: pooled 1−R² = {e['pooled']:.4f}")
    _write(common, report)


@app.command("modes")
@common_options(out=OUT, flags=FLAGS)
@shared_settings(DATA)
def modes_cmd(
    common: Common,
    model: ModelOpt = "smollm2-135m",
    k: Annotated[
        int,
        typer.Option("--k", help="Real dimension ablated."),
        Holds(lambda k, size: 1 <= k <= size, MODES_K, uses=("size",)),
    ] = 4,
    size: Annotated[int, typer.Option("--size", help="PCA dictionary size k_pca.")] = 32,
    positions: Annotated[
        str, typer.Option("--positions", help="'all' or an IOI position, e.g. END.")
    ] = "all",
    n_ioi: Annotated[int, typer.Option("--n-ioi", help="IOI prompts scored.")] = 50,
    n_random: Annotated[int, typer.Option("--n-random", help="Random bases averaged.")] = 5,
    **settings: Any,
) -> None:
    """IOI: ablate k Koopman modes vs k PCA vs k random directions at resid_pre(l)."""
    report = _run(
        common, model, "modes", k=k, size=size, positions=positions, n_ioi=n_ioi,
        n_random=n_random, **settings,
    )  # fmt: skip
    for label, r in report.results.items():
        effects = ", ".join(f"{m} {v:+.3f}" for m, v in zip(r["methods"], r["mean"], strict=True))
        common.say(f"layer {label} (dim {r['dimension']}): {effects}")
    _write(common, report)


@app.command("reduce")
@common_options(out=OUT, flags=FLAGS)
@shared_settings(REDUCE)
def reduce_cmd(
    common: Common,
    model: ModelOpt = "smollm2-135m",
    order: Annotated[
        str,
        typer.Option("--order", help="Comma list of reduced orders."),
        Parsed(
            lambda spec: parse_ints(spec, "--order"),
            lambda orders: min(orders) >= 1,
            "orders must be integers >= 1; got {parsed}.",
        ),
    ] = "4,8,16",
    **settings: Any,
) -> None:
    """Balanced truncation of the pooled depth operator over --layers (horizon = #layers):
    actual error vs Enns–Glover vs the instance bound (attention-write covariance)."""
    report = _run(common, model, "reduce", orders=parse_ints(order, "--order"), **settings)
    for r, e in report.results.items():
        common.say(
            f"order {r}: error {e['error']:.3g} ≤ Enns–Glover {e['enns_glover']:.3g}; "
            f"instance error {e['instance_error']:.3g} ≤ bound {e['instance_bound']:.3g}"
        )
    _write(common, report)

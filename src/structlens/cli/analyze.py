"""``structlens analyze MODEL``: every method on one model, one browsable HTML report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from structlens.cli.checks import PROFILE_NAMES, checked, one_of
from structlens.cli.loading import load_model_or_fail
from structlens.cli.options import Device, ExecutorName, ModelArg, Out, Quiet, Seed
from structlens.cli.output import console, fail_user_error


@checked
def analyze(
    model: ModelArg,
    profile: Annotated[
        str,
        typer.Option(
            help="Sizes: 'smoke' (a tiny model in < 3 min), 'cpu' (SmolLM2-135M on a laptop), "
            "'full' (replication settings, for a GPU or a Ray cluster)."
        ),
        one_of(
            PROFILE_NAMES, f"--profile must be one of {', '.join(PROFILE_NAMES)}; got {{value!r}}."
        ),
    ] = "cpu",
    sites: Annotated[
        str | None,
        typer.Option(
            "--sites",
            help="Analysis layers for Koopman and κ: '3,5', 'blocks.3.hook_resid_pre,...' or "
            "'all' (default: evenly spaced layers, as many as the profile says).",
        ),
    ] = None,
    compare: Annotated[
        str | None, typer.Option("--compare", help="A second model for the equivalence section.")
    ] = None,
    out: Out = Path("results/analysis"),
    executor: Annotated[
        ExecutorName,
        one_of(("local", "ray"), "--executor must be 'local' or 'ray'; got {value!r}."),
    ] = "local",
    device: Device = "cpu",
    seed: Seed = 0,
    quiet: Quiet = False,
) -> None:
    """Run circuit tasks, Koopman, NDM, causal dimensionality and equivalence on MODEL and
    write OUT/analysis.json and OUT/report.html.  Every stage is cached under OUT/cache;
    a second run with the same settings loads it instead of recomputing."""
    from rich.markup import escape

    from structlens.analyze import AnalyzeConfig, parse_layers, run_analysis
    from structlens.report.html import write_report

    m = load_model_or_fail(model, device, "float32", seed)
    try:
        layers = parse_layers(sites, m.n_layers)
    except ValueError as err:
        fail_user_error(err)
    cfg = AnalyzeConfig(
        profile=profile,
        layers=layers,
        out=out,
        executor=executor,
        compare=compare,
        seed=seed,
        device=device,
        progress=not quiet,
    )
    report = run_analysis(cfg, m)
    path = write_report(out)
    if quiet:
        return
    for method, section in report.sections.items():
        for h in section.get("headline", {}).values():
            value, ci = h["value"], h["ci"]
            value = f"{value:.4g}" if isinstance(value, (int, float)) else "—"
            ci_text = "" if ci is None else f" [{ci[0]:.4g}, {ci[1]:.4g}]"
            console.print(f"{method:12s} {escape(h['label'])}: {value}{ci_text} {h['unit']}")
    caveats = report.caveats()
    if caveats:
        console.print(f"[bold yellow]{len(caveats)} caveats[/]")
        for method, c in caveats:
            console.print(f"  [yellow]{c['kind']}[/] {method}: {escape(c['message'])}")
    console.print(f"report: {path}")


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)

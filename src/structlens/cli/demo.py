"""``structlens demo``: the main job on the embedded default model and corpus."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from structlens.cli.checks import at_least, checked
from structlens.cli.options import Device, Out, Quiet, Seed
from structlens.cli.output import console
from structlens.cli.tasks import N_PROMPTS
from structlens.results import write_results
from structlens.sites import site_name


@checked
def demo(
    model: Annotated[str, typer.Option(help="Model to run on.")] = "smollm2-135m",
    n: Annotated[int, typer.Option("-n", help="Prompts per task."), at_least(1, N_PROMPTS)] = 100,
    corpus_prompts: Annotated[
        int,
        typer.Option(help="Corpus prompts to capture."),
        at_least(1, "max_prompts must be a positive integer or None, got {value}."),
    ] = 64,
    out: Out = Path("results/demo"),
    quiet: Quiet = False,
    device: Device = "cpu",
    seed: Seed = 0,
) -> None:
    """Load the model, evaluate the circuit tasks, capture activations over the bundled
    corpus, and write a summary to OUT/demo.json."""
    from structlens.capture import capture
    from structlens.capture.inputs import load_prompts
    from structlens.cli.tasks import evaluate  # its progress bar: rich, not torch
    from structlens.data.tasks import available_tasks
    from structlens.models import load_model

    say = (lambda *a: None) if quiet else console.print
    say(f"[bold]1/3[/] loading {model}")
    m = load_model(model, device=device)
    say(f"    {m!r}")
    say("[bold]2/3[/] circuit tasks")
    tasks = {}
    for name in available_tasks():
        r = evaluate(m, name, n=n, seed=seed, batch_size=16, quiet=quiet)
        tasks[name] = {
            k: r[k]
            for k in (
                "n",
                "accuracy",
                "accuracy_ci",
                "metric_mean",
                "metric_ci",
                "metric_description",
            )
        }
        say(
            f"    {name:20s} accuracy {r['accuracy']:.3f} "
            f"[{r['accuracy_ci'][0]:.3f}, {r['accuracy_ci'][1]:.3f}]  metric "
            f"{r['metric_mean']:+.3f} [{r['metric_ci'][0]:+.3f}, {r['metric_ci'][1]:+.3f}]"
        )
    say("[bold]3/3[/] capture over the bundled corpus")
    mid = m.n_layers // 2
    sites = [
        site_name("resid_pre", mid),
        site_name("attn_out", mid),
        site_name("resid_pre", mid + 1),
    ]
    prompts, _, label = load_prompts(
        m, "corpus", max_prompts=corpus_prompts, prompt_tokens=128, seed=seed
    )
    store = capture(
        m, prompts, sites, root=Path(out) / "activations", data_name=label, progress=not quiet
    )
    say(f"    {len(sites)} sites x {store.n_tokens} tokens -> {store.path}")
    path = write_results(
        out,
        "demo",
        {
            "model": m.name,
            "tasks": tasks,
            "capture": {"store": str(store.path), "sites": sites, "n_tokens": store.n_tokens},
        },
        command="demo",
    )
    say(f"wrote {path}")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)

"""``structlens tasks list|show|eval``: the circuit tasks and a model's behaviour on them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from structlens.cli.common import (
    Device,
    Dtype,
    Out,
    Quiet,
    Seed,
    console,
    fail,
    load_model_or_fail,
    write_results,
)

app = typer.Typer(
    help="Circuit task datasets (IOI, Greater-than, knowledge conflict, ...).", no_args_is_help=True
)


@app.command("list")
def list_tasks() -> None:
    """Names of the available tasks."""
    from structlens.data.tasks import available_tasks

    for name in available_tasks():
        typer.echo(name)


def evaluate(
    model: Any,
    task_name: str,
    *,
    n: int | None,
    seed: int,
    batch_size: int,
    corruption: str | None = None,
) -> dict[str, Any]:
    """Build ``task_name`` for ``model`` and evaluate it (see ``evaluate_task``)."""
    from structlens.data.tasks import evaluate_task, make_task

    try:
        task = make_task(task_name, model.tokenizer, n=n, seed=seed)
    except ValueError as err:
        # A task with a finite prompt pool (factual_recall: one prompt per usable fact) may
        # have fewer than n prompts; "n prompts per task" then means all it has.
        try:
            task = make_task(task_name, model.tokenizer, seed=seed)
        except ValueError:
            fail(str(err))
        if n is None or len(task) >= n:
            fail(str(err))
    if corruption is not None and corruption not in task.corrupted:
        fail(
            f"task {task_name!r} has no corruption {corruption!r}; it has {sorted(task.corrupted)}"
        )
    result = evaluate_task(
        task,
        lambda ids, mask: model.forward(ids.to(model.device), mask.to(model.device)),
        batch_size=batch_size,
        corruption=corruption,
        pad_id=int(model.tokenizer.pad_token_id),
    )
    result["examples"] = task.texts[:3]
    return result


@app.command("eval")
def eval_cmd(
    model: Annotated[
        str, typer.Option("--model", help="Alias, hub name, directory or .gguf.")
    ] = "smollm2-135m",
    task: Annotated[
        str, typer.Option("--task", help="Task name (structlens tasks list) or 'all'.")
    ] = "ioi",
    n: Annotated[
        int | None, typer.Option("-n", help="Prompts per task (all a task has, if fewer).")
    ] = None,
    corruptions: Annotated[
        bool,
        typer.Option(
            "--corruptions", help="Also evaluate every corrupted variant (scored on clean answers)."
        ),
    ] = False,
    batch_size: Annotated[int, typer.Option(help="Prompts per forward pass.")] = 16,
    out: Out = Path("results"),
    quiet: Quiet = False,
    device: Device = "cpu",
    dtype: Dtype = "float32",
    seed: Seed = 0,
) -> None:
    """Accuracy and mean task metric (with 95% CIs) of MODEL on TASK."""
    from structlens.data.tasks import available_tasks

    m = load_model_or_fail(model, device, dtype, seed)
    if not m.causal:
        fail(f"{model} is an encoder; the circuit tasks need a causal LM")
    names = available_tasks() if task == "all" else [task]
    table = Table("task", "variant", "n", "accuracy (95% CI)", "metric mean (95% CI)")
    for name in names:
        results = [evaluate(m, name, n=n, seed=seed, batch_size=batch_size)]
        if corruptions:
            from structlens.data.tasks import make_task

            variants = sorted(make_task(name, m.tokenizer, n=1, seed=seed).corrupted)
            results += [
                evaluate(m, name, n=n, seed=seed, batch_size=batch_size, corruption=c)
                for c in variants
            ]
        path = write_results(
            out,
            f"tasks-{name}",
            {"model": m.name, "seed": seed, "clean": results[0], "corrupted": results[1:]},
            command="tasks eval",
        )
        for r in results:
            lo, hi = r["accuracy_ci"]
            mlo, mhi = r["metric_ci"]
            table.add_row(
                name,
                r["corruption"] or "clean",
                str(r["n"]),
                f"{r['accuracy']:.3f} ({lo:.3f}-{hi:.3f})",
                f"{r['metric_mean']:+.3f} ({mlo:+.3f} to {mhi:+.3f})",
            )
        if not quiet:
            console.print(f"{name}: {results[0]['metric_description']} -> {path}")
    if not quiet:
        console.print(table)

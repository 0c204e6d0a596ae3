"""``structlens tasks list|show|eval``: the circuit tasks and a model's behaviour on them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import Progress
from rich.table import Table

from structlens.cli.checks import MAX_TASK_PROMPTS, Calls, at_least, check_task
from structlens.cli.common import Common, common_options
from structlens.cli.output import console, fail, fail_user_error

#: the words of :func:`structlens.data.tasks.make_task` for a bad number of prompts
N_PROMPTS = f"n must be a number of prompts in [1, {MAX_TASK_PROMPTS}] or None, got {{value!r}}."

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
    quiet: bool = False,
) -> dict[str, Any]:
    """Build ``task_name`` for ``model`` and evaluate it (see ``evaluate_task``), with a
    progress bar unless ``quiet``.

    ``n`` above what the task can generate (its finite pool of usable facts, or
    :data:`~structlens.data.tasks.MAX_PROMPTS`) is capped there, and the cap is said and
    recorded (``requested_n``)."""
    from structlens.data.tasks import evaluate_task, make_task_up_to

    requested = n
    try:
        task = make_task_up_to(task_name, model.tokenizer, n=n, seed=seed)
    except ValueError as err:
        fail_user_error(err)
    if requested is not None and len(task) < requested:
        console.print(
            f"note: {task_name}: -n {requested} is more than the task's pool; "
            f"evaluating its {len(task)} prompts",
            markup=False,
            soft_wrap=True,
        )
    if corruption is not None and corruption not in task.corrupted:
        fail(
            f"task {task_name!r} has no corruption {corruption!r}; it has {sorted(task.corrupted)}"
        )
    label = f"{task_name} ({corruption or 'clean'})"
    with Progress(*Progress.get_default_columns(), console=console, disable=quiet) as bar:
        job = bar.add_task(label, total=len(task))
        result = evaluate_task(
            task,
            lambda ids, mask: model.forward(ids.to(model.device), mask.to(model.device)),
            batch_size=batch_size,
            corruption=corruption,
            pad_id=int(model.tokenizer.pad_token_id),
            progress=lambda k: bar.advance(job, k),
        )
    result["requested_n"] = requested
    result["examples"] = task.texts[:3]
    return result


@app.command("eval")
@common_options(out=Path("results"))
def eval_cmd(
    common: Common,
    model: Annotated[
        str, typer.Option("--model", help="Alias, hub name, directory or .gguf.")
    ] = "smollm2-135m",
    task: Annotated[
        str,
        typer.Option("--task", help="Task name (structlens tasks list) or 'all'."),
        Calls(lambda t: check_task(t, also=("all",))),
    ] = "ioi",
    n: Annotated[
        int | None,
        typer.Option(
            "-n", help="Prompts per task (all a task has if fewer; at most 10000, the cap)."
        ),
        at_least(1, N_PROMPTS),  # more than the cap is capped, not an error
    ] = None,
    corruptions: Annotated[
        bool,
        typer.Option(
            "--corruptions", help="Also evaluate every corrupted variant (scored on clean answers)."
        ),
    ] = False,
    batch_size: Annotated[int, typer.Option(help="Prompts per forward pass.")] = 16,
) -> None:
    """Accuracy and mean task metric (with 95% CIs) of MODEL on TASK."""
    from structlens.data.tasks import available_tasks

    seed, quiet = common.seed, common.quiet
    m = common.load_model(model)
    if not m.causal:
        fail(f"{model} is an encoder; the circuit tasks need a causal LM")
    names = available_tasks() if task == "all" else [task]
    table = Table("task", "variant", "n", "accuracy (95% CI)", "metric mean (95% CI)")
    for name in names:
        results = [evaluate(m, name, n=n, seed=seed, batch_size=batch_size, quiet=quiet)]
        if corruptions:
            from structlens.data.tasks import make_task

            variants = sorted(make_task(name, m.tokenizer, n=1, seed=seed).corrupted)
            results += [
                evaluate(m, name, n=n, seed=seed, batch_size=batch_size, corruption=c, quiet=quiet)
                for c in variants
            ]
        record = {"model": m.name, "seed": seed, "clean": results[0], "corrupted": results[1:]}
        path = common.write(f"tasks-{name}", record, command="tasks eval")
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

"""Task sanity: whether a model performs each circuit task, the precondition of every circuit
analysis run on it.

:func:`task_sanity` evaluates every task the tokenizer supports (accuracy with a Wilson
interval, mean metric with a Student-t interval); :func:`section` turns the result into the
``tasks`` section of ``analysis.json``, with a ``null_effect`` caveat for every task whose mean
metric is not clearly positive.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from structlens.results import Result
from structlens.verdicts import Caveat, Number, Section


@dataclasses.dataclass(frozen=True)
class TaskScore:
    """One task's behaviour: ``n`` prompts, accuracy and mean metric with 95% intervals."""

    task: str
    n: int
    accuracy: float
    accuracy_ci: tuple[float, float]
    metric_mean: float
    metric_ci: tuple[float, float]
    metric: str  # what the metric measures (the task's own description)


@dataclasses.dataclass(frozen=True)
class TaskSanity(Result):
    """Every task tried (``tasks``, in order), the :class:`TaskScore` of those this tokenizer
    can build and, for the others, why not (``unavailable``: ``(task, reason)``)."""

    tasks: tuple[str, ...]
    scores: tuple[TaskScore, ...]
    unavailable: tuple[tuple[str, str], ...] = ()


def task_sanity(
    model: Any,
    n_prompts: int,
    *,
    seed: int,
    batch_size: int = 16,
    step: Callable[[str], None] | None = None,
) -> TaskSanity:
    """Evaluate ``model`` (a :class:`~structlens.models.LoadedModel`) on ``n_prompts`` prompts
    of every registered task; ``step(name)`` is called before each task."""
    from structlens.data.tasks.evaluate import evaluate_task
    from structlens.data.tasks.registry import available_tasks, make_task

    names = tuple(available_tasks())
    scores, unavailable = [], []
    for name in names:
        if step is not None:
            step(name)
        try:
            task = make_task(name, model.tokenizer, n=n_prompts, seed=seed)
        except ValueError as err:
            unavailable.append((name, str(err)))
            continue
        r = evaluate_task(
            task,
            lambda ids, mask: model.forward(ids.to(model.device), mask.to(model.device)),
            batch_size=batch_size,
            pad_id=model.tokenizer.pad_token_id or 0,
        )
        scores.append(
            TaskScore(
                task=name,
                n=int(r["n"]),
                accuracy=float(r["accuracy"]),
                accuracy_ci=(float(r["accuracy_ci"][0]), float(r["accuracy_ci"][1])),
                metric_mean=float(r["metric_mean"]),
                metric_ci=(float(r["metric_ci"][0]), float(r["metric_ci"][1])),
                metric=str(r["metric_description"]),
            )
        )
    return TaskSanity(names, tuple(scores), tuple(unavailable))


def caveats(result: TaskSanity) -> tuple[Caveat, ...]:
    """In task order: ``not_run`` for every task the tokenizer cannot build, ``null_effect`` for
    every task whose mean metric's interval reaches 0; ``not_run`` when no task can be built."""
    why = dict(result.unavailable)
    score = {s.task: s for s in result.scores}
    out = []
    for name in result.tasks:
        if name in why:
            out.append(Caveat("not_run", f"{name}: not available for this tokenizer ({why[name]})"))
            continue
        s = score[name]
        if s.metric_ci[0] <= 0:
            out.append(
                Caveat(
                    "null_effect",
                    f"{s.task}: the mean metric's CI reaches 0 or below "
                    f"([{s.metric_ci[0]:+.3f}, {s.metric_ci[1]:+.3f}]); the model does not "
                    "reliably perform the task, so circuit analyses of it are not meaningful.",
                )
            )
    if not result.scores:
        out.append(Caveat("not_run", "no circuit task is available for this tokenizer."))
    return tuple(out)


def section(result: TaskSanity) -> Section:
    """The ``tasks`` section of ``analysis.json``."""
    headline: dict[str, Number] = {}
    for s in result.scores:
        headline[f"{s.task}_accuracy"] = Number.of(
            s.accuracy, s.accuracy_ci, "", f"{s.task} accuracy"
        )
        headline[f"{s.task}_metric"] = Number.of(s.metric_mean, s.metric_ci, "", f"{s.task} metric")
    rows = [
        {
            "task": s.task,
            "n": s.n,
            "accuracy": s.accuracy,
            "accuracy_ci": list(s.accuracy_ci),
            "metric_mean": s.metric_mean,
            "metric_ci": list(s.metric_ci),
            "metric": s.metric,
        }
        for s in result.scores
    ]
    return Section(headline, caveats(result), {"rows": rows})

"""Stage 1: circuit-task sanity (accuracy with a Wilson CI, mean metric with a t CI)."""

from __future__ import annotations

from typing import Any

from structlens.analyze.common import caveat, logits_fn, number
from structlens.analyze.config import AnalyzeConfig
from structlens.analyze.runtime import StageProgress


def run(model: Any, cfg: AnalyzeConfig, step: StageProgress) -> dict[str, Any]:
    """Accuracy (Wilson CI) and mean metric (t CI) on every task the tokenizer supports."""
    from structlens.data.tasks import available_tasks, evaluate_task, make_task

    p = cfg.settings
    rows, caveats = [], []
    headline: dict[str, Any] = {}
    for name in available_tasks():
        step(name)
        try:
            task = make_task(name, model.tokenizer, n=p.task_prompts, seed=cfg.seed)
        except ValueError as err:
            caveats.append(caveat("not_run", f"{name}: not available for this tokenizer ({err})"))
            continue
        r = evaluate_task(
            task, logits_fn(model), batch_size=16, pad_id=model.tokenizer.pad_token_id or 0
        )
        rows.append(
            {
                "task": name,
                "n": r["n"],
                "accuracy": r["accuracy"],
                "accuracy_ci": list(r["accuracy_ci"]),
                "metric_mean": r["metric_mean"],
                "metric_ci": list(r["metric_ci"]),
                "metric": r["metric_description"],
            }
        )
        headline[f"{name}_accuracy"] = number(
            r["accuracy"], r["accuracy_ci"], "", f"{name} accuracy"
        )
        headline[f"{name}_metric"] = number(r["metric_mean"], r["metric_ci"], "", f"{name} metric")
        if r["metric_ci"][0] <= 0:
            caveats.append(
                caveat(
                    "null_effect",
                    f"{name}: the mean metric's CI reaches 0 or below "
                    f"([{r['metric_ci'][0]:+.3f}, {r['metric_ci'][1]:+.3f}]); the model does not "
                    "reliably perform the task, so circuit analyses of it are not meaningful.",
                )
            )
    if not rows:
        caveats.append(caveat("not_run", "no circuit task is available for this tokenizer."))
    return {"headline": headline, "caveats": caveats, "details": {"rows": rows}}

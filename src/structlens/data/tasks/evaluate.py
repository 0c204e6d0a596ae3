"""Evaluate a model on a task dataset through a plain ``logits_fn`` callable."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from structlens.data.tasks.base import TaskDataset, pad_batch, padded_positions
from structlens.stats.intervals import t_interval, wilson_interval

LogitsFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def evaluate_task(
    task: TaskDataset,
    logits_fn: LogitsFn,
    batch_size: int = 32,
    *,
    corruption: str | None = None,
    confidence: float = 0.95,
    pad_id: int = 0,
    padding_side: str = "right",
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run every prompt of ``task`` through ``logits_fn`` and summarise the task metric.

    Parameters
    ----------
    task : TaskDataset
    logits_fn : callable
        ``logits_fn(input_ids, attention_mask) -> logits`` with ``input_ids`` and
        ``attention_mask`` of shape ``[b, seq]`` (padded on ``padding_side``, mask 1 on real
        tokens) and logits ``[b, seq, vocab]``.  Called under ``torch.no_grad()``.
    batch_size : int
        Prompts per call.
    corruption : str or None
        Evaluate the named corrupted prompts instead of the clean ones (the metric still
        refers to the clean answers).
    confidence : float
        Level of the confidence intervals, in (0, 1).
    pad_id : int
        Token id used for padding (masked out, so any valid id works).
    padding_side : {"right", "left"}
        Where the padding goes (see :func:`~structlens.data.tasks.base.pad_batch`); the
        metric positions are read past each row's leading padding either way.  Left padding
        shifts absolute positions: a ``logits_fn`` for a model with learned position
        embeddings must then derive position ids from the mask.
    progress : callable or None
        Called with the number of prompts finished after each batch (e.g. to advance a
        progress bar).

    Returns
    -------
    dict
        ``n``; ``accuracy`` (fraction with ``task.correct``) and ``accuracy_ci`` (Wilson score
        interval); ``metric_mean``, ``metric_std`` (sample standard deviation, ddof=1) and
        ``metric_ci`` (Student-t interval for the mean); ``top1``: for each answer name, the
        fraction of prompts whose top-1 token at END is that answer; ``outcomes`` for tasks
        with an ``outcome`` method; per-prompt ``prompt_ids``, ``metric`` and ``correct``;
        and ``task``, ``corruption``, ``metric_description``, ``confidence``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}.")
    seqs = task.tokens(corruption)
    metrics: list[torch.Tensor] = []
    correct: list[torch.Tensor] = []
    top1: dict[str, list[torch.Tensor]] = {k: [] for k in task.answers}
    outcomes: list[str] = []
    end_col = task.metric_positions.index("END") if "END" in task.metric_positions else None
    with torch.no_grad():
        for start in range(0, len(task), batch_size):
            index = list(range(start, min(start + batch_size, len(task))))
            ids, mask = pad_batch([seqs[i] for i in index], pad_id, padding_side)
            logits = logits_fn(ids, mask)
            if logits.ndim != 3 or logits.shape[:2] != ids.shape:
                raise ValueError(
                    f"logits_fn returned shape {tuple(logits.shape)} for input {tuple(ids.shape)};"
                    " expected [batch, seq, vocab]."
                )
            sel = task.gather_logits(logits, index, attention_mask=mask).float()
            metrics.append(task.metric(sel, index).cpu())
            correct.append(task.correct(sel, index).cpu())
            end = _end_logits(task, logits, index, end_col, mask)
            top = end.argmax(-1).cpu()
            for key in top1:
                top1[key].append(top == torch.tensor([task.answers[key][i] for i in index]))
            if hasattr(task, "outcome"):
                outcomes += task.outcome(sel, index)
            if progress is not None:
                progress(len(index))
    m = torch.cat(metrics).double()
    c = torch.cat(correct)
    n = len(task)
    mean = float(m.mean())
    std = float(m.std()) if n > 1 else float("nan")
    k = int(c.sum())
    result: dict[str, Any] = {
        "task": task.name,
        "corruption": corruption,
        "metric_description": task.metric_description,
        "n": n,
        "confidence": confidence,
        "accuracy": k / n,
        "accuracy_ci": wilson_interval(k, n, confidence),
        "metric_mean": mean,
        "metric_std": std,
        "metric_ci": t_interval(m.numpy(), confidence) if n > 1 else (math.nan, math.nan),
        "top1": {key: float(torch.cat(v).double().mean()) for key, v in top1.items()},
        "prompt_ids": list(task.prompt_ids),
        "metric": m.tolist(),
        "correct": c.tolist(),
    }
    if outcomes:
        result["outcomes"] = {o: outcomes.count(o) / n for o in sorted(set(outcomes))}
    return result


def _end_logits(
    task: TaskDataset,
    logits: torch.Tensor,
    index: list[int],
    end_col: int | None,
    mask: torch.Tensor,
) -> torch.Tensor:
    """Logits at each prompt's END token (the column past its leading padding)."""
    if end_col is not None:
        sel = task.gather_logits(logits, index, attention_mask=mask)
        return sel if sel.ndim == 2 else sel[:, end_col]
    end = torch.tensor([[task.positions["END"][i]] for i in index], device=logits.device)
    end = padded_positions(end, mask.to(logits.device))[:, 0]
    return logits[torch.arange(len(index), device=logits.device), end]

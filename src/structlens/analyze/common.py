"""Helpers shared by the stages: headline numbers, caveats, intervals, task access."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


def number(value: Any, ci: Sequence[float] | None = None, unit: str = "", label: str = "") -> dict:
    """A headline number: value, 95% CI (or None), unit and a human label."""
    finite = value is not None and math.isfinite(float(value))
    ci_ok = ci is not None and all(math.isfinite(float(c)) for c in ci)
    return {
        "value": (value if isinstance(value, int) else float(value)) if finite else None,
        "ci": [float(ci[0]), float(ci[1])] if ci is not None and ci_ok else None,
        "unit": unit,
        "label": label,
    }


def caveat(kind: str, message: str) -> dict[str, str]:
    return {"kind": kind, "message": message}


def t_interval(x: Sequence[float] | np.ndarray, confidence: float = 0.95) -> list[float]:
    """:func:`structlens.stats.intervals.t_interval`, NaN with fewer than two values (a
    section with one prompt has no interval, which the report shows as such)."""
    from structlens.stats.intervals import t_interval as interval

    if np.asarray(x).size < 2:
        return [float("nan"), float("nan")]
    return list(interval(x, confidence))


def contains(ci: Sequence[float] | None, value: float) -> bool:
    return ci is not None and all(map(math.isfinite, ci)) and ci[0] <= value <= ci[1]


def logits_fn(model: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def fn(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = model.forward(ids.to(model.device), mask.to(model.device))
        return getattr(out, "logits", out)

    return fn


def usable_tasks(model: Any, names: Sequence[str], seed: int) -> list[str]:
    from structlens.data.tasks import make_task

    ok = []
    for name in names:
        try:
            make_task(name, model.tokenizer, n=2, seed=seed)
        except ValueError:
            continue
        ok.append(name)
    return ok

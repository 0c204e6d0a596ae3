"""Interpretive-equivalence experiment on two models: build the probe set, then
:func:`~structlens.equivalence.compare.compare` (matching, patching validation, CONGRUITY).

Example
-------
>>> from structlens.equivalence.experiment import EquivalenceExperimentConfig
>>> EquivalenceExperimentConfig(task="ioi", n=24).task
'ioi'
>>> EquivalenceExperimentConfig(task="nope")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: unknown probe task 'nope'; use 'corpus' or one of ...
"""

from __future__ import annotations

import dataclasses
from typing import Any

from structlens.equivalence.compare import CompareConfig, ComparisonResult, compare
from structlens.equivalence.probes import MIN_PROMPTS, corpus_probe, task_probe

__all__ = ["EquivalenceExperimentConfig", "run"]


@dataclasses.dataclass(frozen=True)
class EquivalenceExperimentConfig:
    """``n`` probe prompts (half fit, half held out) from ``task``: ``"corpus"`` (bundled
    sentences, any two tokenizers) or a circuit task of :mod:`structlens.data.tasks`
    (same prompts in both tokenizers, with corrupted prompts and a task metric);
    ``compare`` holds the comparison settings."""

    task: str = "corpus"
    n: int = 64
    compare: CompareConfig = dataclasses.field(default_factory=CompareConfig)

    def __post_init__(self) -> None:
        from structlens.data.tasks.registry import TASKS

        if self.task != "corpus" and self.task not in TASKS:
            raise ValueError(
                f"unknown probe task {self.task!r}; use 'corpus' or one of {', '.join(TASKS)}."
            )
        if self.n < MIN_PROMPTS:
            raise ValueError(
                f"too few probe prompts (-n {self.n}); compare needs at least {MIN_PROMPTS} (half "
                "fit the similarities and maps, half validate)."
            )


def run(cfg: EquivalenceExperimentConfig, model_a: Any, model_b: Any) -> ComparisonResult:
    """Compare ``model_a`` and ``model_b`` (whose components get replaced) on the probe set."""
    if cfg.task == "corpus":
        probe = corpus_probe(model_a, model_b, n=cfg.n)
    else:
        probe = task_probe(model_a, model_b, cfg.task, n=cfg.n, seed=cfg.compare.seed)
    return compare(model_a, model_b, probe, cfg.compare)

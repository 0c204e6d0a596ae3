"""Circuit task datasets: IOI, greater-than, factual recall and knowledge conflict.

Every task is a :class:`TaskDataset` with clean prompts, same-length corruptions, named
token positions and a differentiable per-prompt metric; build one with
``make_task(name, tokenizer, n=..., seed=...)`` and evaluate a model with
:func:`evaluate_task`.  See docs/tasks.md.
"""

from structlens.data.tasks.base import TaskDataset, pad_batch
from structlens.data.tasks.evaluate import evaluate_task, wilson_interval
from structlens.data.tasks.facts import (
    FactualRecallTask,
    KnowledgeConflictTask,
    make_factual_recall,
    make_knowledge_conflict,
)
from structlens.data.tasks.greater_than import GreaterThanTask, make_greater_than
from structlens.data.tasks.ioi import IOITask, make_ioi
from structlens.data.tasks.registry import (
    MAX_PROMPTS,
    available_tasks,
    make_shared_task,
    make_task,
    make_task_up_to,
)

__all__ = [
    "MAX_PROMPTS",
    "FactualRecallTask",
    "GreaterThanTask",
    "IOITask",
    "KnowledgeConflictTask",
    "TaskDataset",
    "available_tasks",
    "evaluate_task",
    "make_factual_recall",
    "make_greater_than",
    "make_ioi",
    "make_knowledge_conflict",
    "make_shared_task",
    "make_task",
    "make_task_up_to",
    "pad_batch",
    "wilson_interval",
]

"""Task registry: build a task dataset by name for a given tokenizer."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from structlens.data.tasks.base import Encoder, TaskDataset
from structlens.data.tasks.facts import make_factual_recall, make_knowledge_conflict
from structlens.data.tasks.greater_than import make_greater_than
from structlens.data.tasks.ioi import make_ioi
from structlens.errors import InputError

#: Most prompts one task generates: beyond it the generators mostly repeat combinations of
#: their word lists, and a 95% CI on accuracy is already narrower than ±0.01.
MAX_PROMPTS = 10_000

TASKS: dict[str, Callable[..., TaskDataset]] = {
    "ioi": make_ioi,
    "greater_than": make_greater_than,
    "knowledge_conflict": make_knowledge_conflict,
    "factual_recall": make_factual_recall,
}


#: The options of each task that list the words its prompts draw from.  A word is usable only
#: where it is one token after a space, so the usable words depend on the tokenizer.
WORD_LISTS: dict[str, tuple[str, ...]] = {
    "ioi": ("names", "places", "objects"),
    "greater_than": ("nouns",),
}


def available_tasks() -> list[str]:
    """Names accepted by :func:`make_task`."""
    return list(TASKS)


def make_task(
    name: str,
    tokenizer: Any,
    *,
    n: int | None = None,
    seed: int = 0,
    prepend_bos: bool | None = None,
    **kwargs: Any,
) -> TaskDataset:
    """Build the task ``name`` for ``tokenizer``.

    Parameters
    ----------
    name : str
        One of :func:`available_tasks` (``ioi``, ``greater_than``, ``knowledge_conflict``,
        ``factual_recall``).
    tokenizer : fast Hugging Face tokenizer
        The model's tokenizer: names, years and answers are chosen to be single tokens in it.
    n : int or None
        Number of prompts, at most :data:`MAX_PROMPTS`; None uses the task's default (100, or
        every usable fact for ``factual_recall``).
    seed : int
        Seed of all random choices; the same seed and tokenizer give the same dataset.
    prepend_bos : bool or None
        Special tokens before every prompt: None (default) those the tokenizer adds itself
        (Gemma's ``<bos>``, nothing for SmolLM2), True ``bos_token_id``, False none; all
        positions shift by their count (see :class:`~structlens.data.tasks.base.Encoder`).
    **kwargs
        Task-specific options (e.g. ``names=`` for IOI, ``mode=`` for greater-than).

    Raises
    ------
    ValueError
        For an unknown task name (with close matches) or invalid task options.
    """
    if name not in TASKS:
        close = difflib.get_close_matches(name, TASKS, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"Unknown task {name!r}; available: {', '.join(TASKS)}.{hint}")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PROMPTS:
            raise InputError(
                f"n must be a number of prompts in [1, {MAX_PROMPTS}] or None, got {n!r}."
            )
        kwargs["n"] = n
    try:
        return TASKS[name](tokenizer, seed=seed, prepend_bos=prepend_bos, **kwargs)
    except TypeError as e:
        raise ValueError(f"Invalid options for task {name!r}: {e}") from e


def make_task_up_to(name: str, tokenizer: Any, *, n: int | None, seed: int = 0) -> TaskDataset:
    """:func:`make_task` with at most ``n`` prompts: ``n`` above :data:`MAX_PROMPTS` is capped
    there, and a task with a finite prompt pool (``factual_recall``: one prompt per usable
    fact) smaller than ``n`` gives all it has, so "n prompts per task" never fails on a
    small pool.  Compare ``len(task)`` with ``n`` to tell the caller about a cap.

    Raises
    ------
    ValueError
        The task cannot be built for this tokenizer at all (the error of :func:`make_task`).
    """
    capped = n if n is None or n <= MAX_PROMPTS else MAX_PROMPTS
    try:
        return make_task(name, tokenizer, n=capped, seed=seed)
    except ValueError as err:
        try:
            task = make_task(name, tokenizer, seed=seed)
        except ValueError:
            raise err from None
        if capped is None or len(task) >= capped:
            raise
        return task


def make_shared_task(
    name: str, tokenizers: Sequence[Any], *, n: int | None = None, seed: int = 0
) -> list[TaskDataset]:
    """The task ``name`` built for each of ``tokenizers`` on the same prompt texts.

    Each tokenizer alone would keep the words that are single tokens in it (IOI's names,
    places and objects; greater-than's nouns; :data:`WORD_LISTS`), and two tokenizers keep
    different words, so the same seed gives different prompts.  Here every word list is cut
    to the words that are single tokens in all ``tokenizers`` before the prompts are drawn.
    For one tokenizer (or several that agree on every word) the cut removes nothing and the
    datasets are :func:`make_task`'s.  Each dataset keeps its own tokenizer's special tokens
    (Gemma's ``<bos>``; none for SmolLM2), so token positions differ while texts agree.

    Raises
    ------
    ValueError
        When the texts still differ (a task whose prompts depend on the tokenizer beyond its
        word lists, e.g. greater-than's two-digit years), naming the first difference.
    """
    if not tokenizers:
        raise ValueError("make_shared_task needs at least one tokenizer.")
    options = inspect.signature(TASKS[name]).parameters if name in TASKS else {}
    kwargs: dict[str, Any] = {}
    encoders = [Encoder(t) for t in tokenizers]
    for option in WORD_LISTS.get(name, ()):
        words = options[option].default
        kwargs[option] = [
            w for w in words if all(e.single_token(" " + w) is not None for e in encoders)
        ]
    tasks = [make_task(name, t, n=n, seed=seed, **kwargs) for t in tokenizers]
    for i, task in enumerate(tasks[1:], 1):
        if list(task.texts) != list(tasks[0].texts):
            first = next(j for j, (a, b) in enumerate(zip(tasks[0].texts, task.texts)) if a != b)
            raise ValueError(
                f"task {name!r} gives different prompts for tokenizers 0 and {i} even on "
                f"shared words (prompt {first}: {tasks[0].texts[first]!r} vs "
                f"{task.texts[first]!r}); compare these models on a corpus probe."
            )
    return tasks

"""Probe sets for comparing two models: the same inputs, tokenized by each model.

A probe is a circuit task (:func:`task_probe`, with corrupted prompts and a task metric) or
bundled corpus sentences (:func:`corpus_probe`, for models with different tokenizers).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

__all__ = ["MIN_PROMPTS", "Probe", "task_probe", "corpus_sentences", "corpus_probe"]

MIN_PROMPTS = 12


@dataclasses.dataclass
class Probe:
    """The same probe inputs, tokenized for each model.

    ``tokens_a[i]`` and ``tokens_b[i]`` encode ``texts[i]``; ``corrupted_*`` (task probes) are
    same-length corrupted prompts; ``task_*`` the task datasets (metric positions and metric).
    """

    name: str
    texts: list[str]
    tokens_a: list[list[int]]
    tokens_b: list[list[int]]
    corrupted_a: list[list[int]] | None = None
    corrupted_b: list[list[int]] | None = None
    task_a: Any = None
    task_b: Any = None

    def __post_init__(self) -> None:
        n = len(self.texts)
        for name in ("tokens_a", "tokens_b", "corrupted_a", "corrupted_b"):
            v = getattr(self, name)
            if v is not None and len(v) != n:
                raise ValueError(
                    f"mismatched probe sets: {name} has {len(v)} prompts, texts has {n}; both "
                    "models must see the same probe inputs."
                )
        if n < MIN_PROMPTS:
            raise ValueError(
                f"too few probe prompts ({n}); compare needs at least {MIN_PROMPTS} (half fit "
                "the similarities and maps, half validate)."
            )

    @property
    def shared_tokens(self) -> bool:
        """Whether both models see identical token sequences (token-level comparison)."""
        return self.tokens_a == self.tokens_b


def task_probe(model_a: Any, model_b: Any, task: str, n: int = 64, seed: int = 0) -> Probe:
    """A probe from a circuit task (``structlens.data.tasks``); both tokenizers must yield the
    same prompts. Corrupted prompts are the task's first corruption (IOI: ``abc``)."""
    from structlens.data.tasks import make_task

    ta = make_task(task, model_a.tokenizer, n=n, seed=seed)
    tb = make_task(task, model_b.tokenizer, n=n, seed=seed)
    if ta.texts != tb.texts:
        raise ValueError(
            f"the two tokenizers yield different {task!r} prompts (token filters differ); use a "
            "corpus probe for models with different tokenizers."
        )
    corruption = next(iter(ta.corrupted))
    return Probe(
        name=task,
        texts=list(ta.texts),
        tokens_a=[list(t) for t in ta.clean],
        tokens_b=[list(t) for t in tb.clean],
        corrupted_a=[list(t) for t in ta.corrupted[corruption]],
        corrupted_b=[list(t) for t in tb.corrupted[corruption]],
        task_a=ta,
        task_b=tb,
    )


def corpus_sentences(
    n: int, min_chars: int = 40, max_chars: int = 160, source: str | None = None
) -> list[str]:
    """``n`` sentences of the bundled corpus (or ``source``), evenly spaced through it."""
    from structlens.data.corpus import load_texts

    if n < 2:
        raise ValueError(f"a probe needs at least 2 sentences (-n), got {n}.")
    sentences = []
    for doc in load_texts(source):
        for s in re.split(r"(?<=[.!?])\s+", " ".join(doc.text.split())):
            if min_chars <= len(s) <= max_chars:
                sentences.append(s)
    if len(sentences) < n:
        raise ValueError(f"the corpus has {len(sentences)} usable sentences, {n} requested.")
    step = len(sentences) / n
    return [sentences[int(i * step)] for i in range(n)]


def corpus_probe(
    model_a: Any, model_b: Any, n: int = 64, source: str | None = None, max_chars: int = 160
) -> Probe:
    """A probe of ``n`` corpus sentences, tokenized by each model's tokenizer (its default
    special tokens: BERT's ``[CLS]``/``[SEP]``, none for SmolLM2 or the byte tokenizer)."""
    texts = corpus_sentences(n, max_chars=max_chars, source=source)
    return Probe(
        name="corpus",
        texts=texts,
        tokens_a=[list(model_a.tokenizer(t)["input_ids"]) for t in texts],
        tokens_b=[list(model_b.tokenizer(t)["input_ids"]) for t in texts],
    )

"""Probe sets for comparing two models: the same inputs, tokenized by each model.

A probe is a circuit task (:func:`task_probe`, with corrupted prompts and a task metric) or
bundled corpus sentences (:func:`corpus_probe`, for models with different tokenizers).

An encoder–decoder language model (:attr:`~structlens.models.loading.Model.empty_source`:
trained to predict bytes with its decoder while its encoder reads the bytes before them) is
given a real source on a corpus probe: its encoder reads the text of the sentence's document
just before the sentence, its decoder the sentence, so its decoder sites have the sentence's
positions, as a decoder-only model's do, and nothing the decoder is asked to predict is in
its source.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

__all__ = [
    "MIN_PROMPTS",
    "Probe",
    "task_probe",
    "corpus_passages",
    "corpus_sentences",
    "corpus_probe",
]

MIN_PROMPTS = 12
#: Characters of text before a sentence tokenized per context token asked for: a byte-level
#: token spans at most one character and a BPE token rarely more than 16, so the window holds
#: the tokens asked for (where it does not, the context is shorter).
_CHARS_PER_TOKEN = 16


@dataclasses.dataclass
class Probe:
    """The same probe inputs, tokenized for each model.

    ``tokens_a[i]`` and ``tokens_b[i]`` encode ``texts[i]``; ``corrupted_*`` (task probes) are
    same-length corrupted prompts; ``task_*`` the task datasets (metric positions and metric);
    ``context_*`` the encoder's input per prompt for an encoder–decoder language model (the
    text before the sentence; ``None`` for other models, which read the prompt alone).
    """

    name: str
    texts: list[str]
    tokens_a: list[list[int]]
    tokens_b: list[list[int]]
    corrupted_a: list[list[int]] | None = None
    corrupted_b: list[list[int]] | None = None
    task_a: Any = None
    task_b: Any = None
    context_a: list[list[int]] | None = None
    context_b: list[list[int]] | None = None

    def __post_init__(self) -> None:
        n = len(self.texts)
        for name in (
            "tokens_a",
            "tokens_b",
            "corrupted_a",
            "corrupted_b",
            "context_a",
            "context_b",
        ):
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
    """A probe from a circuit task (``structlens.data.tasks``) on the same prompt texts for
    both models: where their tokenizers differ, the task's words are those that are single
    tokens in both (:func:`~structlens.data.tasks.make_shared_task`).  Corrupted prompts are
    the task's first corruption (IOI: ``abc``)."""
    from structlens.data.tasks import make_shared_task

    ta, tb = make_shared_task(task, [model_a.tokenizer, model_b.tokenizer], n=n, seed=seed)
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


def corpus_passages(
    n: int,
    min_chars: int = 40,
    max_chars: int = 160,
    source: str | None = None,
    before: int = 0,
) -> list[tuple[str, str]]:
    """``n`` sentences of the bundled corpus (or ``source``), evenly spaced through it, each
    after the (at most) ``before`` characters of its document that precede it (whitespace
    runs are one space, in both)."""
    from structlens.data.corpus import load_texts

    if n < 2:
        raise ValueError(f"a probe needs at least 2 sentences (-n), got {n}.")
    found: list[tuple[str, int, str]] = []  # (document text, sentence start, sentence)
    for doc in load_texts(source):
        text, pos = " ".join(doc.text.split()), 0
        for s in re.split(r"(?<=[.!?])\s+", text):
            pos = text.index(s, pos)
            if min_chars <= len(s) <= max_chars:
                found.append((text, pos, s))
            pos += len(s)
    if len(found) < n:
        raise ValueError(f"the corpus has {len(found)} usable sentences, {n} requested.")
    step = len(found) / n
    picked = [found[int(i * step)] for i in range(n)]
    return [(text[max(0, at - before) : at], s) for text, at, s in picked]


def corpus_sentences(
    n: int, min_chars: int = 40, max_chars: int = 160, source: str | None = None
) -> list[str]:
    """``n`` sentences of the bundled corpus (or ``source``), evenly spaced through it."""
    return [s for _, s in corpus_passages(n, min_chars, max_chars, source)]


def _encoder_context(model: Any, before: list[str], n_tokens: int) -> list[list[int]] | None:
    """The last ``n_tokens`` tokens of each text ``before`` a sentence, for a model whose
    encoder reads them (an encoder–decoder language model), else ``None``.  An empty text is
    the decoder start token, as in training with no context."""
    if not n_tokens or not getattr(model, "empty_source", False):
        return None
    start = [int(model.config.decoder_start_token_id)]
    out = []
    for text in before:
        ids = list(model.tokenizer(text, add_special_tokens=False)["input_ids"])[-n_tokens:]
        out.append(ids or start)
    return out


def corpus_probe(
    model_a: Any,
    model_b: Any,
    n: int = 64,
    source: str | None = None,
    max_chars: int = 160,
    encoder_context: int = 0,
) -> Probe:
    """A probe of ``n`` corpus sentences, tokenized by each model's tokenizer (its default
    special tokens: BERT's ``[CLS]``/``[SEP]``, none for SmolLM2 or the byte tokenizer).

    ``encoder_context``: tokens of the text before each sentence that an encoder–decoder
    language model's encoder reads (module docstring; 0: none, the encoder reads its start
    token only).
    """
    if encoder_context < 0:
        raise ValueError(f"encoder_context must be >= 0 tokens, got {encoder_context}.")
    passages = corpus_passages(
        n, max_chars=max_chars, source=source, before=_CHARS_PER_TOKEN * encoder_context
    )
    before, texts = [b for b, _ in passages], [t for _, t in passages]
    return Probe(
        name="corpus",
        texts=texts,
        tokens_a=[list(model_a.tokenizer(t)["input_ids"]) for t in texts],
        tokens_b=[list(model_b.tokenizer(t)["input_ids"]) for t in texts],
        context_a=_encoder_context(model_a, before, encoder_context),
        context_b=_encoder_context(model_b, before, encoder_context),
    )

"""Induction on a repeated random word sequence: tests that need no absolute position.

A prompt is a sequence of ``length`` random words followed by its first ``m`` words again,
``w_1 … w_L w_1 … w_m``; the continuation is ``w_{m+1}``, which only an induction mechanism
can predict (find the earlier ``w_m``, read the token after it, copy it).  Everything the
mechanism uses is relative (the previous token, the token after a match), so the tests built
on it transfer to models with rotary position embeddings, where the IOI position-swap tests
find no absolute-position subspace.

Positions: ``A`` (``w_m`` in the first copy), ``A+1`` (``w_{m+1}`` in the first copy, where a
previous-token head writes "the previous token was ``w_m``") and ``END`` (the repeated
``w_m``).  Corruptions keep the length:

- ``resample_first``: the first copy becomes fresh words ``v_1 … v_L`` (nothing to copy);
- ``prev_swap``: only ``w_m`` in the first copy becomes a fresh word, so the match that
  induction looks for is gone while ``w_{m+1}`` stays in place.

Metric: ``logit(w_{m+1}) − logit(v_{m+1})`` at END, the foil ``v_{m+1}`` being the word
``resample_first`` puts at ``A+1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from structlens.data.tasks.base import Encoder, TaskDataset, single_token_words
from structlens.data.tasks.ioi import NAMES, OBJECTS, PLACES

CORRUPTIONS: tuple[str, ...] = ("resample_first", "prev_swap")


@dataclass(frozen=True, kw_only=True)
class InductionTask(TaskDataset):
    """Repeated-sequence prompts; ``answers`` has ``"next"`` (``w_{m+1}``) and ``"foil"``."""

    metric_description: ClassVar[str] = "logit(next) - logit(foil) at END"

    def metric(self, end_logits: torch.Tensor, index: Sequence[int] | None = None) -> torch.Tensor:
        return self._logit_difference(end_logits, index, "next", "foil")


def make_induction(
    tokenizer: Any,
    *,
    n: int = 100,
    seed: int = 0,
    prepend_bos: bool | None = None,
    length: int = 8,
    words: Sequence[str] = (*NAMES, *PLACES, *OBJECTS),
) -> InductionTask:
    """Generate ``n`` repeated-sequence prompts of ``length`` distinct random words.

    Words are drawn from ``words`` restricted to single tokens (with a leading space); the
    repeat stops after ``m`` words, ``m`` uniform in ``[1, length - 1]``.  Token ids are built
    word by word, so every corruption keeps the length.

    Raises
    ------
    ValueError
        If ``n < 1``, ``length < 2`` or fewer than ``2 * length + 1`` words are single tokens.
    """
    if n < 1 or length < 2:
        raise ValueError(f"need n >= 1 and length >= 2, got n={n}, length={length}.")
    enc = Encoder(tokenizer, prepend_bos)
    pool = single_token_words(enc, words, what="words", minimum=2 * length + 1)
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {
        "texts": [],
        "clean": [],
        "corrupted": {c: [] for c in CORRUPTIONS},
        "corrupted_texts": {c: [] for c in CORRUPTIONS},
        "positions": {p: [] for p in ("A", "A+1", "END")},
        "answers": {"next": [], "foil": []},
    }
    offset = len(enc.prefix)
    for _ in range(n):
        picks = [pool[int(j)] for j in rng.choice(len(pool), size=2 * length + 1, replace=False)]
        seq, fresh, swap = picks[:length], picks[length : 2 * length], picks[2 * length]
        m = int(rng.integers(1, length))
        prompts = {
            "clean": seq + seq[:m],
            "resample_first": fresh + seq[:m],
            "prev_swap": seq[: m - 1] + [swap] + seq[m:] + seq[:m],
        }
        for cname, words_ in prompts.items():
            ids = enc.prefix + [tid for _, tid in words_]
            text = "".join(" " + w for w, _ in words_)
            if cname == "clean":
                out["clean"].append(ids)
                out["texts"].append(text)
            else:
                out["corrupted"][cname].append(ids)
                out["corrupted_texts"][cname].append(text)
        out["positions"]["A"].append(offset + m - 1)
        out["positions"]["A+1"].append(offset + m)
        out["positions"]["END"].append(offset + length + m - 1)
        out["answers"]["next"].append(seq[m][1])
        out["answers"]["foil"].append(fresh[m][1])
    return InductionTask(
        name="induction",
        prompt_ids=[f"induction-{i:04d}" for i in range(n)],
        texts=out["texts"],
        clean=out["clean"],
        corrupted=out["corrupted"],
        corrupted_texts=out["corrupted_texts"],
        positions=out["positions"],
        answers=out["answers"],
        metadata={
            "seed": seed,
            "n": n,
            **enc.metadata(),
            "length": length,
            "words": [w for w, _ in pool],
        },
    )

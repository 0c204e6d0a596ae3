"""Small word-level tokenizers built locally, so task logic is tested without a 20 s load.

``build_word_tokenizer(digits="split")`` splits numbers into single digits (like SmolLM2);
``digits="pairs"`` splits them into two-digit pieces (like GPT-2's years).  The vocabulary
holds every word the task generators use plus ``extra_words``; anything else maps to
``[UNK]``, which the task code treats as "not a single token".
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from structlens.data.tasks import facts, greater_than, ioi

SPECIALS = ("[UNK]", "[PAD]", "<s>")


def task_words() -> set[str]:
    texts = [
        *ioi.TEMPLATES,
        *ioi.NAMES,
        *ioi.PLACES,
        *ioi.OBJECTS,
        *greater_than.NOUNS,
        greater_than.TEMPLATE,
        facts.CONTEXT_PREFIX,
        *facts.RELATIONS.values(),
        *(f"{s} {a}" for _, s, a in facts.FACTS),
    ]
    words: set[str] = set()
    for t in texts:
        t = re.sub(r"\{[A-Za-z0-9]+\}", " ", t)
        words.update(re.findall(r"\w+|[^\w\s]+", t))
        words.update(w.capitalize() for w in re.findall(r"\w+", t))
    return words


def build_word_tokenizer(
    extra_words: Iterable[str] = (),
    *,
    drop_words: Iterable[str] = (),
    digits: str = "split",
    add_bos: bool = False,
    padding_side: str = "right",
) -> PreTrainedTokenizerFast:
    """A word-level fast tokenizer over the task vocabulary plus ``extra_words``.

    ``add_bos``: its post-processor puts ``<s>`` before every text (as Gemma's and Llama-2's
    tokenizers do with the default ``add_special_tokens=True``); ``padding_side`` is where
    ``tokenizer(texts, padding=True)`` pads; ``drop_words`` are left out of the vocabulary
    (they become ``[UNK]``, as a word split into pieces is not one token).
    """
    if digits == "split":
        numbers = [str(d) for d in range(10)]
        digit_split = pre_tokenizers.Digits(individual_digits=True)
    elif digits == "pairs":
        numbers = [f"{d:02d}" for d in range(100)] + [str(c) for c in range(10, 100)]
        digit_split = pre_tokenizers.Split(Regex(r"\d\d"), behavior="isolated")
    else:
        raise ValueError(f"digits must be 'split' or 'pairs', got {digits!r}")
    words = sorted(
        (task_words() | set(extra_words) | set(numbers)) - set(SPECIALS) - set(drop_words)
    )
    vocab = {w: i for i, w in enumerate([*SPECIALS, *words])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), digit_split])
    if add_bos:
        tk.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
        )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", bos_token="<s>"
    )
    tok.padding_side = padding_side
    return tok

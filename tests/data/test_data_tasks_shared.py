"""One task, several tokenizers: the same prompt texts, each tokenized by its own tokenizer.

Two models with different tokenizers can be compared on a task only where both see the same
texts.  Each tokenizer alone keeps the task words that are single tokens in it, so a
tokenizer that splits some names draws other prompts from the same seed;
:func:`make_shared_task` draws from the words every tokenizer keeps.
"""

import pytest
from tiny_tokenizers import build_word_tokenizer

from structlens.data.tasks import make_shared_task, make_task
from structlens.data.tasks.ioi import NAMES

SPLIT_NAMES = NAMES[:40]


@pytest.fixture(scope="module")
def lacking_tok():
    """A tokenizer that splits the first 40 names and adds ``<s>``, as Gemma's does."""
    return build_word_tokenizer(drop_words=SPLIT_NAMES, add_bos=True)


def test_alone_the_two_tokenizers_draw_different_prompts(word_tok, lacking_tok):
    a = make_task("ioi", word_tok, n=30, seed=4)
    b = make_task("ioi", lacking_tok, n=30, seed=4)
    assert a.texts != b.texts


def test_shared_task_has_one_text_per_prompt_tokenized_by_each(word_tok, lacking_tok):
    a, b = make_shared_task("ioi", [word_tok, lacking_tok], n=30, seed=4)
    assert a.texts == b.texts and len(a) == 30
    words = {w for t in a.texts for w in t.replace(",", " ").replace(".", " ").split()}
    assert not words & set(SPLIT_NAMES)
    for i, text in enumerate(a.texts):
        assert a.clean[i] == word_tok(text)["input_ids"]
        assert b.clean[i] == lacking_tok(text)["input_ids"]
        assert b.clean[i][0] == lacking_tok.bos_token_id
        # the same name tokens at the same named positions, one further after <s>
        assert b.positions["END"][i] == a.positions["END"][i] + 1
        assert lacking_tok.decode(b.answers["IO"][i]) == word_tok.decode(a.answers["IO"][i])


def test_one_tokenizer_gives_make_task(word_tok):
    (shared,) = make_shared_task("ioi", [word_tok], n=30, seed=4)
    alone = make_task("ioi", word_tok, n=30, seed=4)
    assert shared.texts == alone.texts and shared.clean == alone.clean
    assert shared.corrupted == alone.corrupted and shared.answers == alone.answers


def test_prompts_that_differ_beyond_word_lists_are_refused(word_tok, pair_tok):
    # greater-than's years are one token per digit pair in one tokenizer, per digit in the
    # other, so its prompts differ whatever nouns they share
    with pytest.raises(ValueError, match="different prompts .* corpus probe"):
        make_shared_task("greater_than", [word_tok, pair_tok], n=12, seed=0)

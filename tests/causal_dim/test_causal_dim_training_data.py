"""More SAE training tokens without touching evaluation: the extra corpus chunks and the
texts the model generates stay disjoint from the evaluation and CE prompts, generated texts
continue training text only and are determined by the seed, and the training rows
interleave the two."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from structlens.causal_dim.protocol import PROFILES
from structlens.causal_dim.stages import (
    GeneratedText,
    generated_text,
    prompt_sets,
    training_prompts,
)
from structlens.errors import InputError


@pytest.fixture(scope="module")
def model():
    from structlens.models import load_model

    return load_model("tiny-llama")


def test_every_extra_chunk_stays_out_of_evaluation(model):
    smoke = PROFILES["smoke"]
    rest = prompt_sets(smoke.replace(sae_train_extra=None), model.tokenizer)
    none = prompt_sets(smoke.replace(sae_train_extra=0), model.tokenizer)
    train, ev, ce = (set(map(tuple, x)) for x in (rest.sae_train, rest.sae_eval, rest.ce))
    assert not train & ev and not train & ce and not ev & ce
    # null takes every non-held-out chunk the evaluation leaves: the whole rest of the corpus
    n_other = rest.n_chunks - rest.n_heldout
    assert len(rest.sae_train) == n_other - smoke.sae_eval_extra
    assert rest.n_train_extra == n_other - smoke.sae_eval_extra - smoke.sae_train_prompts
    # the evaluation and CE prompts do not depend on how much the SAEs train on
    assert (rest.sae_eval, rest.ce) == (none.sae_eval, none.ce)
    assert rest.sae_train[: smoke.sae_train_prompts] == none.sae_train
    with pytest.raises(InputError, match="others"):
        prompt_sets(smoke.replace(sae_train_extra=rest.n_train_extra + 1), model.tokenizer)


def test_generated_texts_continue_training_text_and_follow_the_seed(model):
    p = PROFILES["smoke"].replace(sae_generated_prompts=5, sae_generated_prefix=6)
    sets = prompt_sets(p, model.tokenizer)
    gen = generated_text(p, model, sets)
    assert len(gen.texts) == 5 and all(len(t) == p.chunk_tokens for t in gen.texts)
    for text, i in zip(gen.texts, gen.sources, strict=True):
        assert text[:6] == sets.sae_train[i][:6]  # a training chunk's prefix
    evaluation = set(map(tuple, sets.sae_eval + sets.ce))
    assert not evaluation & set(map(tuple, gen.texts))
    special = set(model.tokenizer.all_special_ids)
    assert not special & {t for text in gen.texts for t in text[6:]}
    # determinism: the same seed gives the same texts, another seed others
    assert generated_text(p, model, sets) == gen
    other = generated_text(p.replace(seed=1), model, sets)
    assert [t[:6] for t in other.texts] == [t[:6] for t in gen.texts]
    assert other.texts != gen.texts
    assert generated_text(p.replace(sae_generated_prompts=0), model, sets).texts == []


def test_training_prompts_interleave_chunks_with_their_generated_texts():
    sets = SimpleNamespace(sae_train=[[1, 1], [2, 2], [3, 3]])
    gen = GeneratedText(texts=[[1, 7], [2, 8], [3, 9], [1, 6]], sources=[0, 1, 2, 0],
                        prefix=1, seed=0)  # fmt: skip
    got = training_prompts(sets, gen)
    assert got == [[1, 1], [1, 7], [1, 6], [2, 2], [2, 8], [3, 3], [3, 9]]
    assert training_prompts(sets) == sets.sae_train

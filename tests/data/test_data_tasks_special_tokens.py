"""Tasks follow the tokenizer's own special tokens (BOS) and read positions under either padding.

A tokenizer that puts ``<s>`` before every text (Gemma, Llama-2) must get ``<s>`` at position 0
of every clean and corrupted prompt, with every named position one further than for the same
tokenizer without it; one that adds nothing (SmolLM2, GPT-2) must get exactly what it got
before.  Batches padded on the left (Gemma's tokenizer default) or the right must read the
same tokens.
"""

import pytest
import torch
from tiny_tokenizers import build_word_tokenizer

from structlens.data.tasks import evaluate_task, make_task, pad_batch
from structlens.data.tasks.base import Encoder, padded_positions, special_prefix
from structlens.data.tasks.induction import make_induction

TASKS = ("ioi", "greater_than", "knowledge_conflict", "factual_recall")


def build(name, tok, **kw):
    if name == "induction":
        return make_induction(tok, n=9, seed=2, **kw)
    return make_task(name, tok, n=9, seed=2, **kw)


@pytest.fixture(scope="module", params=["right", "left"])
def bos_tok(request):
    return build_word_tokenizer(add_bos=True, padding_side=request.param)


def test_special_prefix_is_what_the_tokenizer_adds(word_tok, bos_tok):
    assert special_prefix(word_tok) == []
    assert special_prefix(bos_tok) == [bos_tok.bos_token_id]
    assert Encoder(bos_tok).prefix == [bos_tok.bos_token_id]
    assert Encoder(bos_tok, prepend_bos=False).prefix == []
    # word_tok has a bos_token but does not add it by itself: asking for it still works
    assert Encoder(word_tok, prepend_bos=True).prefix == [word_tok.bos_token_id]


@pytest.mark.parametrize("name", [*TASKS, "induction"])
def test_bos_at_position_zero_and_positions_shift_by_one(name, word_tok, bos_tok):
    plain = build(name, word_tok)
    task = build(name, bos_tok)
    bos = bos_tok.bos_token_id
    assert task.texts == plain.texts
    assert task.metadata["prepend_bos"] is True and task.metadata["prefix_ids"] == [bos]
    assert plain.metadata["prepend_bos"] is False and "prefix_ids" not in plain.metadata
    for i, ids in enumerate(task.clean):
        assert ids == [bos, *plain.clean[i]]
        # exactly what the tokenizer gives with its defaults
        assert ids == bos_tok(task.texts[i])["input_ids"]
        for cname, seqs in task.corrupted.items():
            assert seqs[i] == [bos, *plain.corrupted[cname][i]]
            assert seqs[i] == bos_tok(task.corrupted_texts[cname][i])["input_ids"]
    for pname, pos in plain.positions.items():
        assert task.positions[pname] == [p + 1 for p in pos], pname
    # answers are tokens of the continuation, never special tokens
    assert task.answers == plain.answers


@pytest.mark.parametrize("name", TASKS)
def test_a_tokenizer_without_bos_gets_what_it_got_before(name, word_tok, bos_tok):
    # the default follows the tokenizer, and word_tok adds nothing: identical to prepend_bos=False
    default = build(name, word_tok)
    explicit = build(name, word_tok, prepend_bos=False)
    assert default == explicit and default.fingerprint() == explicit.fingerprint()
    # and a BOS-adding tokenizer told not to add one gives the plain token ids
    assert build(name, bos_tok, prepend_bos=False).clean == default.clean


def echo(vocab):
    """A logits function whose logits at each position are the one-hot input token there."""

    def fn(ids, mask):
        return torch.nn.functional.one_hot(ids, vocab).float() * mask[..., None]

    return fn


@pytest.mark.parametrize("name", TASKS)
def test_positions_read_the_same_tokens_under_left_and_right_padding(name, bos_tok):
    task = build(name, bos_tok)
    fn = echo(len(bos_tok))
    index = [4, 0, 7, 2]
    for side in ("right", "left"):
        ids, mask = pad_batch([task.clean[i] for i in index], bos_tok.pad_token_id, side)
        got = task.gather_logits(fn(ids, mask), index, attention_mask=mask).argmax(-1)
        got = got[:, None] if got.ndim == 1 else got
        for col, pname in enumerate(task.metric_positions):
            want = [task.clean[i][task.positions[pname][i]] for i in index]
            assert got[:, col].tolist() == want, (side, pname)
    # a batch the tokenizer pads itself (on its own padding side) reads the same tokens
    enc = bos_tok([task.texts[i] for i in index], padding=True, return_tensors="pt")
    mask = enc["attention_mask"]
    got = task.gather_logits(fn(enc["input_ids"], mask), index, attention_mask=mask).argmax(-1)
    end = task.metric_positions.index("END")
    got_end = got if got.ndim == 1 else got[:, end]
    assert got_end.tolist() == [task.clean[i][-1] for i in index]


def position_free_model(vocab, dim=16):
    """Causal and position-free (a running mean of token embeddings), so left and right padding
    must give the same logits at every real token."""
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(vocab, dim, generator=g)
    out = torch.randn(dim, vocab, generator=g)

    def fn(ids, mask):
        x = emb[ids] * mask[..., None]
        count = mask.cumsum(dim=1).clamp(min=1)[..., None]
        return (x.cumsum(dim=1) / count) @ out

    return fn


@pytest.mark.parametrize("name", TASKS)
def test_evaluate_task_is_the_same_under_left_and_right_padding(name, bos_tok):
    task = build(name, bos_tok)
    fn = position_free_model(len(bos_tok))
    right = evaluate_task(task, fn, batch_size=4, pad_id=bos_tok.pad_token_id)
    left = evaluate_task(task, fn, batch_size=4, pad_id=bos_tok.pad_token_id, padding_side="left")
    assert left["metric"] == pytest.approx(right["metric"], abs=1e-5)
    assert left["correct"] == right["correct"] and left["top1"] == right["top1"]
    # one prompt alone, unpadded
    ids = torch.tensor([task.clean[3]])
    alone = task.metric(task.gather_logits(fn(ids, torch.ones_like(ids)), [3]), [3])
    assert left["metric"][3] == pytest.approx(alone.item(), abs=1e-5)


def test_padding_checks():
    with pytest.raises(ValueError, match="padding_side"):
        pad_batch([[1, 2]], padding_side="middle")
    ids, mask = pad_batch([[5, 6, 7], [8]], pad_id=0, padding_side="left")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert padded_positions(torch.tensor([[2], [0]]), mask).tolist() == [[2], [2]]
    with pytest.raises(ValueError, match="contiguous"):
        padded_positions(torch.tensor([[0], [0]]), torch.tensor([[1, 0, 1], [1, 1, 1]]))
    with pytest.raises(ValueError, match="outside"):
        padded_positions(torch.tensor([[0], [1]]), mask)

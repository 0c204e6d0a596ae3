"""Tasks and corpus chunking with the real SmolLM2-135M-Instruct tokenizer (and model)."""

import pytest
import torch

from structlens.data.corpus import chunk_documents, load_texts
from structlens.data.tasks import evaluate_task, make_task

pytestmark = pytest.mark.slow


def test_ioi_on_smollm2_tokenizer(smol_tok):
    task = make_task("ioi", smol_tok, n=40, seed=0)
    assert len(task.metadata["names"]) >= 50
    assert task.texts[0].endswith(" to")
    for i, ids in enumerate(task.clean):
        assert smol_tok.decode([ids[task.positions["IO"][i]]]) == smol_tok.decode(
            [task.answers["IO"][i]]
        )
        assert smol_tok.decode([ids[task.positions["S2"][i]]]).startswith(" ")
        for cname, seqs in task.corrupted.items():
            assert len(seqs[i]) == len(ids)
            assert seqs[i] == smol_tok(task.corrupted_texts[cname][i])["input_ids"]


def test_greater_than_on_smollm2_tokenizer(smol_tok):
    task = make_task("greater_than", smol_tok, n=40, seed=0)
    assert task.mode == "digits"  # SmolLM2 splits numbers into single digits
    for i, ids in enumerate(task.clean):
        yy = task.start_year[i] % 100
        assert smol_tok.decode([ids[task.positions["START_UNITS"][i]]]) == str(yy % 10)
        assert smol_tok.decode([ids[-1]]) == str(yy // 10)
        assert smol_tok.decode(ids) == task.texts[i]
        assert len(task.corrupted["01"][i]) == len(ids)


def test_facts_on_smollm2_tokenizer(smol_tok):
    kc = make_task("knowledge_conflict", smol_tok, n=100, seed=0)
    assert kc.metadata["n_facts"] >= 60
    fr = make_task("factual_recall", smol_tok)
    assert len(fr) >= 60
    i = 0
    ca = kc.positions["CONTEXT_ANSWER"][i]
    assert smol_tok.decode([kc.clean[i][ca]]) == smol_tok.decode([kc.answers["context"][i]])


def test_corpus_chunks_decode_back_to_the_text(smol_tok):
    docs = load_texts(limit=3)
    prompts = chunk_documents(docs, smol_tok, max_tokens=64, min_tokens=1)
    for d in docs:
        mine = [p for p in prompts if p.id.startswith(d.id + "#")]
        assert smol_tok.decode([t for p in mine for t in p.token_ids]) == d.text


def test_smollm2_solves_ioi(smol_tok, smol_model):
    task = make_task("ioi", smol_tok, n=20, seed=0)

    def logits_fn(ids, mask):
        return smol_model(input_ids=ids, attention_mask=mask).logits

    clean = evaluate_task(task, logits_fn, batch_size=10)
    assert clean["accuracy"] > 0.8
    # Removing the repeated name (ABC) takes away the model's reason to prefer IO over S.
    abc = evaluate_task(task, logits_fn, batch_size=10, corruption="abc")
    assert abc["metric_mean"] < clean["metric_mean"] - 1.0
    # Padding does not change the answer: one prompt alone gives the same metric.
    ids = torch.tensor([task.clean[0]])
    alone = task.metric(task.gather_logits(logits_fn(ids, torch.ones_like(ids)), [0]), [0])
    assert clean["metric"][0] == pytest.approx(alone.item(), abs=1e-3)

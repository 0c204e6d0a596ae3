"""The circuit tasks on two real families, checked against plain transformers.

For Gemma 3 270M (whose tokenizer adds ``<bos>`` and pads on the left) and SmolLM2-135M (no
BOS, right padding), the IOI logit difference structlens computes must equal one computed
here without structlens: the prompt texts tokenized with the tokenizer's defaults, padded as
the tokenizer pads, forwarded through the Hugging Face model loaded from the same checkpoint
directory, logits read at the last real token.  Without its BOS, Gemma gets IOI wrong nearly
every time (accuracy 0.06 on 32 prompts); with it, right nearly every time.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from structlens.data.tasks import evaluate_task, make_task
from structlens.models import load_model

pytestmark = pytest.mark.slow

N_REFERENCE = 6  # prompts compared against plain transformers
N_ACCURACY = 32  # prompts for the accuracy check


@pytest.fixture(scope="session")
def gemma3():
    return load_model("gemma3-270m")


@pytest.fixture(scope="session", params=["gemma3", "smollm2"])
def real(request):
    return request.getfixturevalue(request.param)


def reference_logit_diffs(directory, texts, good, bad):
    """``logit(good) − logit(bad)`` after each text, by plain transformers from ``directory``:
    the tokenizer's own special tokens and padding side, the last real token's logits."""
    tok = AutoTokenizer.from_pretrained(directory)
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    enc = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = hf(**enc, use_cache=False).logits
    mask = enc["attention_mask"]
    # the last real token: the last column under left padding, the last one of the mask else
    last = mask.shape[1] - 1 - mask.flip(1).argmax(1)
    end = logits[torch.arange(len(texts)), last]
    ids = [
        [tok(" " + w, add_special_tokens=False)["input_ids"] for w in pair]
        for pair in zip(good, bad, strict=True)
    ]
    assert all(len(a) == 1 and len(b) == 1 for a, b in ids), "names must be single tokens"
    return [float(end[i, a[0]] - end[i, b[0]]) for i, (a, b) in enumerate(ids)], tok


def logits_fn(model):
    return lambda ids, mask: model.forward(ids.to(model.device), mask.to(model.device))


def test_ioi_metric_matches_plain_transformers(real):
    task = make_task("ioi", real.tokenizer, n=N_REFERENCE, seed=0)
    ours = evaluate_task(task, logits_fn(real), batch_size=N_REFERENCE)["metric"]
    tok = real.tokenizer
    io = [tok.decode([t]).strip() for t in task.answers["IO"]]
    s = [tok.decode([t]).strip() for t in task.answers["S"]]
    want, ref_tok = reference_logit_diffs(real.source, task.texts, io, s)
    assert ours == pytest.approx(want, abs=2e-3)
    # the prompts structlens built are the tokenizer's own encodings, BOS and all
    for text, ids in zip(task.texts, task.clean, strict=True):
        assert ids == ref_tok(text)["input_ids"]
    bos = ref_tok.bos_token_id
    adds_bos = ref_tok("x")["input_ids"][0] == bos
    assert task.metadata["prepend_bos"] is adds_bos
    assert all((ids[0] == bos) is adds_bos for ids in task.clean)


def test_gemma3_knows_its_family_and_adds_bos(gemma3):
    assert gemma3.family.name == "gemma2" and gemma3.n_layers == 18 and gemma3.d_model == 640
    assert gemma3.tokenizer("x")["input_ids"][0] == gemma3.tokenizer.bos_token_id


def test_gemma3_does_ioi_and_greater_than(gemma3):
    for name in ("ioi", "greater_than"):
        task = make_task(name, gemma3.tokenizer, n=N_ACCURACY, seed=0)
        r = evaluate_task(task, logits_fn(gemma3), batch_size=16)
        # chance is 0.5; the BOS-less prompts of before gave 0.06 (IOI) and 0.31 (greater-than)
        assert r["accuracy_ci"][0] > 0.75, (name, r["accuracy"])
        assert r["metric_ci"][0] > 0, (name, r["metric_mean"])


def test_gemma3_has_a_function_preserving_sanity_copy(gemma3):
    """Gemma's blocks normalise their writes, so the equivalence sanity copy changes the
    residual basis by a signed permutation (the gains move with it): the copy computes the
    same logits, each moved head the same ``hook_z``, and a residual stream ``x R``."""
    from structlens.equivalence.stages import fold_check

    got = fold_check(gemma3, "When Mary and John went to the store, John gave a drink to",
                     seed=0, layer=9)  # fmt: skip
    assert got.top1_unchanged
    assert got.max_abs_logit_diff < 1e-3 * got.max_abs_logit
    assert got.max_abs_z_diff < 1e-4
    # float32 round-off of residual entries up to ~1e5 (Gemma's massive activations)
    assert got.max_abs_resid_rotation_error < 1e-6 * got.max_abs_resid


def test_smollm2_and_gemma3_share_ioi_prompts(gemma3, smollm2):
    from structlens.equivalence.probes import task_probe

    probe = task_probe(smollm2, gemma3, "ioi", n=24, seed=0)
    alone = make_task("ioi", smollm2.tokenizer, n=24, seed=0)
    assert probe.texts == list(alone.texts)  # every IOI name is one token in Gemma's too
    bos = gemma3.tokenizer.bos_token_id
    for text, a, b in zip(probe.texts, probe.tokens_a, probe.tokens_b, strict=True):
        assert a == smollm2.tokenizer(text)["input_ids"] and a[0] != bos
        assert b == gemma3.tokenizer(text)["input_ids"] and b[0] == bos
        # the prediction is read after the same last word in both
        assert smollm2.tokenizer.decode(a[-1:]) == gemma3.tokenizer.decode(b[-1:]) == " to"


def test_compare_across_families_on_a_shared_task_probe(gemma3, smollm2):
    """Two tokenizers, one IOI probe: sentence rows, the similarity score, and CONGRUITY
    ranking each model's heads by its own last scored position (the same text in both)."""
    from structlens.equivalence.compare import CompareConfig, compare
    from structlens.equivalence.probes import task_probe

    probe = task_probe(smollm2, gemma3, "ioi", n=12, seed=0)
    assert not probe.shared_tokens
    cfg = CompareConfig(congruity_max_layers=1, congruity_top_k=1, point_n=4, straps=4)
    res = compare(smollm2, gemma3, probe, cfg)
    assert res.representation == "sentence" and res.validation_method == "similarity"
    assert len(res.validation) == gemma3.n_layers * gemma3.n_heads  # every head of B matched
    top_a, top_b = res.congruity["top_heads_a"], res.congruity["top_heads_b"]
    assert top_a[0][0] < smollm2.n_layers and top_b[0][0] < gemma3.n_layers
    assert res.congruity["intervention"] == "head hook_z from corrupted run"

"""Model-level equivalence: sanity models with known answers, end-to-end compare, CLI, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from structlens.equivalence import Preprocess, ValidationCriterion
from structlens.equivalence.compare import CompareConfig, Probe, compare, corpus_probe
from structlens.equivalence.scenarios import finetune_on_task, rotate_and_permute
from structlens.interventions import run_with_cache
from structlens.models import load_model

FAST = dict(batch_size=16, point_n=5, straps=3, congruity_top_k=1, congruity_max_layers=1)


@pytest.fixture(scope="module")
def tiny() -> object:
    return load_model("tiny-llama", seed=1)


@pytest.fixture(scope="module")
def rotated(tiny: object) -> tuple:
    return rotate_and_permute(tiny, seed=3)


def test_rotated_permuted_model_keeps_logits_and_moves_heads(tiny, rotated) -> None:
    model, head_map, r = rotated
    assert not torch.allclose(model.hf.model.embed_tokens.weight, tiny.hf.model.embed_tokens.weight)
    assert any(m != list(range(tiny.n_heads)) for m in head_map)
    ids, mask = tiny.tokenize(["Emma was handsome, clever, and rich.", "It is a truth"])
    sites = ["blocks.1.attn.hook_z", "blocks.2.hook_resid_post"]
    la, ca = run_with_cache(tiny, ids, mask, sites)
    lb, cb = run_with_cache(model, ids, mask, sites)
    assert torch.allclose(la, lb, atol=1e-4)
    za, zb = ca[sites[0]], cb[sites[0]]
    for h in range(tiny.n_heads):
        assert torch.allclose(za[:, :, h], zb[:, :, head_map[1][h]], atol=1e-5)
    assert torch.allclose(ca[sites[1]] @ r, cb[sites[1]], atol=1e-4)
    # the rotation really mixes the basis: the raw residuals differ
    assert not torch.allclose(ca[sites[1]], cb[sites[1]], atol=1e-2)


def test_rotate_rejects_layernorm_models() -> None:
    with pytest.raises(ValueError, match="LayerNorm"):
        rotate_and_permute(load_model("tiny-gpt2"))


def test_sanity_pair_scores_one_and_recovers_permutation(tiny, rotated) -> None:
    model, head_map, _ = rotated
    probe = corpus_probe(tiny, model, n=12, max_chars=60)
    res = compare(tiny, model, probe, CompareConfig(congruity=False, batch_size=16))
    assert res.score == 1.0 and res.layer_score == 1.0
    assert res.validation_method == "patching"
    for (la, ha), (lb, hb) in res.matching["heads"]["pairs"]:
        assert la == lb and head_map[la][ha] == hb
    assert res.matching["layers"]["pairs"] == [[i, i] for i in range(tiny.n_layers)]
    np.testing.assert_allclose(np.diag(res.layer_similarity), 1.0, atol=1e-9)
    assert max(r["kl"] for r in res.validation) < 1e-3
    # heads whose mean ablation fails are exactly rescued by their partners
    assert res.informative["n_heads"] == sum(not r["passed"] for r in res.null_validation)
    assert res.informative["n_passed"] == res.informative["n_heads"]
    assert res.head_groups == {}
    # the decision is calibrated by the paired test on the same heads: McNemar's test for
    # clustered data on the heads where only the partner or only the null passes, B's layers
    # the clusters (the default unit)
    from structlens.stats.intervals import clustered_mcnemar, mcnemar_exact

    partner = [r["passed"] for r in res.validation]
    null = [r["passed"] for r in res.null_validation]
    layer = [r["pair"][1][0] for r in res.validation]
    b = sum(p and not q for p, q in zip(partner, null))
    c = sum(q and not p for p, q in zip(partner, null))
    layers = sorted(set(layer))
    b_l = [sum(p and not q for p, q, x in zip(partner, null, layer) if x == k) for k in layers]
    c_l = [sum(q and not p for p, q, x in zip(partner, null, layer) if x == k) for k in layers]
    p_value = clustered_mcnemar(b_l, c_l)[1] if len(layers) < len(partner) else mcnemar_exact(b, c)
    test = res.verdicts["matching_test"]
    assert (test["partner_only"], test["null_only"]) == (b, c)
    assert test["p_value"] == pytest.approx(p_value) and test["n_clusters"] == len(layers)
    want = "equivalent" if b > c and p_value < 0.05 else "unidentified"
    assert res.verdicts["matching"] == want


def test_head_groups_replace_whole_layers(tiny, rotated) -> None:
    model, _, _ = rotated
    probe = corpus_probe(tiny, model, n=12, max_chars=60)
    cfg = CompareConfig(congruity=False, validate_head_groups=True, batch_size=16)
    res = compare(tiny, model, probe, cfg)
    g = res.head_groups
    # every layer of B with all its heads replaced at once by the rotated model's partners
    # reproduces B (the sanity pair is exact); mean-ablating a whole layer's heads does not
    assert g["pairs"] == list(range(tiny.n_layers)) and g["score"] == 1.0
    assert max(r["kl"] for r in g["validation"]) < 1e-3
    assert g["null_score"] == 0.0
    assert g["informative"]["n_heads"] == tiny.n_layers == g["informative"]["n_passed"]
    t = g["paired_test"]  # every layer: partner passes, null fails
    assert (t["partner_only"], t["null_only"], t["n_heads"]) == (tiny.n_layers, 0, tiny.n_layers)


def test_compare_two_seeds_end_to_end(tiny) -> None:
    other = load_model("tiny-llama", seed=2)
    probe = corpus_probe(tiny, other, n=12, max_chars=60)
    crit = ValidationCriterion(max_kl=0.05, min_top1=0.8)
    res = compare(tiny, other, probe, CompareConfig(criterion=crit, **FAST))
    n_heads = tiny.n_layers * tiny.n_heads
    assert len(res.matching["heads"]["pairs"]) == n_heads == len(res.validation)
    for rec in res.validation:
        assert rec["passed"] == (rec["kl"] <= 0.05 and rec["top1"] >= 0.8)
    k = sum(r["passed"] for r in res.validation)
    assert res.score == pytest.approx(k / n_heads)
    assert res.score_ci[0] <= res.score <= res.score_ci[1]
    # the null (mean ablation) is scored per head on the same pairs; the informative score
    # keeps the heads whose null fails
    assert [r["pair"] for r in res.null_validation] == [r["pair"] for r in res.validation]
    assert res.null_score == pytest.approx(np.mean([r["passed"] for r in res.null_validation]))
    keep = [p["passed"] for p, q in zip(res.validation, res.null_validation) if not q["passed"]]
    assert res.informative["n_heads"] == len(keep) and res.informative["n_passed"] == sum(keep)
    if keep:
        assert res.informative["score"] == pytest.approx(np.mean(keep))
    cg = res.congruity
    assert 0.0 <= cg["point_test_ab"]["decision_rate"] <= 1.0
    assert len(cg["point_test_ab"]["p_values"]) == 3
    assert res.verdicts["agree"] == (res.verdicts["matching"] == res.verdicts["congruity"])
    # two unrelated random models are never declared equivalent: no calibrated evidence
    assert res.verdicts["matching"] == "unidentified" and res.verdicts["matching_reason"]
    assert res.verdicts["congruity"] in ("different", "unidentified")
    # the saved result round-trips
    assert set(res.summary()) >= {"score", "score_ci", "matching", "validation", "congruity"}


def test_sentence_level_against_encoder_uses_similarity_score(tiny) -> None:
    bert = load_model("tiny-bert")
    probe = corpus_probe(bert, tiny, n=12, max_chars=60)
    res = compare(
        bert,
        tiny,
        probe,
        CompareConfig(representation="sentence", similarity_threshold=0.3, **FAST),
    )
    assert res.representation == "sentence" and res.validation_method == "similarity"
    sims = np.array(res.matching["heads"]["similarities"])
    assert res.score == pytest.approx(np.mean(sims >= 0.3))
    assert res.n_fit == 6 and res.layer_similarity.shape == (3, 3)


def test_bad_probes_raise(tiny) -> None:
    with pytest.raises(ValueError, match="mismatched probe sets"):
        Probe("x", ["a"] * 12, [[1, 2]] * 12, [[1, 2]] * 11)
    with pytest.raises(ValueError, match="too few probe prompts"):
        Probe("x", ["a"] * 5, [[1, 2]] * 5, [[1, 2]] * 5)
    probe = Probe("x", ["a"] * 12, [[1, 2, 3]] * 12, [[1, 2, 4]] * 12)
    with pytest.raises(ValueError, match="identical token sequences"):
        compare(tiny, tiny, probe, CompareConfig(representation="tokens"))
    with pytest.raises(ValueError, match="layer_matching"):
        CompareConfig(layer_matching="greedy")


def test_finetune_changes_only_trained_layers(tiny) -> None:
    toks = [list(range(1, 6 + i % 3)) for i in range(8)]
    tuned, losses, curve, steps_run, reached = finetune_on_task(
        tiny, toks, [7] * 8, steps=2, lr=1e-2, batch_size=4, train_layers=[2]
    )
    assert len(losses) == steps_run == 2 and all(np.isfinite(losses))
    assert curve == [] and reached is None
    before = dict(tiny.hf.named_parameters())
    for name, p in tuned.hf.named_parameters():
        changed = not torch.equal(p, before[name])
        assert changed == name.startswith("model.layers.2."), name


def test_finetune_stops_when_the_held_out_behaviour_has_moved(tiny) -> None:
    toks = [list(range(1, 6 + i % 3)) for i in range(8)]
    held = [list(range(2, 7 + i % 2)) for i in range(4)]
    full = finetune_on_task(tiny, toks, [7] * 8, steps=12, lr=1e-2, batch_size=4,
                            held_out=held, eval_every=2)  # fmt: skip
    kls = [kl for _, kl in full.held_out_kl]
    assert full.held_out_kl[0] == (0, 0.0) and [s for s, _ in full.held_out_kl][-1] == 12
    assert min(kls[1:]) > 0 and full.reached is None
    # an independent KL(base ‖ tuned) at the end of each held-out prompt
    from structlens.data.tasks import pad_batch

    ids, mask = pad_batch(held, int(tiny.tokenizer.pad_token_id))
    last = (torch.arange(len(held)), mask.sum(1) - 1)
    with torch.no_grad():
        p = tiny.hf(input_ids=ids, attention_mask=mask).logits[last].log_softmax(-1)
        q = full.model.hf(input_ids=ids, attention_mask=mask).logits[last].log_softmax(-1)
    assert np.isclose(float((p.exp() * (p - q)).sum(-1).mean()), kls[-1], rtol=1e-4)
    target = kls[3]  # reached at step 6 on the same seeded path
    early = finetune_on_task(tiny, toks, [7] * 8, steps=12, lr=1e-2, batch_size=4,
                             held_out=held, eval_every=2, target_kl=target)  # fmt: skip
    first = next(s for s, kl in full.held_out_kl if kl >= target)
    assert early.reached and early.steps_run == first
    assert early.held_out_kl == full.held_out_kl[: len(early.held_out_kl)]
    with pytest.raises(ValueError, match="held_out"):
        finetune_on_task(tiny, toks, [7] * 8, steps=2, batch_size=4, target_kl=0.1)


def test_cli_compare_writes_documented_keys(tmp_path) -> None:
    from typer.testing import CliRunner

    from structlens.cli import equiv

    args = ["tiny-llama", "tiny-llama", "--task", "corpus", "-n", "12", "--no-congruity"]
    args += ["--max-validate-heads", "3", "--head-subset", "random", "--head-groups"]
    res = CliRunner().invoke(
        equiv.app, ["compare", *args, "--out", str(tmp_path), "--quiet", "--batch-size", "16"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "compare.json").read_text())
    for key in ("heads", "layers", "head_groups", "decision", "caveats", "layer_similarity"):
        assert key in doc
    assert doc["congruity"] is None and doc["protocol"]["congruity"] is False
    heads = doc["heads"]
    assert len(heads["pairs"]) == len(heads["kl"]) == len(heads["null_passed"]) == 3
    assert heads["informative"].keys() >= {"n", "n_passed", "score"}
    assert heads["decision"]["verdict"] == doc["decision"]
    assert doc["head_groups"]["pairs"] == [0, 1, 2]
    assert (tmp_path / "compare_result" / "result.json").exists()
    assert (tmp_path / "compare_layers.png").stat().st_size > 0
    # without CONGRUITY the subset cannot come from its KL grid: said in one line, exit 2
    bad = CliRunner().invoke(equiv.app, ["compare", *args[:9], "--out", str(tmp_path), "-q"])
    assert bad.exit_code == 2 and "turn congruity on" in bad.output
    bad = CliRunner().invoke(equiv.app, ["compare", *args[:2], "-n", "4", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "too few" in bad.output


def test_preprocess_default_excludes_first_position() -> None:
    assert CompareConfig().preprocess == Preprocess(exclude_bos=True)


def test_validated_heads_are_the_top_kl_heads_whose_null_fails(tiny) -> None:
    from structlens.equivalence import informative_heads

    other = load_model("tiny-llama", seed=2)
    probe = corpus_probe(tiny, other, n=12, max_chars=60)
    crit = ValidationCriterion(max_kl=1e-4, min_top1=0.8)
    cfg = CompareConfig(criterion=crit, max_validate_heads=2, validate_layers=False, **FAST)
    res = compare(tiny, other, probe, cfg)
    pairs = res.matching["heads"]["pairs"]
    want = informative_heads(res.congruity["kl_grid_b"], pairs, 2, 1e-4)
    assert want, "the tiny model's most important heads should move its output"
    assert [r["pair"] for r in res.validation] == [pairs[i] for i in want]


def test_encoder_decoder_against_decoder_only_is_scored_by_patching(tiny, tmp_path) -> None:
    # an encoder–decoder with an empty source reads probes like a decoder-only LM, so its
    # decoder heads are matched to B's and validated by the same patching as every row
    import dataclasses

    from structlens.equivalence.train_small import SmallLMConfig, train_small_lm

    cfg = SmallLMConfig(n_layers=3, encoder_layers=1, d_model=64, n_heads=4, d_mlp=128,
                        seq_len=16, batch_size=2, steps=2)  # fmt: skip
    a = load_model(str(train_small_lm(cfg, tmp_path / "ed")))
    b = load_model(str(train_small_lm(dataclasses.replace(cfg, encoder_layers=0), tmp_path / "d")))
    probe = corpus_probe(a, b, n=12, max_chars=60)
    res = compare(a, b, probe, CompareConfig(**FAST | {"congruity_top_k": 2}))
    assert res.representation == "tokens" and res.validation_method == "patching"
    assert (
        len(res.matching["heads"]["pairs"]) == a.n_output_layers * a.n_heads == len(res.validation)
    )
    assert np.isfinite(res.null_score) and len(res.congruity["top_heads_a"]) == 2
    assert all(0 <= la < a.n_output_layers for la, _ in res.congruity["top_heads_a"])

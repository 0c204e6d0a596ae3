"""Model-level equivalence: sanity models with known answers, end-to-end compare, CLI, errors."""

from __future__ import annotations

import dataclasses
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


def _same_function_in_a_new_basis(a, b, head_map, r) -> None:
    """``b`` computes ``a``'s logits, each head ``h`` of layer 1 as ``b``'s head
    ``head_map[1][h]``, and the residual stream ``x R``, which differs from ``x``."""
    ids, mask = a.tokenize(["Emma was handsome, clever, and rich.", "It is a truth"])
    sites = ["blocks.1.attn.hook_z", "blocks.2.hook_resid_post"]
    la, ca = run_with_cache(a, ids, mask, sites)
    lb, cb = run_with_cache(b, ids, mask, sites)
    assert torch.allclose(la, lb, atol=1e-4)
    za, zb = ca[sites[0]], cb[sites[0]]
    for h in range(a.n_heads):
        assert torch.allclose(za[:, :, h], zb[:, :, head_map[1][h]], atol=1e-5)
    assert torch.allclose(ca[sites[1]] @ r, cb[sites[1]], atol=1e-4)
    # the basis change really moves the residuals
    assert not torch.allclose(ca[sites[1]], cb[sites[1]], atol=1e-2)


def test_rotated_permuted_model_keeps_logits_and_moves_heads(tiny, rotated) -> None:
    model, head_map, r = rotated
    assert not torch.allclose(model.hf.model.embed_tokens.weight, tiny.hf.model.embed_tokens.weight)
    assert any(m != list(range(tiny.n_heads)) for m in head_map)
    _same_function_in_a_new_basis(tiny, model, head_map, r)


def test_gemma_copies_change_basis_by_a_signed_permutation() -> None:
    """Gemma 2/3 normalise each block's write, so no gain can be folded away: the copy's
    basis change is a signed permutation that every gain follows, and the function stays."""
    from structlens.equivalence.scenarios import basis_change, random_signed_permutation

    gemma = load_model("tiny-gemma2", seed=1)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # the random model's gains are all 1 + 0: give them values to move
        for name, p in gemma.hf.named_parameters():
            if name.endswith("norm.weight") and p.shape == (gemma.d_model,):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    twin, head_map, r = rotate_and_permute(gemma, seed=3)
    assert twin.name.endswith("+sperm3") and basis_change(twin.name) == "signed-permuted"
    r64 = r.double()
    assert torch.equal(r64.abs().sum(0), torch.ones(gemma.d_model))
    assert torch.equal(r64.abs().sum(1), torch.ones(gemma.d_model))
    assert torch.equal(r64, random_signed_permutation(gemma.d_model, 3).to(r.dtype).double())
    before, after = gemma.hf.model.layers[1], twin.hf.model.layers[1]
    for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"):  # fmt: skip
        g, g2 = getattr(before, name).weight, getattr(after, name).weight
        assert torch.allclose(g @ r.abs(), g2) and not torch.allclose(g, g2)
    _same_function_in_a_new_basis(gemma, twin, head_map, r)


def test_rotate_rejects_layernorm_models() -> None:
    with pytest.raises(ValueError, match="LayerNorm"):
        rotate_and_permute(load_model("tiny-gpt2"))


def test_sanity_pair_scores_one_and_recovers_permutation(tiny, rotated) -> None:
    model, head_map, _ = rotated
    probe = corpus_probe(tiny, model, n=12, max_chars=60)
    cfg = CompareConfig(congruity=False, batch_size=16, relation="copy")
    res = compare(tiny, model, probe, cfg)
    assert res.score == 1.0 and res.layer_score == 1.0
    assert res.validation_method == "patching"
    # a copy keeps the Procrustes layer map, on fewer rows than an affine map would need
    assert res.layer_map["method"] == "procrustes" and res.layer_map["relation"] == "copy"
    assert res.layer_map["rows"] < 10 * tiny.d_model
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
    # told nothing of the copy, the pair is independent: too few rows for an affine layer map
    assert res.layer_map["method"] is None and res.layer_validation == []
    assert np.isnan(res.layer_score) and "rows per dimension" in res.layer_map["reason"]
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
    # independent models: an affine layer map, refused on ~5 rows per dimension, with why
    assert res.layer_map["relation"] == "independent" and res.layer_map["method"] is None
    assert res.layer_map["rows"] < res.layer_map["min_rows"] == 10 * tiny.d_model
    from structlens.equivalence.protocol import EquivalenceProtocol
    from structlens.equivalence.stages import summarize

    typed = summarize(EquivalenceProtocol(), res)
    assert typed.layers is None and typed.layer_map is not None
    (caveat,) = [c for c in typed.caveats if c.kind == "layers_not_validated"]
    assert caveat.message == typed.layer_map.reason
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


def test_finetune_checks_the_held_out_kl_every_step_and_stops_at_the_first(tiny) -> None:
    from structlens.data.tasks import pad_batch
    from structlens.equivalence.scenarios import FT_SETTINGS, FT_TRAINED_LAYERS, SCENARIOS

    toks = [list(range(1, 6 + i % 3)) for i in range(8)]
    held = [list(range(2, 7 + i % 2)) for i in range(4)]
    kw = dict(steps=6, lr=1e-2, batch_size=4, train_layers=[1, 2], held_out=held)
    full = finetune_on_task(tiny, toks, [7] * 8, **kw)
    assert [s for s, _ in full.held_out_kl] == list(range(7))  # every step, from step 0
    # each check reuses the frozen layer 0's outputs; the KL is the full forward's
    ids, mask = pad_batch(held, int(tiny.tokenizer.pad_token_id))
    last = (torch.arange(len(held)), mask.sum(1) - 1)
    with torch.no_grad():
        p = tiny.hf(input_ids=ids, attention_mask=mask).logits[last].log_softmax(-1)
        q = full.model.hf(input_ids=ids, attention_mask=mask).logits[last].log_softmax(-1)
    kl = float((p.exp() * (p - q)).sum(-1).mean())
    assert np.isclose(kl, full.held_out_kl[-1][1], rtol=1e-5)
    # the target is met at the first step whose KL reaches it, not at a later check
    kls = [v for _, v in full.held_out_kl]
    target = 0.5 * (kls[2] + kls[3]) if kls[3] > kls[2] else kls[3]
    first = next(s for s, v in full.held_out_kl if v >= target)
    early = finetune_on_task(tiny, toks, [7] * 8, **kw, target_kl=target)
    assert early.reached and early.steps_run == first
    assert early.held_out_kl == full.held_out_kl[: first + 1]
    # the replication's fine-tunes check every step and score the layers they train
    assert FT_SETTINGS["eval_every"] == 1
    assert FT_SETTINGS["train_layers"] == list(FT_TRAINED_LAYERS)
    rows = [sc for sc in SCENARIOS if sc.group == "finetune"]
    assert rows and all(sc.first_layer == min(FT_TRAINED_LAYERS) for sc in rows)
    with pytest.raises(ValueError, match="train_layers must lie in"):
        finetune_on_task(tiny, toks, [7] * 8, steps=1, batch_size=4, train_layers=[3])


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
    # the subset is chosen on the fit prompts by the null's own intervention, with or without
    # CONGRUITY; the old ranking by CONGRUITY's grid (all prompts) is gone
    bad = [*args[:7], "--head-subset", "congruity_kl", "--out", str(tmp_path), "-q"]
    bad = CliRunner().invoke(equiv.app, ["compare", *bad])
    assert bad.exit_code == 2 and "null_kl" in bad.output
    bad = CliRunner().invoke(equiv.app, ["compare", *args[:2], "-n", "4", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "too few" in bad.output


def test_preprocess_default_excludes_first_position() -> None:
    assert CompareConfig().preprocess == Preprocess(exclude_bos=True)


def _fit_null_kl(model, probe, fit, raw_z, head) -> float:
    """KL(B ‖ B with ``head`` mean-ablated) over the fit prompts' tokens from position 1,
    computed here with hooks (an independent computation of the selection's ranking)."""
    from structlens.data.tasks import pad_batch
    from structlens.interventions import hooked

    lb, hb = head
    mean = torch.as_tensor(raw_z[lb][:, hb].astype(np.float64).mean(0), dtype=torch.float32)
    ids, mask = pad_batch([probe.tokens_b[i] for i in fit], int(model.tokenizer.pad_token_id))

    def ablate(act, src=None):
        out = act.clone()
        out[:, 1:, hb] = mean
        return out

    with torch.no_grad():
        p = model.forward(ids, mask).double().log_softmax(-1)
        with hooked(model, writes={f"blocks.{lb}.attn.hook_z": lambda a: ablate(a)}):
            q = model.forward(ids, mask).double().log_softmax(-1)
    keep = mask.bool().clone()
    keep[:, :1] = False
    return float((p.exp() * (p - q)).sum(-1)[keep].mean())


def test_validated_heads_are_chosen_on_the_fit_prompts_by_the_null(tiny) -> None:
    from structlens.equivalence import informative_heads
    from structlens.equivalence.collect import collect_rows
    from structlens.equivalence.compare import split_prompts

    other = load_model("tiny-llama", seed=2)
    probe = corpus_probe(tiny, other, n=12, max_chars=60)
    crit = ValidationCriterion(max_kl=1e-4, min_top1=0.8)
    cfg = CompareConfig(criterion=crit, max_validate_heads=2, validate_layers=False, **FAST)
    res = compare(tiny, other, probe, cfg)
    pairs = res.matching["heads"]["pairs"]
    fit, _ = split_prompts(12, cfg.heldout_fraction, np.random.default_rng(cfg.seed))
    _, raw_z = collect_rows(other, [probe.tokens_b[i] for i in fit], 1, False, 16)
    kl = [_fit_null_kl(other, probe, fit, raw_z, b) for _, b in pairs]
    sel = res.head_selection
    assert sel["method"] == "null_kl" and sel["prompts"] == "fit"
    np.testing.assert_allclose(sel["fit_null_kl"], kl, rtol=1e-4)
    grid = np.zeros((other.n_layers, other.n_heads))
    for (_, (lb, hb)), v in zip(pairs, kl):
        grid[lb, hb] = v
    want = informative_heads(grid, pairs, 2, 1e-4)
    assert want, "the tiny model's most important heads should move its output"
    assert [r["pair"] for r in res.validation] == [pairs[i] for i in want]


def test_validated_heads_do_not_depend_on_held_out_prompts(tiny) -> None:
    """The selection reads no held-out prompt: other held-out sentences (CONGRUITY, which
    reads every prompt, sees them) leave the chosen heads and their fit KLs unchanged."""
    from structlens.equivalence.compare import split_prompts

    other = load_model("tiny-llama", seed=2)
    probe = corpus_probe(tiny, other, n=12, max_chars=60)
    cfg = CompareConfig(max_validate_heads=3, validate_layers=False, **FAST)
    _, heldout = split_prompts(12, cfg.heldout_fraction, np.random.default_rng(cfg.seed))
    spare = corpus_probe(tiny, other, n=40, max_chars=60)
    changed = Probe(probe.name, list(probe.texts), [list(t) for t in probe.tokens_a],
                    [list(t) for t in probe.tokens_b])  # fmt: skip
    for k, i in enumerate(heldout):
        changed.texts[i] = spare.texts[2 * k + 1]
        changed.tokens_a[i] = changed.tokens_b[i] = spare.tokens_a[2 * k + 1]
    assert changed.texts != probe.texts
    one, two = compare(tiny, other, probe, cfg), compare(tiny, other, changed, cfg)
    assert one.congruity["kl_grid_b"] != two.congruity["kl_grid_b"]  # CONGRUITY saw them
    assert one.head_selection == two.head_selection
    assert [r["pair"] for r in one.validation] == [r["pair"] for r in two.validation]
    assert [r["kl"] for r in one.validation] != [r["kl"] for r in two.validation]


def test_finetune_rows_score_only_the_trained_layers(tiny) -> None:
    toks = [list(range(1, 6 + i % 3)) for i in range(8)]
    tuned = finetune_on_task(tiny, toks, [7] * 8, steps=3, lr=1e-2, batch_size=4,
                             train_layers=[2]).model  # fmt: skip
    probe = corpus_probe(tiny, tuned, n=12, max_chars=60)
    cfg = CompareConfig(congruity=False, relation="copy", batch_size=16)
    every = compare(tiny, tuned, probe, cfg)
    # the frozen layers are the base's own: their heads match themselves (identical rows)
    # and pass, and would inflate the score
    frozen = [r for r in every.validation if r["pair"][1][0] < 2]
    assert len(frozen) == 2 * tiny.n_heads and all(r["passed"] for r in frozen)
    assert all(r["pair"][0] == r["pair"][1] and r["similarity"] > 0.999 for r in frozen)
    trained = compare(tiny, tuned, probe, dataclasses.replace(cfg, first_layer=2))
    assert trained.compared_layers == {"a": [2], "b": [2]}
    assert trained.matching["layers"]["pairs"] == [[2, 2]]
    heads = [r["pair"] for r in trained.validation]
    assert len(heads) == tiny.n_heads and all(a[0] == b[0] == 2 for a, b in heads)
    assert [r["pair"] for r in trained.layer_validation] == [[2, 2]]
    assert [r["pair"] for r in trained.null_validation] == heads
    sim = trained.layer_similarity
    assert np.isnan(sim[:2]).all() and np.isnan(sim[:, :2]).all()
    assert sim[2, 2] == pytest.approx(every.layer_similarity[2, 2])
    with pytest.raises(ValueError, match="first_layer=3 leaves no layer"):
        compare(tiny, tuned, probe, dataclasses.replace(cfg, first_layer=3))


@pytest.fixture(scope="module")
def enc_dec(tmp_path_factory) -> tuple:
    """A tiny T5 trained (two steps) as a language model over its decoder with the bytes
    before the decoder's in its encoder, and a decoder-only model of the same size."""
    from structlens.equivalence.train_small import SmallLMConfig, train_small_lm

    tmp = tmp_path_factory.mktemp("enc-dec")
    cfg = SmallLMConfig(n_layers=3, encoder_layers=1, d_model=64, n_heads=4, d_mlp=128,
                        seq_len=16, batch_size=2, steps=2)  # fmt: skip
    a = load_model(str(train_small_lm(cfg, tmp / "ed")))
    b = load_model(str(train_small_lm(dataclasses.replace(cfg, encoder_layers=0), tmp / "d")))
    return a, b, cfg


def test_encoder_reads_the_text_before_each_sentence(enc_dec) -> None:
    from structlens.data.corpus import load_texts
    from structlens.equivalence.collect import collect_rows

    a, b, cfg = enc_dec
    probe = corpus_probe(a, b, n=12, max_chars=60, encoder_context=cfg.max_context)
    assert probe.context_b is None and len(probe.context_a) == 12  # B reads the sentence alone
    start = int(a.config.decoder_start_token_id)
    docs = [" ".join(d.text.split()) for d in load_texts(None)]
    for text, ctx in zip(probe.texts, probe.context_a):
        assert 1 <= len(ctx) <= cfg.max_context
        if ctx == [start]:  # the sentence opens its document: the start token, as in training
            assert any(d.startswith(text) for d in docs)
            continue
        # the bytes right before the sentence: nothing the decoder predicts is in the source
        assert any(a.tokenizer.decode(ctx) + text in d for d in docs)
    # the decoder's rows are those of the encoder–decoder run on (context, sentence) ...
    tokens = probe.tokens_a[:3]
    rows, _ = collect_rows(a, tokens, 1, False, 3, context=probe.context_a[:3])
    for i, (ctx, toks) in enumerate(zip(probe.context_a[:3], tokens)):
        with torch.no_grad():
            out = a.hf(input_ids=torch.tensor([ctx]), decoder_input_ids=torch.tensor([toks]),
                       output_hidden_states=True)  # fmt: skip
        at = sum(len(t) - 1 for t in tokens[:i])
        want = out.decoder_hidden_states[1][0, 1:].numpy()
        np.testing.assert_allclose(rows[0][at : at + len(toks) - 1], want, atol=1e-5)
    # ... and the encoder is live: the start token alone gives other rows
    empty, _ = collect_rows(a, tokens, 1, False, 3)
    assert not np.allclose(empty[0], rows[0], atol=1e-3)


def test_encoder_decoder_against_decoder_only_is_scored_by_patching(enc_dec) -> None:
    # the encoder–decoder's decoder has the sentence's positions, so its decoder heads are
    # matched to B's and validated by the same patching as every row, its encoder reading
    # the text before the sentence in every run (fit rows, validation, CONGRUITY)
    a, b, cfg = enc_dec
    probe = corpus_probe(a, b, n=12, max_chars=60, encoder_context=cfg.max_context)
    res = compare(a, b, probe, CompareConfig(**FAST | {"congruity_top_k": 2}))
    assert res.representation == "tokens" and res.validation_method == "patching"
    assert (
        len(res.matching["heads"]["pairs"]) == a.n_output_layers * a.n_heads == len(res.validation)
    )
    assert np.isfinite(res.null_score) and len(res.congruity["top_heads_a"]) == 2
    assert all(0 <= la < a.n_output_layers for la, _ in res.congruity["top_heads_a"])
    bare = corpus_probe(a, b, n=12, max_chars=60)
    assert bare.context_a is None
    other = compare(a, b, bare, CompareConfig(**FAST | {"congruity_top_k": 2}))
    assert other.matching["heads"]["similarities"] != res.matching["heads"]["similarities"]

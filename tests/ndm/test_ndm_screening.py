"""Screening of patching tests by their whole-space effect, and the RoPE-transferable tests."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from structlens.data.tasks.induction import make_induction
from structlens.models import load_model
from structlens.models.loading import Model
from structlens.ndm.evaluate import (
    PAPER_TESTS,
    ROPE_TESTS,
    PatchRun,
    corrupted_prompts,
    make_test_task,
    patch_positions,
    patch_subspaces,
    patch_tests_for,
    summarize_gini,
    uses_rope,
    whole_space_run,
    whole_space_share,
)
from structlens.ndm.protocol import PROFILES
from structlens.ndm.stages import Decomposition, Screen, gini, screen


@pytest.fixture(scope="module")
def tok():
    return load_model("smollm2-135m").tokenizer


@pytest.fixture(scope="module")
def tiny(tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return Model(LlamaForCausalLM(cfg), tok, "tiny-llama-smol", "test")


@pytest.fixture(scope="module")
def induction(tok):
    return make_induction(tok, n=6, seed=0, length=6)


def test_induction_task_structure(induction):
    for i, ids in enumerate(induction.clean):
        a, a1, end = (induction.positions[k][i] for k in ("A", "A+1", "END"))
        L = end - a  # the repeat starts L tokens after the first copy
        assert len(ids) == end + 1 and ids[end] == ids[a]
        assert ids[: end + 1 - L] == ids[L:]  # second part repeats the first copy's start
        assert induction.answers["next"][i] == ids[a1]
        swap = induction.corrupted["prev_swap"][i]
        assert [p for p in range(len(ids)) if swap[p] != ids[p]] == [a]
        fresh = induction.corrupted["resample_first"][i]
        assert [p for p in range(len(ids)) if fresh[p] != ids[p]] == list(range(L))
        assert not set(fresh[:L]) & set(ids)  # fresh words never occur in the clean prompt
        assert induction.answers["foil"][i] == fresh[a1]


def _run(clean, full, n_sub=3, rng=None):
    rng = rng or np.random.default_rng(0)
    clean, full = np.asarray(clean, float), np.asarray(full, float)
    effects = np.abs(rng.standard_normal((len(clean), n_sub))) * 0.1
    effects[:, 0] += full  # one subspace carries the effect
    z = np.zeros(len(clean), dtype=np.int64)
    return PatchRun(clean, clean - full, effects, full, np.zeros((len(clean), n_sub), int), z, z)


def test_screen_and_no_signal_tests():
    runs = {
        "strong": {"ndm": _run([5.0, 5.0, 5.0], [2.0, 2.0, 2.0])},  # 40% of clean
        "weak": {"ndm": _run([5.0, 5.0, 5.0], [0.5, 0.4, 0.6])},  # 10% of clean
        "no_task": {"ndm": _run([-1.0, 0.5, 0.0], [0.1, 0.1, 0.1])},  # mean clean <= 0
    }
    layers = {"strong": 3, "weak": 3, "no_task": 5}
    protocol = PROFILES["smoke"].replace(gini_bootstrap=50)
    assert protocol.min_share == 0.3

    def screens(p):
        return [Screen.of(p, PAPER_TESTS[i], layers[t], r["ndm"]) for i, (t, r) in
                enumerate(runs.items())]  # fmt: skip

    table = screens(protocol)
    assert [row.screened for row in table] == [True, False, False]
    assert table[0].whole_space_share == pytest.approx(0.4)
    assert table[1].whole_space_share == pytest.approx(0.1)
    assert np.isnan(table[2].whole_space_share) and table[2].layer == 5
    assert screens(protocol.replace(min_share=0.05))[1].screened
    part = Decomposition(3, (1, 1, 1), {"ndm": np.eye(3)}, {"ndm": [1.0] * 3})
    named = {s.name: runs[t] for s, t in zip(table, runs, strict=True)}
    out = gini(protocol, table, named, {3: part, 5: part}).to_json()
    strong, weak, no_task = (s.name for s in table)
    assert out["gini"][weak] == "no signal" and out["gini"][no_task] == "no signal"
    dims, var = {strong: [1, 1, 1]}, {strong: {"ndm": [1.0] * 3}}
    alone = summarize_gini({strong: named[strong]}, dims, var, n_boot=50)
    assert out["gini"][strong] == alone["gini"][strong]
    assert out["gini_mean"] == alone["gini_mean"]  # the mean covers screened tests only
    none = gini(protocol, table[1:2], named, {3: part}).to_json()
    assert none["gini"] == {weak: "no signal"} and none["gini_mean"] == "no signal"


def test_whole_space_run_agrees_with_patching(tiny, induction):
    for test in ROPE_TESTS:
        corrupted = corrupted_prompts(induction, test.corruption)
        positions = patch_positions(induction, test.positions)
        whole = whole_space_run(tiny, induction, corrupted, 1, positions, batch_size=4)
        R = np.linalg.qr(np.random.default_rng(1).standard_normal((32, 32)))[0]
        full = patch_subspaces(
            tiny, induction, corrupted, 1, positions, {"r": [R[:, :20], R[:, 20:]]}, batch_size=4
        )["r"]
        assert whole.effects.shape == (len(induction), 0)
        np.testing.assert_allclose(whole.full_effect, full.full_effect, atol=1e-6)
        np.testing.assert_allclose(whole.clean_metric, full.clean_metric, atol=1e-6)
        # The two halves of a rotation add up to the whole space only in a linear model, but
        # patching the whole space at every position must reproduce the corrupted run.
        everywhere = whole_space_run(tiny, induction, corrupted, 1, None, batch_size=4)
        np.testing.assert_allclose(
            everywhere.clean_metric - everywhere.full_effect, everywhere.corrupt_metric, atol=1e-5
        )


def test_rope_models_get_transferable_tests(tiny, tok):
    from transformers import GPT2Config

    assert uses_rope(tiny)
    chosen = patch_tests_for(tiny)
    assert not [t for t in chosen if t.corruption == "position_swap"]
    assert set(ROPE_TESTS) <= set(chosen)
    assert {t.name for t in chosen} >= {"s_inhibition_name", "greater_than"}
    gpt2 = SimpleNamespace(hf=SimpleNamespace(config=GPT2Config()))
    assert not uses_rope(gpt2) and patch_tests_for(gpt2) == PAPER_TESTS
    for test in chosen:
        task = make_test_task(test, tok, n=4, seed=1)
        assert task.name == test.task and len(task) == 4
        assert len(corrupted_prompts(task, test.corruption)) == 4
        assert all(p is not None for p in patch_positions(task, test.positions))


def test_screen_is_the_whole_space_run_against_min_share(tiny, tok):
    test = ROPE_TESTS[1]
    protocol = PROFILES["smoke"].replace(patch_prompts=6)
    task = make_test_task(test, tok, n=6, seed=protocol.seed)
    whole = whole_space_run(
        tiny, task, corrupted_prompts(task, test.corruption), 2,
        patch_positions(task, test.positions), batch_size=6,
    )  # fmt: skip
    share = whole_space_share(whole)
    for min_share in (0.0, 1.0):
        row = screen(protocol.replace(min_share=min_share), tiny, test, 2, batch_size=6)
        assert row.screened is bool(np.isfinite(share) and share >= min_share)
        assert row.layer == 2 and row.run.effects.shape == (6, 0)  # no subspace patched
        assert row.whole_space_share == pytest.approx(share, nan_ok=True)
        np.testing.assert_allclose(row.run.full_effect, whole.full_effect, atol=1e-6)

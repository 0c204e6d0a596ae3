"""The patching tests' layers: the depth rule maps the paper's GPT-2 layer to the same relative
depth; the share sweep keeps the largest whole-space share (the candidate nearest the mapped
layer within one standard error of it, leaving the mapped layer only on a significant paired
gain), measured on selection prompts that are never evaluation prompts."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from structlens.errors import InputError
from structlens.models import load_model
from structlens.ndm import stages
from structlens.ndm.evaluate import (
    PatchRun,
    choose_layer,
    corrupted_prompts,
    make_test_task,
    map_layer,
    patch_positions,
    patch_tests_for,
    share_gain_p,
    sweep_candidates,
    whole_space_run,
    whole_space_share,
    whole_space_share_error,
)
from structlens.ndm.protocol import PROFILES

PROTOCOL = PROFILES["smoke"]  # share sweep, window 1, 8 selection prompts after 16


@pytest.fixture(scope="module")
def tiny():
    """A random 3-layer Llama with SmolLM2's tokenizer: every test of a rotary model builds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model("tiny-smol")
    torch.set_num_threads(before)


def test_choose_layer_is_the_largest_share_nearest_the_mapped_depth():
    """With every gain over the mapped layer significant, the rule is the argmax, ties
    (within one standard error) going to the layer nearest the mapped one."""
    layers, exact, gains = (10, 11, 12, 13, 14), (0.0,) * 5, (0.0, 0.0, math.nan, 0.0, 0.0)
    assert choose_layer(12, layers, (0.1, 0.2, 0.3, 0.6, 0.5), exact, gains) == 13  # the argmax
    assert choose_layer(12, layers, (0.6, 0.2, 0.3, 0.6, 0.1), exact, gains) == 13  # tie: nearer
    assert choose_layer(12, layers, (0.1, 0.6, 0.3, 0.6, 0.2), exact, gains) == 11  # equidistant
    assert choose_layer(12, layers, (math.nan, 0.1, -0.2, math.nan, 0.0), exact, gains) == 11
    assert choose_layer(12, layers, (math.nan,) * 5, exact, gains) == 12  # no behaviour: stay
    # within one standard error of the largest share counts as a tie
    noisy = (0.1, 0.2, 0.3, 0.6, 0.5)
    assert choose_layer(12, layers, noisy, (0.05,) * 5, gains) == 13  # 0.5 < 0.6 - 0.05
    assert choose_layer(12, layers, noisy, (0.1,) * 5, gains) == 13  # only 14 (0.5) ties
    assert choose_layer(12, layers, noisy, (0.35,) * 5, gains) == 12  # 0.3 >= 0.6 - 0.35
    assert choose_layer(12, layers, noisy, (0.0, 0.0, 0.0, math.nan, 0.0), gains) == 13
    with pytest.raises(ValueError, match="5 candidate layers for 4 shares, 5 standard"):
        choose_layer(12, layers, (0.1,) * 4, exact, gains)


def test_choose_layer_leaves_the_mapped_layer_only_on_a_significant_paired_gain():
    """Holm over the four other candidates multiplies the smallest p-value by 4: 0.02 stays,
    0.01 moves; a tied layer that fails its test is passed over for one that passes."""
    layers, errors, shares = (10, 11, 12, 13, 14), (0.01,) * 5, (0.1, 0.2, 0.3, 0.6, 0.5)
    p = (0.9, 0.9, math.nan, 0.02, 0.9)
    assert choose_layer(12, layers, shares, errors, p) == 12  # 4 · 0.02 > 0.05
    p = (0.9, 0.9, math.nan, 0.01, 0.9)
    assert choose_layer(12, layers, shares, errors, p) == 13  # 4 · 0.01 <= 0.05
    assert choose_layer(12, layers, shares, errors, p, alpha=0.01) == 12
    # 13 and 14 tie within the error; 13 fails its test, 14 passes
    tied = (0.1, 0.2, 0.3, 0.6, 0.58)
    p = (0.9, 0.9, math.nan, 0.5, 0.001)
    assert choose_layer(12, layers, tied, (0.05,) * 5, p) == 14
    # NaN p-values (no pairing possible) never count
    assert choose_layer(12, layers, shares, errors, (math.nan,) * 5) == 12


def test_share_gain_p_is_the_paired_t_test_of_the_whole_space_effects():
    """Against scipy's paired t test; the shared prompt noise cancels, so a gain far below
    each share's own standard error is still detected."""
    from scipy.stats import ttest_rel

    rng = np.random.default_rng(0)
    n = 24
    clean, prompt = np.full(n, 2.0), rng.normal(0.0, 1.0, n)
    runs = []
    for gain in (0.0, 0.05, -0.05):
        full = 1.0 + gain + prompt + 0.01 * rng.standard_normal(n)
        runs.append(_run(clean, full))
    p = share_gain_p(runs, 0)
    assert math.isnan(p[0])
    ref = ttest_rel(runs[1].full_effect, runs[0].full_effect, alternative="greater").pvalue
    assert p[1] == pytest.approx(ref, rel=1e-9) and p[1] < 1e-6
    assert p[2] > 0.999
    # each share's own (unpaired) error is over three times the share gain of 0.05 / 2
    assert whole_space_share_error(runs[1]) > 3 * 0.025
    same = share_gain_p([runs[0], _run(clean, runs[0].full_effect + 0.1)], 0)
    assert same[1] == 0.0  # a difference without spread
    assert all(map(math.isnan, share_gain_p([_run(-clean, runs[0].full_effect)] * 2, 0)))


def _run(clean, full):
    n = len(clean)
    empty, z = np.empty((n, 0)), np.zeros(n, dtype=np.int64)
    return PatchRun(clean, clean - full, empty, np.asarray(full, float), empty.astype(np.int64),
                    z, z)  # fmt: skip


def test_candidates_are_the_window_around_the_mapped_layer_inside_the_model():
    assert sweep_candidates(12, 30, 2) == (10, 11, 12, 13, 14)
    assert sweep_candidates(0, 3, 1) == (0, 1) and sweep_candidates(2, 3, 1) == (1, 2)
    assert sweep_candidates(5, 30, 0) == (5,)
    with pytest.raises(ValueError, match="mapped=30"):
        sweep_candidates(30, 30, 2)


def _planted(shares, spread=0.0):
    """A stand-in for whole_space_run whose whole-space share at each layer is planted: the
    clean metric is 1 and the per-prompt effects alternate ``share ± spread``."""

    def run(model, task, corrupted, layer, positions, *, batch_size=16):
        n = len(task)
        sign = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
        clean, full = np.ones(n), shares[layer] + spread * sign
        empty, z = np.empty((n, 0)), np.zeros(n, dtype=np.int64)
        return PatchRun(clean, clean - full, empty, full, empty.astype(np.int64), z, z)

    return run


def test_the_sweep_chooses_the_argmax_of_planted_shares(tiny, monkeypatch):
    shares = {0: 0.05, 1: 0.5, 2: 0.2}
    monkeypatch.setattr(stages, "whole_space_run", _planted(shares))
    plan = stages.plan_tests(PROTOCOL, tiny)
    assert [c.test for c in plan.sweep.choices] == [t.name for t in plan.tests]
    for c in plan.sweep.choices:
        assert c.candidates == sweep_candidates(c.mapped, 3, PROTOCOL.sweep_window)
        assert c.shares == pytest.approx([shares[layer] for layer in c.candidates])
        assert c.errors == (0.0,) * len(c.candidates)  # no spread over prompts
        assert c.chosen == max(c.candidates, key=shares.__getitem__) == plan.layers[c.test]
    # windows of one layer: every test whose window reaches layer 1 moves there
    assert set(plan.layers.values()) == {1} and plan.sweep.layers == [1]


def test_a_larger_share_within_its_standard_error_keeps_the_mapped_layer(tiny, monkeypatch):
    shares = {0: 0.55, 1: 0.5, 2: 0.1}
    n = PROTOCOL.sweep_prompts
    monkeypatch.setattr(stages, "whole_space_run", _planted(shares, spread=0.2))
    plan = stages.plan_tests(PROTOCOL, tiny)
    error = 0.2 * math.sqrt(n / (n - 1)) / math.sqrt(n)  # 0.076: 0.5 is within it of 0.55
    for c in plan.sweep.choices:
        assert c.errors == pytest.approx([error] * len(c.candidates))
    # mapped 0, 1, 1, 2: layer 0 holds the largest share, but layer 1 is within its error
    assert plan.layers == {"previous_token_relative": 0, "induction": 1,
                           "s_inhibition_name": 1, "greater_than": 1}  # fmt: skip


def test_the_sweep_chooses_the_argmax_of_measured_shares(tiny):
    plan = stages.plan_tests(PROTOCOL, tiny, ["s_inhibition_name", "greater_than"])
    measured = 0
    for test, c in zip(plan.tests, plan.sweep.choices, strict=True):
        task = stages.selection_task(PROTOCOL, tiny, test)
        assert c.prompt_ids == tuple(task.prompt_ids)
        corrupted = corrupted_prompts(task, test.corruption)
        positions = patch_positions(task, test.positions)
        runs = [whole_space_run(tiny, task, corrupted, layer, positions) for layer in c.candidates]
        np.testing.assert_allclose(c.shares, [whole_space_share(r) for r in runs], rtol=1e-9)
        np.testing.assert_allclose(c.errors, [whole_space_share_error(r) for r in runs], rtol=1e-9)
        gains = share_gain_p(runs, c.candidates.index(c.mapped))
        np.testing.assert_allclose(c.p_values, gains, rtol=1e-9)
        finite = [(s, e, layer) for layer, s, e in zip(c.candidates, c.shares, c.errors)
                  if math.isfinite(s)]  # fmt: skip
        if not finite:  # NaN where the random model does not do the task
            assert c.chosen == c.mapped
            continue
        measured += 1
        best, error, argmax = max(finite)
        tied = [layer for s, _, layer in finite if s >= best - error]
        assert argmax in tied
        if c.chosen != c.mapped:  # moved: to the nearest tied layer with a significant gain
            assert c.chosen in tied and gains[c.candidates.index(c.chosen)] <= 0.05
            assert abs(c.chosen - c.mapped) <= min(abs(layer - c.mapped) for layer in tied
                                                   if layer != c.mapped)  # fmt: skip
    assert measured  # at least one test has a measured share to take the argmax of


def test_selection_prompts_are_never_evaluation_prompts(tiny):
    for test in stages.plan_tests(PROTOCOL.replace(layer_rule="depth"), tiny).tests:
        evaluation = make_test_task(test, tiny.tokenizer, n=PROTOCOL.patch_prompts, seed=0)
        selection = stages.selection_task(PROTOCOL, tiny, test)
        assert len(selection) == PROTOCOL.sweep_prompts
        assert not set(selection.prompt_ids) & set(evaluation.prompt_ids)
        assert not {tuple(t) for t in selection.clean} & {tuple(t) for t in evaluation.clean}


def _repeating(original, n_eval, every):
    """make_test_task whose prompts after the first ``n_eval`` repeat an evaluation prompt's
    tokens (under their own ids) wherever ``every(i)`` holds."""

    def make(test, tokenizer, *, n, seed=0):
        task = original(test, tokenizer, n=n, seed=seed)
        src = [i - n_eval if i >= n_eval and every(i) else i for i in range(n)]
        rows = {}
        for name in type(task).per_prompt_fields:
            if name == "prompt_ids":
                continue
            value = getattr(task, name)
            rows[name] = (
                {k: [v[i] for i in src] for k, v in value.items()}
                if isinstance(value, dict)
                else [value[i] for i in src]
            )
        return dataclasses.replace(task, **rows)

    return make


def test_selection_drops_prompts_equal_to_an_evaluation_prompt(tiny, monkeypatch):
    n_eval, n = PROTOCOL.patch_prompts, PROTOCOL.sweep_prompts
    test = next(t for t in patch_tests_for(tiny) if t.name == "s_inhibition_name")
    original = stages.make_test_task
    monkeypatch.setattr(stages, "make_test_task", _repeating(original, n_eval, lambda i: i % 2))
    evaluation = {tuple(t) for t in stages._inputs(PROTOCOL, tiny, test)[0].clean}
    selection = stages.selection_task(PROTOCOL, tiny, test)
    assert not {tuple(t) for t in selection.clean} & evaluation
    ids = [int(pid.rsplit("-", 1)[1]) for pid in selection.prompt_ids]
    assert ids == list(range(n_eval, n_eval + 2 * n, 2))  # the odd ones repeat: dropped
    everything = _repeating(original, n_eval, lambda i: i < 2 * n_eval)
    monkeypatch.setattr(stages, "make_test_task", everything)
    with pytest.raises(InputError, match="lower sweep_prompts"):
        stages.selection_task(PROTOCOL, tiny, test)


def _no_forward(*args, **kwargs):
    raise AssertionError("the layers must be chosen without a forward pass")


def test_the_depth_rule_reproduces_the_mapped_layers(tiny, monkeypatch):
    monkeypatch.setattr(stages, "whole_space_run", _no_forward)
    depth = PROTOCOL.replace(layer_rule="depth")
    # at SmolLM2's 30 layers, the layers of the replication before the sweep
    smol = SimpleNamespace(n_layers=30, tokenizer=tiny.tokenizer, hf=tiny.hf, name="smol")
    for model in (tiny, smol):
        plan = stages.plan_tests(depth, model)
        assert plan.layers == {t.name: map_layer(t.gpt2_layer, model.n_layers) for t in plan.tests}
        assert all(c.candidates == c.shares == c.errors == c.prompt_ids == ()
                   for c in plan.sweep.choices)  # fmt: skip
        assert plan.sweep.rule == "depth" and len(plan.tests) == 4
    assert plan.layers == {"previous_token_relative": 12, "induction": 17,
                           "s_inhibition_name": 22, "greater_than": 24}  # fmt: skip


def test_a_recorded_sweep_is_reused_only_under_its_own_protocol(tiny, monkeypatch):
    monkeypatch.setattr(stages, "whole_space_run", _planted({0: 0.1, 1: 0.3, 2: 0.9}))
    recorded = stages.plan_tests(PROTOCOL, tiny).sweep
    monkeypatch.setattr(stages, "whole_space_run", _no_forward)
    plan = stages.plan_tests(PROTOCOL, tiny, ["greater_than"], sweep=recorded)
    assert plan.layers == {"greater_than": recorded.chosen["greater_than"]}
    assert [c.test for c in plan.sweep.choices] == ["greater_than"]
    with pytest.raises(InputError, match="sweep again with this protocol"):
        stages.plan_tests(PROTOCOL.replace(sweep_window=2), tiny, sweep=recorded)
    partial = stages.LayerSweep(recorded.selection, recorded.choices[:1])
    with pytest.raises(InputError, match="no choice for the tests"):
        stages.plan_tests(PROTOCOL, tiny, sweep=partial)
    # a sweep an older `ndm train` recorded (one standard error alone: no p-values, no
    # sweep_alpha) is not this protocol's and is swept again, not loaded
    from structlens.ndm.experiment import _recorded_sweep

    doc = recorded.to_json()
    assert _recorded_sweep({"layer_sweep": doc}, PROTOCOL).chosen == recorded.chosen
    old = {
        **doc,
        "selection": {k: v for k, v in doc["selection"].items() if k != "sweep_alpha"},
        "choices": [{k: v for k, v in c.items() if k != "p_values"} for c in doc["choices"]],
    }
    assert _recorded_sweep({"layer_sweep": old}, PROTOCOL) is None
    assert _recorded_sweep({}, PROTOCOL) is None


def test_the_sweep_survives_a_save_and_a_load(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(stages, "whole_space_run", _planted({0: math.nan, 1: 0.3, 2: 0.9}))
    sweep = stages.plan_tests(PROTOCOL, tiny).sweep
    back = stages.LayerSweep.load(sweep.save(tmp_path / "sweep"))
    assert back.to_json() == sweep.to_json()
    assert all(isinstance(c, stages.LayerChoice) for c in back.choices)
    assert back.chosen == sweep.chosen and back.selection == PROTOCOL.layer_selection()

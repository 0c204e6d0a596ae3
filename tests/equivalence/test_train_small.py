"""The small byte-level LMs: the held-out stopping rule."""

import dataclasses
import json

import pytest

from structlens.equivalence.train_small import SmallLMConfig, train_small_lm

TINY = SmallLMConfig(n_layers=1, d_model=16, n_heads=2, d_mlp=32, seq_len=16, batch_size=2)


def _record(config, path):
    return json.loads((train_small_lm(config, path) / "train.json").read_text())


def test_training_stops_once_the_held_out_loss_stalls(tmp_path):
    # lr 0: the held-out loss never improves, so the rule stops after `patience` evaluations
    frozen = dataclasses.replace(TINY, steps=50, lr=0.0, eval_every=2, patience=3)
    rec = _record(frozen, tmp_path / "frozen")
    assert rec["converged"] is True and rec["steps_run"] == 8  # best at 2, stale at 4, 6, 8
    assert [s for s, _ in rec["held_out_loss"]] == [2, 4, 6, 8]
    assert len({round(v, 6) for _, v in rec["held_out_loss"]}) == 1
    assert rec["loss"][-1][0] == 8
    # a stall at the last step of the budget is the schedule's end, not a plateau
    at_budget = _record(dataclasses.replace(frozen, steps=8), tmp_path / "budget")
    assert at_budget["steps_run"] == 8 and at_budget["converged"] is False


def test_without_evaluation_every_step_runs(tmp_path):
    rec = _record(dataclasses.replace(TINY, steps=5), tmp_path / "plain")
    assert rec["steps_run"] == 5 and rec["converged"] is None and rec["held_out_loss"] == []
    learning = dataclasses.replace(TINY, steps=6, eval_every=3, converge_tol=0.0, patience=5)
    rec = _record(learning, tmp_path / "learning")
    assert rec["steps_run"] == 6 and rec["converged"] is False


def test_bad_stopping_rule_is_rejected():
    with pytest.raises(ValueError, match="patience"):
        SmallLMConfig(patience=0)


def test_encoder_decoder_trains_on_the_same_bytes_and_loads_as_a_language_model(tmp_path):
    import torch

    from structlens.models import load_model

    cfg = dataclasses.replace(TINY, encoder_layers=1, n_layers=2, steps=4, eval_every=2)
    rec = _record(cfg, tmp_path / "ed")
    assert rec["config"]["encoder_layers"] == 1 and rec["steps_run"] == 4
    assert len(rec["held_out_loss"]) == 2 and all(v > 0 for _, v in rec["held_out_loss"])
    model = load_model(str(tmp_path / "ed"))
    assert model.is_encoder_decoder and model.empty_source
    assert (model.output_stack, model.n_output_layers) == ("decoder", 2)
    ids = torch.tensor([[5, 9, 11, 60, 61], [70, 71, 72, 73, 74]])
    # the LM view: the decoder reads the ids themselves, the encoder only the start token
    start = torch.full((2, 1), int(model.config.decoder_start_token_id))
    with torch.no_grad():
        direct = model.hf(input_ids=start, decoder_input_ids=ids).logits
        assert torch.equal(model.forward(ids), direct)
        # causal over the input: logits at t do not depend on tokens after t
        later = ids.clone()
        later[:, 3:] = 1
        assert torch.allclose(model.forward(later)[:, :3], direct[:, :3], atol=1e-6)


def test_decoder_only_keys_are_unchanged_by_the_encoder_field():
    assert "encoder_layers" not in TINY.key()
    assert dataclasses.replace(TINY, encoder_layers=2).key()["encoder_layers"] == 2

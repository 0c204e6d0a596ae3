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


def test_without_evaluation_every_step_runs(tmp_path):
    rec = _record(dataclasses.replace(TINY, steps=5), tmp_path / "plain")
    assert rec["steps_run"] == 5 and rec["converged"] is None and rec["held_out_loss"] == []
    learning = dataclasses.replace(TINY, steps=6, eval_every=3, converge_tol=0.0, patience=5)
    rec = _record(learning, tmp_path / "learning")
    assert rec["steps_run"] == 6 and rec["converged"] is False


def test_bad_stopping_rule_is_rejected():
    with pytest.raises(ValueError, match="patience"):
        SmallLMConfig(patience=0)

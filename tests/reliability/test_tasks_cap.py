"""``tasks eval -n HUGE`` is bounded: capped at the task's pool (at most ``MAX_PROMPTS``), the
cap is said and recorded, and evaluation advances a progress bar batch by batch."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "data"))
from tiny_tokenizers import build_word_tokenizer  # noqa: E402

import structlens.data.tasks as tasks  # noqa: E402
import structlens.data.tasks.registry as registry  # noqa: E402
from structlens.errors import InputError  # noqa: E402


class _RandomLM:
    """A model stand-in with a real word-level tokenizer and seeded random logits."""

    name = "random-lm"
    device = "cpu"

    def __init__(self):
        self.tokenizer = build_word_tokenizer(digits="split")
        self.calls = 0

    def forward(self, ids, mask):
        self.calls += 1
        g = torch.Generator().manual_seed(int(ids.sum()))
        return torch.randn(*ids.shape, len(self.tokenizer), generator=g)


@pytest.fixture
def small_cap(monkeypatch):
    monkeypatch.setattr(tasks, "MAX_PROMPTS", 12)
    monkeypatch.setattr(registry, "MAX_PROMPTS", 12)
    return 12


def test_huge_n_is_capped_said_and_recorded(capsys, small_cap):
    from structlens.cli.tasks import evaluate

    model = _RandomLM()
    r = evaluate(model, "ioi", n=1_000_000_000, seed=0, batch_size=5, quiet=True)
    assert r["n"] == small_cap and r["requested_n"] == 1_000_000_000
    assert model.calls == math.ceil(small_cap / 5)
    err = capsys.readouterr().err
    assert "1000000000" in err and f"its {small_cap} prompts" in err


def test_n_within_the_pool_is_not_capped(capsys, small_cap):
    from structlens.cli.tasks import evaluate

    r = evaluate(_RandomLM(), "ioi", n=7, seed=0, batch_size=5, quiet=True)
    assert r["n"] == 7 and r["requested_n"] == 7
    assert "pool" not in capsys.readouterr().err


def test_make_task_refuses_more_than_max_prompts():
    with pytest.raises(InputError, match=str(tasks.MAX_PROMPTS)):
        tasks.make_task("ioi", build_word_tokenizer(), n=tasks.MAX_PROMPTS + 1)


def test_progress_is_reported_once_per_batch_and_sums_to_n():
    task = tasks.make_task("ioi", build_word_tokenizer(), n=11, seed=0)
    model = _RandomLM()
    done: list[int] = []
    r = tasks.evaluate_task(task, model.forward, batch_size=4, progress=done.append)
    assert done == [4, 4, 3] and r["n"] == 11


def test_make_task_up_to_caps_at_the_pool_and_keeps_real_errors(small_cap):
    tok = _RandomLM().tokenizer
    assert len(tasks.make_task_up_to("ioi", tok, n=1_000_000_000)) == small_cap
    assert len(tasks.make_task_up_to("ioi", tok, n=5)) == 5
    with pytest.raises(ValueError, match="Unknown task"):
        tasks.make_task_up_to("nope", tok, n=5)

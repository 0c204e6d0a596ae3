"""The SAE experiments in the library: configs reject bad values at construction, and
``run``/``evaluate`` on tiny-llama give the numbers the ``sae`` commands write."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from structlens.cli import sae as sae_cli
from structlens.models import load_model
from structlens.sae import load_sae
from structlens.sae.experiment import (
    SAEEvaluationConfig,
    SAEExperimentConfig,
    SAEReport,
    evaluate,
    run,
)

SMALL = dict(layer=1, widths=(128,), k=4, prompts=12, eval_prompts=2, prompt_tokens=32)
FLAGS = ["--layer", "1", "--width", "128", "--k", "4", "--prompts", "12", "--eval-prompts", "2"]
FLAGS += ["--prompt-tokens", "32", "--batch-size", "64", "-q"]


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    [
        (SAEExperimentConfig, dict(arch="gated"), "unknown architecture 'gated'"),
        (SAEExperimentConfig, dict(widths=()), "widths must be positive"),
        (SAEExperimentConfig, dict(widths=(0, 64)), "widths must be positive"),
        (SAEExperimentConfig, dict(prompt_tokens=1), "prompt-tokens"),
        (SAEExperimentConfig, dict(epochs=0), "epochs"),
        (SAEEvaluationConfig, dict(eval_prompts=0), "eval-prompts"),
    ],
)
def test_configs_reject_bad_values_at_construction(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**kwargs)


def test_widths_are_sorted_and_distinct():
    assert SAEExperimentConfig(widths=(256, 64, 256)).widths == (64, 256)


def test_run_and_evaluate_equal_cli(tmp_path):
    model = load_model("tiny-llama")
    report = run(SAEExperimentConfig(batch_size=64, **SMALL), model, out=tmp_path / "lib")
    r = CliRunner().invoke(sae_cli.app, ["train", "tiny-llama", "--out", str(tmp_path), *FLAGS])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "sae_train.json").read_text())
    ours = json.loads(json.dumps(report.results["128"]))
    theirs = doc["per_width"]["128"]
    assert {k: v for k, v in ours.items() if k != "path"} == {
        k: v for k, v in theirs.items() if k != "path"
    }
    assert ours["eval"]["l0"] == 4.0  # TopK: exactly k active features
    sae = load_sae(tmp_path / "lib" / "saes" / "128")
    ev = evaluate(SAEEvaluationConfig(layer=1, eval_prompts=2, prompt_tokens=32), model, sae,
                  path=tmp_path / "lib" / "saes" / "128")  # fmt: skip
    assert ev.results["eval"] == ours["eval"] and ev.results["ce"] == ours["ce"]
    again = SAEReport.load(ev.save(tmp_path / "report"))
    assert again.payload()["eval"] == ours["eval"]

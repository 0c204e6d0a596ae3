"""The NDM experiments in the library: configs reject bad values at construction, and
``run`` on tiny-llama gives the numbers the ``ndm train`` command writes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from structlens.cli import ndm as ndm_cli
from structlens.models import load_model
from structlens.ndm import NDMResult
from structlens.ndm.experiment import (
    NDMEvaluationConfig,
    NDMExperimentConfig,
    NDMReport,
    load_rotation,
    run,
)

SMALL = dict(
    layers=(1,), corpus_prompts=6, task_prompts=0, unit_size=16, steps=12, bank_size=256,
    batch_size=16, refresh_interval=4, merge_start=6, merge_interval=6, mi_samples=200,
)  # fmt: skip


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    [
        (NDMExperimentConfig, dict(unit_size=0), "unit_size must be >= 1"),
        (NDMExperimentConfig, dict(mi_samples=1), "mi_samples"),
        (NDMExperimentConfig, dict(corpus_prompts=-1), "corpus_prompts"),
        (NDMExperimentConfig, dict(restarts=0), "restarts"),
        (NDMEvaluationConfig, dict(min_share=1.5), "min_share"),
        (NDMEvaluationConfig, dict(sae_epochs=0), "sae_epochs"),
        (NDMEvaluationConfig, dict(methods=("pca",)), "must include ndm"),
        (NDMEvaluationConfig, dict(methods=("ndm", "ica")), "must include ndm and only name"),
        (NDMEvaluationConfig, dict(tests=("nope",)), "unknown tests"),
        (NDMEvaluationConfig, dict(n=1), "at least 2"),
    ],
)
def test_configs_reject_bad_values_at_construction(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**kwargs)


def test_layers_are_checked_against_the_model():
    with pytest.raises(ValueError, match=r"must lie in \[0, 3\)"):
        NDMExperimentConfig(layers=(7,)).chosen_layers(3)


def test_run_equals_cli(tmp_path):
    model = load_model("tiny-llama")
    report = run(
        NDMExperimentConfig(**SMALL), model, out=tmp_path / "lib", activations=tmp_path / "acts"
    )
    args = ["train", "tiny-llama", "--layers", "1", "--corpus-prompts", "6", "--task-prompts"]
    args += ["0", "--unit-size", "16", "--steps", "12", "--bank-size", "256", "--batch-size"]
    args += ["16", "--refresh-interval", "4", "--merge-start", "6", "--merge-interval", "6"]
    args += ["--mi-samples", "200", "--activations", str(tmp_path / "acts")]
    r = CliRunner().invoke(ndm_cli.app, [*args, "--out", str(tmp_path / "cli"), "-q"])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "cli" / "ndm_train.json").read_text())
    timing = {"seconds", "queries_per_second"}
    ours = {k: v for k, v in report.results["1"].items() if k not in timing}
    theirs = {k: v for k, v in doc["results"]["1"].items() if k not in timing}
    assert json.loads(json.dumps(ours)) == theirs
    assert report.meta["partition"] == doc["partition"] and report.meta["store"] == doc["store"]
    R_lib, p_lib = load_rotation(tmp_path / "lib" / "R-L1.safetensors")
    R_cli, p_cli = load_rotation(tmp_path / "cli" / "R-L1.safetensors")
    np.testing.assert_array_equal(R_lib, R_cli)
    assert p_lib == p_cli == NDMResult.load(tmp_path / "lib" / "ndm-L1").partition
    assert np.allclose(R_lib.T @ R_lib, np.eye(R_lib.shape[0]), atol=1e-6)
    again = NDMReport.load(report.save(tmp_path / "report"))
    assert again.payload().keys() == report.payload().keys()


def test_restarts_are_run_and_the_kept_one_recorded(tmp_path):
    model = load_model("tiny-llama")
    cfg = NDMExperimentConfig(**SMALL, restarts=2)
    assert cfg.ndm.restarts == 2
    report = run(cfg, model, out=tmp_path / "out", activations=tmp_path / "acts")
    table = report.results["1"]["restarts"]
    assert [r["restart"] for r in table] == [0, 1] and sum(r["chosen"] for r in table) == 1
    kept = next(r for r in table if r["chosen"])
    assert kept["partition"] == report.results["1"]["partition"]
    assert report.meta["config"]["restarts"] == 2

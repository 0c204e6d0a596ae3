"""The causal-dimensionality experiment in the library: its config rejects bad values at
construction, and ``run`` on tiny-llama gives the numbers ``causal-dim jacobian`` writes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from structlens.causal_dim.experiment import CausalDimExperimentConfig, CausalDimReport, run
from structlens.cli import causal as causal_cli
from structlens.models import load_model
from structlens.sae.experiment import SAEExperimentConfig


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(analysis="wedge"), "analysis must be one of"),
        (dict(output="probs"), "output must be one of"),
        (dict(positions="all"), "positions must be one of"),
        (dict(layers=()), "layers must name"),
        (dict(jacobian_prompts=0), "jacobian_prompts"),
        (dict(analysis="sweep", sae_config=SAEExperimentConfig(widths=(64,))), "two widths"),
        (dict(percentile=100.0), "percentile"),
    ],
)
def test_config_rejects_bad_values_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CausalDimExperimentConfig(**kwargs)


def test_run_equals_cli(tmp_path):
    model = load_model("tiny-llama")
    cfg = CausalDimExperimentConfig(layers=(0, 2), jacobian_prompts=2)
    report, saes = run(cfg, model)
    assert saes == {}
    r = CliRunner().invoke(
        causal_cli.app,
        ["jacobian", "tiny-llama", "--out", str(tmp_path), "--layers", "0,2",
         "--jacobian-prompts", "2", "-q"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "causal_jacobian.json").read_text())
    assert json.loads(json.dumps(report.results)) == {k: doc[k] for k in ("kappa", "by_layer")}
    layers = report.results["by_layer"]["layers"]
    assert [e["layer"] for e in layers] == [0, 2]
    assert all(1 <= e["erank"] <= model.d_model for e in layers)
    with pytest.raises(ValueError, match=r"must lie in \[0, 3\)"):
        run(CausalDimExperimentConfig(layers=(5,)), model)
    again = CausalDimReport.load(report.save(tmp_path / "report"))
    assert again.payload()["kappa"] == report.payload()["kappa"]

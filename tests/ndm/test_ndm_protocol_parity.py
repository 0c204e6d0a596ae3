"""One protocol, one answer: ``structlens ndm``, ``structlens analyze`` and the NDM replication
run the same stages, so at the same protocol instance (``smoke``) on the same model they choose
the same layers by the share sweep, train the same rotation there and screen the same tests;
the evaluation prompts are never training prompts."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from structlens.cli import ndm as ndm_cli
from structlens.models import load_model
from structlens.ndm import stages
from structlens.ndm.experiment import load_rotation
from structlens.ndm.protocol import PROFILES
from structlens.results import to_jsonable

# tiny-llama (3 layers) builds only greater_than: every driver trains NDM at its one layer
TESTS = ["greater_than"]
PROTOCOL = PROFILES["smoke"]


@pytest.fixture(scope="module")
def drivers(tmp_path_factory):
    """Each driver's layer sweep, training record, rotation and screen of the test at the
    layer the sweep chose (``layer``)."""
    from structlens.analyze import AnalyzeConfig, run_analysis
    from structlens.replication.ndm import run as rep

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # bitwise-equal runs; the CI machine is oversubscribed anyway
    tmp = tmp_path_factory.mktemp("ndm-parity")
    out = {}
    try:
        runner = CliRunner()
        # no --layers: NDM is trained where the share sweep puts the tests
        train = ["train", "tiny-llama", "--protocol", "smoke"]
        r = runner.invoke(ndm_cli.app, [*train, "--activations", str(tmp / "acts"),
                                        "--out", str(tmp / "cli"), "-q"])  # fmt: skip
        assert r.exit_code == 0, r.output
        evaluate = ["evaluate", "tiny-llama", "--train", str(tmp / "cli"), "--no-toy"]
        r = runner.invoke(ndm_cli.app, [*evaluate, "--out", str(tmp / "cli-eval"), "-q"])
        assert r.exit_code == 0, r.output
        doc = json.loads((tmp / "cli" / "ndm_train.json").read_text())
        ev = json.loads((tmp / "cli-eval" / "ndm_evaluate.json").read_text())
        assert doc["protocol"] == ev["protocol"] == PROTOCOL.to_json()
        assert ev["layer_sweep"] == doc["layer_sweep"]  # evaluate reuses the recorded sweep
        out["layer"] = doc["layers"]
        (layer,) = doc["layers"]
        out["cli"] = {
            "sweep": doc["layer_sweep"],
            "record": doc["results"][str(layer)],
            "rotation": load_rotation(tmp / "cli" / f"R-L{layer}.safetensors")[0],
            "screen": ev["screen"],
            "gini_mean": ev["gini_mean"],
        }

        cfg = AnalyzeConfig(profile="smoke", stages=("ndm",), out=tmp / "analyze", progress=False)
        assert cfg.settings.ndm == PROTOCOL
        section = run_analysis(cfg, load_model("tiny-llama")).sections["ndm"]
        assert section["details"]["protocol"] == PROTOCOL.to_json()
        (trained,) = section["details"]["trained"]
        out["analyze"] = {"trained": trained, "tests": section["details"]["tests"],
                          "sweep": section["details"]["layer_sweep"]}  # fmt: skip

        s = rep.PROFILES["smoke"].replace(model="tiny-llama", tests=tuple(TESTS), protocol=PROTOCOL)
        replication = rep.NDMReplication(s, tmp / "replication")
        sweep_stage, sweep = replication.sweep()
        stage, _, per_layer = replication.train(sweep.layers)
        ev = replication.evaluate(stage, sweep_stage, sweep)
        out["replication"] = {
            "sweep": sweep.to_json(),
            "record": per_layer[layer],
            "rotation": load_rotation(replication.cache.path(stage) / f"R-L{layer}.safetensors")[0],
            # as the CLI's JSON document holds them (non-finite floats as strings)
            "screen": to_jsonable(ev.screen),
            "gini_mean": "no signal" if ev.gini_mean is None else to_jsonable(ev.gini_mean),
        }
    finally:
        torch.set_num_threads(before)
    return out


def test_every_driver_chooses_the_layers_by_the_same_sweep(drivers):
    sweeps = [drivers[d]["sweep"] for d in ("cli", "analyze", "replication")]
    assert sweeps[0] == sweeps[1] == sweeps[2]
    (choice,) = sweeps[0]["choices"]
    assert choice["test"] == "greater_than" and [choice["chosen"]] == drivers["layer"]
    assert len(choice["candidates"]) == len(choice["shares"]) >= 2  # the window was swept


def test_the_replication_trains_and_screens_as_the_cli(drivers):
    cli, rep = drivers["cli"], drivers["replication"]
    for key in ("partition", "steps", "converged", "loss_history", "merge_history", "config"):
        assert rep["record"][key] == cli["record"][key], key
    np.testing.assert_array_equal(rep["rotation"], cli["rotation"])
    assert rep["screen"] == cli["screen"] and rep["gini_mean"] == cli["gini_mean"]
    assert [row["test"] for row in cli["screen"]] == TESTS


def test_analyze_trains_and_screens_as_the_cli(drivers):
    cli, analyze = drivers["cli"], drivers["analyze"]
    trained = analyze["trained"]
    assert [trained["layer"]] == drivers["layer"]
    assert trained["partition"] == cli["record"]["partition"]
    assert trained["steps"] == cli["record"]["steps"]
    want = [(m["step"], m["max_mi"]) for m in cli["record"]["merge_history"]]
    assert [(m["step"], m["max_mi"]) for m in trained["merge_history"]] == want
    assert want  # the merge rounds ran, so the MI values compared are the trained rotation's
    (test,) = analyze["tests"]
    (row,) = cli["screen"]
    assert test["test"] == row["test"] and test["screened"] == row["screened"]
    np.testing.assert_allclose(test["whole_space_share"], row["whole_space_share"], rtol=1e-12)


def test_another_protocol_changes_the_answer(drivers, tmp_path):
    """The comparison can fail: another learning rate trains another rotation."""
    (layer,) = drivers["layer"]
    args = ["train", "tiny-llama", "--protocol", "smoke", "--layers", str(layer), "--lr", "0.01"]
    r = CliRunner().invoke(ndm_cli.app, [*args, "--activations", str(tmp_path / "acts"),
                                         "--out", str(tmp_path), "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
    other = json.loads((tmp_path / "ndm_train.json").read_text())["results"][str(layer)]
    assert other["loss_history"] != drivers["cli"]["record"]["loss_history"]


def test_evaluation_prompts_are_held_out_of_training():
    """With task prompts from the evaluation's own seed (the old rule) the sets overlap; the
    protocol's training prompts never include one, and an evaluation that would is refused."""
    from structlens.data.tasks import make_task
    from structlens.errors import InputError
    from structlens.ndm.experiment import _check_held_out

    model = load_model("tiny-llama")
    protocol = PROTOCOL.replace(task_prompts=12)
    held_out = stages.evaluation_prompts(protocol, model)["greater_than"]
    assert len(held_out) > 0
    old_rule = make_task("greater_than", model.tokenizer, n=12, seed=protocol.seed)
    assert any(tuple(t) in held_out for t in old_rule.clean)  # the leak the rule removes
    prompts = stages.training_prompts(protocol, model)
    tasks = [t for pid, t in prompts if pid.startswith("greater_than-")]
    assert len(tasks) == 12 and not any(tuple(t) in held_out for t in tasks)
    _check_held_out(protocol, model, prompts)
    with pytest.raises(InputError, match="evaluation prompts"):
        _check_held_out(protocol, model, [("x", list(t)) for t in held_out])

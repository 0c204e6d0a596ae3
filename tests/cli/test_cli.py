import json

import pytest
from typer.testing import CliRunner

from structlens.cli.main import app

runner = CliRunner()


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_models_and_sites(tmp_path):
    r = _run("models", "--out", tmp_path, "-q")
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "models.json").read_text())
    assert doc["schema_version"] == 1
    assert {"smollm2-135m", "minilm-l6", "tiny-llama"} <= {m["alias"] for m in doc["models"]}
    r = _run("sites", "tiny-gpt2", "--out", tmp_path, "-q")
    assert r.exit_code == 0, r.output
    sites = json.loads((tmp_path / "sites.json").read_text())["sites"]
    assert {"site": "blocks.2.attn.hook_z", "shape": [4, 16]} in sites
    assert sites[0]["site"] == "hook_embed"


def test_capture_command_writes_store(tmp_path):
    args = (
        "capture",
        "tiny-llama",
        "--sites",
        "blocks.*.hook_resid_pre,blocks.0.hook_attn_out",
        "--data",
        "corpus",
        "--max-prompts",
        3,
        "--prompt-tokens",
        32,
        "--out",
        tmp_path,
        "-q",
    )
    r = _run(*args)
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "capture.json").read_text())
    assert doc["sites"] == [
        "blocks.0.hook_resid_pre",
        "blocks.1.hook_resid_pre",
        "blocks.2.hook_resid_pre",
        "blocks.0.hook_attn_out",
    ]
    assert doc["n_tokens"] == 3 * 32
    assert _run(*args).exit_code == 0  # cache hit
    assert json.loads((tmp_path / "capture.json").read_text())["store"] == doc["store"]


@pytest.mark.parametrize(
    "args, message",
    [
        (("capture", "tiny-llama", "--sites", "blocks.0.hook_resid_pr"), "Did you mean"),
        (("capture", "tiny-llama", "--sites", "blocks.*.hook_nothing"), "matches no site"),
        (("capture", "tiny-llama", "--sites", "hook_embed", "--data", "/no/such.txt"), "such"),
        (("sites", "org/definitely-not-local"), "offline"),
        (("tasks", "eval", "--model", "tiny-bert"), "encoder"),
        (("tasks", "eval", "--model", "tiny-llama", "--task", "iio"), "ioi"),
    ],
)
def test_bad_input_exits_with_clear_message(tmp_path, monkeypatch, args, message):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = _run(*args, "--out", tmp_path)
    assert r.exit_code == 2, r.output
    assert message.lower() in r.output.lower()


def test_no_cli_module_is_over_200_lines():
    from pathlib import Path

    import structlens.cli

    for path in Path(structlens.cli.__file__).parent.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 200, path.name


def _option_names(*command):
    import typer

    cmd = typer.main.get_command(app)
    for name in command:
        cmd = cmd.commands[name]
    return [p.name for p in cmd.params]


def _sae_training(widths):
    return ["layer", widths, "arch", "k", "target_l0", "prompts", "eval_prompts",
            "prompt_tokens", "epochs", "batch_size", "lr_base"]  # fmt: skip


# the shared options, with the placement options every command that takes a model has
_COMMON = ["out", "device", "dtype", "seed", "quiet", "device_map", "max_memory", "revision"]


@pytest.mark.parametrize(
    "command, names",
    [
        (("sae", "train"), ["model", *_sae_training("width"), *_COMMON]),
        (
            ("causal-dim", "sweep"),
            [
                "model",
                "protocol",
                "layer",
                "widths",
                "k",
                "prompts",
                "eval_prompts",
                "prompt_tokens",
                "epochs",
                "batch_size",
                "lr_base",
                "percentile",
                "min_count",
                "n_bootstrap",
                "n_blocks",
                "extra_prompts",
                "generated_prompts",
                "fvu_tolerance",
                "jacobian_prompts",
                "jacobian_tokens",
                "saes",
                "allow_foreign",
                *_COMMON,
                "executor",
                "address",
            ],
        ),
        (
            ("equiv", "similarity"),
            [
                "model_a",
                "model_b",
                "protocol",
                "task",
                "n",
                "metric",
                "layer_matching",
                "head_matching",
                "representation",
                "threshold",
                "batch_size",
                *_COMMON,
            ],
        ),
        (
            ("causal-dim", "ablate"),
            [
                "model",
                "sae",
                "layer",
                "protocol",
                "eval_prompts",
                "prompt_tokens",
                "allow_foreign",
                *_COMMON,
            ],
        ),
    ],
)
def test_shared_option_blocks_keep_each_commands_option_order(command, names):
    """Options added from a shared block stand where the command declared them before."""
    assert _option_names(*command) == names

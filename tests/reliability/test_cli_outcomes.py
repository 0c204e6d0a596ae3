"""Every command group, fed bad input: one line ``error: ...``, exit 2, no traceback.

Each row is ``(id, argv, needles)``: ``{name}`` in an argument is replaced by the path of the
hostile file of that name (see ``conftest.files``); every needle must appear in the error
line, so the message names the input at fault.  Rows whose command succeeds are in
``OK_CASES`` and must exit 0.
"""

from __future__ import annotations

import pytest
import torch
from _outcome import assert_ok, assert_user_error, run_cli

M = "tiny-llama"
Q = "-q"

ERROR_CASES = [
    # load / sites
    ("sites-unknown-model", ["sites", "no-such-model-xyz", Q], ["no-such-model-xyz"]),
    ("sites-markup-name", ["sites", "[/x]", Q], ["[/x]"]),
    ("sites-markup-red", ["sites", "a[red]b", Q], ["a[red]b"]),
    ("sites-bad-dtype", ["sites", M, "--dtype", "float8", Q], ["float8"]),
    ("sites-unknown-device", ["sites", M, "--device", "quantum", Q], ["quantum"]),
    ("sites-missing-dir", ["sites", "{missing}", Q], ["does-not-exist"]),
    ("sites-missing-gguf", ["sites", "{root}/x.gguf", Q], ["x.gguf"]),
    ("sites-corrupt-config", ["sites", "{bad_config_model}", Q], []),
    ("sites-remote-code", ["sites", "{remote_code_model}", Q], []),
    ("sites-out-under-file", ["sites", M, "--out", "{under_file}", Q], []),
    ("usage-unknown-option", ["sites", M, "--no-such-option"], ["--no-such-option"]),
    ("usage-missing-model", ["sites"], ["model"]),
    ("usage-unknown-command", ["no-such-command"], ["no-such-command"]),
    # capture
    ("capture-bad-site", ["capture", M, "--sites", "blocks.0.nonsense", Q], ["nonsense"]),
    ("capture-layer-range", ["capture", M, "--sites", "blocks.99.hook_resid_pre", Q], ["99"]),
    (
        "capture-max-prompts-0",
        ["capture", M, "--sites", "hook_embed", "--max-prompts", 0, Q],
        ["0"],
    ),
    (
        "capture-max-prompts-neg",
        ["capture", M, "--sites", "hook_embed", "--max-prompts", -3, Q],
        [],
    ),
    (
        "capture-task-prompts-0",
        ["capture", M, "--sites", "hook_embed", "--data", "task:ioi", "--max-prompts", 0, Q],
        [],
    ),
    (
        "capture-batch-0",
        ["capture", M, "--sites", "hook_embed", "--max-prompts", 2, "--batch-size", 0, Q],
        ["batch_size"],
    ),
    (
        "capture-shard-0",
        ["capture", M, "--sites", "hook_embed", "--max-prompts", 2, "--shard-mb", 0, Q],
        ["shard_mb"],
    ),
    (
        "capture-prompt-tokens-0",
        ["capture", M, "--sites", "hook_embed", "--prompt-tokens", 0, Q],
        ["max_tokens"],
    ),
    (
        "capture-missing-data",
        ["capture", M, "--sites", "hook_embed", "--data", "{missing}", Q],
        ["does-not-exist"],
    ),
    (
        "capture-bad-utf8",
        ["capture", M, "--sites", "hook_embed", "--data", "{bad_utf8}", Q],
        ["latin1.txt"],
    ),
    ("capture-empty-data", ["capture", M, "--sites", "hook_embed", "--data", "{empty}", Q], []),
    (
        "capture-unknown-task",
        ["capture", M, "--sites", "hook_embed", "--data", "task:nope", Q],
        ["nope"],
    ),
    (
        "capture-bad-positions",
        ["capture", M, "--sites", "hook_embed", "--positions", "bogus", "--max-prompts", 2, Q],
        ["bogus"],
    ),
    (
        "capture-bad-store-dtype",
        ["capture", M, "--sites", "hook_embed", "--store-dtype", "int3", "--max-prompts", 2, Q],
        ["int3"],
    ),
    (
        "capture-bad-executor",
        ["capture", M, "--sites", "hook_embed", "--executor", "nope", Q],
        ["nope"],
    ),
    (
        "capture-address-no-ray",
        ["capture", M, "--sites", "hook_embed", "--address", "x:1", Q],
        ["--address"],
    ),
    (
        "capture-ray-no-cluster",
        [
            "capture",
            M,
            "--sites",
            "hook_embed",
            "--max-prompts",
            2,
            "--executor",
            "ray",
            "--address",
            "127.0.0.1:1",
            Q,
        ],
        ["no Ray cluster", "127.0.0.1:1"],
    ),
    # tasks
    ("tasks-unknown-task", ["tasks", "eval", "--model", M, "--task", "nope", Q], ["nope"]),
    ("tasks-n-0", ["tasks", "eval", "--model", M, "-n", 0, Q], []),
    ("tasks-n-neg", ["tasks", "eval", "--model", M, "-n", -5, Q], []),
    (
        "tasks-unknown-model",
        ["tasks", "eval", "--model", "no-such-model-xyz", Q],
        ["no-such-model-xyz"],
    ),
    # ndm
    (
        "ndm-browse-missing-train",
        ["ndm", "browse", M, "--train", "{missing}", "--prompt", "hi", Q],
        ["does-not-exist"],
    ),
    (
        "ndm-browse-garbage-train",
        ["ndm", "browse", M, "--train", "{ndm_garbage}", "--prompt", "hi", Q],
        [],
    ),
    (
        "ndm-evaluate-missing-train",
        ["ndm", "evaluate", M, "--train", "{missing}", Q],
        ["does-not-exist"],
    ),
    ("ndm-train-layer-range", ["ndm", "train", M, "--layers", "99", Q], ["99"]),
    ("ndm-train-steps-0", ["ndm", "train", M, "--layers", "0", "--steps", 0, Q], ["steps"]),
    # sae
    ("sae-eval-missing", ["sae", "eval", M, "--sae", "{missing}", Q], ["does-not-exist"]),
    ("sae-eval-short-bias", ["sae", "eval", M, "--sae", "{sae_short_bias}", Q], ["b_dec"]),
    ("sae-eval-bad-json", ["sae", "eval", M, "--sae", "{sae_bad_json}", Q], ["cfg.json"]),
    ("sae-eval-pickle", ["sae", "eval", M, "--sae", "{sae_pickle}", Q], ["sae-pickle"]),
    ("sae-eval-object-npz", ["sae", "eval", M, "--sae", "{sae_object_npz}", Q], ["object.npz"]),
    ("sae-eval-nan", ["sae", "eval", M, "--sae", "{sae_nan}", Q], ["NaN"]),
    ("sae-train-width-0", ["sae", "train", M, "--width", 0, Q], ["--widths"]),
    ("sae-train-k-0", ["sae", "train", M, "--width", 64, "--k", 0, Q], ["k"]),
    (
        "sae-train-batch-0",
        ["sae", "train", M, "--width", 64, "--batch-size", 0, Q],
        ["--batch-size"],
    ),
    ("sae-train-batch-1", ["sae", "train", M, "--width", 64, "--batch-size", 1, Q], ["batch size"]),
    ("sae-train-layer-range", ["sae", "train", M, "--width", 64, "--layer", 99, Q], ["99"]),
    ("sae-train-bad-arch", ["sae", "train", M, "--width", 64, "--arch", "nope", Q], ["nope"]),
    ("sae-sweep-bad-widths", ["sae", "sweep", M, "--widths", "abc", Q], ["abc"]),
    # koopman
    ("koopman-layer-range", ["koopman", "fit", M, "--layers", "99", Q], ["99"]),
    (
        "koopman-bad-dictionary",
        ["koopman", "fit", M, "--layers", "2", "--dictionary", "nope", Q],
        ["nope"],
    ),
    (
        "koopman-size-0",
        ["koopman", "fit", M, "--layers", "2", "--size", 0, "--n-task", 0, Q],
        ["size"],
    ),
    (
        "koopman-missing-sae",
        [
            "koopman",
            "fit",
            M,
            "--layers",
            "2",
            "--dictionary",
            "sae",
            "--sae",
            "{missing}",
            "--n-task",
            0,
            Q,
        ],
        ["does-not-exist"],
    ),
    (
        "koopman-foreign-sae",
        [
            "koopman",
            "fit",
            M,
            "--layers",
            "2",
            "--dictionary",
            "sae",
            "--sae",
            "{sae_short_bias}",
            "--n-task",
            0,
            Q,
        ],
        ["b_dec"],
    ),
    ("koopman-modes-k-0", ["koopman", "modes", M, "--layers", "2", "--k", 0, Q], ["k"]),
    ("koopman-reduce-order-0", ["koopman", "reduce", M, "--layers", "0-2", "--order", "0", Q], []),
    # causal-dim
    ("causal-layer-range", ["causal-dim", "jacobian", M, "--layers", "99", Q], ["99"]),
    ("causal-bad-output", ["causal-dim", "jacobian", M, "--output", "nope", Q], ["nope"]),
    (
        "causal-prompts-0",
        ["causal-dim", "jacobian", M, "--jacobian-prompts", 0, Q],
        ["--jacobian-prompts"],
    ),
    (
        "causal-ablate-missing-sae",
        ["causal-dim", "ablate", M, "--sae", "{missing}", Q],
        ["does-not-exist"],
    ),
    ("causal-sweep-width-0", ["causal-dim", "sweep", M, "--widths", "0", Q], ["--widths"]),
    # equiv
    (
        "equiv-unknown-model-b",
        ["equiv", "similarity", M, "no-such-model-xyz", Q],
        ["no-such-model-xyz"],
    ),
    ("equiv-bad-metric", ["equiv", "similarity", M, "tiny-qwen2", "--metric", "nope", Q], ["nope"]),
    ("equiv-bad-task", ["equiv", "similarity", M, "tiny-qwen2", "--task", "nope", Q], ["nope"]),
    ("equiv-n-0", ["equiv", "similarity", M, "tiny-qwen2", "-n", 0, Q], ["-n"]),
    ("equiv-n-1", ["equiv", "similarity", M, "tiny-qwen2", "-n", 1, Q], ["-n"]),
    # demo
    ("demo-unknown-model", ["demo", "--model", "no-such-model-xyz", Q], ["no-such-model-xyz"]),
    ("demo-n-0", ["demo", "--model", M, "-n", 0, Q], []),
]


COMMANDS = {
    "models",
    "sites",
    "capture",
    "tasks",
    "ndm",
    "sae",
    "koopman",
    "causal-dim",
    "equiv",
    "demo",
}


def _argv(args, files, tmp_path):
    out = []
    for a in args:
        a = str(a)
        for name, path in files.items():
            a = a.replace("{" + name + "}", str(path))
        out.append(a)
    if "--out" not in out and out[:2] != ["tasks", "list"] and out[0] in COMMANDS:
        out += ["--out", str(tmp_path / "out")]
    return out


@pytest.mark.parametrize(
    "argv,needles", [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES]
)
def test_user_error(capsys, files, tmp_path, monkeypatch, argv, needles):
    monkeypatch.chdir(tmp_path)
    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    o = run_cli(capsys, *_argv(argv, files, tmp_path))
    assert_user_error(o, *needles)
    assert not files["unpickled_marker"].exists()
    assert not (files["root"] / "PWNED").exists()


OK_CASES = [
    ("models", ["models", Q]),
    ("sites-tiny", ["sites", M, Q]),
    ("tasks-list", ["tasks", "list"]),
    (
        "capture-tiny",
        ["capture", M, "--sites", "hook_embed", "--max-prompts", 2, "--prompt-tokens", 16, Q],
    ),
    ("debug-flag-ok", ["--debug", "sites", M, Q]),
]


@pytest.mark.parametrize("argv", [c[1] for c in OK_CASES], ids=[c[0] for c in OK_CASES])
def test_ok(capsys, files, tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    assert_ok(run_cli(capsys, *_argv(argv, files, tmp_path)))


def test_cuda_absent_is_a_user_error(capsys, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    o = run_cli(capsys, "sites", M, "--device", "cuda", "--out", tmp_path, Q)
    assert_user_error(o, "cuda")


def test_debug_shows_the_traceback(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("STRUCTLENS_DEBUG", "1")
    (tmp_path / "file").write_text("")
    o = run_cli(capsys, "sites", M, "--out", tmp_path / "file" / "out", Q)
    assert o.code == 2 and "Traceback" in o.err and "error: " in o.err


def test_internal_bug_shows_traceback_and_asks_for_a_report(capsys, tmp_path, monkeypatch):
    import structlens.cli.models as models_cli

    def broken(*a, **k):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(models_cli, "write_results", broken)
    o = run_cli(capsys, "models", "--out", tmp_path, Q)
    assert o.code == 1 and "Traceback" in o.err and "report" in o.err

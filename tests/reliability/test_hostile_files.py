"""Truncated, garbage and contradictory files of every format structlens reads, each given to
the command that reads it: one line ``error: ...`` naming the file, exit 2, no traceback,
nothing unpickled, and every file already in the input and ``--out`` directories left as it
was (a refused input must not cost earlier results; new files, such as an activation cache
written before the file was read, may appear).

The files are built once (``conftest.hostile``): ``"{kind}:{variant}"`` names one, and each
kind says which command reads it and how.  Formats: GGUF (valid magic with the header or the
metadata cut short, garbage, empty), safetensors (empty, garbage, header cut short, header
length past the end of the file, data cut short) as model weights, SAE weights and NDM
rotations, numpy ``.npz`` (Gemma Scope ``params.npz``: a truncated zip, garbage, a pickle,
missing or text arrays), JSON (cut short, a list, not UTF-8, empty, garbage) as a model's
config.json, an SAE's cfg.json, ``analysis.json`` and ``ndm_train.json``, a pickle posing as
``pytorch_model.bin``, and config.json files whose head counts and sizes contradict each
other.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from _hostile import BAD_CONFIGS, GGUF_FILES, JSON_FILES, safetensors_variants
from _outcome import assert_user_error, run_cli

M = "tiny-llama"
Q = "-q"
SAFETENSORS = list(safetensors_variants(b"\0" * 16))
NPZ = [
    "truncated-zip",
    "garbage",
    "empty",
    "pickle",
    "missing-W_dec",
    "text-arrays",
    "short-b_dec",
]
SAE_CFG = [*JSON_FILES, "d-in-text", "k-list", "metadata-list"]

#: kind -> (argv with {path} for the hostile file, the file a message must name: "" for the
#: path itself, else a name inside it)
COMMANDS = {
    "gguf": (["sites", "{path}"], ""),
    "model-config": (["sites", "{path}"], "config.json"),
    "model-bad-config": (["sites", "{path}"], ""),
    "model-weights": (["sites", "{path}"], ""),
    "model-pickle": (["sites", "{path}"], ""),
    "sae-cfg": (["sae", "eval", M, "--sae", "{path}"], "cfg.json"),
    "sae-weights": (["sae", "eval", M, "--sae", "{path}"], "sae_weights.safetensors"),
    "gemma-scope": (
        ["koopman", "fit", M, "--layers", "2", "--dictionary", "sae", "--sae", "{path}"]
        + ["--n-task", "0", "--n-corpus", "8", "--prompt-tokens", "16"],
        "params.npz",
    ),
    "analysis": (["report", "{path}"], "analysis.json"),
    "ndm-train": (["ndm", "evaluate", M, "--train", "{path}"], "ndm_train.json"),
}

CASES = (
    [("gguf", v) for v in GGUF_FILES]
    + [("model-config", v) for v in JSON_FILES]
    + [("model-bad-config", v) for v in BAD_CONFIGS]
    + [("model-weights", v) for v in SAFETENSORS]
    + [("model-pickle", v) for v in ("bomb", "truncated-zip")]
    + [("sae-cfg", v) for v in SAE_CFG]
    + [("sae-weights", v) for v in [*SAFETENSORS, "missing-W_dec"]]
    + [("gemma-scope", v) for v in NPZ]
    + [("analysis", v) for v in [*JSON_FILES, "no-run"]]
    + [("ndm-train", v) for v in [*JSON_FILES, "no-store"]]
)

#: what each command writes to --out, so that a refusal that clobbered it would show
EARLIER_OUTPUT = ("sites", "sae_eval", "fit", "ndm_evaluate", "ndm_browse", "causal_ablate")


def _snapshot(*dirs):
    """Every file below ``dirs`` with its bytes (the hostile input included)."""
    return {
        p: p.read_bytes() for d in dirs if d.is_dir() for p in sorted(d.rglob("*")) if p.is_file()
    }


def _earlier_output(out):
    out.mkdir()
    for name in EARLIER_OUTPUT:
        (out / f"{name}.json").write_text(f'{{"written": "before, by {name}"}}\n')
    (out / "notes.txt").write_text("kept\n")


def _run(capsys, hostile, tmp_path, argv, path, needles):
    out = tmp_path / "out"
    _earlier_output(out)
    before = _snapshot(out, path if path.is_dir() else path.parent)
    argv = [a.replace("{path}", str(path)) for a in argv]
    o = run_cli(capsys, *argv, "--out", out, Q) if argv[0] != "report" else run_cli(capsys, *argv)
    assert_user_error(o, *needles)
    assert not hostile["marker"].exists(), "a pickle was unpickled"
    after = _snapshot(out, path if path.is_dir() else path.parent)
    # new files may appear (an activation cache written before the file was read); none of
    # the earlier ones may change or go
    changed = [p for p, blob in before.items() if after.get(p) != blob]
    assert not changed, f"a refused input changed or removed earlier files: {changed}"
    return o


@pytest.mark.parametrize("kind,variant", CASES, ids=[f"{k}:{v}" for k, v in CASES])
def test_hostile_file(capsys, hostile, tmp_path, monkeypatch, kind, variant):
    monkeypatch.chdir(tmp_path)
    argv, inner = COMMANDS[kind]
    path = hostile[f"{kind}:{variant}"]
    needles = [str(path / inner) if inner else str(path)]
    if kind == "model-bad-config":
        needles += BAD_CONFIGS[variant][1]
    _run(capsys, hostile, tmp_path, argv, path, needles)


# -- four inputs that used to end in a traceback ---------------------------------------------


def test_gguf_with_valid_magic_and_truncated_header(capsys, hostile, tmp_path):
    path = hostile["gguf:truncated-header"]
    assert path.read_bytes()[:4] == b"GGUF"
    o = _run(capsys, hostile, tmp_path, ["sites", "{path}"], path, [str(path), "GGUF file"])
    assert "truncated" in o.err and "bug" not in o.err


def test_hf_dataset_offline_says_how_to_pass_a_local_file(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = tmp_path / "out"
    _earlier_output(out)
    before = _snapshot(out)
    o = run_cli(
        capsys, "capture", M, "--sites", "hook_embed", "--data", "hf:nonexistent/dataset",
        "--out", out, Q,
    )  # fmt: skip
    assert_user_error(o, "nonexistent/dataset", "--data PATH", ".jsonl", "--data corpus")
    assert _snapshot(out) == before


def test_pickled_pytorch_model_bin_is_refused_with_the_way_to_convert_it(capsys, hostile, tmp_path):
    path = hostile["model-pickle:bomb"]
    o = _run(
        capsys, hostile, tmp_path, ["sites", "{path}"], path,
        [str(path / "pytorch_model.bin"), "pickle", "safe_serialization=True", "safetensors"],
    )  # fmt: skip
    assert "refused" in o.err


@pytest.mark.parametrize(
    "variant", ["kv-heads-32", "hidden-66-no-head-dim", "layers-0", "heads-0", "head-dim-0"]
)
def test_inconsistent_config_is_refused_before_the_model_is_built(
    capsys, hostile, tmp_path, monkeypatch, variant
):
    import transformers

    built = []
    real = transformers.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM,
        "from_pretrained",
        lambda *a, **k: built.append(a) or real(*a, **k),
    )
    path = hostile[f"model-bad-config:{variant}"]
    needles = [str(path / "config.json"), *BAD_CONFIGS[variant][1]]
    _run(capsys, hostile, tmp_path, ["sites", "{path}"], path, needles)
    assert built == [], "the model was built from a config that contradicts itself"


def test_check_config_accepts_the_configs_of_real_families():
    from structlens.models.loading import check_config

    # Gemma 2/3: head_dim * heads != hidden_size is legitimate; T5 names it d_kv
    check_config(
        {"model_type": "gemma3_text", "hidden_size": 640, "num_attention_heads": 4,
         "num_key_value_heads": 1, "head_dim": 256, "num_hidden_layers": 18},
        "gemma",
    )  # fmt: skip
    check_config(
        {"model_type": "t5", "d_model": 60, "num_heads": 8, "d_kv": 16, "num_layers": 2}, "t5"
    )
    with pytest.raises(ValueError, match="n_head = 0"):
        check_config({"model_type": "gpt2", "n_embd": 64, "n_head": 0}, "gpt2")
    with pytest.raises(ValueError, match="n_embd = 66 is not a multiple of n_head = 4"):
        check_config({"model_type": "gpt2", "n_embd": 66, "n_head": 4}, "gpt2")
    with pytest.raises(ValueError, match=r"\(text_config\): num_key_value_heads = 3"):
        check_config(
            {
                "model_type": "x",
                "text_config": {"num_attention_heads": 4, "num_key_value_heads": 3},
            },
            "vlm",
        )


# -- NDM rotations: a real `ndm train` run, its R-L0.safetensors broken in turn --------------


@pytest.fixture(scope="module")
def ndm_train(tmp_path_factory):
    from structlens.cli.main import main

    root = tmp_path_factory.mktemp("ndm-hostile")
    args = [
        "ndm", "train", M, "--layers", "0", "--corpus-prompts", "6", "--task-prompts", "0",
        "--unit-size", "8", "--steps", "4", "--bank-size", "256", "--batch-size", "16",
        "--refresh-interval", "2", "--merge-start", "100", "--mi-samples", "200",
        "--activations", str(root / "acts"), "--out", str(root / "train"), Q,
    ]  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 0
    return root / "train"


@pytest.mark.parametrize("variant", [*SAFETENSORS, "no-partition"])
def test_broken_ndm_rotation(capsys, hostile, ndm_train, tmp_path, variant):
    from safetensors.numpy import load_file, save_file

    train = tmp_path / "train"
    shutil.copytree(ndm_train, train, ignore=shutil.ignore_patterns("checkpoints"))
    rotation = train / "R-L0.safetensors"
    if variant == "no-partition":
        save_file(load_file(str(rotation)), str(rotation), metadata={"note": "no partition"})
    else:
        rotation.write_bytes(safetensors_variants(rotation.read_bytes())[variant])
    argv = ["ndm", "evaluate", M, "--train", "{path}"]
    _run(capsys, hostile, tmp_path, argv, train, [str(rotation)])


def test_the_matrix_covers_every_kind():
    assert {k for k, _ in CASES} == set(COMMANDS)
    assert np.unique([f"{k}:{v}" for k, v in CASES]).size == len(CASES)


def test_reading_blames_the_file_only_for_parser_errors(tmp_path):
    import json
    import struct

    from structlens.errors import DamagedFileError, InputError, is_user_error, reading

    path = tmp_path / "x.json"

    def caught(exc):
        try:
            with reading(path, "thing (JSON)"):
                raise exc
        except BaseException as err:  # noqa: BLE001  (the translation is under test)
            return err
        raise AssertionError("nothing raised")

    for parser_error in (
        json.JSONDecodeError("Expecting value", "", 0),
        struct.error("unpack_from requires a buffer"),
        KeyError("partition"),
        EOFError("No data left in file"),
    ):
        err = caught(parser_error)
        assert isinstance(err, DamagedFileError) and is_user_error(err)
        assert str(path) in str(err) and "thing (JSON)" in str(err)
        assert err.__cause__ is parser_error
    # a clear message already, a missing path, and a bug each pass unchanged
    for passed in (InputError("x.json: k must be positive"), FileNotFoundError(2, "no", "x")):
        assert caught(passed) is passed
    bug = TypeError("unsupported operand type(s)")
    assert caught(bug) is bug and not is_user_error(bug)

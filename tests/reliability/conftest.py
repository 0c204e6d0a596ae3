"""Hostile and damaged inputs shared by the reliability cases (built once per session)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from _hostile import BAD_CONFIGS, GGUF_FILES, JSON_FILES, Bomb, safetensors_variants


@pytest.fixture(scope="session")
def files(tmp_path_factory):
    """name -> path of every bad input a case can name as ``{name}``."""
    from structlens.models import load_model
    from structlens.sae import TopKSAE, save_sae

    root = tmp_path_factory.mktemp("hostile")
    f = {"root": root}
    f["bad_utf8"] = root / "latin1.txt"
    f["bad_utf8"].write_bytes(b"caf\xe9 au lait, " * 50)
    f["empty"] = root / "empty.txt"
    f["empty"].write_text("")
    f["a_file"] = root / "plain-file"
    f["a_file"].write_text("not a directory")
    f["under_file"] = f["a_file"] / "out"
    f["missing"] = root / "does-not-exist"

    bad_cfg = root / "bad-config-model"
    bad_cfg.mkdir()
    (bad_cfg / "config.json").write_text("{ this is not json")
    f["bad_config_model"] = bad_cfg

    remote = root / "remote-code-model"
    m = load_model("tiny-llama")
    m.hf.save_pretrained(remote)
    m.tokenizer.save_pretrained(remote)
    cfg = json.loads((remote / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "evil.EvilModel", "AutoConfig": "evil.EvilConfig"}
    cfg["model_type"] = "evil"
    (remote / "config.json").write_text(json.dumps(cfg))
    (remote / "evil.py").write_text(f"open({str(root / 'PWNED')!r}, 'w').write('x')\n")
    f["remote_code_model"] = remote

    good = root / "sae-good"
    sae = TopKSAE(m.d_model, 32, 4)
    save_sae(
        sae,
        good,
        hook_name="blocks.0.hook_resid_pre",
        model_name="tiny-llama",
        model_digest=m.fingerprint(),
    )
    f["sae_good"] = good

    foreign = root / "sae-foreign"
    save_sae(
        sae,
        foreign,
        hook_name="blocks.0.hook_resid_pre",
        model_name="tiny-llama",
        model_digest=load_model("tiny-llama", seed=7).fingerprint(),
    )
    f["sae_foreign"] = foreign

    short_bias = root / "sae-short-bias"
    save_sae(sae, short_bias)
    from safetensors.torch import load_file, save_file

    t = load_file(str(short_bias / "sae_weights.safetensors"))
    t["b_dec"] = torch.zeros(1)
    save_file(t, str(short_bias / "sae_weights.safetensors"))
    f["sae_short_bias"] = short_bias

    bad_json = root / "sae-bad-json"
    save_sae(sae, bad_json)
    (bad_json / "cfg.json").write_text('{"d_in": 32,')
    f["sae_bad_json"] = bad_json

    pickled = root / "sae-pickle"
    pickled.mkdir()
    marker = root / "UNPICKLED"

    class Bomb:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (pickled / "pytorch_model.bin").write_bytes(pickle.dumps(Bomb()))
    (pickled / "cfg.json").write_text(json.dumps({"d_in": 32, "d_sae": 8}))
    f["sae_pickle"] = pickled
    f["unpickled_marker"] = marker

    npz = root / "object.npz"
    np.savez(npz, W_enc=np.array([{"evil": 1}], dtype=object))
    f["sae_object_npz"] = npz

    nan_sae = root / "sae-nan"
    save_sae(sae, nan_sae)
    t = load_file(str(nan_sae / "sae_weights.safetensors"))
    t["W_dec"][0, 0] = float("nan")
    save_file(t, str(nan_sae / "sae_weights.safetensors"))
    f["sae_nan"] = nan_sae

    ndm_garbage = root / "ndm-garbage"
    ndm_garbage.mkdir()
    (ndm_garbage / "ndm_train.json").write_text("[1, 2")
    f["ndm_garbage"] = ndm_garbage
    return f


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    # an unknown model name must fail at once, not after hub retries
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def hostile(tmp_path_factory):
    """name -> path of every broken file of the hostile-file matrix; ``"{kind}:{variant}"``
    names the file or directory a command is given (see test_hostile_files.py)."""
    import io
    import shutil

    from safetensors.torch import load_file, save_file

    from structlens.models import load_model
    from structlens.sae import JumpReLUSAE, TopKSAE, save_sae

    root = tmp_path_factory.mktemp("hostile-files")
    h = {"root": root, "marker": root / "UNPICKLED"}
    m = load_model("tiny-llama")

    for name, blob in GGUF_FILES.items():
        h[f"gguf:{name}"] = root / f"gguf-{name}.gguf"
        h[f"gguf:{name}"].write_bytes(blob)

    # Hugging Face model directories: config.json, then the weights, broken in turn
    model = root / "model-good"
    m.hf.save_pretrained(model)
    m.tokenizer.save_pretrained(model)
    config = json.loads((model / "config.json").read_text())

    def model_copy(name):
        d = root / f"model-{name}"
        shutil.copytree(model, d)
        return d

    for name, blob in JSON_FILES.items():
        h[f"model-config:{name}"] = d = model_copy(f"config-{name}")
        (d / "config.json").write_bytes(blob)
    for name, (edit, _) in BAD_CONFIGS.items():
        h[f"model-bad-config:{name}"] = d = model_copy(f"bad-config-{name}")
        (d / "config.json").write_text(json.dumps({**config, **edit}))
    weights = (model / "model.safetensors").read_bytes()
    for name, blob in safetensors_variants(weights).items():
        h[f"model-weights:{name}"] = d = model_copy(f"weights-{name}")
        (d / "model.safetensors").write_bytes(blob)
    h["model-pickle:bomb"] = d = model_copy("pickle-bomb")
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(pickle.dumps(Bomb(h["marker"]), protocol=2))
    h["model-pickle:truncated-zip"] = d = model_copy("pickle-truncated-zip")
    (d / "model.safetensors").unlink()
    buf = io.BytesIO()
    torch.save(load_file(str(model / "model.safetensors")), buf)
    (d / "pytorch_model.bin").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])

    # SAELens directories: cfg.json, then sae_weights.safetensors, broken in turn
    sae = root / "sae-good"
    save_sae(TopKSAE(m.d_model, 32, 4), sae, hook_name="blocks.0.hook_resid_pre")

    def sae_copy(name):
        d = root / f"sae-{name}"
        shutil.copytree(sae, d)
        return d

    for name, blob in JSON_FILES.items():
        h[f"sae-cfg:{name}"] = d = sae_copy(f"cfg-{name}")
        (d / "cfg.json").write_bytes(blob)
    cfg = json.loads((sae / "cfg.json").read_text())
    for name, edit in {
        "d-in-text": {"d_in": "sixty-four"},
        "k-list": {"k": [4]},
        "metadata-list": {"metadata": [1, 2]},
    }.items():
        h[f"sae-cfg:{name}"] = d = sae_copy(f"cfg-{name}")
        (d / "cfg.json").write_text(json.dumps({**cfg, **edit}))
    sae_weights = (sae / "sae_weights.safetensors").read_bytes()
    for name, blob in safetensors_variants(sae_weights).items():
        h[f"sae-weights:{name}"] = d = sae_copy(f"weights-{name}")
        (d / "sae_weights.safetensors").write_bytes(blob)
    tensors = load_file(str(sae / "sae_weights.safetensors"))
    h["sae-weights:missing-W_dec"] = d = sae_copy("weights-missing-W_dec")
    save_file(
        {k: v for k, v in tensors.items() if k != "W_dec"}, str(d / "sae_weights.safetensors")
    )

    # Gemma Scope directories: params.npz broken
    jump = JumpReLUSAE(m.d_model, 32)
    arrays = {
        "W_enc": jump.W_enc.detach().numpy(),
        "W_dec": jump.W_dec.detach().numpy(),
        "b_enc": jump.b_enc.detach().numpy(),
        "b_dec": jump.b_dec.detach().numpy(),
        "threshold": np.full(32, 0.1, dtype=np.float32),
    }
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    npz = buf.getvalue()
    for name, blob in {
        "truncated-zip": npz[: len(npz) // 2],
        "garbage": np.random.default_rng(3).bytes(300),
        "empty": b"",
        "pickle": pickle.dumps(Bomb(h["marker"]), protocol=2),
    }.items():
        h[f"gemma-scope:{name}"] = d = root / f"gemma-scope-{name}"
        d.mkdir()
        (d / "params.npz").write_bytes(blob)
    for name, arrs in {
        "missing-W_dec": {k: v for k, v in arrays.items() if k != "W_dec"},
        "text-arrays": {**arrays, "W_enc": np.array(["a", "b"])},
        "short-b_dec": {**arrays, "b_dec": np.zeros(3, dtype=np.float32)},
    }.items():
        h[f"gemma-scope:{name}"] = d = root / f"gemma-scope-{name}"
        d.mkdir()
        np.savez(d / "params.npz", **arrs)

    # `structlens analyze` output directories: analysis.json broken (report.html from before)
    for name, blob in {**JSON_FILES, "no-run": b'{"schema_version": 1}'}.items():
        h[f"analysis:{name}"] = d = root / f"analysis-{name}"
        d.mkdir()
        (d / "analysis.json").write_bytes(blob)
        (d / "report.html").write_text("<html>the report from before</html>\n")

    # `ndm train` output directories: ndm_train.json broken
    for name, blob in {**JSON_FILES, "no-store": b'{"layers": [0]}'}.items():
        h[f"ndm-train:{name}"] = d = root / f"ndm-train-{name}"
        d.mkdir()
        (d / "ndm_train.json").write_bytes(blob)
    return h

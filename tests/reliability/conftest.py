"""Hostile and damaged inputs shared by the reliability cases (built once per session)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch


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

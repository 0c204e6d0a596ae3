"""Koopman's ``sae`` dictionary from published SAEs and transcoders
(:func:`structlens.koopman.pipeline.load_sae_dictionary`): the dictionary's features equal the
loaded module's encoder on the same states for each layout and for a registry name, and the
experiment's provenance check refuses a dictionary made from another model or site."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from structlens.errors import ForeignResultError
from structlens.koopman.experiment import KoopmanExperimentConfig, _check_sae
from structlens.koopman.pipeline import load_sae_dictionary
from structlens.provenance import ForeignResultWarning
from structlens.sae.formats import read_dictionary
from structlens.sae.registry import LOCAL_DIR_ENV, resolve

D, M = 6, 24
RNG = np.random.default_rng(4)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _gemma2(folder, *, skip=False, hf="model.layers.0.output"):
    folder.mkdir(parents=True)
    p = {"w_enc": _f32(D, M), "b_enc": _f32(M), "w_dec": _f32(M, D), "b_dec": _f32(D),
         "threshold": np.abs(_f32(M)) * 0.5}  # fmt: skip
    if skip:
        p["affine_skip_connection"] = _f32(D, D)
    save_file(p, str(folder / "params.safetensors"))
    (folder / "config.json").write_text(json.dumps({"hf_hook_point_in": hf, "model_name": "m"}))


def _sparsify(folder):
    folder.mkdir(parents=True)
    cfg = {"activation": "topk", "num_latents": M, "k": 4, "d_in": D, "transcode": False,
           "skip_connection": False, "normalize_decoder": True}  # fmt: skip
    (folder / "cfg.json").write_text(json.dumps(cfg))
    t = {
        "encoder.weight": _f32(M, D),
        "encoder.bias": _f32(M),
        "W_dec": _f32(M, D),
        "b_dec": _f32(D),
    }
    save_file(t, str(folder / "sae.safetensors"))


def _llama(folder):
    (folder / "checkpoints").mkdir(parents=True)
    hp = {"d_model": D, "d_sae": M, "act_fn": "jumprelu", "jump_relu_threshold": 0.2,
          "norm_activation": "dataset-wise", "apply_decoder_bias_to_pre_encoder": False,
          "dataset_average_activation_norm": {"in": 2.0, "out": 2.0},
          "hook_point_in": "blocks.1.hook_resid_post",
          "hook_point_out": "blocks.1.hook_resid_post"}  # fmt: skip
    (folder / "hyperparams.json").write_text(json.dumps(hp))
    t = {"encoder.weight": _f32(M, D), "encoder.bias": _f32(M), "decoder.weight": _f32(D, M),
         "decoder.bias": _f32(D)}  # fmt: skip
    save_file(t, str(folder / "checkpoints" / "final.safetensors"))


WRITERS = {
    "gemma-scope-2": lambda p: _gemma2(p / "resid_post" / "layer_0_width_16k_l0_small"),
    "gemma-scope-2-skip": lambda p: _gemma2(p / "transcoder" / "layer_0_x", skip=True),
    "sparsify": lambda p: _sparsify(p / "layers.0"),
    "llama-scope": lambda p: _llama(p / "L1R"),
}
FOLDERS = {"gemma-scope-2": "resid_post/layer_0_width_16k_l0_small",
           "gemma-scope-2-skip": "transcoder/layer_0_x", "sparsify": "layers.0",
           "llama-scope": "L1R"}  # fmt: skip


@pytest.mark.parametrize("layout", sorted(WRITERS))
def test_dictionary_features_are_the_encoder(tmp_path, layout):
    WRITERS[layout](tmp_path)
    folder = tmp_path / FOLDERS[layout]
    module = read_dictionary(folder).module
    x = (3 * RNG.standard_normal((50, D))).astype(np.float32)
    dictionary = load_sae_dictionary(folder).fit(x)
    with torch.no_grad():
        want = module.encode(torch.from_numpy(x)).double().numpy()
    assert (want > 0).any() and (want == 0).any()
    np.testing.assert_allclose(dictionary.transform(x), want, rtol=1e-5, atol=1e-5)


def test_registry_name_from_a_local_directory(tmp_path, monkeypatch):
    name = "gemma-scope-2-270m-pt-res/layer_12_width_16k_l0_medium"
    e = resolve(name)
    _gemma2(tmp_path / e.release / e.sae_id)
    monkeypatch.setenv(LOCAL_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    x = RNG.standard_normal((20, D))
    by_name = load_sae_dictionary(name).fit(x).transform(x)
    by_path = load_sae_dictionary(tmp_path / e.release / e.sae_id).fit(x).transform(x)
    np.testing.assert_array_equal(by_name, by_path)


class _Model:
    def __init__(self, name):
        self.name = name

    def fingerprint(self):
        return "0" * 64


def test_the_experiment_refuses_a_foreign_dictionary(tmp_path):
    _gemma2(tmp_path / "g", hf="model.layers.0.output")  # resid_post(0) = resid_pre(1)
    cfg = KoopmanExperimentConfig(
        analysis="fit", layers=(1,), dictionaries=("sae",), sae=tmp_path / "g"
    )
    with pytest.raises(ForeignResultError, match="made from model m"):
        _check_sae(cfg, _Model("someone/model"), pooled=False)
    assert _check_sae(cfg, _Model("m"), pooled=False) == []
    wrong = KoopmanExperimentConfig(
        analysis="fit", layers=(2,), dictionaries=("sae",), sae=tmp_path / "g", allow_foreign=True
    )
    with pytest.warns(ForeignResultWarning):
        assert _check_sae(wrong, _Model("m"), pooled=False)  # the site differs

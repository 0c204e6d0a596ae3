"""Published SAE and transcoder layouts (structlens.sae.formats): each test writes a tiny file
in one layout exactly as its publisher does and checks that the loaded module computes what
that layout's documented forward computes, in NumPy from the raw arrays; damaged files give
one-line DamagedFileErrors naming the file."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from structlens.errors import DamagedFileError, ForeignResultError, InputError
from structlens.provenance import ForeignResultWarning
from structlens.sae import (
    JumpReLUSAE,
    TopKSAE,
    Transcoder,
    detect_format,
    load_dictionary,
    load_sae,
    read_dictionary,
    save_sae,
)
from structlens.sae.formats import PretrainedDictionary, check_dictionary

D, M, N = 6, 20, 64
RNG = np.random.default_rng(0)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _x(d=D, scale=1.0):
    return (scale * RNG.standard_normal((N, d))).astype(np.float32)


def _run(module, x):
    with torch.no_grad():
        f = module.encode(torch.from_numpy(x)).numpy()
        y = module(torch.from_numpy(x)).numpy()
    return f, y


def _topk(pre, k):
    out = np.zeros_like(pre)
    idx = np.argsort(-pre, axis=1)[:, :k]
    rows = np.arange(pre.shape[0])[:, None]
    out[rows, idx] = np.maximum(pre[rows, idx], 0)
    return out


def _jump(pre, theta):
    return pre * (pre > theta)


# ---------------------------------------------------------------- Gemma Scope 1 and 2
def test_gemma_scope_1_npz(tmp_path):
    p = {"W_enc": _f32(D, M), "W_dec": _f32(M, D), "b_enc": _f32(M), "b_dec": _f32(D)}
    p["threshold"] = np.abs(_f32(M))
    np.savez(tmp_path / "params.npz", **p)
    d = read_dictionary(tmp_path)
    assert d.format == detect_format(tmp_path) == "gemma-scope"
    x = _x()
    f, y = _run(d.module, x)
    f_ref = _jump(x @ p["W_enc"] + p["b_enc"], p["threshold"])
    np.testing.assert_allclose(f, f_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, f_ref @ p["W_dec"] + p["b_dec"], rtol=1e-5, atol=1e-4)


def test_gemma_scope_1_transcoder(tmp_path):
    folder = tmp_path / "gemma-scope-2b-pt-transcoders" / "layer_3" / "width_16k" / "average_l0_54"
    folder.mkdir(parents=True)
    p = {"w_enc": _f32(D, M), "w_dec": _f32(M, D), "b_enc": _f32(M), "b_dec": _f32(D)}
    p["threshold"] = np.abs(_f32(M))
    np.savez(folder / "params.npz", **p)
    d = read_dictionary(folder)
    assert d.is_transcoder and d.module.W_skip is None
    assert (d.input_site, d.output_site) == (None, "blocks.3.hook_mlp_out")
    x = _x()
    f, y = _run(d.module, x)
    f_ref = _jump(x @ p["w_enc"] + p["b_enc"], p["threshold"])
    np.testing.assert_allclose(y, f_ref @ p["w_dec"] + p["b_dec"], rtol=1e-5, atol=1e-4)


def _gemma2_params(d_out=D, skip=False, upper=False):
    p = {"w_enc": _f32(D, M), "b_enc": _f32(M), "w_dec": _f32(M, d_out), "b_dec": _f32(d_out)}
    p["threshold"] = np.abs(_f32(M))
    if skip:
        p["affine_skip_connection"] = _f32(D, d_out)
    return {k.upper() if upper and k.startswith("w_") else k: v for k, v in p.items()}


@pytest.mark.parametrize("upper", [False, True])
def test_gemma_scope_2_jumprelu_sae(tmp_path, upper):
    folder = tmp_path / "resid_post" / "layer_12_width_16k_l0_medium"
    folder.mkdir(parents=True)
    p = _gemma2_params(upper=upper)
    save_file(p, str(folder / "params.safetensors"))
    d = read_dictionary(folder)
    assert d.format == "gemma-scope-2" and isinstance(d.module, JumpReLUSAE)
    assert d.metadata["hook_name"] == "blocks.12.hook_resid_post"
    q = {k.lower(): v for k, v in p.items()}
    x = _x()
    f, y = _run(d.module, x)
    f_ref = _jump(x @ q["w_enc"] + q["b_enc"], q["threshold"])
    np.testing.assert_allclose(f, f_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, f_ref @ q["w_dec"] + q["b_dec"], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("key", ["affine_skip_connection", "w_skip", "W_skip"])
def test_gemma_scope_2_skip_transcoder(tmp_path, key):
    folder = tmp_path / "transcoder_all" / "layer_3_width_16k_l0_small_affine"
    folder.mkdir(parents=True)
    p = _gemma2_params(skip=True)
    p[key] = p.pop("affine_skip_connection")
    save_file(p, str(folder / "params.safetensors"))
    cfg = {"hf_hook_point_in": "model.layers.3.pre_feedforward_layernorm.output",
           "hf_hook_point_out": "model.layers.3.post_feedforward_layernorm.output",
           "model_name": "google/gemma-3-1b-pt", "architecture": "jump_relu", "width": M,
           "l0": 20, "affine_connection": True, "type": "transcoder"}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(cfg))
    d = read_dictionary(folder)
    assert d.is_transcoder and isinstance(d.module, Transcoder)
    # the pre-feed-forward norm's output includes its gain: no structlens site
    assert (d.input_site, d.output_site) == (None, "blocks.3.hook_mlp_out")
    assert d.metadata["hf_hook_name"] == cfg["hf_hook_point_in"]
    assert (d.module.input_site, d.module.output_site) == (d.input_site, d.output_site)
    assert d.metadata["config"] == cfg and d.metadata["model_name"] == "google/gemma-3-1b-pt"
    x = _x()
    f, y = _run(d.module, x)
    f_ref = _jump(x @ p["w_enc"] + p["b_enc"], p["threshold"])
    np.testing.assert_allclose(f, f_ref, rtol=1e-5, atol=1e-5)
    y_ref = f_ref @ p["w_dec"] + p["b_dec"] + x @ p[key]  # untransposed, as Gemma Scope 2's
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-4)
    with pytest.raises(InputError, match="transcoder"):
        load_sae(folder)  # an SAE loader does not hand out a transcoder


@pytest.mark.parametrize(
    "folder, hf, site",
    [
        ("resid_post_all/layer_10_width_262k_l0_small", "model.layers.10.output",
         "blocks.10.hook_resid_post"),
        ("attn_out_all/layer_11_width_16k_l0_small", "model.layers.11.self_attn.o_proj.input",
         "blocks.11.attn.hook_z"),
        ("mlp_out/layer_2_width_16k_l0_big", "model.layers.2.post_feedforward_layernorm.output",
         "blocks.2.hook_mlp_out"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("with_config", [True, False])
def test_gemma_scope_2_sites(tmp_path, folder, hf, site, with_config):
    path = tmp_path / folder
    path.mkdir(parents=True)
    save_file(_gemma2_params(), str(path / "params.safetensors"))
    if with_config:  # else inferred from the folder name, as SAELens does
        (path / "config.json").write_text(json.dumps({"hf_hook_point_in": hf}))
    d = read_dictionary(path)
    assert not d.is_transcoder
    assert (d.metadata["hf_hook_name"], d.input_site) == (hf, site)


def test_gemma_scope_2_transcoder_without_skip_by_folder_name(tmp_path):
    folder = tmp_path / "transcoder_all" / "layer_1_width_16k_l0_small"
    folder.mkdir(parents=True)
    save_file(_gemma2_params(), str(folder / "params.safetensors"))
    d = read_dictionary(folder)
    assert d.is_transcoder and d.module.W_skip is None
    assert d.output_site == "blocks.1.hook_mlp_out"


def test_gemma_scope_2_affine_config_without_skip_is_refused(tmp_path):
    save_file(_gemma2_params(), str(tmp_path / "params.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"affine_connection": True}))
    with pytest.raises(InputError, match="affine_connection"):
        read_dictionary(tmp_path)


def test_gemma_scope_2_keys_differing_in_case_only_are_refused(tmp_path):
    p = _gemma2_params()
    p["W_ENC"] = p["w_enc"]
    save_file(p, str(tmp_path / "params.safetensors"))
    with pytest.raises(InputError, match="twice"):
        read_dictionary(tmp_path)


# ---------------------------------------------------------------- sparsify
def _sparsify(folder, *, d_out=D, transcode=False, skip=False, run_model=None):
    folder.mkdir(parents=True)
    cfg = {"activation": "topk", "expansion_factor": 32, "normalize_decoder": True,
           "num_latents": M, "k": 3, "multi_topk": False, "skip_connection": skip,
           "transcode": transcode, "d_in": D}  # fmt: skip
    (folder / "cfg.json").write_text(json.dumps(cfg))
    t = {"encoder.weight": _f32(M, D), "encoder.bias": _f32(M), "W_dec": _f32(M, d_out)}
    t["b_dec"] = _f32(d_out)
    if skip:
        t["W_skip"] = _f32(d_out, D)
    save_file(t, str(folder / "sae.safetensors"))
    if run_model:
        (folder.parent / "config.json").write_text(json.dumps({"model": run_model}))
    return t


def _sparsify_forward(t, x, transcode):
    """sparsify's SparseCoder forward, from its arrays."""
    s = x if transcode else x - t["b_dec"]
    pre = np.maximum(s @ t["encoder.weight"].T + t["encoder.bias"], 0)
    f = _topk(pre, 3)
    y = f @ t["W_dec"] + t["b_dec"]
    if "W_skip" in t:
        y = y + x @ t["W_skip"].T
    return f, y


def test_sparsify_sae(tmp_path):
    t = _sparsify(tmp_path / "run" / "layers.4", run_model="EleutherAI/pythia-70m")
    d = read_dictionary(tmp_path / "run" / "layers.4")
    assert d.format == "sparsify" and isinstance(d.module, TopKSAE)
    assert d.metadata == {
        "hook_name": "blocks.4.hook_resid_post",
        "model_name": "EleutherAI/pythia-70m",
    }
    x = _x()
    f, y = _run(d.module, x)
    f_ref, y_ref = _sparsify_forward(t, x, transcode=False)
    np.testing.assert_allclose(f, f_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("transcode,skip", [(True, True), (True, False), (False, True)])
def test_sparsify_transcoders_and_skip(tmp_path, transcode, skip):
    folder = tmp_path / "layers.2.mlp"
    t = _sparsify(folder, transcode=transcode, skip=skip)
    d = read_dictionary(folder)
    assert d.is_transcoder
    if transcode:
        assert d.output_site == "blocks.2.hook_mlp_out" and d.input_site is None
    x = _x()
    f, y = _run(d.module, x)
    f_ref, y_ref = _sparsify_forward(t, x, transcode=transcode)
    np.testing.assert_allclose(f, f_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("edit", [{"activation": "groupmax"}, {"signed": True}])
def test_sparsify_unsupported_activation_is_refused(tmp_path, edit):
    _sparsify(tmp_path / "layers.0")
    cfg = json.loads((tmp_path / "layers.0" / "cfg.json").read_text())
    (tmp_path / "layers.0" / "cfg.json").write_text(json.dumps({**cfg, **edit}))
    with pytest.raises(InputError, match="only unsigned TopK"):
        read_dictionary(tmp_path / "layers.0")


# ---------------------------------------------------------------- Llama Scope
def _llama(folder, *, act="jumprelu", norms=(3.0, 5.0), d_out=D, per_feature=False,
           pre_bias=False, layout="hyperparams", decoder_norm=True,
           mode="dataset-wise"):  # fmt: skip
    folder.mkdir(parents=True)
    hp = {"d_model": D, "d_sae": M, "act_fn": act, "jump_relu_threshold": 0.3, "top_k": 4,
          "hook_point_in": "blocks.7.hook_resid_post",
          "hook_point_out": "blocks.7.hook_resid_post" if d_out == D else "blocks.7.hook_mlp_out",
          "norm_activation": mode, "apply_decoder_bias_to_pre_encoder": pre_bias,
          "sparsity_include_decoder_norm": decoder_norm, "use_decoder_bias": True,
          "dataset_average_activation_norm": {"in": norms[0], "out": norms[1]}}  # fmt: skip
    t = {"encoder.weight": _f32(M, D), "encoder.bias": _f32(M), "decoder.weight": _f32(d_out, M)}
    t["decoder.bias"] = _f32(d_out)
    if per_feature:
        t["log_jumprelu_threshold"] = np.log(np.abs(_f32(M)) + 0.05).astype(np.float32)
    if layout == "hyperparams":
        (folder / "hyperparams.json").write_text(json.dumps(hp))
        (folder / "checkpoints").mkdir()
        save_file(t, str(folder / "checkpoints" / "final.safetensors"))
    else:  # the later releases: config.json + sae_weights.safetensors
        if layout == "llamascopium":  # W_E [d, d_sae], W_D [d_sae, d], norms in the weights
            t = {"W_E": t["encoder.weight"].T.copy(), "b_E": t["encoder.bias"],
                 "W_D": t["decoder.weight"].T.copy(), "b_D": t["decoder.bias"],
                 **({"activation_function.log_jumprelu_threshold": t["log_jumprelu_threshold"]}
                    if per_feature else {}),
                 "dataset_average_activation_norm.blocks.7.hook_resid_post":
                     np.array(norms[0], np.float32)}  # fmt: skip
            if norms[0] != norms[1]:
                raise ValueError("one hook point, one norm")
            del hp["dataset_average_activation_norm"]
        (folder / "config.json").write_text(json.dumps(hp))
        save_file(t, str(folder / "sae_weights.safetensors"))
    return hp, t


def _gate(hp, t, hidden):
    theta = np.exp(t["log_jumprelu_threshold"]) if "log_jumprelu_threshold" in t else 0.3
    if hp["act_fn"] == "topk":
        return _topk(hidden, hp["top_k"])
    if hp["act_fn"] == "relu":
        return np.maximum(hidden, 0)
    return _jump(hidden, theta)


def _llama_first_forward(hp, t, x):
    """What the publisher's loader of the first releases (lm_saes ``from_pretrained``) runs,
    step by step: the dataset norm folded (b_E/s_in, b_D/s_out, W_D·s_in/s_out), the decoder
    made unit-norm with its norms moved into the encoder, then the plain forward on raw x."""
    n = hp["dataset_average_activation_norm"]
    s_in, s_out = math.sqrt(D) / n["in"], math.sqrt(D) / n["out"]
    W_E, b_E = t["encoder.weight"].astype(np.float64), t["encoder.bias"] / s_in
    W_D, b_D = t["decoder.weight"] * s_in / s_out, t["decoder.bias"] / s_out
    if hp["sparsity_include_decoder_norm"]:
        norm = np.linalg.norm(W_D, axis=0)
        W_D, W_E, b_E = W_D / norm, W_E * norm[:, None], b_E * norm
    xin = x - b_D if hp["apply_decoder_bias_to_pre_encoder"] else x
    f = _gate(hp, t, xin @ W_E.T + b_E)
    return f, f @ W_D.T + b_D


def _llama_later_forward(hp, t, x, s_in, s_out):
    """The later loader's forward: inputs normalised, gating on the pre-activation times the
    decoder norm, the output de-normalised; features are the ungated pre-activations."""
    W_E, W_D = t["encoder.weight"], t["decoder.weight"]
    pre = (x * s_in) @ W_E.T + t["encoder.bias"]
    norm = np.linalg.norm(W_D, axis=0) if hp["sparsity_include_decoder_norm"] else 1.0
    f = _gate(hp, t, pre * norm) / norm
    return f, (f @ W_D.T + t["decoder.bias"]) / s_out


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"per_feature": True},
        {"act": "topk"},
        {"act": "relu", "pre_bias": True},
        {"pre_bias": True, "norms": (4.0, 4.0)},
        {"decoder_norm": False},
        {"norms": (1.0, 1.0)},
        {"d_out": D + 1},  # a transcoder (another output site and width)
    ],
)
def test_llama_scope_first_releases(tmp_path, kw):
    hp, t = _llama(tmp_path / "L7R", **kw)
    d = read_dictionary(tmp_path / "L7R")
    assert d.format == "llama-scope" and d.input_site == "blocks.7.hook_resid_post"
    assert d.is_transcoder == ("d_out" in kw)
    x = _x(scale=4.0)  # raw activations, not the SAE's unit-scale inputs
    f, y = _run(d.module, x)
    f_ref, y_ref = _llama_first_forward(hp, t, x)
    assert (f_ref > 0).any() and (f_ref == 0).any()  # the gate matters
    np.testing.assert_allclose(f, f_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "kw",
    [
        {"layout": "config", "per_feature": True},
        {"layout": "config", "act": "topk", "decoder_norm": False},
        {"layout": "config", "mode": "inference", "per_feature": True},
        {"layout": "llamascopium", "per_feature": True, "norms": (2.5, 2.5)},
    ],
)
def test_llama_scope_later_releases(tmp_path, kw):
    hp, t = _llama(tmp_path / "L7R", **kw)
    if kw["layout"] == "llamascopium":  # back to the first generation's names
        t = {"encoder.weight": t["W_E"].T, "encoder.bias": t["b_E"], "decoder.weight": t["W_D"].T,
             "decoder.bias": t["b_D"], "log_jumprelu_threshold":
             t["activation_function.log_jumprelu_threshold"]}  # fmt: skip
    d = read_dictionary(tmp_path / "L7R")
    assert d.format == "llama-scope"
    n_in, n_out = (
        (math.sqrt(D), math.sqrt(D))
        if kw.get("mode") == "inference"
        else kw.get("norms", (3.0, 5.0))
    )
    s = (math.sqrt(D) / n_in, math.sqrt(D) / n_out)
    x = _x(scale=4.0)
    f, y = _run(d.module, x)
    f_ref, y_ref = _llama_later_forward(hp, t, x, *s)
    norm = np.linalg.norm(t["decoder.weight"], axis=0) if hp["sparsity_include_decoder_norm"] else 1
    assert (f_ref > 0).any() and (f_ref == 0).any()
    # the same features, each scaled by its decoder norm (our decoder rows are unit-norm)
    np.testing.assert_allclose(f, f_ref * norm, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["token-wise", "batch-wise", None])
def test_llama_scope_per_token_normalisation_is_refused(tmp_path, mode):
    _llama(tmp_path / "L7R")
    hp = json.loads((tmp_path / "L7R" / "hyperparams.json").read_text())
    hp["norm_activation"] = mode
    (tmp_path / "L7R" / "hyperparams.json").write_text(json.dumps(hp))
    with pytest.raises(InputError, match="norm_activation"):
        read_dictionary(tmp_path / "L7R")


# ---------------------------------------------------------------- SAELens 6
def test_saelens_6_sparsity_and_neuronpedia_id(tmp_path):
    sae = TopKSAE(D, M, 3, seed=1)
    with torch.no_grad():
        sae.b_dec.copy_(torch.from_numpy(_f32(D)))
        sae.b_enc.copy_(torch.from_numpy(_f32(M)))
    save_sae(sae, tmp_path, hook_name="blocks.1.hook_resid_pre", model_name="gpt2",
             metadata={"neuronpedia_id": "gpt2-small/1-res-jb"})  # fmt: skip
    log_density = RNG.uniform(-6, 0, M).astype(np.float32)
    save_file({"sparsity": log_density}, str(tmp_path / "sparsity.safetensors"))
    d = read_dictionary(tmp_path)
    assert d.format == "saelens"
    assert d.metadata["neuronpedia_id"] == "gpt2-small/1-res-jb"
    np.testing.assert_allclose(d.log_sparsity, log_density)
    x = _x()
    f, y = _run(d.module, x)
    W_enc, W_dec = sae.W_enc.detach().numpy(), sae.W_dec.detach().numpy()
    b_enc, b_dec = sae.b_enc.detach().numpy(), sae.b_dec.detach().numpy()
    f_ref = _topk((x - b_dec) @ W_enc + b_enc, 3)  # SAELens: apply_b_dec_to_input
    np.testing.assert_allclose(f, f_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, f_ref @ W_dec + b_dec, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "arch", ["transcoder", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder"]
)
def test_saelens_6_transcoders(tmp_path, arch):
    d_out = D + 3
    t = {"W_enc": _f32(D, M), "b_enc": _f32(M), "W_dec": _f32(M, d_out), "b_dec": _f32(d_out)}
    if "jumprelu" in arch:
        t["threshold"] = np.abs(_f32(M))
    if "skip" in arch:
        t["W_skip"] = _f32(d_out, D)  # SAELens: [d_out, d_in], ŷ = … + x @ W_skipᵀ
    save_file(t, str(tmp_path / "sae_weights.safetensors"))
    meta = {"model_name": "gpt2", "hook_name": "blocks.2.ln2.hook_normalized",
            "hook_name_out": "blocks.2.hook_mlp_out", "neuronpedia_id": "gpt2/2-tc"}  # fmt: skip
    cfg = {"architecture": arch, "d_in": D, "d_sae": M, "d_out": d_out, "dtype": "float32",
           "apply_b_dec_to_input": False, "normalize_activations": "none",
           "metadata": meta}  # fmt: skip
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    save_file({"sparsity": np.full(M, -2.0, np.float32)}, str(tmp_path / "sparsity.safetensors"))
    d = read_dictionary(tmp_path)
    assert d.format == "saelens" and d.is_transcoder
    assert (d.input_site, d.output_site) == (meta["hook_name"], meta["hook_name_out"])
    assert d.metadata["neuronpedia_id"] == "gpt2/2-tc" and d.log_sparsity.shape == (M,)
    x = _x()
    f, y = _run(d.module, x)
    pre = x @ t["W_enc"] + t["b_enc"]
    f_ref = _jump(pre, t["threshold"]) if "jumprelu" in arch else np.maximum(pre, 0)
    np.testing.assert_allclose(f, np.maximum(f_ref, 0), rtol=1e-5, atol=1e-5)
    y_ref = np.maximum(f_ref, 0) @ t["W_dec"] + t["b_dec"]
    if "skip" in arch:
        y_ref = y_ref + x @ t["W_skip"].T
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-4)
    (tmp_path / "cfg.json").write_text(json.dumps({**cfg, "d_out": d_out + 1}))
    with pytest.raises(InputError, match="d_out"):
        read_dictionary(tmp_path)


def test_saelens_top_level_neuronpedia_id(tmp_path):
    save_sae(TopKSAE(D, M, 3), tmp_path)
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    (tmp_path / "cfg.json").write_text(json.dumps({**cfg, "neuronpedia_id": "x/y"}))
    assert read_dictionary(tmp_path).metadata["neuronpedia_id"] == "x/y"


def test_wrong_sparsity_shape_is_refused(tmp_path):
    save_sae(TopKSAE(D, M, 3), tmp_path)
    save_file({"sparsity": np.zeros(M + 1, np.float32)}, str(tmp_path / "sparsity.safetensors"))
    with pytest.raises(InputError, match="sparsity"):
        read_dictionary(tmp_path)


# ---------------------------------------------------------------- provenance
class _Model:
    def __init__(self, name):
        self.name = name

    def fingerprint(self):
        return "f" * 64


def _d(meta):
    return PretrainedDictionary(module=None, format="gemma-scope-2", path=None, metadata=meta)


def test_provenance_of_published_dictionaries():
    m = _Model("google/gemma-2-2b")
    # the same model without its organisation, and resid_post L = resid_pre L+1: no mismatch
    meta = {"model_name": "gemma-2-2b", "hook_name": "blocks.4.hook_resid_post"}
    assert check_dictionary(_d(meta), model=m, site="blocks.5.hook_resid_pre") == []
    with pytest.raises(ForeignResultError, match="site blocks.4.hook_resid_post"):
        check_dictionary(_d(meta), model=m, site="blocks.4.hook_resid_pre")
    with pytest.raises(ForeignResultError, match="gemma-2-9b"):
        check_dictionary(_d({"model_name": "gemma-2-9b"}), model=m)
    with pytest.warns(ForeignResultWarning):
        assert check_dictionary(_d({"model_name": "gpt2"}), model=m, allow_foreign=True)


def test_load_dictionary_checks_the_site(tmp_path):
    folder = tmp_path / "resid_post" / "layer_2_width_16k_l0_small"
    folder.mkdir(parents=True)
    save_file(_gemma2_params(), str(folder / "params.safetensors"))
    assert load_dictionary(folder, site="blocks.3.hook_resid_pre").d_sae == M
    with pytest.raises(ForeignResultError):
        load_dictionary(folder, site="blocks.2.hook_resid_pre")


# ---------------------------------------------------------------- damaged files
def _valid_st(folder, name, tensors):
    save_file(tensors, str(folder / name))
    return (folder / name).read_bytes()


def _damage(good: bytes) -> dict[str, bytes]:
    n = int.from_bytes(good[:8], "little")
    return {
        "empty": b"",
        "garbage": np.random.default_rng(1).bytes(300),
        "truncated-header": good[: 8 + n // 2],
        "truncated-data": good[: 8 + n + (len(good) - 8 - n) // 2],
    }


def _layouts(tmp_path):
    """(folder, file to damage) for each layout's weights, sparsity and JSON files."""
    g = tmp_path / "g2"
    g.mkdir(parents=True)
    save_file(_gemma2_params(), str(g / "params.safetensors"))
    s = tmp_path / "sp" / "layers.1"
    _sparsify(s)
    ll = tmp_path / "ll"
    _llama(ll)
    sl = tmp_path / "sl"
    save_sae(TopKSAE(D, M, 3), sl)
    save_file({"sparsity": np.zeros(M, np.float32)}, str(sl / "sparsity.safetensors"))
    return {
        "gemma-scope-2": (g, g / "params.safetensors"),
        "sparsify-weights": (s, s / "sae.safetensors"),
        "sparsify-cfg": (s, s / "cfg.json"),
        "llama-weights": (ll, ll / "checkpoints" / "final.safetensors"),
        "llama-hyperparams": (ll, ll / "hyperparams.json"),
        "saelens-sparsity": (sl, sl / "sparsity.safetensors"),
    }


@pytest.mark.parametrize("variant", ["empty", "garbage", "truncated-header", "truncated-data"])
def test_damaged_files_give_one_line_errors(tmp_path, variant):
    for kind, (folder, file) in _layouts(tmp_path / variant).items():
        good = file.read_bytes()
        if file.suffix == ".json":
            blobs = {"empty": b"", "garbage": b"\x89\x00not json", "truncated-header": good[:7],
                     "truncated-data": b"[1, 2]"}  # fmt: skip
            blob = blobs[variant]
        else:
            blob = _damage(good)[variant]
        file.write_bytes(blob)
        with pytest.raises(InputError) as info:
            read_dictionary(folder)
        msg = str(info.value)
        assert "\n" not in msg and file.name in msg, (kind, msg)
        if variant != "truncated-data" or file.suffix != ".json":  # a list is valid JSON
            assert isinstance(info.value, DamagedFileError), (kind, msg)
        file.write_bytes(good)


def test_wrong_shapes_and_nan_are_refused(tmp_path):
    p = _gemma2_params()
    p["b_dec"] = np.zeros(1, np.float32)  # broadcastable, and wrong
    save_file(p, str(tmp_path / "params.safetensors"))
    with pytest.raises(InputError, match="shape"):
        read_dictionary(tmp_path)
    s = tmp_path / "layers.0"
    t = _sparsify(s)
    t["encoder.bias"][0] = np.nan
    save_file(t, str(s / "sae.safetensors"))
    with pytest.raises(InputError, match="NaN"):
        read_dictionary(s)


def test_unknown_layout_lists_the_layouts(tmp_path):
    with pytest.raises(InputError, match="sparsify"):
        read_dictionary(tmp_path)

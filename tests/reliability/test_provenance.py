"""Cache identity and foreign results: any change to a model changes every cache key, and a
saved SAE is refused with another model or site unless the user overrides it."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from structlens.capture import capture
from structlens.errors import ForeignResultError
from structlens.models import load_model
from structlens.provenance import ForeignResultWarning, check_provenance, provenance
from structlens.sae import TopKSAE, load_sae, save_sae

SITE = "blocks.1.hook_resid_post"


def _prompts():
    g = torch.Generator().manual_seed(0)
    return [(f"p{i}", torch.randint(0, 256, (10,), generator=g).tolist()) for i in range(4)]


def _zero_head_1_of_o_proj(m):
    o = m.layer_module(0, "self_attn.o_proj").weight  # [d_model, n_heads * d_head]
    o[:, m.d_head : 2 * m.d_head] = 0


def _one_ulp(m):
    w = m.layer_module(1, "mlp.down_proj").weight
    w[3, 5] = torch.nextafter(w[3, 5], torch.tensor(float("inf")))


def _eps(m):
    m.config.rms_norm_eps = m.config.rms_norm_eps * 2


def _tokenizer(m):
    m.tokenizer.add_tokens(["<new-token>"])


def _buffer(m):
    buf = next(b for _, b in m.hf.named_buffers())
    buf.view(-1)[0] += 1


@pytest.mark.parametrize(
    "change",
    [_zero_head_1_of_o_proj, _one_ulp, _eps, _tokenizer, _buffer],
    ids=["zero-head", "one-ulp", "config", "tokenizer", "buffer"],
)
def test_any_change_gives_a_new_key_and_a_cache_miss(tmp_path, change):
    m = load_model("tiny-llama")
    first = capture(m, _prompts(), [SITE], root=tmp_path, progress=False)
    key = m.fingerprint()
    with torch.no_grad():
        change(m)
    assert m.fingerprint() != key
    second = capture(m, _prompts(), [SITE], root=tmp_path, progress=False)
    assert second.path != first.path


def test_dtype_changes_the_key():
    assert (
        load_model("tiny-llama").fingerprint()
        != load_model("tiny-llama", dtype="bfloat16").fingerprint()
    )


def test_zeroed_head_changes_the_activations_the_cache_would_have_hidden(tmp_path):
    m = load_model("tiny-llama")
    before = capture(m, _prompts(), [SITE], root=tmp_path, progress=False).load(SITE)
    with torch.no_grad():
        _zero_head_1_of_o_proj(m)
    after = capture(m, _prompts(), [SITE], root=tmp_path, progress=False).load(SITE)
    assert not torch.allclose(before, after)


def test_key_is_stable_across_loads_and_tokenizer_use():
    a, b = load_model("tiny-llama"), load_model("tiny-llama")
    a.tokenize(["padding state", "is set by a batch call"])
    assert a.fingerprint() == b.fingerprint()


@pytest.fixture(scope="module")
def models():
    return load_model("tiny-llama"), load_model("tiny-llama", seed=5)


@pytest.fixture
def saved(models, tmp_path):
    m = models[0]
    path = tmp_path / "sae"
    save_sae(TopKSAE(m.d_model, 16, 2), path, **provenance(m, SITE))
    return path


def test_sae_cfg_records_provenance_in_saelens_keys(saved, models):
    meta = json.loads((saved / "cfg.json").read_text())["metadata"]
    assert meta["model_name"] == "tiny-llama" and meta["hook_name"] == SITE
    assert meta["model_digest"] == models[0].fingerprint()
    assert "sae_lens_version" not in meta and "sae_lens_training_version" not in meta


def test_own_sae_loads(saved, models):
    assert load_sae(saved, model=models[0], site=SITE).d_in == models[0].d_model


@pytest.mark.parametrize("other_model,other_site", [(True, False), (False, True), (True, True)])
def test_foreign_sae_is_refused(saved, models, other_model, other_site):
    model = models[1] if other_model else models[0]
    site = "blocks.0.hook_resid_pre" if other_site else SITE
    with pytest.raises(ForeignResultError, match="foreign"):
        load_sae(saved, model=model, site=site)


def test_foreign_sae_with_override_warns(saved, models):
    with pytest.warns(ForeignResultWarning, match="foreign"):
        load_sae(saved, model=models[1], site=SITE, allow_foreign=True)


def test_record_without_digest_is_checked_by_name(models):
    with pytest.raises(ForeignResultError, match="gpt2"):
        check_provenance({"model_name": "gpt2"}, what="x", model=models[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_provenance({}, what="x", model=models[0], site=SITE) == []


@pytest.mark.parametrize(
    "tensor,shape",
    [("b_dec", (1,)), ("b_enc", (1,)), ("b_dec", (16, 1)), ("W_dec", (16, 1)), ("W_enc", (64,))],
)
def test_wrong_shaped_sae_tensor_is_refused(tmp_path, tensor, shape):
    from safetensors.torch import load_file, save_file

    path = tmp_path / "sae"
    save_sae(TopKSAE(16, 8, 2), path)
    t = load_file(str(path / "sae_weights.safetensors"))
    t[tensor] = torch.zeros(shape)
    save_file(t, str(path / "sae_weights.safetensors"))
    with pytest.raises(ValueError, match="shape"):
        load_sae(path)


def test_object_npz_is_not_unpickled(tmp_path):
    import numpy as np

    np.savez(tmp_path / "params.npz", w_enc=np.array([object()], dtype=object))
    with pytest.raises(ValueError, match="pickle"):
        load_sae(tmp_path / "params.npz")

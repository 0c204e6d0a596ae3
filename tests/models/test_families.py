"""The family registry, automatic discovery of unregistered architectures, and the worked
``register_family`` example of docs/sites.md."""

import importlib.util
import re
import tempfile
from pathlib import Path

import pytest
import torch
from _families import assert_sites_equal_transformer_lens

import structlens.models.families as families_module
from _models import TEXTS
from structlens.interventions import hooked
from structlens.models import Family, load_model, register_family, registered_families
from structlens.models.tiny import build_tiny

DOCS = Path(__file__).resolve().parents[2] / "docs" / "sites.md"


@pytest.fixture
def registry(monkeypatch):
    """A private copy of the family registry for one test."""
    monkeypatch.setattr(families_module, "_FAMILIES", dict(families_module._FAMILIES))
    return families_module._FAMILIES


def _saved(model_name_or_hf, tok=None) -> str:
    hf, tok = build_tiny(model_name_or_hf) if tok is None else (model_name_or_hf, tok)
    d = tempfile.mkdtemp(prefix="structlens-model-")
    hf.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _all_sites(model):
    ids, mask = model.tokenize(TEXTS)
    with hooked(model, model.site_names()) as c:
        model.forward(ids, mask)
    return c


def test_register_family_refuses_duplicates_unless_replacing(registry):
    llama = families_module.family_for("llama")
    other = Family(**{**llama.__dict__, "name": "mine", "model_types": ("llama",)})
    with pytest.raises(ValueError, match="already have a family"):
        register_family(other)
    assert register_family(other, replace=True) is other
    assert families_module.family_for("llama") is other
    with pytest.raises(TypeError, match="takes a Family"):
        register_family({"name": "x"})
    assert other in registered_families()


def test_discovered_adapter_matches_the_hand_written_one(registry, capsys):
    d = _saved("tiny-llama")
    known = load_model(d)
    for t in ("llama",):
        families_module.unregister_family(t)
    found = load_model(d)
    assert found.family.name == "generic:llama"
    assert "generic adapter" in capsys.readouterr().out
    assert found.site_names() == known.site_names()
    a, b = _all_sites(known), _all_sites(found)
    for site in known.site_names():
        assert torch.equal(a[site], b[site]), site


@pytest.mark.parametrize("name", ["tiny-gptj", "tiny-phi", "tiny-starcoder2", "tiny-gpt2"])
def test_discovery_covers_parallel_and_non_gated_families(registry, name):
    d = _saved(name)
    known = load_model(d)
    for t in known.family.model_types:
        families_module.unregister_family(t)
    found = load_model(d)
    assert found.family.name.startswith("generic:")
    a, b = _all_sites(known), _all_sites(found)
    shared = [s for s in found.site_names() if s in known.site_names()]
    assert "blocks.0.hook_mlp_out" in shared and "blocks.0.attn.hook_z" in shared
    for site in shared:
        assert torch.allclose(a[site], b[site], atol=1e-6), site


def test_discovery_refuses_an_adapter_whose_identities_fail(registry):
    # Falcon adds attention into the MLP's output tensor in place: a naively discovered
    # adapter reads a wrong mlp_out, and the residual identities catch it.
    d = _saved("tiny-falcon")
    families_module.unregister_family("falcon")
    with pytest.raises(ValueError, match="fails the residual identities"):
        load_model(d)


def test_discovery_failure_names_what_is_missing(registry):
    d = _saved("tiny-bloom")
    families_module.unregister_family("bloom")
    with pytest.raises(ValueError, match="no site adapter for model_type 'bloom'.*one final norm"):
        load_model(d)


def _tiny_gpt_neo():
    import transformers

    from structlens.models.tiny import VOCAB, byte_tokenizer

    config = transformers.GPTNeoConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_layers=2,
        attention_types=[[["global", "local"], 1]],
        num_heads=4,
        max_position_embeddings=256,
        window_size=8,
        embed_dropout=0.0,
        attention_dropout=0.0,
        resid_dropout=0.0,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
        pad_token_id=VOCAB - 1,
    )
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(1.0 if p.dim() == 1 else 0.0, 0.2 if p.dim() == 1 else 0.08)
    hf.config.architectures = [type(hf).__name__]
    return _saved(hf, byte_tokenizer())


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_documented_register_family_example(registry):
    block = re.search(r"```python\n(.*?)```", DOCS.read_text(), re.S).group(1)
    d = _tiny_gpt_neo()
    with pytest.raises(ValueError, match="no site adapter for model_type 'gpt_neo'"):
        load_model(d)
    exec(block, {})
    model = load_model(d)
    assert model.family.name == "gpt_neo"
    assert {"blocks.0.attn.hook_q", "blocks.1.mlp.hook_post"} <= set(model.site_names())
    from structlens.models.adapters import residual_identity_errors

    ids, _ = model.tokenize(["abcdefghijklmnop"])
    assert max(residual_identity_errors(model, ids).values()) < 1e-5
    c = _all_sites(model)
    # attn_out = W_O z + b_O and mlp_out = W_out post + b_out
    for layer in range(model.n_layers):
        out_proj = model.layer_module(layer, "attn.attention.out_proj")
        z = c[f"blocks.{layer}.attn.hook_z"].flatten(-2)
        assert torch.allclose(out_proj(z), c[f"blocks.{layer}.hook_attn_out"], atol=1e-5)
        c_proj = model.layer_module(layer, "mlp.c_proj")
        post = c[f"blocks.{layer}.mlp.hook_post"]
        assert torch.allclose(c_proj(post), c[f"blocks.{layer}.hook_mlp_out"], atol=1e-5)
    if importlib.util.find_spec("transformer_lens") is not None:
        compared = assert_sites_equal_transformer_lens(model, d)
        assert "blocks.1.attn.hook_q" in compared


def test_a_registered_family_that_does_not_fit_the_checkpoint_is_refused(registry):
    # Without its residual multiplier, Granite's attn_out and mlp_out would be off by 0.5.
    d = _saved("tiny-granite")
    granite = families_module.family_for("granite")
    register_family(Family(**{**granite.__dict__, "residual_multiplier": None}), replace=True)
    with pytest.raises(ValueError, match="registered 'granite' family.*residual identities"):
        load_model(d)

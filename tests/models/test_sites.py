import pytest
import torch

from _models import TEXTS, affine_fit_error
from structlens.interventions import hooked
from structlens.sites import ALIASES, Site, SiteError, parse_site


def _identity_errors(model, texts):
    ids, mask = model.tokenize(texts)
    with hooked(model, model.site_names()) as c:
        out = model.hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    errs = {}
    for layer in range(model.n_layers):
        g = {
            k: c[f"blocks.{layer}.hook_{k}"]
            for k in ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
        }
        scale = g["resid_post"].abs().max()
        errs[f"mid{layer}"] = (g["resid_pre"] + g["attn_out"] - g["resid_mid"]).abs().max() / scale
        errs[f"post{layer}"] = (g["resid_mid"] + g["mlp_out"] - g["resid_post"]).abs().max() / scale
        if layer + 1 < model.n_layers:
            nxt = c[f"blocks.{layer + 1}.hook_resid_pre"]
            errs[f"chain{layer}"] = (g["resid_post"] - nxt).abs().max() / scale
        # HF's hidden_states[l] is the input of layer l.
        errs[f"hf{layer}"] = (out.hidden_states[layer] - g["resid_pre"]).abs().max() / scale
    last = c[f"blocks.{model.n_layers - 1}.hook_resid_post"]
    if model.causal:
        normed = model.base_module(model.family.final_norm)(last)
        errs["hf_last"] = (out.hidden_states[-1] - normed).abs().max()
        # hook_normalized is the norm's input over hook_scale, before the gain (TL's meaning):
        # the norm's output is an affine function of it, feature by feature.
        errs["final_norm"] = affine_fit_error(c["ln_final.hook_normalized"], normed)
        errs["logits_alias"] = (c["logits"] - c["unembed.hook_out"]).abs().max()
        if model.family.name != "gemma2":  # Gemma-2 soft-caps logits after the unembedding
            errs["logits"] = (out.logits - c["logits"]).abs().max()
    else:
        errs["hf_last"] = (out.last_hidden_state - last).abs().max()
    z = c["blocks.0.attn.hook_z"]
    assert z.shape == (*ids.shape, model.n_heads, model.d_head)
    return {k: float(v) for k, v in errs.items()}


def test_site_identities_hold_on_every_family(tiny):
    errs = _identity_errors(tiny, TEXTS)
    bad = {k: v for k, v in errs.items() if v > 1e-5}
    assert not bad, bad


@pytest.mark.slow
def test_site_identities_hold_on_smollm2(smollm2):
    errs = _identity_errors(smollm2, ["When Mary and John went to the store, John gave a drink to"])
    bad = {k: v for k, v in errs.items() if v > 1e-5}
    assert not bad, bad


def test_z_projects_to_attn_out(llama):
    # attn_out is the output projection applied to the concatenated heads of hook_z.
    ids, mask = llama.tokenize(TEXTS)
    with hooked(llama, ["blocks.1.attn.hook_z", "blocks.1.hook_attn_out"]) as c:
        llama.forward(ids, mask)
    z = c["blocks.1.attn.hook_z"]
    o_proj = llama.layer_module(1, "self_attn.o_proj")
    assert torch.allclose(o_proj(z.flatten(-2)), c["blocks.1.hook_attn_out"], atol=1e-5)


def test_parse_site_normalizes_and_rejects():
    assert parse_site("blocks.-1.hook_resid_post", 4) == Site("resid_post", 3)
    assert parse_site("blocks.2.attn.hook_z", 4).name == "blocks.2.attn.hook_z"
    with pytest.raises(SiteError, match="Did you mean: blocks.1.hook_resid_pre"):
        parse_site("blocks.1.hook_resid_pr", 4)
    with pytest.raises(SiteError, match="out of range"):
        parse_site("blocks.7.hook_resid_pre", 4)
    with pytest.raises(SiteError, match="no logits|unknown site"):
        parse_site("logits", 4, causal=False)


def test_every_listed_site_parses(tiny):
    for name in tiny.site_names():
        assert tiny.site(name).name == ALIASES.get(name, name)

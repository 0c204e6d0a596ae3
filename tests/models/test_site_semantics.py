"""Every site of every family: its shape, the identities TransformerLens's sites satisfy, and
agreement with TransformerLens itself on the same tiny model."""

import pytest
import torch
from _families import (
    EXPECTED_MISSING,
    FAMILY_MODELS,
    GATED_Z,
    LAYER_LACKS,
    QK_NORM,
    SINKS,
    assert_sites_equal_transformer_lens,
    family_model,
    saved_dir,
)

from _models import TEXTS, affine_fit_error
from structlens.interventions import hooked


@pytest.fixture(scope="module", params=FAMILY_MODELS)
def fam(request):
    return request.param, family_model(request.param)


def _run(model, texts=TEXTS):
    ids, mask = model.tokenize(texts)
    with hooked(model, model.site_names()) as c:
        out = model.forward(ids, mask)
    return ids, mask, c, out


def _close(a, b, tol=1e-4):
    scale = b.abs().max().clamp_min(1e-6)
    return float((a - b).abs().max() / scale) < tol


def test_sites_offered_per_family(fam):
    name, model = fam
    assert sorted(model.missing_kinds) == EXPECTED_MISSING[name]
    names = model.site_names()
    lacks = LAYER_LACKS.get(name, [[]] * model.n_layers)
    for layer in range(model.n_layers):
        for kind, site in (
            ("pattern", "attn.hook_pattern"),
            ("q", "attn.hook_q"),
            ("z", "attn.hook_z"),
            ("mlp_post", "mlp.hook_post"),
        ):
            offered = kind not in EXPECTED_MISSING[name] and kind not in lacks[layer]
            assert (f"blocks.{layer}.{site}" in names) == offered, (layer, site)
    ids, mask, c, _ = _run(model)
    b, p = ids.shape
    for site in names:
        if model.site(site).head_first:
            assert c[site].shape == (b, model.n_heads, p, p), site
        else:
            assert c[site].shape == (b, p, *model.site_shape(site)), site


def test_residual_identities(fam):
    name, model = fam
    ids, mask = model.tokenize(TEXTS)
    with hooked(model, model.site_names()) as c:
        out = model.hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    for layer in range(model.n_layers):
        g = lambda k, layer=layer: c[f"blocks.{layer}.hook_{k}"]  # noqa: E731
        assert _close(g("resid_pre") + g("attn_out"), g("resid_mid"), 1e-5), layer
        assert _close(g("resid_mid") + g("mlp_out"), g("resid_post"), 1e-5), layer
        assert _close(out.hidden_states[layer], g("resid_pre"), 1e-6), layer


def test_attention_identities(fam):
    name, model = fam
    if "pattern" not in model.layer_kinds:
        pytest.skip(f"{name}: attention does not use HF's attention-function interface")
    _check_attention(model, qk_norm=name in QK_NORM, sinks=name in SINKS, gated_z=name in GATED_Z)


@pytest.mark.slow
def test_attention_identities_on_smollm2(smollm2):
    # SmolLM2 runs SDPA; the attention sites switch it to the eager path for the pass.
    _check_attention(smollm2, qk_norm=False, texts=["When Mary and John went to the store,"])


def _alibi(n_heads, n):
    """TransformerLens's ALiBi bias ``slope_h * (key - query)``, slopes ``2^(-8 (h+1) / H)``."""
    assert n_heads & (n_heads - 1) == 0, "closed form for a power-of-two head count"
    slopes = 2.0 ** (-8.0 * torch.arange(1, n_heads + 1) / n_heads)
    rel = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    return slopes[:, None, None] * rel


def _check_attention(model, qk_norm, texts=TEXTS, sinks=False, gated_z=False):
    ids, mask, c, _ = _run(model, texts)
    n = ids.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    allowed = mask.bool()[:, None, None, :] & (causal if model.causal else True)
    groups = model.n_heads // model.n_kv_heads
    for layer in range(model.n_layers):
        if f"blocks.{layer}.attn.hook_pattern" not in c:
            continue  # a hybrid model's linear-attention layer
        fam_ = model.family_at(layer)
        site = lambda k, layer=layer: c[f"blocks.{layer}.attn.hook_{k}"]  # noqa: E731
        pattern, scores = site("pattern"), site("attn_scores")
        attn = model.layer_module(layer, fam_.attn_module)
        window = getattr(attn, "sliding_window", None)
        near = torch.arange(n)[:, None] - torch.arange(n)[None, :] < (window or n)
        # rows sum to one (less with sinks); masked scores are -inf exactly where the mask and
        # any sliding window block
        assert torch.equal(torch.isinf(scores), ~(allowed & near).expand_as(scores))
        if sinks:
            sink = attn.sinks.reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
            assert _close(torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1], pattern)
            assert bool((pattern.sum(-1) < 1).all())
        else:
            assert torch.allclose(pattern.sum(-1), torch.ones(()), atol=1e-5)
            assert _close(torch.softmax(scores, -1), pattern)
        if "rot_q" not in model.layer_kinds and "q" not in model.layer_kinds:
            continue  # latent attention: no per-head q/k/v (checked in test_new_families.py)
        # scores = q k^T * scaling (soft-capped where the model soft-caps)
        q, k = (site("rot_q"), site("rot_k")) if fam_.rotary else (site("q"), site("k"))
        raw = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(groups, dim=2))
        raw = raw * getattr(attn, "scaling", model.d_head**-0.5)
        if model.config.model_type == "bloom":
            raw = raw + _alibi(model.n_heads, ids.shape[1])
        cap = getattr(model.config, "attn_logit_softcapping", None)
        if cap:
            raw = torch.tanh(raw / cap) * cap
        fin = torch.isfinite(scores)
        assert _close(raw[fin], scores[fin])
        # rotary leaves position 0 unchanged
        if fam_.rotary and not qk_norm:
            assert _close(site("rot_q")[:, 0], site("q")[:, 0], 1e-5)
            assert _close(site("rot_k")[:, 0], site("k")[:, 0], 1e-5)
        # z = pattern . v (keys/values per KV head); gated attention: test_new_families.py
        if not gated_z:
            v = site("v").repeat_interleave(groups, dim=2)
            assert _close(torch.einsum("bhqk,bkhd->bqhd", pattern, v), site("z"))


def test_sublayer_outputs_are_projections_of_z_and_neurons(fam):
    name, model = fam
    if model.family.name == "bert":
        pytest.skip("post-LN BERT: attn_out/mlp_out are defined as differences, LN included")
    ids, mask, c, _ = _run(model)
    for layer in range(model.n_layers):
        fam_ = model.family_at(layer)
        mod = lambda path, layer=layer: model.layer_module(layer, path)  # noqa: E731
        if f"blocks.{layer}.attn.hook_z" in c:  # not on a hybrid's linear-attention layers
            z = c[f"blocks.{layer}.attn.hook_z"]
            attn_out = mod(fam_.z_reader)(z.flatten(-2))  # sum_h z_h W_O^h + b_O
            attn_out = attn_out * model.residual_scale  # Granite's residual multiplier
            if fam_.attn_write and fam_.attn_write != fam_.attn_module:  # post-sublayer norm
                attn_out = mod(fam_.attn_write)(attn_out)
            assert _close(attn_out, c[f"blocks.{layer}.hook_attn_out"]), layer
        if f"blocks.{layer}.mlp.hook_post" in c and not fam_.moe_experts:  # MoE: test_moe.py
            mlp_out = mod(fam_.mlp_post_reader)(c[f"blocks.{layer}.mlp.hook_post"])
            mlp_out = mlp_out * model.residual_scale
            if fam_.mlp_write and not fam_.mlp_post_reader.startswith(fam_.mlp_write):
                mlp_out = mod(fam_.mlp_write)(mlp_out)
            assert _close(mlp_out, c[f"blocks.{layer}.hook_mlp_out"]), layer


def _norm_checks(model, module, x, scale, normalized):
    from structlens.models.adapters import norm_kind

    xc = x - x.mean(-1, keepdim=True) if norm_kind(module) == "layer" else x
    assert _close(normalized * scale, xc, 1e-5)
    # before the gain: unit RMS per token (the gains are random, so after them it is not)
    rms = normalized.pow(2).mean(-1)
    assert torch.allclose(rms, torch.ones(()), atol=2e-2), float((rms - 1).abs().max())
    # the norm's output is an affine function of hook_normalized, feature by feature
    assert affine_fit_error(normalized, module(x)) < 1e-4


def test_norm_sites(fam):
    name, model = fam
    if model.family.name == "bert":
        pytest.skip("post-LN BERT: ln1/ln2 read sublayer sums, checked against TL's encoder")
    ids, mask, c, _ = _run(model)
    fam_ = model.family
    for layer in range(model.n_layers):
        g = lambda s, layer=layer: c[f"blocks.{layer}.{s}"]  # noqa: E731
        if "ln1_scale" in model.layer_kinds:
            _norm_checks(
                model,
                model.layer_module(layer, fam_.ln1),
                g("hook_resid_pre"),
                g("ln1.hook_scale"),
                g("ln1.hook_normalized"),
            )
        if "ln2_scale" in model.layer_kinds:
            x = g("hook_resid_pre") if model.parallel else g("hook_resid_mid")
            _norm_checks(
                model,
                model.layer_module(layer, fam_.ln2),
                x,
                g("ln2.hook_scale"),
                g("ln2.hook_normalized"),
            )
    if model.causal:
        last = c[f"blocks.{model.n_layers - 1}.hook_resid_post"]
        final = model.base_module(fam_.final_norm)
        _norm_checks(model, final, last, c["ln_final.hook_scale"], c["ln_final.hook_normalized"])


def test_reads_do_not_change_the_output_and_identity_writes_rebuild_it(fam):
    name, model = fam
    ids, mask = model.tokenize(TEXTS)
    ref = model.forward(ids, mask)
    names = model.site_names()
    with hooked(model, names) as _:
        read = model.forward(ids, mask)
    writes = {s: (lambda a: a * 1.0) for s in names if s != "unembed.hook_out"}
    with hooked(model, writes=writes):
        written = model.forward(ids, mask)
    assert _close(read, ref, 1e-5)
    assert _close(written, ref, 1e-4)


# TransformerLens ------------------------------------------------------------------------------

#: Families TransformerLens 3.x's HookedTransformer cannot build from a local checkpoint.
TL_UNSUPPORTED = {
    "tiny-granite": "TransformerLens does not support GraniteForCausalLM",
    "tiny-gemma2": "TransformerLens does not support Gemma2ForCausalLM",
    "tiny-olmo2": "TransformerLens does not support Olmo2ForCausalLM",
    "tiny-qwen3-moe": "TransformerLens does not support Qwen3MoeForCausalLM",
    "tiny-starcoder2": "TransformerLens does not support Starcoder2ForCausalLM",
    "tiny-stablelm": "TransformerLens supports only StableLM-alpha (GPT-NeoX) checkpoints",
    "tiny-cohere": "TransformerLens does not support CohereForCausalLM",
    "tiny-bigcode": "TransformerLens supports GPTBigCode only for santacoder (remote code)",
    "tiny-falcon": "TransformerLens does not support FalconForCausalLM",
    "tiny-bert": "BERT is a HookedEncoder in TransformerLens, not a HookedTransformer",
    "tiny-phi": "TransformerLens reads PhiConfig.partial_rotary_factor, gone in transformers 5",
    "tiny-olmo3": "TransformerLens 3.x builds OLMo-3 as pre-norm: its logits are not HF's",
    "tiny-gemma3-mm": "TransformerLens does not support Gemma3ForConditionalGeneration",
    "tiny-qwen3-next": "TransformerLens does not support Qwen3NextForCausalLM",
    "tiny-qwen3.5": "TransformerLens's HookedTransformer does not support Qwen3_5ForCausalLM",
    "tiny-qwen3.5-moe": "TransformerLens does not support Qwen3_5MoeForCausalLM",
    "tiny-deepseek-v3": "TransformerLens's HookedTransformer does not support DeepSeek-V3",
}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("name", [n for n in FAMILY_MODELS if n not in TL_UNSUPPORTED])
def test_every_site_equals_transformer_lens(name):
    pytest.importorskip("transformer_lens", reason="transformer-lens is not installed")
    model = family_model(name)
    compared = assert_sites_equal_transformer_lens(model, saved_dir(name))
    assert len(compared) >= 10 * model.n_layers


def test_sites_command_on_a_saved_directory(tmp_path):
    import json

    from typer.testing import CliRunner

    from structlens.cli.main import app

    for name in FAMILY_MODELS:
        r = CliRunner().invoke(app, ["sites", saved_dir(name), "--out", str(tmp_path), "-q"])
        assert r.exit_code == 0, (name, r.output)
        rows = json.loads((tmp_path / "sites.json").read_text())["sites"]
        listed = {row["site"]: row["shape"] for row in rows}
        model = family_model(name)
        assert list(listed) == model.site_names()
        for layer in range(model.n_layers):
            at = f"blocks.{layer}."
            assert listed.get(at + "attn.hook_pattern") in (
                None,
                [model.n_heads, "query_pos", "key_pos"],
            )
            assert listed.get(at + "attn.hook_q") in (None, [model.n_heads, model.d_head])
            assert listed.get(at + "mlp.hook_post") in (None, [model.d_mlp])

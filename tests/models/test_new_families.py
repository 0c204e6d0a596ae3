"""What the family matrix cannot check on the 2026 architectures: the per-layer sites of hybrid
models, gated attention, gpt-oss's experts, DeepSeek-V3's latent attention and the text tower of
Gemma-3's multimodal checkpoints, each against a computation from the module's own weights."""

import json

import pytest
import torch
from _families import family_model, saved_dir

from _models import TEXTS
from structlens.interventions import hooked
from structlens.models import Model
from structlens.sites import SiteError

HYBRIDS = ["tiny-qwen3-next", "tiny-qwen3.5", "tiny-qwen3.5-moe"]


def _run(model, sites):
    ids, mask = model.tokenize(TEXTS)
    with hooked(model, sites) as c:
        out = model.forward(ids, mask)
    return ids, mask, c, out


def _close(a, b, tol=1e-5):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-6)) < tol


@pytest.mark.parametrize("name", HYBRIDS)
def test_hybrid_layers_list_and_refuse_their_own_sites(name):
    model = family_model(name)
    names = set(model.site_names())
    linear = [layer for layer in range(model.n_layers) if model.family_at(layer).z_reader is None]
    assert linear and len(linear) < model.n_layers  # both kinds of layer
    for layer in range(model.n_layers):
        heads = {f"blocks.{layer}.attn.hook_{k}" for k in ("pattern", "z", "k", "v", "rot_q")}
        assert heads.isdisjoint(names) if layer in linear else heads <= names, layer
        for kind in ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post"):
            assert f"blocks.{layer}.hook_{kind}" in names  # every layer writes the residual
        assert f"blocks.{layer}.ln1.hook_normalized" in names
    first = linear[0]
    assert "linear-attention" in model.layer_missing(first)["pattern"]
    assert "pattern" not in model.layer_missing(next(i for i in range(3) if i not in linear))
    for site in (
        f"blocks.{first}.attn.hook_pattern",
        f"blocks.{first - model.n_layers}.attn.hook_z",
    ):
        with pytest.raises(SiteError, match=f"not available on layer {first}: .*linear-attention"):
            model.site(site)
        with pytest.raises(SiteError, match="linear-attention"):
            with hooked(model, [site]):
                pass
    full = next(layer for layer in range(model.n_layers) if layer not in linear)
    assert model.site(f"blocks.{full}.attn.hook_pattern").layer == full
    with pytest.raises(
        SiteError, match="q_proj computes the queries and the attention output gate"
    ):
        model.site(f"blocks.{full}.attn.hook_q")


@pytest.mark.parametrize("name", HYBRIDS)
def test_a_linear_attention_layers_write_reaches_the_output(name):
    model = family_model(name)
    layer = next(i for i in range(model.n_layers) if model.family_at(i).z_reader is None)
    ids, mask = model.tokenize(TEXTS)
    ref = model.forward(ids, mask)
    site = f"blocks.{layer}.hook_attn_out"
    with hooked(model, [site], writes={site: lambda a: 0 * a}) as c:
        out = model.forward(ids, mask)
    assert torch.equal(c[site], torch.zeros_like(c[site]))
    assert not torch.allclose(out, ref, atol=1e-4)  # positive control: the write matters
    with hooked(model, writes={site: lambda a: a * 1.0}):
        same = model.forward(ids, mask)
    assert torch.allclose(same, ref, atol=1e-6)


def test_the_sites_command_says_per_layer_what_a_hybrid_lacks(tmp_path):
    from typer.testing import CliRunner

    from structlens.cli.main import app

    r = CliRunner().invoke(app, ["sites", saved_dir("tiny-qwen3-next"), "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "layer 0 has no blocks.0.attn.hook_k" in r.output
    missing = json.loads((tmp_path / "sites.json").read_text())["model"]["layer_missing"]
    assert "linear-attention" in missing["0"]["blocks.0.attn.hook_pattern"]
    assert "shared expert" in missing["1"]["blocks.1.mlp.hook_post"]
    assert "1" in missing and "blocks.1.attn.hook_pattern" not in missing["1"]


@pytest.mark.parametrize("name", HYBRIDS)
def test_gated_attention_z_is_the_pattern_times_v_through_the_output_gate(name):
    # Qwen3-Next/Qwen3.5: o_proj reads (pattern · v) ⊙ σ(gate), the gate coming out of q_proj
    # interleaved per head with the queries; hook_z is what o_proj reads.
    model = family_model(name)
    layer = next(i for i in range(model.n_layers) if model.family_at(i).z_reader is not None)
    pre = [f"blocks.{layer}.{s}" for s in ("hook_resid_pre", "attn.hook_pattern")]
    sites = pre + [f"blocks.{layer}.attn.hook_{k}" for k in ("v", "z")]
    _, _, c, _ = _run(model, sites)
    x = model.layer_module(layer, "input_layernorm")(c[sites[0]])
    both = model.layer_module(layer, "self_attn.q_proj")(x).unflatten(-1, (model.n_heads, -1))
    gate = both[..., model.d_head :]
    v = c[sites[2]].repeat_interleave(model.n_heads // model.n_kv_heads, dim=2)
    ungated = torch.einsum("bhqk,bkhd->bqhd", c[sites[1]], v)
    assert _close(ungated * torch.sigmoid(gate), c[sites[3]])
    assert not _close(ungated, c[sites[3]], 1e-2)  # positive control: the gate matters


def _gpt_oss_routing(model, layer, x):
    """Dense routing weights ``[batch, pos, expert]`` from gpt-oss's router: top-k of
    ``x W^T + b``, softmax over the chosen logits."""
    router = model.layer_module(layer, "mlp.router")
    logits = x @ router.weight.T + router.bias
    top, idx = logits.topk(router.top_k, dim=-1)
    return torch.zeros_like(logits).scatter(-1, idx, torch.softmax(top, dim=-1))


def test_gpt_oss_expert_neurons_reproduce_the_mlp_output():
    model = family_model("tiny-gpt-oss")
    ids, mask = model.tokenize(TEXTS)
    ref = model.forward(ids, mask)
    with hooked(model, model.site_names()) as c:
        out = model.forward(ids, mask)
    assert torch.allclose(out, ref, atol=1e-5)  # the dense recomputation changes nothing
    for layer in range(model.n_layers):
        g = lambda k, layer=layer: c[f"blocks.{layer}.{k}"]  # noqa: E731
        experts = model.layer_module(layer, "mlp.experts")
        n, d = experts.num_experts, model.d_mlp // experts.num_experts
        x = model.layer_module(layer, "post_attention_layernorm")(g("hook_resid_mid"))
        weights = _gpt_oss_routing(model, layer, x)
        routed = (weights > 0)[..., None]
        both = torch.einsum("bpd,edf->bpef", x, experts.gate_up_proj) + experts.gate_up_proj_bias
        pre, lin, post = (
            g(f"mlp.hook_{k}").unflatten(-1, (n, d)) for k in ("pre", "pre_linear", "post")
        )
        assert torch.allclose(pre, both[..., ::2] * routed, atol=1e-5)
        assert torch.allclose(lin, both[..., 1::2] * routed, atol=1e-5)
        assert torch.equal((post != 0).any(-1), routed[..., 0])
        gate = pre.clamp(max=experts.limit)
        want = (
            (lin.clamp(-experts.limit, experts.limit) + 1)
            * gate
            * torch.sigmoid(gate * experts.alpha)
        )
        assert torch.allclose(post, want, atol=1e-6)
        # mlp_out = Σ_e g_e · (post_e W_out^e + b_out^e)
        per_expert = (
            torch.einsum("bpef,efd->bped", post, experts.down_proj) + experts.down_proj_bias
        )
        assert _close(torch.einsum("bpe,bped->bpd", weights, per_expert), g("hook_mlp_out")), layer


def test_ablating_one_gpt_oss_experts_neurons_removes_its_output_but_its_bias():
    model = family_model("tiny-gpt-oss")
    ids, mask = model.tokenize(TEXTS)
    experts = model.layer_module(0, "mlp.experts")
    d = model.d_mlp // experts.num_experts
    sites = ["blocks.0.hook_resid_mid", "blocks.0.hook_mlp_out", "blocks.0.mlp.hook_post"]
    with hooked(model, sites) as c:
        model.forward(ids, mask)
    x = model.layer_module(0, "post_attention_layernorm")(c[sites[0]])
    weights = _gpt_oss_routing(model, 0, x)
    e = int((weights > 0).flatten(0, 1).sum(0).argmax())  # the busiest expert

    def drop(post):
        post = post.clone()
        post[..., e * d : (e + 1) * d] = 0
        return post

    with hooked(model, sites[1:2], {sites[2]: drop}) as a:
        model.forward(ids, mask)
    # the expert's bias still joins the output: only g_e · post_e W_out^e goes
    expert = weights[..., e : e + 1] * (
        c[sites[2]][..., e * d : (e + 1) * d] @ experts.down_proj[e]
    )
    assert expert.abs().max() > 0
    assert torch.allclose(c[sites[1]] - a[sites[1]], expert, atol=1e-5)


def test_deepseek_latent_attention_z_is_the_pattern_times_the_latents_values():
    model = family_model("tiny-deepseek-v3")
    cfg = model.config
    assert model.d_head == cfg.v_head_dim != cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    for layer in range(model.n_layers):
        sites = [
            f"blocks.{layer}.{s}" for s in ("hook_resid_pre", "attn.hook_pattern", "attn.hook_z")
        ]
        _, _, c, _ = _run(model, sites)
        attn = model.layer_module(layer, "self_attn")
        x = model.layer_module(layer, "input_layernorm")(c[sites[0]])
        latent = attn.kv_a_proj_with_mqa(x)[..., : cfg.kv_lora_rank]
        kv = attn.kv_b_proj(attn.kv_a_layernorm(latent)).unflatten(-1, (model.n_heads, -1))
        v = kv[..., cfg.qk_nope_head_dim :]
        assert _close(torch.einsum("bhqk,bkhd->bqhd", c[sites[1]], v), c[sites[2]]), layer
    with pytest.raises(SiteError, match="latent attention has no per-head"):
        model.site("blocks.0.attn.hook_k")
    assert "blocks.0.mlp.hook_post" in model.site_names()  # the dense first layer
    with pytest.raises(SiteError, match="not available on layer 1: .*shared expert"):
        model.site("blocks.1.mlp.hook_post")


def test_gemma3_multimodal_sites_are_those_of_its_text_tower_alone():
    import transformers

    mm = family_model("tiny-gemma3-mm")
    text = transformers.Gemma3ForCausalLM(mm.hf.config.text_config)
    tower = {
        k.removeprefix("model.language_model."): v
        for k, v in mm.hf.state_dict().items()
        if k.startswith("model.language_model.")
    }
    text.model.load_state_dict(tower)
    text.lm_head.load_state_dict(mm.hf.lm_head.state_dict())
    alone = Model(text, mm.tokenizer, "gemma3-text-tower", source="test")
    assert alone.family.name == "gemma2" and mm.family.name == "gemma3_multimodal"
    assert alone.site_names() == mm.site_names()
    _, _, a, _ = _run(alone, alone.site_names())
    _, _, b, _ = _run(mm, mm.site_names())
    for site in mm.site_names():
        assert torch.allclose(a[site], b[site], atol=1e-5), site


def test_gemma4_is_refused_naming_what_its_layers_add():
    import transformers

    from structlens.models.tiny import build_tiny

    _, tok = build_tiny("tiny-llama")
    cfg = transformers.Gemma4TextConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        global_head_dim=32,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=256,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=16,
    )
    hf = transformers.Gemma4ForCausalLM(cfg)
    with pytest.raises(ValueError, match="Gemma 4 is not supported: .*per-layer input") as err:
        Model(hf, tok, "tiny-gemma4", source="test")
    assert "\n" not in str(err.value)

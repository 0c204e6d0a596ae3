"""Mixture-of-experts neuron sites: every expert's neurons side by side, unweighted, zero where
the token is not routed to the expert, and ``mlp_out = Σ_e g_e · post_e W_out^e`` with the
routing weights recomputed here from the router's weights."""

import pytest
import torch
from _families import family_model

from _models import TEXTS
from structlens.interventions import hooked
from structlens.models import Model
from structlens.models.tiny import VOCAB, byte_tokenizer


def _tiny_mixtral() -> Model:
    import transformers

    config = transformers.MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=256,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
        pad_token_id=VOCAB - 1,
    )
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    return Model(hf, byte_tokenizer(), "tiny-mixtral", source="test")


@pytest.fixture(scope="module", params=["tiny-qwen3-moe", "tiny-mixtral"])
def moe(request):
    return _tiny_mixtral() if request.param == "tiny-mixtral" else family_model(request.param)


def _routing(model, layer, x):
    """Dense routing weights ``[batch, pos, expert]`` from the router's weight matrix."""
    router = model.layer_module(layer, "mlp.gate")
    probs = torch.softmax(x @ router.weight.T, dim=-1)
    top, idx = probs.topk(router.top_k, dim=-1)
    if getattr(router, "norm_topk_prob", True):  # Mixtral always renormalises
        top = top / top.sum(-1, keepdim=True)
    return torch.zeros_like(probs).scatter(-1, idx, top)


def test_moe_neurons_reproduce_the_mlp_output(moe):
    model = moe
    ids, mask = model.tokenize(TEXTS)
    ref = model.forward(ids, mask)
    with hooked(model, model.site_names()) as c:
        out = model.forward(ids, mask)
    assert torch.allclose(out, ref, atol=1e-5)  # the dense recomputation changes nothing
    experts = model.layer_module(0, "mlp.experts")
    n, d = experts.num_experts, experts.down_proj.shape[-1]
    assert model.d_mlp == n * d
    for layer in range(model.n_layers):
        g = lambda k, layer=layer: c[f"blocks.{layer}.{k}"]  # noqa: E731
        experts = model.layer_module(layer, "mlp.experts")
        x = model.layer_module(layer, "post_attention_layernorm")(g("hook_resid_mid"))
        weights = _routing(model, layer, x)
        routed = (weights > 0)[..., None]
        pre, lin, post = (
            g(f"mlp.hook_{k}").unflatten(-1, (n, d)) for k in ("pre", "pre_linear", "post")
        )
        assert post.shape[:2] == ids.shape
        # each token uses exactly top_k experts; the others' entries are zero
        assert torch.equal((post != 0).any(-1), routed[..., 0])
        w_gate, w_up = experts.gate_up_proj.chunk(2, dim=1)
        assert torch.allclose(pre, torch.einsum("bpd,efd->bpef", x, w_gate) * routed, atol=1e-5)
        assert torch.allclose(lin, torch.einsum("bpd,efd->bpef", x, w_up) * routed, atol=1e-5)
        assert torch.allclose(post, torch.nn.functional.silu(pre) * lin, atol=1e-6)
        # mlp_out = Σ_e g_e · W_out^e post_e
        mlp_out = torch.einsum("bpe,bpef,edf->bpd", weights, post, experts.down_proj)
        scale = g("hook_mlp_out").abs().max()
        assert float((mlp_out - g("hook_mlp_out")).abs().max() / scale) < 1e-5, layer


def test_ablating_one_experts_neurons_removes_its_contribution(moe):
    model = moe
    ids, mask = model.tokenize(TEXTS)
    n = model.layer_module(0, "mlp.experts").num_experts
    d = model.d_mlp // n

    def drop_expert_1(post):
        post = post.clone()
        post[..., d : 2 * d] = 0
        return post

    with hooked(model, ["blocks.0.hook_mlp_out", "blocks.0.mlp.hook_post"]) as c:
        model.forward(ids, mask)
    with hooked(model, ["blocks.0.hook_mlp_out"], {"blocks.0.mlp.hook_post": drop_expert_1}) as a:
        model.forward(ids, mask)
    experts = model.layer_module(0, "mlp.experts")
    x = model.layer_module(0, "post_attention_layernorm")
    with hooked(model, ["blocks.0.hook_resid_mid"]) as r:
        model.forward(ids, mask)
    weights = _routing(model, 0, x(r["blocks.0.hook_resid_mid"]))
    post1 = c["blocks.0.mlp.hook_post"][..., d : 2 * d]
    expert_1 = weights[..., 1:2] * (post1 @ experts.down_proj[1].T)
    assert expert_1.abs().max() > 0
    got = c["blocks.0.hook_mlp_out"] - a["blocks.0.hook_mlp_out"]
    assert torch.allclose(got, expert_1, atol=1e-5)

"""Patching, ablation and attribution patching on the TransformerLens sites."""

import pytest
import torch
from _families import family_model

from structlens.interventions import (
    ablate,
    attribution_patch,
    hooked,
    patch,
    replace_writer,
    run_with_cache,
)
from structlens.sites import SiteError

TEXTS = ["abcdefghij", "klmnopqrst"]


@pytest.fixture(scope="module")
def llama64():
    m = family_model("tiny-llama", dtype="float64")
    # HF's eager attention takes the softmax in float32 even for float64 models; SDPA does not,
    # and finite differences below need float64 throughout.
    m.hf.config._attn_implementation = "sdpa"
    return m


def test_pattern_patch_replaces_whole_rows_and_keeps_them_normalized(llama64):
    m = llama64
    ids, mask = m.tokenize(TEXTS)
    corrupt = ids.flip(0)
    site = "blocks.1.attn.hook_pattern"
    _, src = run_with_cache(m, corrupt, mask, [site])
    _, clean = run_with_cache(m, ids, mask, [site])
    writer = replace_writer(src[site], positions=[[4], [6]], heads=[1, 3], head_first=True)
    with hooked(m, [site], writes={site: writer}) as c:
        m.forward(ids, mask)
    got = c[site]
    assert torch.allclose(got.sum(-1), torch.ones_like(got[..., 0]), atol=1e-12)
    for b, q in ((0, 4), (1, 6)):
        for h in range(m.n_heads):
            want = src[site] if h in (1, 3) else clean[site]
            assert torch.allclose(got[b, h, q], want[b, h, q], rtol=0, atol=1e-15)
    untouched = torch.ones_like(got, dtype=torch.bool)
    untouched[0, [1, 3], 4] = False
    untouched[1, [1, 3], 6] = False
    assert torch.equal(got[untouched], clean[site][untouched])
    # patching the pattern changes the output; patching with the clean one does not
    out = patch(m, ids, mask, site, src[site], heads=[1], positions=[[4], [6]])
    same = patch(m, ids, mask, site, clean[site])
    assert torch.allclose(same, m.forward(ids, mask), atol=1e-10)
    assert not torch.allclose(out, m.forward(ids, mask), atol=1e-6)
    with pytest.raises(ValueError, match="basis"):
        patch(m, ids, mask, site, src[site], basis=torch.eye(ids.shape[1])[:, :2])


def test_kv_head_patch_moves_only_its_query_group(llama64):
    # GQA: 4 query heads share 2 KV heads; KV head 1 feeds query heads 2 and 3 (TL's mapping).
    m = llama64
    ids, mask = m.tokenize(TEXTS)
    v_site, z_site = "blocks.0.attn.hook_v", "blocks.0.attn.hook_z"
    _, clean = run_with_cache(m, ids, mask, [z_site])
    with hooked(m, [z_site], writes={v_site: lambda v: v.index_fill(2, torch.tensor([1]), 0)}) as c:
        m.forward(ids, mask)
    z = c[z_site]
    assert torch.equal(z[:, :, :2], clean[z_site][:, :, :2])
    assert torch.allclose(z[:, :, 2:], torch.zeros_like(z[:, :, 2:]), atol=1e-12)


def test_zero_ablating_neurons_equals_zero_ablating_mlp_out(llama64):
    # Llama's down projection has no bias: no neurons, no MLP output.
    m = llama64
    ids, mask = m.tokenize(TEXTS)
    a = ablate(m, ids, mask, "blocks.1.mlp.hook_post")
    b = ablate(m, ids, mask, "blocks.1.hook_mlp_out")
    assert torch.allclose(a, b, atol=1e-10)
    # mean-ablating the pre-activation of a subset of positions changes only later tokens
    c = ablate(m, ids, mask, "blocks.1.mlp.hook_pre", mode="mean", positions=[[5], [5]])
    base = m.forward(ids, mask)
    assert torch.allclose(c[:, :5], base[:, :5], atol=1e-10)
    assert not torch.allclose(c[:, 5:], base[:, 5:], atol=1e-6)


SITES = [
    "blocks.0.ln1.hook_normalized",
    "blocks.0.ln1.hook_scale",
    "blocks.0.attn.hook_q",
    "blocks.0.attn.hook_k",
    "blocks.0.attn.hook_v",
    "blocks.0.attn.hook_rot_q",
    "blocks.1.attn.hook_attn_scores",
    "blocks.1.attn.hook_pattern",
    "blocks.1.ln2.hook_normalized",
    "blocks.1.mlp.hook_pre",
    "blocks.1.mlp.hook_pre_linear",
    "blocks.1.mlp.hook_post",
    "ln_final.hook_scale",
]


@pytest.mark.parametrize("site", SITES)
def test_attribution_patching_is_the_first_order_effect(llama64, site):
    # AtP's total over the site equals the derivative of the metric along the straight path
    # from the clean to the corrupt activation, measured by central finite differences.
    m = llama64
    ids, mask = m.tokenize(TEXTS)
    corrupt = ids.flip(0)
    w = torch.randn(
        m.config.vocab_size, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )

    def metric(logits):
        return logits[:, -1] @ w

    atp = attribution_patch(m, ids, corrupt, mask, [site], metric)
    _, c = run_with_cache(m, corrupt, mask, [site])
    _, k = run_with_cache(m, ids, mask, [site])
    delta = c[site] - k[site]
    if m.site(site).head_first:
        delta = torch.where(torch.isinf(k[site]), 0.0, delta)
    # HF's norms compute in float32 even in float64 models, which sets the step and tolerance
    eps = 1e-3

    def at(t):
        return metric(patch(m, ids, mask, site, k[site] + t * delta))

    fd = (at(eps) - at(-eps)) / (2 * eps)
    total = atp[site].flatten(1).sum(1)
    assert torch.allclose(total, fd, rtol=5e-3, atol=1e-4), (total, fd)
    s = m.site(site)
    if s.head_first:  # one value per head and query row
        assert atp[site].shape == (2, m.n_heads, ids.shape[1])
    elif s.has_heads:  # one value per token and head
        assert atp[site].shape == (2, ids.shape[1], m.site_shape(site)[0])


def test_head_first_sites_have_no_per_token_shape(llama64):
    with pytest.raises(SiteError, match="query_pos, key_pos"):
        llama64.site_shape("blocks.0.attn.hook_pattern")
    assert llama64.site_dims("blocks.0.attn.hook_pattern") == ("batch", 4, "query_pos", "key_pos")
    assert llama64.site_dims("blocks.0.attn.hook_k") == ("batch", "pos", 2, 16)
    with pytest.raises(SiteError, match="not available for this model: .*no norm before attention"):
        family_model("tiny-olmo2").site("blocks.0.ln1.hook_scale")
    with pytest.raises(SiteError, match="not available for this model: .*no rotary"):
        family_model("tiny-gpt2").site("blocks.0.attn.hook_rot_q")

import pytest
import torch

from _models import TEXTS
from structlens.interventions import (
    ablate,
    attribution_patch,
    hooked,
    patch,
    replace_writer,
    run_with_cache,
    run_with_grads,
    run_with_writes,
    subspace_basis,
)

KINDS = [
    "hook_resid_pre",
    "hook_resid_mid",
    "hook_resid_post",
    "hook_attn_out",
    "hook_mlp_out",
    "attn.hook_z",
]


def _inputs(model):
    return model.tokenize(TEXTS)


@pytest.mark.parametrize("kind", KINDS)
def test_self_patch_changes_nothing(tiny, kind):
    ids, mask = _inputs(tiny)
    site = f"blocks.1.{kind}"
    out, cache = run_with_cache(tiny, ids, mask, [site])
    patched = patch(tiny, ids, mask, site, cache[site])
    assert torch.allclose(out, patched, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_patch_from_corrupt_run_reproduces_corrupt_downstream(tiny, kind):
    # Patching layer 1's site with the corrupt run's values at every position makes every
    # later activation equal to the corrupt run's (layer 1's resid_post needs both sublayers,
    # so compare at the next layer input only for residual sites).
    ids, mask = _inputs(tiny)
    corrupt = ids.flip(0)
    cmask = mask.flip(0)
    site = f"blocks.1.{kind}"
    _, c_cache = run_with_cache(tiny, corrupt, cmask, [site])
    with hooked(tiny, [site], writes={site: lambda a: c_cache[site]}) as cache:
        tiny.forward(ids, mask)
    assert torch.allclose(cache[site], c_cache[site], atol=1e-5)


def test_derived_write_keeps_identities(tiny):
    ids, mask = _inputs(tiny)
    names = [f"blocks.1.hook_{k}" for k in ("resid_pre", "resid_mid", "attn_out")]
    target = torch.full((tiny.d_model,), 0.5)
    with hooked(
        tiny, names, writes={"blocks.1.hook_resid_mid": lambda a: target.expand_as(a)}
    ) as c:
        tiny.forward(ids, mask)
    assert torch.allclose(
        c["blocks.1.hook_resid_mid"], target.expand_as(c["blocks.1.hook_resid_mid"]), atol=1e-5
    )
    assert torch.allclose(c[names[0]] + c[names[2]], c[names[1]], atol=1e-5)


def test_full_space_subspace_patch_equals_activation_patch(tiny):
    ids, mask = _inputs(tiny)
    site = "blocks.1.hook_resid_post"
    _, cache = run_with_cache(tiny, ids.flip(0), mask.flip(0), [site])
    q, _ = torch.linalg.qr(torch.randn(tiny.d_model, tiny.d_model, dtype=torch.float64))
    positions = [[0, 2]] * ids.shape[0]
    full = patch(tiny, ids, mask, site, cache[site], positions=positions)
    sub = patch(
        tiny,
        ids,
        mask,
        site,
        cache[site],
        positions=positions,
        basis=subspace_basis(q.float(), range(tiny.d_model)),
    )
    assert torch.allclose(full, sub, atol=1e-4)
    # complementary subspaces applied one after the other equal the full patch
    b1, b2 = (
        subspace_basis(q.float(), range(0, 20)),
        subspace_basis(q.float(), range(20, tiny.d_model)),
    )
    w1 = replace_writer(cache[site], positions=positions, basis=b1)
    w2 = replace_writer(cache[site], positions=positions, basis=b2)
    both = run_with_writes(tiny, ids, mask, {site: lambda a: w2(w1(a))})
    assert torch.allclose(full, both, atol=1e-4)


def test_head_patching(llama):
    ids, mask = _inputs(llama)
    site = "blocks.2.attn.hook_z"
    _, cache = run_with_cache(llama, ids.flip(0), mask.flip(0), [site])
    all_heads = patch(llama, ids, mask, site, cache[site], heads=range(llama.n_heads))
    full = patch(llama, ids, mask, site, cache[site])
    assert torch.allclose(all_heads, full, atol=1e-5)
    _, clean = run_with_cache(llama, ids, mask, [site])
    with hooked(llama, [site], writes={site: replace_writer(cache[site], heads=[1])}) as c:
        llama.forward(ids, mask)
    z = c[site]
    assert torch.allclose(z[:, :, 1], cache[site][:, :, 1], atol=1e-6)
    others = [h for h in range(llama.n_heads) if h != 1]
    assert torch.allclose(z[:, :, others], clean[site][:, :, others], atol=1e-6)
    with pytest.raises(ValueError, match="heads"):
        patch(llama, ids, mask, "blocks.2.hook_resid_pre", cache[site].flatten(-2), heads=[0])


def test_ablation_modes(llama):
    ids, mask = _inputs(llama)
    site = "blocks.1.hook_mlp_out"
    zero = ablate(llama, ids, mask, site, mode="zero")
    explicit = patch(llama, ids, mask, site, torch.zeros(llama.d_model))
    assert torch.allclose(zero, explicit, atol=1e-6)
    _, cache = run_with_cache(llama, ids, mask, [site])
    mean = cache[site].reshape(-1, llama.d_model).mean(0)
    assert torch.allclose(
        ablate(llama, ids, mask, site, mode="mean"), patch(llama, ids, mask, site, mean), atol=1e-6
    )
    # ablating a direction the activations never use changes nothing
    q = torch.zeros(llama.d_model, 1)
    q[0] = 1.0
    with hooked(
        llama,
        writes={
            site: lambda a: (
                a - a[..., :1] * 0 - torch.nn.functional.pad(a[..., :1], (0, llama.d_model - 1))
            )
        },
    ):
        manual = llama.forward(ids, mask)
    assert torch.allclose(ablate(llama, ids, mask, site, mode="zero", basis=q), manual, atol=1e-5)
    with pytest.raises(ValueError, match="orthonormal"):
        ablate(llama, ids, mask, site, basis=2 * q)
    with pytest.raises(ValueError, match="unknown ablation mode"):
        ablate(llama, ids, mask, site, mode="noise")


def _linear_metric(model, w):
    if model.causal:
        return lambda logits: logits[:, -1] @ w
    return lambda hidden: hidden[:, -1] @ w


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2", "tiny-bert", "tiny-neox"])
def test_atp_equals_exact_patching_for_linear_metric(name):
    from _models import get_model

    model = get_model(name)
    ids, mask = model.tokenize(["abcdefgh", "ijklmnop"])
    corrupt = ids.flip(0)
    site = (
        "ln_final.hook_normalized"
        if model.causal
        else f"blocks.{model.n_layers - 1}.hook_resid_post"
    )
    out_dim = model.hf.config.vocab_size if model.causal else model.d_model
    w = torch.randn(out_dim)
    metric = _linear_metric(model, w)
    atp = attribution_patch(model, ids, corrupt, mask, [site], metric)
    _, c_cache = run_with_cache(model, corrupt, mask, [site])
    base = metric(model.forward(ids, mask))
    for pos in range(ids.shape[1]):
        exact = metric(patch(model, ids, mask, site, c_cache[site], positions=[[pos]] * 2)) - base
        assert torch.allclose(atp[site][:, pos], exact, atol=1e-3, rtol=1e-3)
    dirs = torch.randn(3, model.d_model)
    atp_dir = attribution_patch(model, ids, corrupt, mask, [site], metric, directions=dirs)
    for j in range(3):
        q = (dirs[j] / dirs[j].norm())[:, None]
        exact = (
            metric(patch(model, ids, mask, site, c_cache[site], positions=[[3]] * 2, basis=q))
            - base
        )
        assert torch.allclose(atp_dir[site][:, 3, j], exact, atol=1e-3, rtol=1e-3)


def test_atp_gradients_match_finite_differences(llama):
    # On a non-linear metric, AtP's gradient must still be the true gradient.
    ids, mask = llama.tokenize(["abcdefgh"])
    site = "blocks.1.hook_resid_mid"

    def metric(logits):
        return logits[:, -1].log_softmax(-1)[:, 5]

    _, acts, grads = run_with_grads(llama, ids, mask, [site], metric)
    v = torch.randn_like(acts[site]) * 1e-3
    plus = metric(patch(llama, ids, mask, site, acts[site] + v))
    minus = metric(patch(llama, ids, mask, site, acts[site] - v))
    fd = (plus - minus) / 2
    assert torch.allclose((grads[site] * v).sum(), fd.sum(), rtol=2e-2, atol=1e-6)

"""Model-side causal-dimensionality pieces on tiny random models (fast)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from structlens.capture.residuals import ce_runner, residual_batches
from structlens.causal_dim import JacobianConfig, jacobians_forward
from structlens.causal_dim.model import (
    eager_attention,
    exact_feature_effects,
    model_causal_dimension,
    residual_function,
    residual_grads,
    sae_splice_writer,
)
from structlens.interventions import hooked
from structlens.models import load_model
from structlens.sae import TopKSAE

LAYER = 1
TOKS = [list(range(5, 15)), list(range(30, 42))]


@pytest.fixture(scope="module")
def model():
    return load_model("tiny-llama")


def _reference_jacobian(model, toks, t, outputs, h0):
    """Autograd Jacobian of the FULL forward (no cache, no batch tricks) w.r.t. the residual."""
    site = f"blocks.{LAYER}.hook_resid_pre"
    ids = torch.tensor([toks])

    def g(h):
        def write(a):
            a = a.clone()
            a[:, t] = h
            return a

        with hooked(model, writes={site: write}, grad=True):
            y = model.forward(ids)[0]
        return y[t] if outputs == "same" else y[t:]

    jac = torch.autograd.functional.jacobian(g, h0[0])
    return jac.reshape(-1, jac.shape[-1])


@pytest.mark.parametrize("outputs", ["same", "downstream"])
@pytest.mark.parametrize("position", [-1, 3, 0])
def test_f_jacobian_matches_autograd_of_model(model, outputs, position):
    toks = TOKS[0]
    f, h0 = residual_function(model, LAYER, toks, position, outputs)
    t = position % len(toks)
    with eager_attention(model):
        jt = jacobians_forward(f, h0)[0]
    ref = _reference_jacobian(model, toks, t, outputs, h0)
    assert torch.allclose(jt.T, ref, atol=1e-5, rtol=1e-4)
    # f at the clean residual reproduces the clean logits.
    clean = model.forward(torch.tensor([toks]))[0]
    expect = clean[t] if outputs == "same" else clean[t:]
    assert torch.allclose(f(h0)[0], expect, atol=1e-5)


@pytest.mark.parametrize("output", ["raw", "log_probs"])
def test_compressed_head_gives_the_same_sigma(model, output):
    kw = dict(position=-3, outputs="downstream")
    full = model_causal_dimension(
        model, LAYER, TOKS, JacobianConfig(output=output), compress_head=False, **kw
    )
    small = model_causal_dimension(
        model, LAYER, TOKS, JacobianConfig(output=output), compress_head=True, **kw
    )
    assert np.allclose(full.sigma, small.sigma, rtol=1e-5, atol=1e-6 * np.abs(full.sigma).max())
    assert full.erank == pytest.approx(small.erank, rel=1e-6)
    assert full.participation_ratio <= full.erank <= full.numerical_rank


def test_unembedding_moments_are_cached_per_weight_and_follow_in_place_edits():
    from structlens.causal_dim import model as side

    weight = torch.nn.Parameter(torch.randn(40_000, 6, dtype=torch.float32))  # > one row block
    w = weight.detach().double()
    gram, ones = side._unembedding_moments(weight)
    assert torch.allclose(gram, w.T @ w, rtol=1e-12) and torch.allclose(ones, w.sum(0))
    assert side._unembedding_moments(weight)[0] is gram  # served from the cache
    with torch.no_grad():
        weight.mul_(2.0)  # an in-place edit moves the version: recomputed
    assert torch.allclose(side._unembedding_moments(weight)[0], 4 * w.T @ w, rtol=1e-12)
    p = torch.softmax(torch.randn(3, 40_000, dtype=torch.float64), -1)
    assert torch.allclose(side._weighted_rows(p, weight), p @ (2 * w), rtol=1e-12)
    key = id(weight)
    del weight
    assert key not in side._UNEMBEDDING  # the entry leaves with its tensor


def test_sae_splice_with_error_leaves_logits_unchanged(model):
    sae = TopKSAE(model.d_model, 128, 4, seed=0)
    ids = torch.tensor([TOKS[0]])
    site = f"blocks.{LAYER}.hook_resid_pre"
    clean = model.forward(ids)
    with torch.no_grad(), hooked(model, writes={site: sae_splice_writer(sae)}):
        spliced = model.forward(ids)
    with torch.no_grad(), hooked(model, writes={site: sae_splice_writer(sae, error_term=False)}):
        lossy = model.forward(ids)
    assert torch.allclose(spliced, clean, atol=1e-5)
    assert not torch.allclose(lossy, clean, atol=1e-3)


def test_residual_batches_and_grads(model):
    from structlens.capture import collect

    acts = torch.cat(list(residual_batches(model, LAYER, TOKS, batch_size=1)))
    ref = collect(model, TOKS, [f"blocks.{LAYER}.hook_resid_pre"], positions="skip-first")
    assert torch.allclose(acts, ref[f"blocks.{LAYER}.hook_resid_pre"], atol=1e-6)
    pairs = list(residual_grads(model, LAYER, TOKS, batch_size=2))
    assert torch.allclose(pairs[0][0], acts, atol=1e-6)
    # grads = d(summed NLL)/d(resid): compare one direction with a finite difference.
    a, g = pairs[0]
    run = ce_runner(model, LAYER, [TOKS[0]], skip_first=False)
    n_pred = len(TOKS[0]) - 1
    v = torch.randn(model.d_model, generator=torch.Generator().manual_seed(0))
    eps = 1e-2

    def shifted(s):
        def fn(x):
            x = x.clone()
            x[:, 4] += s * v  # token 4 of prompt 0 is row 3 (position 0 dropped)
            return x

        return run(fn) * n_pred

    fd = (shifted(eps) - shifted(-eps)) / (2 * eps)
    assert fd == pytest.approx(float(g[3] @ v), rel=2e-2, abs=1e-3)


def test_exact_feature_effects_match_direct_ablation(model):
    sae = TopKSAE(model.d_model, 64, 4, seed=1)
    toks = TOKS[1]
    ids = torch.tensor([toks])
    site = f"blocks.{LAYER}.hook_resid_pre"

    def metric(logits):
        return logits[:, -1, 7] - logits[:, -1, 9]

    feats = [0, 5, 17]
    eff = exact_feature_effects(model, LAYER, toks, sae, feats, metric, chunk=2)
    base = metric(model.forward(ids))
    for j, i in enumerate(feats):

        def write(a, i=i):
            f = sae.encode(a[0])
            f[0] = 0
            return a - f[:, i, None] * sae.W_dec[i]

        with torch.no_grad(), hooked(model, writes={site: write}):
            direct = metric(model.forward(ids)) - base
        assert float(eff[j]) == pytest.approx(float(direct[0]), abs=1e-5)


def test_bad_input(model):
    with pytest.raises(ValueError, match="layer"):
        residual_function(model, 99, TOKS[0])
    with pytest.raises(ValueError, match="position"):
        residual_function(model, LAYER, TOKS[0], position=50)
    with pytest.raises(ValueError, match="outputs"):
        residual_function(model, LAYER, TOKS[0], outputs="all")  # type: ignore[arg-type]
    f, _ = residual_function(model, LAYER, TOKS[0])
    with pytest.raises(ValueError, match="residuals"):
        f(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="exact"):
        model_causal_dimension(model, LAYER, TOKS, JacobianConfig(method="sketch"))
    with pytest.raises(ValueError, match="prompt"):
        model_causal_dimension(model, LAYER, [])


@pytest.mark.slow
def test_smollm2_f_reproduces_clean_logits():
    m = load_model("smollm2-135m")
    ids, _ = m.tokenize(["The quick brown fox jumps over the lazy dog"])
    toks = ids[0].tolist()
    f, h0 = residual_function(m, 15, toks, -1, "same")
    clean = m.forward(ids)[0, -1]
    with torch.no_grad():
        assert torch.allclose(f(h0)[0], clean, atol=1e-3)

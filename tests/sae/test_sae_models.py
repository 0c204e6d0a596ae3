"""SAE architectures: sparse kernels against dense autograd, TopK exactness, bad input."""

import pytest
import torch

from structlens.sae import BatchTopKSAE, JumpReLUSAE, ReLUSAE, TopKSAE
from structlens.sae.sparse import batch_topk_pattern


def _perturbed(sae, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in sae.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return sae


def _dense_reference(sae, x, mask_fn, dead=None, aux_k=None, aux_coef=0.0):
    """Plain dense autograd of the same loss (mask chosen on detached pre-activations)."""
    s = x - sae.b_dec
    pre = s @ sae.W_enc + sae.b_enc
    mask = mask_fn(pre.detach())
    f = torch.relu(pre) * mask
    recon = f @ sae.W_dec + sae.b_dec
    loss = (recon - x).pow(2).sum(-1).mean()
    if dead is not None:
        k = min(aux_k, int(dead.sum()))
        masked = pre.detach().masked_fill(~dead, float("-inf"))
        idx = masked.topk(k, dim=1).indices
        amask = torch.zeros_like(pre, dtype=torch.bool).scatter_(1, idx, True)
        af = torch.relu(pre) * amask
        scale = min(int(dead.sum()) / aux_k, 1.0)
        loss = (
            loss + aux_coef * scale * (af @ sae.W_dec - (x - recon).detach()).pow(2).sum(-1).mean()
        )
    return loss


def _grads(sae, loss):
    sae.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in sae.named_parameters()}


@pytest.mark.parametrize("with_dead", [False, True])
def test_topk_sparse_gradients_equal_dense_autograd(with_dead):
    torch.manual_seed(0)
    sae = _perturbed(TopKSAE(12, 40, k=5, aux_k=6, dtype=torch.float64))
    x = torch.randn(30, 12, dtype=torch.float64)
    dead = torch.zeros(40, dtype=torch.bool)
    dead[::3] = True
    out = sae.training_output(x, dead if with_dead else None, 0.5)
    got = _grads(sae, out.loss)

    def topk_mask(pre):
        return torch.zeros_like(pre, dtype=torch.bool).scatter_(1, pre.topk(5, 1).indices, True)

    ref = _grads(
        sae,
        _dense_reference(sae, x, topk_mask, dead if with_dead else None, aux_k=6, aux_coef=0.5),
    )
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-9, atol=1e-10, msg=name)


def test_batchtopk_and_relu_sparse_gradients_equal_dense():
    torch.manual_seed(0)
    x = torch.randn(25, 10, dtype=torch.float64)
    bt = _perturbed(BatchTopKSAE(10, 30, k=3, dtype=torch.float64))
    got = _grads(bt, bt.training_output(x, None, 0.0).loss)

    def bmask(pre):
        cols, _, rows = batch_topk_pattern(pre, 3)
        m = torch.zeros_like(pre, dtype=torch.bool)
        m[rows, cols] = True
        return m

    ref = _grads(bt, _dense_reference(bt, x, bmask))
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-9, atol=1e-10)

    relu = _perturbed(ReLUSAE(10, 30, dtype=torch.float64))
    with torch.no_grad():
        relu.b_enc.sub_(1.5)  # sparse enough to take the sparse path
    out_sparse = relu.training_output(x, None, 0.3)
    got = _grads(relu, out_sparse.loss)
    type(relu).sparse_density, old = 1.1, type(relu).sparse_density  # force dense path
    try:
        ref = _grads(relu, relu.training_output(x, None, 0.3).loss)
    finally:
        type(relu).sparse_density = old
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-9, atol=1e-10)


def test_topk_gives_exactly_k_active_features():
    sae = TopKSAE(16, 64, k=7, seed=3)
    with torch.no_grad():
        sae.b_enc.fill_(10.0)  # all pre-activations positive, so ReLU cannot drop any
    x = torch.randn(50, 16)
    f = sae.encode(x)
    assert torch.all((f > 0).sum(-1) == 7)
    pre = sae.preacts(x)
    expected = pre.topk(7, dim=-1).indices.sort(-1).values
    assert torch.equal(torch.nonzero(f > 0)[:, 1].reshape(50, 7), expected)


def test_jumprelu_threshold_pseudo_gradient():
    sae = JumpReLUSAE(4, 3, bandwidth=0.5, init_threshold=1.0, dtype=torch.float64)
    with torch.no_grad():
        sae.W_enc_t.copy_(torch.eye(3, 4, dtype=torch.float64))
        sae.W_dec.zero_()
    x = torch.tensor([[1.1, 0.5, 3.0, 0.0]], dtype=torch.float64)
    out = sae.training_output(x, None, 1.0)
    out.sparsity_loss.backward()
    # L0 pseudo-gradient: dθ = −(1/ε)·rect((pre−θ)/ε); pre = (1.1, 0.5, 3.0), θ = 1, ε = 0.5.
    # Only pre_0 lies within ε/2 of θ; the chain rule through θ = exp(log θ) multiplies by θ.
    expected = torch.tensor([-1 / 0.5, 0.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(sae.log_threshold.grad, expected)
    assert out.l0 == 2.0  # 1.1 > 1 and 3.0 > 1


def test_bad_input_raises_clear_errors():
    sae = TopKSAE(8, 16, k=2)
    with pytest.raises(ValueError, match="d_in = 8"):
        sae.encode(torch.randn(3, 5))
    with pytest.raises(ValueError, match="k must be"):
        TopKSAE(8, 16, k=17)
    with pytest.raises(ValueError, match="no inference threshold"):
        BatchTopKSAE(8, 16, k=2).encode(torch.randn(2, 8))

"""Effective ranks of known spectra and Σ = E[JᵀJ] on maps with known Jacobians."""

import math

import numpy as np
import pytest
import torch

from structlens.causal_dim import (
    CausalDimension,
    EJOPAccumulator,
    JacobianConfig,
    SyntheticCausalModel,
)
from structlens.stats.ranks import (
    effective_ranks,
    entropy_effective_rank,
    numerical_rank,
    participation_ratio,
    stable_rank,
)


def test_effective_ranks_of_known_spectra(rng):
    flat = np.r_[np.ones(5), np.zeros(3)]
    r = effective_ranks(flat)
    assert r.entropy_effective_rank == pytest.approx(5)
    assert r.participation_ratio == pytest.approx(5)
    assert r.stable_rank == pytest.approx(5)
    assert r.numerical_rank == 5
    assert "eigenvalues" in r.convention
    lam = np.array([4.0, 1.0])  # p = (0.8, 0.2)
    assert entropy_effective_rank(lam) == pytest.approx(
        math.exp(-(0.8 * math.log(0.8) + 0.2 * math.log(0.2)))
    )
    assert participation_ratio(lam) == pytest.approx(25 / 17)
    assert stable_rank(lam) == pytest.approx(1.25)
    for _ in range(20):
        spec = rng.exponential(size=30) ** 3
        s, p, e, n = (
            stable_rank(spec),
            participation_ratio(spec),
            entropy_effective_rank(spec),
            numerical_rank(spec),
        )
        assert s <= p + 1e-12 <= e + 2e-12 <= n + 3e-12
    # Scale invariance and the eigenvalue/matrix routes agree.
    q, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    lam = np.array([3.0, 2.0, 1.0, 0.5, 0.0, 0.0])
    m = q @ np.diag(lam) @ q.T
    assert effective_ranks(matrix=7 * m).entropy_effective_rank == pytest.approx(
        entropy_effective_rank(lam)
    )


def test_effective_ranks_bad_input():
    with pytest.raises(ValueError, match="NaN"):
        effective_ranks(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="positive semidefinite"):
        effective_ranks(np.array([1.0, -0.5]))
    with pytest.raises(ValueError, match="zero"):
        effective_ranks(np.zeros(3))
    with pytest.raises(ValueError, match="exactly one"):
        effective_ranks()


def test_sigma_of_linear_map_is_wtw():
    w = torch.randn(30, 7, dtype=torch.float64)
    res = CausalDimension(JacobianConfig(n_groups=2)).fit(
        lambda h: h @ w.T, torch.randn(10, 7, dtype=torch.float64)
    )
    np.testing.assert_allclose(res.sigma, (w.T @ w).numpy(), rtol=1e-12, atol=1e-12)
    assert res.relative_error == pytest.approx(0.0, abs=1e-12)  # constant Jacobian
    # [b, P, V] outputs: JᵀJ sums over positions.
    two = CausalDimension().fit(
        lambda h: torch.stack([h @ w.T, 3 * h @ w.T], 1), torch.randn(4, 7, dtype=torch.float64)
    )
    np.testing.assert_allclose(two.sigma, 10 * (w.T @ w).numpy(), rtol=1e-12)


def test_rank_k_bottleneck_gives_numerical_rank_k():
    torch.manual_seed(0)
    for k in (1, 3, 6):
        a, b = torch.randn(k, 12), torch.randn(40, k)
        res = CausalDimension().fit(
            lambda h, a=a, b=b: torch.tanh(h @ a.T) @ b.T, torch.randn(32, 12)
        )
        assert res.numerical_rank == k
        assert res.erank <= k + 1e-9


def test_log_probs_and_nonlinear_match_independent_jacobians():
    torch.manual_seed(1)
    w1, w2 = torch.randn(9, 6, dtype=torch.float64), torch.randn(20, 9, dtype=torch.float64)

    def f(h):
        return torch.tanh(h @ w1.T) @ w2.T

    h = torch.randn(5, 6, dtype=torch.float64)
    ref = torch.zeros(6, 6, dtype=torch.float64)
    for row in h:
        j = torch.autograd.functional.jacobian(lambda v: torch.log_softmax(f(v[None])[0], -1), row)
        ref += j.T @ j
    res = CausalDimension(JacobianConfig(output="log_probs", max_rows=4)).fit(f, h)
    np.testing.assert_allclose(res.sigma, (ref / 5).numpy(), rtol=1e-10, atol=1e-12)
    # log-softmax removes the all-ones logit direction: a map whose logits move only along it
    # has zero log-prob Jacobian.
    est = CausalDimension(JacobianConfig(output="log_probs"))
    along_ones = lambda h: h[:, :1].expand(-1, 7) * 1.0  # noqa: E731
    assert est.partial_fit((along_ones, h)).statistics.sigma().abs().max() < 1e-12
    with pytest.raises(ValueError, match="zero"):
        est.fit(along_ones, h)


def test_sketch_converges_to_exact_and_reports_its_error():
    torch.manual_seed(2)
    model = SyntheticCausalModel(d=10, n_atoms=20, n_causal=4, vocab=30, seed=0)
    h = model.sample(24)
    exact = CausalDimension().fit(model, h)
    errs = []
    for m in (8, 128, 2048):
        sk = CausalDimension(JacobianConfig(method="sketch", n_projections=m, seed=3)).fit(model, h)
        err = np.linalg.norm(sk.sigma - exact.sigma) / np.linalg.norm(exact.sigma)
        errs.append(err)
        assert sk.projection_error / 4 < err < 4 * sk.projection_error
    assert errs[2] < errs[0] / 5 and errs[2] < 0.05
    assert exact.numerical_rank == 4


def test_accumulators_merge_to_one_pass():
    w = torch.randn(8, 5, dtype=torch.float64)

    def f(h):
        return torch.sin(h @ w.T)

    h = torch.randn(16, 5, dtype=torch.float64)
    cfg = JacobianConfig(n_groups=4)
    whole = CausalDimension(cfg).partial_fit((f, h)).statistics
    parts = (
        CausalDimension(cfg)
        .partial_fit((f, h[:7]))
        .statistics.merge(CausalDimension(cfg).partial_fit((f, h[7:])).statistics)
    )
    torch.testing.assert_close(parts.sigma(), whole.sigma(), rtol=1e-12, atol=1e-12)
    assert isinstance(parts, EJOPAccumulator) and parts.n == 16


def test_jacobian_bad_input():
    est = CausalDimension()
    with pytest.raises(ValueError, match=r"\[n, d\]"):
        est.fit(lambda h: h, torch.randn(3, 4, 5))
    with pytest.raises(ValueError, match="NaN"):
        est.fit(lambda h: h, torch.tensor([[float("nan"), 1.0]]))
    with pytest.raises(ValueError, match="f must map"):
        est.fit(lambda h: h.sum(), torch.randn(3, 4))
    with pytest.raises(ValueError, match="method"):
        JacobianConfig(method="lanczos")


def test_vmapped_forward_mode_equals_replicated_rows_and_backward_loop():
    # new (vmap over tangent blocks, one primal pass) vs old (replicated rows) vs reverse mode
    from structlens.causal_dim.jacobian import _jvp_replicated, _wrap, jacobians_forward

    g = torch.Generator().manual_seed(0)
    d, v = 12, 30
    w1, w2 = torch.randn(40, d, generator=g) / d**0.5, torch.randn(v, 40, generator=g) / 40**0.5

    def f(h):
        z = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return torch.nn.functional.silu(z @ w1.T) @ w2.T

    h = torch.randn(5, d, generator=g, dtype=torch.float64)
    w1, w2 = w1.double(), w2.double()
    for max_rows in (7, 24, 4096):  # partial bases, two vectors per call, everything at once
        jt = jacobians_forward(f, h, max_rows=max_rows, output="log_probs")
        old = _jvp_replicated(_wrap(f, "log_probs"), h, torch.eye(d, dtype=h.dtype))
        torch.testing.assert_close(jt, old, rtol=1e-12, atol=1e-12)
    for i in range(h.shape[0]):
        hi = h[i : i + 1].clone().requires_grad_(True)
        y = torch.log_softmax(f(hi), -1)[0]
        rows = [torch.autograd.grad(y[k], hi, retain_graph=True)[0][0] for k in range(v)]
        torch.testing.assert_close(jt[i], torch.stack(rows).T, rtol=1e-6, atol=1e-10)


def test_forward_mode_falls_back_to_replication_when_f_cannot_be_vmapped():
    from structlens.causal_dim.jacobian import jacobians_forward

    w = torch.randn(7, 4, dtype=torch.float64)

    def f(h):
        if float(h.abs().max()) > 1e9:  # data-dependent control flow: vmap refuses it
            raise AssertionError
        return h @ w.T

    jt = jacobians_forward(f, torch.randn(3, 4, dtype=torch.float64))
    torch.testing.assert_close(jt, w.T.expand(3, 4, 7))

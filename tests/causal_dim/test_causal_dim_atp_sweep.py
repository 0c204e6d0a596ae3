"""AtP over SAE features, the error-term splice, width-sweep analysis and controls."""

import math

import numpy as np
import pytest
import torch

from structlens.causal_dim import (
    CausalDimension,
    FeatureStats,
    SyntheticCausalModel,
    WidthSweepConfig,
    analyze_width_sweep,
    atp_recall,
    calibrate_epsilon,
    exact_zero_ablation,
    feature_atp,
    fit_saturating,
    four_cell_ablation,
    random_orthonormal_encoder,
    splice_with_error,
    verify_atp,
)
from structlens.sae import JumpReLUSAE, TopKSAE


def _sae(d=12, m=40, k=4, seed=0):
    sae = TopKSAE(d, m, k=k, seed=seed, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed + 10)
    with torch.no_grad():
        sae.b_dec.copy_(0.1 * torch.randn(d, generator=g, dtype=torch.float64))
        sae.W_dec.mul_(1 + torch.rand(m, 1, generator=g, dtype=torch.float64))
    return sae


def test_atp_equals_exact_ablation_for_linear_metric():
    sae = _sae()
    acts = torch.randn(20, 12, dtype=torch.float64)
    w = torch.randn(12, dtype=torch.float64)
    grads = w.expand(20, 12)  # ∇_h (h·w)
    atp = feature_atp(sae, acts, grads)
    exact = exact_zero_ablation(sae, acts, lambda h: h @ w, range(40))
    torch.testing.assert_close(atp, exact, rtol=1e-10, atol=1e-12)
    # Sign convention: Δ = −f_i ⟨W_dec[i], g⟩.
    f = sae.encode(acts)
    torch.testing.assert_close(atp, -f * (grads @ sae.W_dec.T))


def test_atp_rank_correlates_with_exact_ablation_for_smooth_metric():
    sae = _sae()
    acts = torch.randn(30, 12, dtype=torch.float64)
    v = torch.randn(12, dtype=torch.float64)

    def metric(h):
        return torch.tanh(0.2 * h @ v)

    h = acts.clone().requires_grad_(True)
    (grads,) = torch.autograd.grad(metric(h).sum(), h)
    check = verify_atp(sae, acts, grads, metric, list(range(40)))
    assert check.spearman > 0.9
    assert check.n_tokens == 30


def test_splice_with_error_keeps_outputs_and_gradients():
    sae = _sae()
    h = torch.randn(6, 12, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 12, dtype=torch.float64)

    def downstream(x):
        return torch.logsumexp(torch.tanh(x) @ w.T, -1).sum()

    (g_clean,) = torch.autograd.grad(downstream(h), h)
    h_spliced, f = splice_with_error(sae, h.detach())
    h_spliced.retain_grad()
    loss = downstream(h_spliced)
    loss.backward()
    torch.testing.assert_close(h_spliced, h.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h_spliced.grad, g_clean)
    # SAELens identity: ∂L/∂f = ∇_h L · W_decᵀ.
    torch.testing.assert_close(f.grad, g_clean @ sae.W_dec.T)


def test_n_causal_at_base_width_is_two_percent():
    rng = np.random.default_rng(0)
    for m in (51, 100, 128, 1000, 16384):
        scores = rng.exponential(size=m)
        scores[rng.random(m) < 0.3] = 0.0  # non-firing features count in the population
        eps = calibrate_epsilon(scores, 0.02)
        assert np.sum(scores > eps) == math.ceil(0.02 * m)


def test_saturating_fits_recover_noiseless_curves():
    m = np.array([1e3, 2e3, 4e3, 8e3, 16e3, 32e3, 64e3])
    mm = 500 * m / (m + 6e3)
    fit = fit_saturating(m, mm, "michaelis_menten")
    assert fit["K"] == pytest.approx(500, rel=1e-5) and fit["m_half"] == pytest.approx(
        6e3, rel=1e-5
    )
    ex = 300 * -np.expm1(-m / 1e4)
    assert fit_saturating(m, ex, "exponential")["K"] == pytest.approx(300, rel=1e-5)
    hill = 800 / (1 + (2e4 / m) ** 1.5)
    h = fit_saturating(m, hill, "hill")
    assert h["K"] == pytest.approx(800, rel=1e-4) and h["n"] == pytest.approx(1.5, rel=1e-4)


def _stats_for(sae, acts, grads, start=0, n_blocks=8):
    # synthetic tokens are independent draws: each is its own prompt
    s = FeatureStats(sae.d_sae, n_blocks)
    s.update(sae, acts, grads, torch.arange(start, start + acts.shape[0]))
    return s


def test_width_sweep_analysis_end_to_end():
    torch.manual_seed(0)
    model = SyntheticCausalModel(d=16, n_atoms=64, n_causal=6, vocab=20, seed=1)
    acts = model.sample(400)
    grads = model.metric_grads(acts)
    stats = {}
    for m in (50, 100, 200, 400):
        sae = TopKSAE(16, m, k=4, seed=m)
        stats[m] = _stats_for(sae, acts[:200], grads[:200]).merge(
            _stats_for(sae, acts[200:], grads[200:], start=200)
        )
    kappa = CausalDimension().fit(model, acts[:64]).erank
    res = analyze_width_sweep(stats, WidthSweepConfig(n_bootstrap=30), exact_erank=kappa)
    assert res.n_causal[0] == math.ceil(0.02 * 50)
    assert list(res.widths) == [50, 100, 200, 400]
    assert np.all(res.n_repr <= res.widths)
    assert res.n_causal_growth[0] == 1.0
    if res.kappa_hat_status == "identified":
        assert res.kappa_hat_over_erank == pytest.approx(res.kappa_hat / kappa)
        lo, hi = res.kappa_hat_ci
        assert lo <= hi
    else:  # no κ̂ (and no interval) is reported for an unidentified fit
        assert np.isnan(res.kappa_hat) and res.kappa_hat_over_erank is None
        assert res.kappa_hat_reason
    # Growth CIs: the base width's ratio is 1 in every replicate; bands bracket sensibly.
    assert res.n_repr_growth_ci.shape == (2, 4)
    np.testing.assert_allclose(res.n_repr_growth_ci[:, 0], 1.0)
    assert np.all(res.n_repr_growth_ci[0] <= res.n_repr_growth_ci[1])
    # distinct counts: jackknife intervals around the observed values contain them
    assert np.all(res.n_repr_ci[0] <= res.n_repr) and np.all(res.n_repr <= res.n_repr_ci[1])
    assert np.all(res.n_repr_growth_ci[0] <= res.n_repr_growth)
    assert np.all(res.n_repr_growth <= res.n_repr_growth_ci[1])
    assert res.n_blocks_filled == 8 and res.n_prompts == 400
    if np.isfinite(res.wedge):
        if np.all(np.isfinite(res.wedge_ci)):
            assert res.wedge_ci[0] <= res.wedge <= res.wedge_ci[1]
        else:  # N_causal hits 0 at the widest SAE without some block: no interval, a reason
            assert "wedge" in res.distinct_ci_reason
    # Merging split accumulators equals one pass over all tokens.
    one = _stats_for(TopKSAE(16, 50, k=4, seed=50), acts, grads)
    np.testing.assert_allclose(one.scores()[0], stats[50].scores()[0], rtol=1e-12)
    with pytest.raises(ValueError, match="at least two widths"):
        analyze_width_sweep({50: stats[50]})


def test_four_cell_ablation_and_random_encoder_is_orthonormal():
    sae = _sae(d=12, m=10, k=3)
    enc = random_orthonormal_encoder(sae, seed=0)
    cols = enc.W_enc / enc.W_enc.norm(dim=0, keepdim=True)
    torch.testing.assert_close(
        cols.T @ cols, torch.eye(10, dtype=torch.float64), atol=1e-10, rtol=0
    )
    torch.testing.assert_close(enc.W_enc.norm(dim=0), sae.W_enc.norm(dim=0))
    acts = torch.randn(200, 12, dtype=torch.float64)
    grads = torch.randn(200, 12, dtype=torch.float64)
    res = four_cell_ablation(sae, [(acts[:100], grads[:100]), (acts[100:], grads[100:])])
    assert res.n_causal["learned_enc/learned_dec"] == math.ceil(0.02 * 10)
    assert res.inflation["learned_enc/learned_dec"] == 1.0
    assert set(res.inflation) == {
        "learned_enc/learned_dec",
        "random_enc/learned_dec",
        "learned_enc/random_dec",
        "random_enc/random_dec",
    }


def test_synthetic_model_known_directions_and_recall():
    model = SyntheticCausalModel(
        d=64, n_atoms=48, n_causal=6, vocab=32, active=3, seed=2, orthogonal_atoms=True
    )
    assert CausalDimension().fit(model, model.sample(32)).numerical_rank == 6
    acts = model.sample(600)
    grads = model.metric_grads(acts)
    oracle = TopKSAE(64, 48, k=3, dtype=torch.float32)
    with torch.no_grad():
        oracle.W_dec.copy_(model.atoms)
        oracle.W_enc_t.copy_(model.atoms)
        oracle.b_dec.zero_()
    r = atp_recall(oracle, model.causal, acts, grads, top_k=6)
    assert r.recall == 1.0  # decoder = true atoms, inert ones have AtP 0: exact recovery
    blind = JumpReLUSAE(64, 48, init_threshold=0.01)
    with torch.no_grad():
        blind.W_dec.copy_(torch.linalg.qr(torch.randn(64, 48))[0].T)  # unrelated directions
    assert atp_recall(blind, model.causal, acts, grads, top_k=6).recall == 0.0


def test_atp_bad_input():
    sae = _sae()
    with pytest.raises(ValueError, match="same shape"):
        feature_atp(sae, torch.randn(4, 12), torch.randn(5, 12))
    with pytest.raises(ValueError, match="NaN"):
        feature_atp(sae, torch.full((2, 12), float("nan")), torch.zeros(2, 12))
    with pytest.raises(ValueError, match="indices"):
        exact_zero_ablation(sae, torch.randn(2, 12), lambda h: h.sum(1), [99])
    with pytest.raises(ValueError, match="percentile"):
        WidthSweepConfig(percentile=100)


def test_results_save_and_load(tmp_path):
    model = SyntheticCausalModel(d=8, n_atoms=16, n_causal=3, vocab=10, seed=0)
    res = CausalDimension().fit(model, model.sample(16))
    res.save(tmp_path / "kappa")
    back = type(res).load(tmp_path / "kappa")
    assert back.erank == res.erank and back.numerical_rank == 3
    np.testing.assert_array_equal(back.sigma, res.sigma)

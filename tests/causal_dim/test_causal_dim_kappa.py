"""κ from per-vector Grams: closed forms, jackknife, the few-vector curve, and the model-side
per-vector Grams and multi-layer captures agreeing with their single-layer counterparts."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import torch

from structlens.capture.residuals import residual_batches, residual_batches_multi
from structlens.causal_dim import JacobianConfig
from structlens.causal_dim.kappa import (
    doubling_ratio,
    kappa_curve,
    kappa_from_grams,
    kappa_until_identified,
    residual_bias,
)
from structlens.causal_dim.model import (
    model_causal_dimension,
    residual_grads,
    residual_grads_multi,
    vector_grams,
)
from structlens.models import load_model
from structlens.stats.ranks import effective_ranks


def _rank_one_basis(n: int, d: int) -> np.ndarray:
    """G_i = e_i e_iᵀ: the mean of any s of them has s equal eigenvalues."""
    g = np.zeros((n, d, d))
    for i in range(n):
        g[i, i, i] = 1.0
    return g


def test_identical_grams_have_exact_rank_and_zero_spread():
    g = np.stack([np.diag([1.0, 1.0, 1.0, 0.0, 0.0])] * 6)
    res = kappa_from_grams(g)
    assert res.erank == pytest.approx(3.0) and res.erank_plugin == pytest.approx(3.0)
    assert res.participation_ratio == pytest.approx(3.0)
    assert res.participation_ratio_plugin == pytest.approx(3.0)
    assert res.erank_se == pytest.approx(0.0, abs=1e-9)
    assert res.erank_ci == pytest.approx([3.0, 3.0])
    assert res.ratio_last_doubling == pytest.approx(1.0)
    assert res.kappa_over_d == pytest.approx(3 / 5)
    assert res.n_vectors == 6 and res.d == 5


@pytest.mark.parametrize(("n", "d"), [(9, 7), (9, 30)])
def test_mean_gram_ranks_and_jackknife_match_direct_computation(n, d):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(n, 3, d))
    g = np.einsum("nki,nkj->nij", a, a)  # rank-3 PSD Grams
    res = kappa_from_grams(g)
    ref = effective_ranks(matrix=g.mean(0))
    assert res.erank_plugin == pytest.approx(ref.entropy_effective_rank)
    assert res.participation_ratio_plugin == pytest.approx(ref.participation_ratio)
    loo = np.array(
        [
            effective_ranks(matrix=np.delete(g, i, 0).mean(0)).entropy_effective_rank
            for i in range(n)
        ]
    )
    plain_se = np.sqrt((n - 1) / n * np.sum((loo - loo.mean()) ** 2))

    def corrected(h):  # the bias-corrected κ of the Grams, written out
        m = len(h)
        out = [effective_ranks(matrix=np.delete(h, j, 0).mean(0)).entropy_effective_rank
               for j in range(m)]  # fmt: skip
        return m * effective_ranks(matrix=h.mean(0)).entropy_effective_rank - (m - 1) * np.mean(out)

    # the standard error is that of the bias-corrected estimate: its own delete-one jackknife
    reps = np.array([corrected(np.delete(g, i, 0)) for i in range(n)])
    se = np.sqrt((n - 1) / n * np.sum((reps - reps.mean()) ** 2))
    assert res.erank_se == pytest.approx(se) and res.erank_se > plain_se
    # the point is the bias-corrected estimate, the centre of its interval, within [1, d]
    raw = n * res.erank_plugin - (n - 1) * loo.mean()
    half = scipy.stats.t.ppf(0.975, n - 1) * res.erank_se
    assert res.erank == pytest.approx(np.clip(raw, 1, d))
    assert res.erank_ci == pytest.approx(list(np.clip([raw - half, raw + half], 1, d)))
    assert res.kappa_over_d == pytest.approx(res.erank / d)
    assert ("clipped to [1, d]" in res.ci_method) == (not 1 <= raw <= d)
    if d == 30:  # 9 rank-3 Grams in 30 dimensions: the point needs no clipping
        assert 1 <= raw <= d
    else:  # in 7 dimensions the correction overshoots d: projected onto [1, d]
        assert raw > d and res.erank == pytest.approx(7.0)


def _gaussian_grams(rng, lam, n, k):
    """Rank-k Grams G_i = J_iᵀJ_i with E[G_i] = diag(lam) exactly."""
    z = rng.standard_normal((n, k, lam.size)) * np.sqrt(lam / k)
    return np.einsum("nki,nkj->nij", z, z)


def test_jackknife_interval_covers_the_known_erank_where_the_bootstrap_did_not():
    """A synthetic spectrum with known erank: κ(Σ̂_n) is biased low, a percentile bootstrap
    (duplicated vectors) lies below even the plug-in; the jackknife interval covers κ(Σ)."""
    lam = np.exp(-np.arange(30) / 6.0)
    truth = effective_ranks(lam).entropy_effective_rank
    covered, below = 0, 0
    for seed in range(30):
        rng = np.random.default_rng(seed)
        g = _gaussian_grams(rng, lam, 60, 2)
        res = kappa_from_grams(g)
        covered += res.erank_ci[0] <= truth <= res.erank_ci[1]
        below += res.erank_plugin < truth
        # point and interval are of one estimand: the point is the interval's centre
        assert sum(res.erank_ci) / 2 == pytest.approx(res.erank)
        # the duplicated-vector bootstrap of the old interval sits below the plug-in
        boot = [
            effective_ranks(matrix=g[rng.integers(0, 60, 60)].mean(0)).entropy_effective_rank
            for _ in range(20)
        ]
        assert np.mean(boot) < res.erank_plugin
    assert below == 30  # the plug-in is biased low
    assert covered >= 26  # nominal 95%


def test_doubling_stops_once_kappa_is_identified():
    lam = np.exp(-np.arange(20) / 4.0)
    rng = np.random.default_rng(0)
    conv = kappa_until_identified(lambda k: _gaussian_grams(rng, lam, k, 2), 8, tolerance=1.05)
    fit = conv.fit
    assert conv.identified and conv.n_vectors == [8 * 2**i for i in range(len(conv.n_vectors))]
    assert conv.grams.shape[0] == conv.n_vectors[-1] == fit.n_vectors
    # the rule's criterion, from the reported (raised) interval: both ends within 5% of κ
    lo, hi = fit.erank_ci
    assert fit.erank - lo <= 0.05 * fit.erank and hi - fit.erank <= 0.05 * fit.erank
    # the paper's plug-in ratio is recorded at every size, the bias estimate too
    assert conv.ratio_last_doubling == pytest.approx(doubling_ratio(conv.grams))
    assert conv.residual_bias[-1] == pytest.approx(residual_bias(conv.grams))
    assert "raised by the residual bias" in fit.ci_method
    # a budget too small to identify κ says so; 2 vectors leave no halves for the bias
    capped = kappa_until_identified(lambda k: _gaussian_grams(rng, lam, k, 1), 2, max_vectors=2)
    assert not capped.identified and capped.n_vectors == [2]
    assert np.isnan(capped.residual_bias[-1]) and "not raised" in capped.fit.ci_method
    # rank-one basis: κ(n) = n, so every doubling has ratio exactly 2
    assert doubling_ratio(_rank_one_basis(8, 10)) == pytest.approx(2.0)


def test_identical_grams_are_identified_at_once():
    g = np.stack([np.diag([1.0, 1.0, 0.0])] * 8)
    conv = kappa_until_identified(lambda k: g[:k], 8, max_vectors=64)
    assert conv.identified and conv.n_vectors == [8] and conv.residual_bias == [0.0]
    assert conv.fit.erank_ci == pytest.approx([2.0, 2.0])


def test_residual_bias_is_a_third_of_the_gap_to_the_halves():
    """Independent computation: the bias-corrected κ of all groups and of each half of them,
    each from :func:`kappa_from_grams`."""
    rng = np.random.default_rng(3)
    g = _gaussian_grams(rng, np.ones(12), 24, 2)
    groups = np.arange(24) % 8  # 8 groups in order of first appearance: halves 0-3 and 4-7
    whole = kappa_from_grams(g, groups=groups).erank
    halves = [kappa_from_grams(g[np.isin(groups, h)], groups=groups[np.isin(groups, h)]).erank
              for h in (range(4), range(4, 8))]  # fmt: skip
    assert residual_bias(g, groups) == pytest.approx(max(0.0, (whole - np.mean(halves)) / 3))
    assert residual_bias(g, groups) > 0  # a flat spectrum from few rank-2 vectors: biased low
    assert np.isnan(residual_bias(g[:3]))  # 3 groups: a half of 1 has no jackknife


def test_raised_interval_covers_a_flat_spectrum_that_the_jackknife_misses():
    """Planted flat spectrum in d = 64 from 64 rank-2 vectors in 32 groups: the bias-corrected
    κ is still below κ = 64 by more than its interval's half-width, so the jackknife interval
    misses in most instances; the upper end raised by the residual bias covers it."""
    rng = np.random.default_rng(11)
    groups = np.arange(64) % 32
    old = new = 0
    for _ in range(20):
        g = _gaussian_grams(rng, np.ones(64), 64, 2)
        conv = kappa_until_identified(lambda k, g=g: g[:k], 64, max_vectors=64, groups=groups)
        jack = kappa_from_grams(g, groups=groups).erank_ci
        old += jack[0] <= 64 <= jack[1]
        new += conv.fit.erank_ci[0] <= 64 <= conv.fit.erank_ci[1]
    assert old <= 8 and new >= 18


def test_curve_on_rank_one_basis_equals_subset_size():
    g = _rank_one_basis(8, 10)
    curve = kappa_curve(g, [1, 2, 5, 8], n_draws=5)
    assert curve.sizes == [1.0, 2.0, 5.0, 8.0]
    assert curve.erank == pytest.approx([1.0, 2.0, 5.0, 8.0])
    assert curve.pr == pytest.approx([1.0, 2.0, 5.0, 8.0])
    assert curve.erank_sd == pytest.approx([0.0] * 4, abs=1e-9)


def test_bad_input_raises():
    with pytest.raises(ValueError, match=r"\[n, d, d\]"):
        kappa_from_grams(np.eye(3))
    with pytest.raises(ValueError, match="at least 2"):
        kappa_from_grams(np.eye(3)[None])
    bad = np.stack([np.eye(3)] * 3)
    bad[1, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        kappa_from_grams(bad)
    with pytest.raises(ValueError, match="sizes"):
        kappa_curve(np.stack([np.eye(3)] * 3), [4])


@pytest.fixture(scope="module")
def model():
    return load_model("tiny-llama")


PROMPTS = [list(range(5, 15)), list(range(30, 42)), list(range(50, 57))]


def test_vector_grams_average_to_model_sigma(model):
    cfg = JacobianConfig(output="log_probs", max_rows=model.d_model)
    grams = torch.stack(list(vector_grams(model, 1, PROMPTS, cfg)))
    assert grams.shape == (3, model.d_model, model.d_model) and grams.dtype == torch.float64
    ref = model_causal_dimension(model, 1, PROMPTS, cfg)
    np.testing.assert_allclose(grams.mean(0).numpy(), ref.sigma, rtol=1e-6, atol=1e-9)
    res = kappa_from_grams(grams)
    assert res.erank_plugin == pytest.approx(ref.erank, rel=1e-6)
    assert res.erank_ci[0] <= res.erank <= res.erank_ci[1]


def test_multi_layer_captures_match_single_layer(model):
    multi = list(residual_batches_multi(model, [2, 0], PROMPTS, batch_size=2))
    for layer in (0, 2):
        single = list(residual_batches(model, layer, PROMPTS, batch_size=2))
        for m, s in zip(multi, single, strict=True):
            torch.testing.assert_close(m[layer], s)
    gm = list(residual_grads_multi(model, [0, 2], PROMPTS, batch_size=2))
    for layer in (0, 2):
        for m, (a, g) in zip(gm, residual_grads(model, layer, PROMPTS, batch_size=2), strict=True):
            torch.testing.assert_close(m[layer][0], a)
            torch.testing.assert_close(m[layer][1], g)
    with pytest.raises(ValueError, match="layers is empty"):
        next(residual_batches_multi(model, [], PROMPTS))


def test_kappa_stage_agrees_with_the_streamed_accumulator(model):
    """The κ stage's plug-in is the erank of the same Σ̂ that CausalDimension streams (an
    independent path through the Jacobians); its point lies in its own interval."""
    from structlens.causal_dim.protocol import PROFILES
    from structlens.causal_dim.stages import kappa, prompt_sets

    p = PROFILES["smoke"].replace(kappa_start=4, kappa_max_vectors=4)
    sets = prompt_sets(p, model.tokenizer)
    fit = kappa(p, model, 1, sets)
    assert fit.n_vectors == 4 and fit.doubling_n == [4] and fit.max_vectors == 4
    cfg = JacobianConfig(output="log_probs", max_rows=model.d_model)
    ref = model_causal_dimension(model, 1, sets.kappa_windows[:4], cfg)
    assert fit.erank_plugin == pytest.approx(ref.erank, rel=1e-6)
    assert fit.participation_ratio_plugin == pytest.approx(ref.participation_ratio, rel=1e-6)
    assert fit.erank_ci[0] <= fit.erank <= fit.erank_ci[1]  # one estimand
    # the jackknife's groups are the windows' corpus chunks
    assert fit.n_groups == len(set(sets.kappa_chunks[:4])) and fit.unit == "chunk"
    # a caching driver's Gram source gives the same fit
    cached = kappa(p, model, 1, sets, grams=lambda a, b: np.stack(
        [g.numpy() for g in vector_grams(model, 1, sets.kappa_windows[a:b], cfg)]
    ))  # fmt: skip
    assert cached.erank == fit.erank and cached.erank_ci == fit.erank_ci

"""κ̂ identification, profile intervals and the width-sweep gates on curves with known answers."""

import math

import numpy as np
import pytest
import torch

from structlens.causal_dim.sweep import (
    FeatureStats,
    WidthSweepConfig,
    analyze_width_sweep,
    fit_saturating,
    fvu_gate,
    kappa_identification,
    power_law_lack_of_fit,
    profile_interval_K,
)
from structlens.sae import TopKSAE

WIDTHS = np.array([1e3, 2e3, 4e3, 8e3, 16e3, 32e3, 64e3])


def test_saturating_curve_inside_the_range_is_identified_and_its_interval_covers_truth():
    K, m_half = 500.0, 6e3
    covered = 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        y = K * WIDTHS / (WIDTHS + m_half) * np.exp(0.03 * rng.standard_normal(WIDTHS.size))
        fit = fit_saturating(WIDTHS, y, "michaelis_menten")
        assert kappa_identification(WIDTHS, y, fit) == ("identified", "")
        lo, hi = profile_interval_K(WIDTHS, y, "michaelis_menten")
        assert lo <= fit["K"] <= hi < math.inf
        covered += lo <= K <= hi
    assert covered >= 16  # nominal 95%


def test_linear_and_flat_curves_are_unidentified():
    linear = 0.02 * WIDTHS
    status, reason = kappa_identification(
        WIDTHS, linear, fit_saturating(WIDTHS, linear, "michaelis_menten")
    )
    assert status == "unidentified" and ("m_half" in reason or "upper" in reason)
    flat = np.full(WIDTHS.size, 13.0)
    status, reason = kappa_identification(
        WIDTHS, flat, fit_saturating(WIDTHS, flat, "michaelis_menten")
    )
    assert status == "unidentified" and "m_half" in reason  # saturated below the widths
    # counts that fall with width pin K to its lower bound, max N_causal
    falling = np.linspace(13.0, 11.0, WIDTHS.size)
    status, reason = kappa_identification(
        WIDTHS, falling, fit_saturating(WIDTHS, falling, "michaelis_menten")
    )
    assert status == "unidentified" and "lower bound" in reason
    # saturation well below the smallest width: m_half outside the measured widths
    early = 300 * WIDTHS / (WIDTHS + 300.0)
    status, reason = kappa_identification(
        WIDTHS, early, fit_saturating(WIDTHS, early, "michaelis_menten")
    )
    assert status == "unidentified" and "m_half" in reason


def _with_halves(truth, sigma, seed, halves=100):
    """Counts ``truth·e^{σz}`` and half-sample counts whose log-covariance is ``σ² I`` (scale 1),
    independent across widths."""
    rng = np.random.default_rng(seed)
    noise = lambda *shape: np.exp(sigma * rng.standard_normal(shape))  # noqa: E731
    return truth * noise(truth.size), truth * noise(halves, truth.size)


def test_the_power_law_lack_of_fit_test_holds_its_level_and_rejects_a_saturating_curve():
    """A power law ``a·m^0.5`` (which never saturates) is rejected at 5% about 5% of the time;
    a Michaelis–Menten curve whose bend lies inside the widths is rejected every time, and
    only then is its κ̂ identified."""
    sigma = 0.05
    power = 3.0 * WIDTHS**0.5
    rejected = 0
    for seed in range(300):
        y, halves = _with_halves(power, sigma, seed)
        p = power_law_lack_of_fit(WIDTHS, y, halves, 1.0)
        rejected += p < 0.05
        if p >= 0.05:
            status, reason = kappa_identification(
                WIDTHS, y, fit_saturating(WIDTHS, y, "michaelis_menten"), power_law_p=p
            )
            assert status == "unidentified"
    assert 0.02 <= rejected / 300 <= 0.09
    saturating = 500.0 * WIDTHS / (WIDTHS + 6e3)
    for seed in range(20):
        y, halves = _with_halves(saturating, sigma, seed)
        p = power_law_lack_of_fit(WIDTHS, y, halves, 1.0)
        assert p < 1e-3
        fit = fit_saturating(WIDTHS, y, "michaelis_menten")
        assert kappa_identification(WIDTHS, y, fit, power_law_p=p) == ("identified", "")


def test_an_exact_base_count_is_a_point_the_power_law_must_pass_through():
    """The base width's N_causal does not vary between halves (ε is defined there): the test
    keeps its level with the power law pinned through it, and a law that misses it fails."""
    sigma = 0.05
    power = 3.0 * WIDTHS**0.5
    rejected = 0
    for seed in range(300):
        y, halves = _with_halves(power, sigma, seed)
        y[0], halves[:, 0] = power[0], power[0]
        rejected += power_law_lack_of_fit(WIDTHS, y, halves, 1.0) < 0.05
    assert 0.02 <= rejected / 300 <= 0.09
    y, halves = _with_halves(power, sigma, 0)
    y[0], halves[:, 0] = 2 * power[0], 2 * power[0]  # the rest lies on a law it misses
    assert power_law_lack_of_fit(WIDTHS, y, halves, 1.0) < 1e-6


def test_a_bend_that_cannot_be_tested_is_not_identified():
    y = 500.0 * WIDTHS[:2] / (WIDTHS[:2] + 6e3)
    assert math.isnan(power_law_lack_of_fit(WIDTHS[:2], y, np.tile(y, (10, 1)), 1.0))
    fit = fit_saturating(WIDTHS, 500.0 * WIDTHS / (WIDTHS + 6e3), "michaelis_menten")
    status, reason = kappa_identification(
        WIDTHS, 500.0 * WIDTHS / (WIDTHS + 6e3), fit, power_law_p=math.nan
    )
    assert status == "unidentified" and "cannot be tested" in reason


def test_fvu_gate():
    ok = fvu_gate([64, 128, 256], [0.3, 0.2, 0.1])
    assert ok.passed and ok.cause is None and ok.reason == "" and ok.failing == []
    bad = fvu_gate([512, 1024, 2048], [0.336, 0.301, 0.349])
    assert not bad.passed and bad.failing == [2048] and "2048" in bad.reason
    assert bad.cause == "undiagnosed"  # no training FVU to tell why


def _sweep_stats(d=16, widths=(64, 128, 256)):
    torch.manual_seed(0)
    acts = torch.randn(300, d, dtype=torch.float64)
    grads = torch.randn(300, d, dtype=torch.float64)
    stats = {}
    for m in widths:
        s = FeatureStats(m, 8)
        s.update(TopKSAE(d, m, k=4, seed=m, dtype=torch.float64), acts, grads, torch.arange(300))
        stats[m] = s
    return stats


def test_width_sweep_gates_base_width_and_fvu():
    stats = _sweep_stats()
    with pytest.raises(ValueError, match="base width 64"):
        analyze_width_sweep(stats, WidthSweepConfig(n_bootstrap=0, d_model=32))
    ok = analyze_width_sweep(stats, WidthSweepConfig(n_bootstrap=0, d_model=16))
    assert ok.base_width == 64 and ok.d_model == 16 and ok.fvu_monotone is None
    bad = analyze_width_sweep(
        stats, WidthSweepConfig(n_bootstrap=5), heldout_fvu={64: 0.3, 128: 0.2, 256: 0.25}
    )
    assert bad.sweep_status == "not interpretable" and bad.fvu_monotone is False
    assert bad.kappa_hat_status == "not interpretable" and bad.fits == {}
    assert math.isnan(bad.kappa_hat)
    good = analyze_width_sweep(
        stats, WidthSweepConfig(n_bootstrap=5), heldout_fvu={64: 0.3, 128: 0.2, 256: 0.1}
    )
    assert good.sweep_status == "interpretable" and good.fvu_monotone is True
    assert good.kappa_hat_status in ("identified", "unidentified", "no fit")
    if good.kappa_hat_status != "identified":
        assert math.isnan(good.kappa_hat) and good.kappa_hat_profile_ci is None


def test_exponential_half_width_and_exact_curves():
    ex = 300 * -np.expm1(-WIDTHS / 5e3)  # m½ = 5e3·ln 2 inside the widths
    fit = fit_saturating(WIDTHS, ex, "exponential")
    assert kappa_identification(WIDTHS, ex, fit, "exponential") == ("identified", "")
    lo, hi = profile_interval_K(WIDTHS, ex, "exponential")
    assert lo == pytest.approx(300, rel=1e-4) and hi == pytest.approx(300, rel=1e-4)
    # scale 1.2e3 puts m½ = 832 below the smallest width although m₀ is inside
    early = 300 * -np.expm1(-WIDTHS / 1.2e3)
    fit = fit_saturating(WIDTHS, early, "exponential")
    status, reason = kappa_identification(WIDTHS, early, fit, "exponential")
    assert status == "unidentified"


def _brute_force_rss(widths, y, model):
    """The least residual sum of squares of ``model`` over a dense grid of its parameters in
    their boxes (log K from max y up, log m½ over the widths' span and beyond, Hill's n), an
    independent check of the fit's optimiser."""
    m, ly = np.asarray(widths, float), np.log(y)
    log_k = np.log(y.max()) + np.linspace(0, 8, 161)
    log_h = np.linspace(np.log(m.min()) - 3, np.log(m.max()) + 5, 161)
    n = np.exp(np.linspace(np.log(0.1), np.log(10), 41)) if model == "hill" else np.ones(1)
    K, H, N = np.meshgrid(np.exp(log_k), np.exp(log_h), n, indexing="ij")
    K, H, N = (a[..., None] for a in (K, H, N))
    if model == "michaelis_menten":
        pred = K * m / (m + H)
    elif model == "exponential":
        pred = K * -np.expm1(-m / H)
    else:
        pred = K / (1 + (H / m) ** N)
    return float(np.min(np.sum((np.log(pred) - ly) ** 2, axis=-1)))


@pytest.mark.parametrize("model", ["michaelis_menten", "exponential", "hill"])
def test_the_fit_is_at_least_as_good_as_any_point_of_a_dense_grid(model):
    """``fit_saturating`` profiles log K out and searches the shapes over their whole box: its
    residual sum of squares is never above the best of a dense grid over all parameters, on
    saturating, linear, power-law and noisy flat counts."""
    rng = np.random.default_rng(7)
    w = np.array([2304.0, 4608, 9216, 18432])
    curves = [
        47 * w / w[0],
        188 * w / (w + 3 * w[0]),
        47 * (w / w[0]) ** 0.5,
        47 * np.exp(0.2 * rng.standard_normal(4)),
        np.array([47.0, 39, 30, 27]),  # falling, as SmolLM2's counts did
    ]
    for y in curves:
        y = np.round(y * np.exp(0.05 * rng.standard_normal(4)))
        fit = fit_saturating(w, y, model)
        rss = fit["rms_log_residual"] ** 2 * w.size
        assert rss <= _brute_force_rss(w, y, model) + 1e-9, (model, y, fit)

"""Protocol guarantees of the Koopman analysis: no held-out row reaches a fit, position 0 is
excluded, the split-half slope interval covers data-set variation, noise floors and tails."""

import numpy as np
import pytest
from koopman_synth import linear_system

from structlens.koopman import (
    EDMDc,
    EDMDcConfig,
    IdentityDictionary,
    PCADictionary,
    SAEDictionary,
    SpectralDictionary,
    fit_on_rows,
    invariance_residual,
    invariance_residual_split,
    load_dictionary,
    merge_statistics,
    prompt_split,
    select_sae_features,
    solve,
    split_half_convergence,
)
from structlens.koopman.diagnostics import (
    henrici_noise_floor,
    kurtosis_bounds,
    lifting_tails,
    tail_statistics,
)

LAM = np.array([0.9, 0.5 + 0.3j, 0.5 - 0.3j, -0.4])


def test_invariance_split_fits_the_dictionary_on_training_prompts_only():
    s = linear_system(np.random.default_rng(0), LAM, n_samples=1600, noise=0.2)
    X, U, Y, ids = s["X"], s["U"], s["Y"], s["ids"]
    cfg = EDMDcConfig(alpha=1e-6)
    test = prompt_split(ids, seed=3)
    # prompts never straddle the split
    assert not set(ids[test]) & set(ids[~test])
    leaky = PCADictionary(3).fit(X)  # fitted on all rows: the function must refit it
    got = invariance_residual_split(leaky, X, U, Y, ids, cfg, seed=3)
    explicit = PCADictionary(3).fit(X[~test])
    est = EDMDc(explicit, cfg)
    want = invariance_residual(
        est.statistics(X[~test], U[~test], Y[~test])[0],
        est.statistics(X[test], U[test], Y[test])[0],
        cfg,
    )
    np.testing.assert_allclose(got.per_feature, want.per_feature, rtol=1e-10)
    assert got.dictionary_fit_split == "train"
    assert got.n_train_prompts + got.n_test_prompts == len(np.unique(ids))
    assert np.array_equal(leaky.components, PCADictionary(3).fit(X).components)  # untouched


def test_dictionary_fit_never_sees_held_out_rows():
    s = linear_system(np.random.default_rng(1), LAM, n_samples=2400, noise=0.1)
    X, U, Y, ids = s["X"], s["U"], s["Y"], s["ids"]
    test = prompt_split(ids, seed=0)
    a = fit_on_rows(SpectralDictionary(n_modes=3, k=4, q=2), X, U, Y, ~test)
    # change every held-out row beyond recognition: the fitted dictionary must not move
    X2, U2, Y2 = X.copy(), U.copy(), Y.copy()
    X2[test] = 100.0 * np.random.default_rng(2).standard_normal(X2[test].shape)
    U2[test] = -U2[test]
    Y2[test] = 0.0
    b = fit_on_rows(SpectralDictionary(n_modes=3, k=4, q=2), X2, U2, Y2, ~test)
    for key, arr in a.arrays().items():
        np.testing.assert_array_equal(arr, b.arrays()[key])


def test_split_half_slope_interval_covers_data_set_variation():
    """On a system with a known M^{-1/2} rate, the slope intervals of independent data sets
    cover the rate, and are as wide as the spread of the slope across data sets."""
    slopes, cis = [], []
    for ds in range(16):
        s = linear_system(
            np.random.default_rng(100 + ds),
            np.array([0.8, -0.3]),
            n_controls=1,
            n_samples=32 * 64,
            noise=1.0,
            tokens_per_prompt=4,
        )
        est = EDMDc(IdentityDictionary().fit(s["X"]), EDMDcConfig(alpha=0.0))
        blocks = est.statistics(s["X"], s["U"], s["Y"], s["ids"], n_blocks=32, seed=ds)
        sh = split_half_convergence(blocks, est.config, n_repeats=6, n_groups=8, seed=ds)
        slopes.append(sh.slope)
        cis.append(sh.slope_ci)
    slopes, cis = np.array(slopes), np.array(cis)
    assert abs(slopes.mean() + 0.5) < 0.1
    covered = (cis[:, 0] <= -0.5) & (-0.5 <= cis[:, 1])
    assert covered.mean() >= 13 / 16
    # a 95% interval spans about ±2 data-set standard deviations
    assert np.mean(cis[:, 1] - cis[:, 0]) / 2 >= 1.5 * slopes.std(ddof=1)
    with pytest.raises(ValueError, match="n_groups"):
        split_half_convergence(blocks, est.config, n_groups=20)


def _system(rng, A, n, noise):
    d = A.shape[0]
    X, U = rng.standard_normal((n, d)), rng.standard_normal((n, 2))
    Y = X @ A.T + U @ rng.standard_normal((d, 2)).T + noise * rng.standard_normal((n, d))
    return X, U, Y, np.arange(n) // 8


def test_henrici_noise_floor_separates_sampling_from_non_normality():
    rng = np.random.default_rng(0)
    d = 10
    Q = np.linalg.qr(rng.standard_normal((d, d)))[0]
    ev = np.linspace(-0.5, 0.9, d)
    normal = Q @ np.diag(ev) @ Q.T
    skew = Q @ (np.diag(ev) + np.diag(np.full(d - 1, 0.3), 1)) @ Q.T
    cfg = EDMDcConfig(alpha=0.0)
    fits = {}
    for name, A in (("normal", normal), ("skew", skew)):
        X, U, Y, ids = _system(rng, A, 8000, 1.0)
        blocks = EDMDc(IdentityDictionary().fit(X), cfg).statistics(X, U, Y, ids, n_blocks=16)
        fits[name] = henrici_noise_floor(blocks, cfg, n_repeats=10)
    # a normal operator: the raw departure is sampling noise, and the floor says so
    nf = fits["normal"]
    assert nf.henrici > 0.05 and nf.noise_floor > 0.5 * nf.henrici
    assert nf.henrici_extrapolated < 0.6 * nf.henrici
    # a non-normal one (Schur form with known strict upper part): the departure survives
    truth = float(np.sqrt(0.3**2 * (d - 1)))
    assert fits["skew"].henrici_extrapolated == pytest.approx(truth, rel=0.12)
    # a truncated (PCA-3) fit goes through the same statistics
    X, U, Y, ids = _system(rng, skew, 4000, 1.0)
    blocks = EDMDc(PCADictionary(3).fit(X), cfg).statistics(X, U, Y, ids, n_blocks=8)
    assert henrici_noise_floor(blocks, cfg, n_repeats=2).n_features == 3


def _merged_one_by_one(parts, weights, *, with_state=True, chunk_bytes=0):
    """The loop the batched pooling replaces: merge_statistics of each row of weights."""
    parts = list(parts)
    return iter([merge_statistics(parts, w) for w in np.asarray(weights)])


def test_batched_pooling_gives_the_resampling_loops_numbers(monkeypatch):
    # split halves (and their jackknife), noise-floor halves and quarters, permutations and
    # bootstrap resamples of the blocks, pooled in one pass each: the same draws and the same
    # numbers as pooling every half or resample by itself; a large state mean
    from structlens.koopman import convergence, diagnostics, stages

    cfg = EDMDcConfig(alpha=1e-6, control_rank=2)
    models = []
    for seed in (7, 8):
        s = linear_system(np.random.default_rng(seed), LAM, n_controls=3, n_samples=3200, noise=0.3)
        X, Y = s["X"] + 1e3, s["Y"] + 1e3
        dic = PCADictionary(3).fit(X)
        models.append((dic, EDMDc(dic, cfg).statistics(X, s["U"], Y, s["ids"], n_blocks=16)))
    (dic, blocks), (_, other) = models

    def resampled():
        sh = split_half_convergence(blocks, cfg, n_repeats=4)
        hn = henrici_noise_floor(blocks, cfg, n_repeats=3)
        ut = convergence.universality_test(blocks, other, cfg, n_permutations=5)
        st = convergence.spectral_distance_test(blocks, other, cfg, n_resamples=5)
        return [
            sh.w_inf, sh.w2, sh.n_samples, [sh.slope, *sh.slope_ci, hn.henrici, hn.noise_floor],
            [hn.henrici_extrapolated, hn.n_samples_half], ut.null, st.null,
        ]  # fmt: skip

    batched = resampled()
    monkeypatch.setattr(convergence, "merge_statistics_many", _merged_one_by_one)
    monkeypatch.setattr(diagnostics, "merge_statistics_many", _merged_one_by_one)
    for got, want in zip(batched, resampled(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9)
    # the spectral-radius bootstrap against a full solve of each resample, pooled by itself
    draws, radii = np.random.default_rng(0), []
    for _ in range(20):
        counts = np.bincount(draws.integers(0, 16, 16), minlength=16)
        radii.append(np.max(np.abs(solve(merge_statistics(blocks, counts), cfg, dic).eigenvalues)))
    np.testing.assert_allclose(
        stages._radius_bootstrap(blocks, cfg, 20, 0), np.percentile(radii, [2.5, 97.5]), rtol=1e-10
    )


def test_kurtosis_bounds_cover_known_kurtoses_and_widen_with_an_outlier():
    """Gaussian coordinates (excess kurtosis 0) and a Bernoulli(2%) one (45) lie inside their
    bounds; one extreme row lifts a coordinate's sample kurtosis far above 10 but widens its
    jackknife spread as much, so its lower bound stays below (the statistic the heavy-tail rule
    reads, not the sample maximum)."""
    rng = np.random.default_rng(1)
    n = 20000
    x = rng.standard_normal((n, 4))
    x[:, 3] = rng.random(n) < 0.02
    prompts = np.arange(n) // 16
    est, lower, upper = kurtosis_bounds(x, prompts)
    truth = np.array([0.0, 0.0, 0.0, (1 - 6 * 0.02 * 0.98) / (0.02 * 0.98)])
    assert np.all(lower < truth) and np.all(truth < upper)
    assert np.all(lower <= est) and np.all(est <= upper)
    assert lower[3] > 10 and upper[:3].max() < 1
    # one prompt group holding one extreme value
    y = rng.standard_normal((2000, 2))
    y[7, 0] = 40.0
    est, lower, _ = kurtosis_bounds(y, np.arange(2000) // 16)
    stats = tail_statistics(y, np.arange(2000) // 16)
    assert stats["max_excess_kurtosis"] > 100 and lower[0] < 10
    assert stats["max_kurtosis_lower"] < 10 and stats["kurtosis_blocks"] == 32
    # rows as their own groups are the default; one group leaves the bounds undefined
    np.testing.assert_array_equal(kurtosis_bounds(y, np.arange(2000))[1], kurtosis_bounds(y)[1])
    assert np.isnan(kurtosis_bounds(y, np.zeros(2000))[1]).all()
    with pytest.raises(ValueError, match="one label per row"):
        kurtosis_bounds(y, np.arange(5))


def test_tail_statistics_known_answers():
    rng = np.random.default_rng(0)
    n, d = 40000, 8
    gauss = rng.standard_normal((n, d))
    t = tail_statistics(gauss)
    assert abs(t["max_excess_kurtosis"]) < 0.2
    assert t["norm_kurtosis"] == pytest.approx((d + 2) / d, rel=0.03)
    # z_i z_j of independent Gaussians: kurtosis 9, excess 6
    assert t["gram_max_excess_kurtosis"] == pytest.approx(6.0, rel=0.25)
    # one sparse spike coordinate: Bernoulli(p) has excess kurtosis (1 − 6pq)/(pq) = 45 at 2%
    spiky = gauss.copy()
    spiky[:, 3] = 10.0 * (rng.random(n) < 0.02)
    s = tail_statistics(spiky)
    assert s["argmax_excess_kurtosis"] == 3
    assert s["max_excess_kurtosis"] == pytest.approx((1 - 6 * 0.02 * 0.98) / (0.02 * 0.98), rel=0.1)
    assert s["p95_excess_kurtosis"] < s["max_excess_kurtosis"]
    assert s["norm_kurtosis"] > t["norm_kurtosis"]
    assert s["gram_max_excess_kurtosis"] > 5 * t["gram_max_excess_kurtosis"]
    lifted = lifting_tails(spiky, PCADictionary(8).fit(spiky))
    assert set(lifted) == {"state", "lifted"}
    # a rotation-only lift (PCA, all components) keeps the norm kurtosis
    assert lifted["lifted"]["norm_kurtosis"] == pytest.approx(s["norm_kurtosis"], rel=1e-9)


@pytest.mark.parametrize("activation", ["relu", "topk"])
def test_sae_features_selected_by_variance_and_frequency(activation, tmp_path):
    rng = np.random.default_rng(0)
    d, m = 6, 10
    W = rng.standard_normal((d, m))
    W[:, 3] *= 5.0  # latent 3 has the largest code variance
    b_enc = np.full(m, -0.5)
    b_enc[7] = 3.0  # latent 7 fires on almost every row
    sae = SAEDictionary(W, b_enc, np.zeros(d), activation=activation, k=4)
    X = rng.standard_normal((4000, d))
    full = sae.transform(X)
    by_var = select_sae_features(sae, X, 3, "variance")
    by_freq = select_sae_features(sae, X, 3, "frequency")
    assert 3 in by_var.features and 7 in by_freq.features
    want_var = np.sort(np.argsort(-full.var(0), kind="stable")[:3])
    np.testing.assert_array_equal(by_var.features, want_var)
    # each kept latent is the whole SAE's code, TopK competition included
    np.testing.assert_array_equal(by_freq.transform(X), full[:, by_freq.features])
    assert by_var.n_features == 3 and sae.features is None
    back = load_dictionary(by_var.save(tmp_path / "d"))
    np.testing.assert_array_equal(back.transform(X), by_var.transform(X))

"""Protocol guarantees of the Koopman analysis: no held-out row reaches a fit, position 0 is
excluded, the split-half slope interval covers data-set variation, noise floors and tails."""

import numpy as np
from koopman_synth import linear_system

from structlens.koopman import (
    EDMDc,
    EDMDcConfig,
    PCADictionary,
    SpectralDictionary,
    fit_on_rows,
    invariance_residual,
    invariance_residual_split,
    prompt_split,
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

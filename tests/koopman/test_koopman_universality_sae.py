import numpy as np
import pytest
from koopman_synth import linear_system

from structlens.koopman import EDMDc, EDMDcConfig, IdentityDictionary, invariance_residual_split
from structlens.koopman.convergence import spectral_distance_test
from structlens.koopman.invariance import decoder_agreement, train_sae_dictionary

LAM = np.array([0.9, 0.5 + 0.3j, 0.5 - 0.3j, -0.4, 0.1])


def _blocks(s, cfg):
    est = EDMDc(IdentityDictionary().fit(s["X"]), cfg)
    return est.statistics(s["X"], s["U"], s["Y"], s["ids"], n_blocks=8)


def test_spectral_distance_test_separates_spectra_in_different_bases():
    cfg = EDMDcConfig(alpha=0.0)
    a = linear_system(np.random.default_rng(1), LAM, n_samples=3000, noise=0.3)
    # same spectrum, another random basis S (the test never mixes the two coordinate systems)
    same = linear_system(np.random.default_rng(2), LAM, n_samples=3000, noise=0.3)
    lam_b = LAM.copy()
    lam_b[0] = 0.6
    diff = linear_system(np.random.default_rng(3), lam_b, n_samples=3000, noise=0.3)
    ba = _blocks(a, cfg)
    r_same = spectral_distance_test(ba, _blocks(same, cfg), cfg, n_resamples=80)
    r_diff = spectral_distance_test(ba, _blocks(diff, cfg), cfg, n_resamples=80)
    assert r_same.p_value > 0.05
    assert r_diff.p_value < 0.05
    assert r_diff.distance == pytest.approx(0.3, abs=0.05)
    # equal sample sizes: halves are rescaled by sqrt(2/4)
    assert r_same.null_scale == pytest.approx([np.sqrt(0.5)] * 2)


def test_spectral_distance_test_rejects_bad_input():
    cfg = EDMDcConfig(alpha=0.0)
    s = linear_system(np.random.default_rng(0), LAM, n_samples=400)
    b = _blocks(s, cfg)
    with pytest.raises(ValueError, match="at least 2"):
        spectral_distance_test(b[:1], b, cfg)


def test_decoder_agreement_is_invariant_to_order_and_sign():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((12, 6))
    perm = rng.permutation(12)
    signs = rng.choice([-1.0, 1.0], size=(12, 1))
    same = decoder_agreement(w, 3.0 * signs * w[perm])
    assert same["mean_cos"] == pytest.approx(1.0) and same["share_above"] == 1.0
    other = decoder_agreement(w, rng.standard_normal((12, 6)))
    assert other["mean_cos"] < 0.9
    with pytest.raises(ValueError, match="equal shape"):
        decoder_agreement(w, w[:5])


def test_invariance_penalty_lowers_held_out_residual():
    s = linear_system(np.random.default_rng(4), LAM, n_samples=4096, noise=0.05)
    cfg = EDMDcConfig(alpha=1e-6)
    kw = dict(d_sae=12, k=3, control_rank=2, epochs=6, batch_size=256, lr=3e-3, seed=0)
    res = {}
    for lam in (0.0, 3.0):
        dic, info = train_sae_dictionary(s["X"], s["U"], s["Y"], invariance_weight=lam, **kw)
        assert info["decoder"].shape == (12, 5)
        dic.fit(s["X"])
        res[lam] = invariance_residual_split(dic, s["X"], s["U"], s["Y"], s["ids"], cfg).pooled
    assert res[3.0] < res[0.0]
    with pytest.raises(ValueError, match="U and next states Y"):
        train_sae_dictionary(s["X"], invariance_weight=1.0, **kw)
    with pytest.raises(ValueError, match="batch_size"):
        train_sae_dictionary(s["X"], s["U"], s["Y"], invariance_weight=1.0, **{**kw, "d_sae": 300})

import numpy as np
import pytest
import torch
from koopman_synth import linear_system

from structlens.koopman import (
    EDMDc,
    EDMDcConfig,
    IdentityDictionary,
    PCADictionary,
    RandomFourierDictionary,
    balanced_truncation,
    eigendecomposition,
    markov_parameters,
    modal_principal_dissociation,
    mode_ablation,
    non_normality,
    real_modes,
    spectral_projectors,
    split_half_convergence,
    toeplitz_operator,
    universality_test,
)

LAM = np.array([0.9, 0.5 + 0.3j, 0.5 - 0.3j, -0.4, 0.1])


def test_projector_algebra(rng):
    A = rng.standard_normal((6, 6))
    eig = eigendecomposition(A)
    modes = real_modes(eig)
    P = spectral_projectors(eig, modes)
    assert sum(m.size for m in modes) == 6
    for i, Pi in enumerate(P):
        assert np.isrealobj(Pi)
        for j, Pj in enumerate(P):
            np.testing.assert_allclose(Pi @ Pj, Pi if i == j else 0 * Pi, atol=1e-9)
    np.testing.assert_allclose(sum(P), np.eye(6), atol=1e-10)
    # Σ λ_i P_i = A, with the complex projectors of each member of a pair
    recon = sum(
        lam * np.outer(eig.right[:, i], eig.left[:, i].conj())
        for i, lam in enumerate(eig.eigenvalues)
    )
    np.testing.assert_allclose(recon, A, atol=1e-10)
    # a real mode's projector commutes with A and A restricted to it has the mode's λ
    for m, Pm in zip(modes, P, strict=True):
        np.testing.assert_allclose(A @ Pm, Pm @ A, atol=1e-10)
        ev = np.linalg.eigvals(np.linalg.pinv(m.basis) @ A @ m.basis)
        assert np.min(np.abs(ev - m.eigenvalue)) < 1e-9


def test_non_normality(rng):
    Q, _ = np.linalg.qr(rng.standard_normal((5, 5)))
    normal = Q @ np.diag([0.9, 0.5, -0.3, 0.2, 0.1]) @ Q.T
    nn = non_normality(normal)
    assert nn.henrici == pytest.approx(0, abs=1e-12)
    assert nn.kappa_V == pytest.approx(1, abs=1e-8)
    np.testing.assert_allclose(nn.eig_condition, 1, atol=1e-8)
    J = np.array([[0.5, 10.0], [0.0, 0.4]])
    nj = non_normality(J)
    assert nj.henrici == pytest.approx(10.0)  # ‖A‖_F² − Σ|λ|² = 100
    assert nj.henrici_relative == pytest.approx(10 / np.linalg.norm(J))
    assert nj.kappa_V > 50 and np.all(nj.eig_condition > 50)


def test_mode_ablation_removes_the_mode_exactly_for_linear_dictionaries(rng):
    s = linear_system(rng, LAM, n_samples=800, noise=0.05)
    for dic in (IdentityDictionary().fit(s["X"]), PCADictionary(5).fit(s["X"])):
        res = EDMDc(dic, EDMDcConfig(alpha=0.0)).fit(s["X"], s["U"], s["Y"])
        eig = eigendecomposition(res.A)
        modes = real_modes(eig)
        pair = next(i for i, m in enumerate(modes) if m.size == 2)
        abl = mode_ablation(res, dic, [pair])
        x2 = abl(s["X"])
        np.testing.assert_allclose(x2, s["X"] @ abl.weight + abl.bias)
        # the ablated modes' eigenfunctions are at their mean; the others are untouched
        before, after = (
            (dic.transform(x) - res.psi_mean_x) @ eig.left.conj() for x in (s["X"], x2)
        )
        idx = list(modes[pair].indices)
        np.testing.assert_allclose(after[:, idx], 0, atol=1e-9)
        rest = [i for i in range(5) if i not in idx]
        np.testing.assert_allclose(after[:, rest], before[:, rest], atol=1e-9)
        xt = torch.tensor(s["X"], dtype=torch.float32)
        assert isinstance(abl(xt), torch.Tensor)
    rff = RandomFourierDictionary(8, seed=0).fit(s["X"])
    res = EDMDc(rff, EDMDcConfig(alpha=1e-6)).fit(s["X"], s["U"], s["Y"])
    nl = mode_ablation(res, rff, [0])
    assert nl.weight is None and nl(s["X"]).shape == s["X"].shape
    with pytest.raises(ValueError, match="out of range"):
        mode_ablation(res, rff, [999])


def test_modal_principal_dissociation(rng):
    # A shares its eigenvectors with the PCA axes: modes and principal directions coincide
    d, M = 5, 4000
    scales = np.array([5.0, 3.0, 2.0, 1.0, 0.5])
    Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    A = Q @ np.diag([0.9, 0.8, 0.3, 0.2, 0.1]) @ Q.T
    X = (rng.standard_normal((M, d)) * scales) @ Q.T
    U = rng.standard_normal((M, 1))
    Y = X @ A.T + U @ rng.standard_normal((1, d))
    res = EDMDc(IdentityDictionary().fit(X), EDMDcConfig(alpha=0)).fit(X, U, Y)
    aligned = modal_principal_dissociation(res, 2)
    assert aligned.largest_angle < 0.05 and aligned.mean_cos2 > 0.99
    # reverse the dynamics' ordering: dominant modes are the low-variance directions
    A2 = Q @ np.diag([0.1, 0.2, 0.3, 0.8, 0.9]) @ Q.T
    res2 = EDMDc(IdentityDictionary().fit(X), EDMDcConfig(alpha=0)).fit(X, U, X @ A2.T)
    apart = modal_principal_dissociation(res2, 2)
    assert apart.mean_cos2 < 0.01 and apart.largest_angle > 1.5


def test_split_half_slope_is_minus_one_half(rng):
    s = linear_system(rng, LAM, n_samples=64 * 300, noise=0.5, tokens_per_prompt=4)
    dic = IdentityDictionary().fit(s["X"])
    est = EDMDc(dic, EDMDcConfig(alpha=0.0))
    blocks = est.statistics(s["X"], s["U"], s["Y"], s["ids"], n_blocks=64, seed=0)
    sh = split_half_convergence(blocks, est.config, n_repeats=24, seed=1)
    assert sh.w_inf.shape == (24, 6)  # half sizes 1..16 and 28: a jackknife replicate has 56 blocks
    assert -0.62 < sh.slope < -0.38
    assert sh.slope_ci[0] < sh.slope < sh.slope_ci[1]
    assert -0.65 < sh.slope_w2 < -0.35
    assert sh.eig_condition_max >= 1
    assert np.all(np.diff(sh.n_samples) > 0)


def test_universality_test(rng):
    sys_a = linear_system(rng, LAM, n_samples=3000, noise=0.3)
    rng2 = np.random.default_rng(7)
    same = linear_system(rng2, LAM, n_samples=3000, noise=0.3)  # other basis, same spectrum
    lam_b = LAM.copy()
    lam_b[0] = 0.6
    diff = linear_system(rng2, lam_b, n_samples=3000, noise=0.3)
    cfg = EDMDcConfig(alpha=0.0)

    def blocks(s):
        est = EDMDc(IdentityDictionary().fit(s["X"]), cfg)
        return est.statistics(s["X"], s["U"], s["Y"], s["ids"], n_blocks=8)

    ba = blocks(sys_a)
    assert universality_test(ba, blocks(same), cfg, n_permutations=60).p_value > 0.05
    r = universality_test(ba, blocks(diff), cfg, n_permutations=60)
    assert r.p_value < 0.05 and r.distance == pytest.approx(0.3, abs=0.05)


@pytest.mark.parametrize("gramians", ["shifted", "finite"])
def test_reduction_bounds_never_below_true_error(rng, gramians):
    n, m, p, L = 9, 4, 3, 7
    sigma_u = np.diag([1.0, 0.05, 0.01, 0.001])
    for _ in range(12):
        A = rng.standard_normal((n, n))
        A *= (0.4 + 0.9 * rng.random()) / np.max(np.abs(np.linalg.eigvals(A)))  # some unstable
        B, C = rng.standard_normal((n, m)), rng.standard_normal((p, n))
        for order in (2, 5):
            r = balanced_truncation(A, B, C, order, L, input_cov=sigma_u, gramians=gramians)
            # independent check of the reported error from the explicit Toeplitz operators
            full = toeplitz_operator(markov_parameters(A, B, C, L))
            red = toeplitz_operator(markov_parameters(r.A_r, r.B_r, r.C_r, L))
            assert r.error == pytest.approx(np.linalg.norm(full - red, 2), rel=1e-8)
            assert r.markov_bound >= r.error * (1 - 1e-12)
            assert r.instance_markov_bound >= r.instance_error * (1 - 1e-12)
            if gramians == "shifted":
                assert r.certified
                assert r.enns_glover >= r.error * (1 - 1e-9)
                assert r.instance_bound >= r.instance_error * (1 - 1e-9)
                assert r.instance_bound <= r.enns_glover * (1 + 1e-9)
            np.testing.assert_array_less(r.hsv_instance, r.hsv * (1 + 1e-9) + 1e-12)
    with pytest.raises(ValueError, match="order"):
        balanced_truncation(A, B, C, n, L)
    with pytest.raises(ValueError, match="shapes"):
        balanced_truncation(A, B.T, C, 2, L)

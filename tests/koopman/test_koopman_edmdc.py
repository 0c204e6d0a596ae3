import numpy as np
import pytest
import torch
from koopman_synth import linear_system

from structlens.koopman import (
    Dictionary,
    EDMDc,
    EDMDcConfig,
    EDMDcResult,
    IdentityDictionary,
    PCADictionary,
    RandomFourierDictionary,
    RandomReLUDictionary,
    SAEDictionary,
    SpectralDictionary,
    accumulate,
    invariance_penalty,
    invariance_residual,
    invariance_residual_split,
    iter_chunks,
    load_dictionary,
    merge_statistics,
    merge_statistics_many,
    solve,
)

LAM = np.array([0.9, 0.5 + 0.3j, 0.5 - 0.3j, -0.4])


class LinearDictionary(Dictionary):
    """Ψ(x) = x M for an invertible M: an invertible change of dictionary basis."""

    kind = "test_linear"

    def __init__(self, M: np.ndarray) -> None:
        self.M, self.dim = M, None

    def _lift(self, x):
        return x @ self.M

    def _n_features(self):
        return self.M.shape[1]


def test_exact_recovery_noiseless(rng):
    s = linear_system(rng, LAM, n_controls=3, n_samples=400)
    res = EDMDc(IdentityDictionary().fit(s["X"]), EDMDcConfig(alpha=0.0)).fit(
        s["X"], s["U"], s["Y"]
    )
    np.testing.assert_allclose(res.A, s["A"], atol=1e-10)
    np.testing.assert_allclose(res.B_full(), s["B"], atol=1e-10)
    np.testing.assert_allclose(np.sort_complex(res.eigenvalues), np.sort_complex(LAM), atol=1e-10)
    assert res.readout == "selector"
    np.testing.assert_array_equal(res.C, np.eye(4))
    assert np.isfinite(res.cond_gram) and res.cond_gram >= 1


def test_control_compression_exact_when_u_is_low_rank(rng):
    s = linear_system(rng, LAM, n_controls=2, n_samples=400)
    mix = rng.standard_normal((2, 6))
    U6 = s["U"] @ mix  # 6-dim control of rank 2
    Y = s["X"] @ s["A"].T + U6 @ (np.linalg.pinv(mix) @ s["B"].T)
    cfg = EDMDcConfig(alpha=0.0, control_energy=0.999999)
    res = EDMDc(IdentityDictionary().fit(s["X"]), cfg).fit(s["X"], U6, Y)
    assert res.control_rank == 2
    np.testing.assert_allclose(res.A, s["A"], atol=1e-9)
    np.testing.assert_allclose(res.predict(s["X"], U6), Y, atol=1e-8)


def test_merged_statistics_equal_one_pass(rng):
    s = linear_system(rng, LAM, n_samples=600, noise=0.1)
    dic = RandomFourierDictionary(16, seed=3).fit(s["X"])
    cfg = EDMDcConfig(alpha=1e-6, control_rank=1)
    one = EDMDc(dic, cfg).statistics(s["X"], s["U"], s["Y"])[0]
    parts = accumulate(dic, iter_chunks(s["X"], s["U"], s["Y"], s["ids"], 77), n_blocks=5)
    merged = merge_statistics(parts)
    assert merged.n == one.n == 600
    np.testing.assert_allclose(merged.zy.s_xx, one.zy.s_xx, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(merged.zy.s_xy, one.zy.s_xy, rtol=1e-10, atol=1e-10)
    r1, r2 = solve(one, cfg, dic), solve(merged, cfg, dic)
    np.testing.assert_allclose(r1.A, r2.A, atol=1e-8)
    np.testing.assert_allclose(r1.B, r2.B, atol=1e-8)


def test_weighted_merge_equals_merging_the_repeated_parts(rng):
    s = linear_system(rng, LAM, n_controls=3, n_samples=600, noise=0.1)
    dic = RandomFourierDictionary(12, seed=1).fit(s["X"])
    parts = accumulate(dic, iter_chunks(s["X"], s["U"], s["Y"], s["ids"], 50), n_blocks=4)
    weights = [0, 2, 1, 3]  # a bootstrap draw of the four blocks, as counts
    repeated = merge_statistics([p for p, k in zip(parts, weights) for _ in range(k)])
    weighted = merge_statistics(parts, weights)
    assert weighted.n == repeated.n
    np.testing.assert_allclose(weighted.zy.s_xx, repeated.zy.s_xx, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(weighted.zy.s_xy, repeated.zy.s_xy, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(weighted.tails.m4, repeated.tails.m4, rtol=1e-10)


@pytest.mark.parametrize("make", [lambda: PCADictionary(3), lambda: IdentityDictionary()])
def test_merge_statistics_many_equals_merge_statistics_per_row(rng, make):
    # separate state moments (PCA) or the state inside Z (identity); a large state mean
    s = linear_system(rng, LAM, n_controls=3, n_samples=900, noise=0.1)
    X, Y = s["X"] + 1e3, s["Y"] + 1e3
    dic = make().fit(X)
    parts = accumulate(dic, iter_chunks(X, s["U"], Y, s["ids"], 64), n_blocks=6)
    W = np.array([[1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1], [2, 0, 1, 3, 0, 0], [0] * 6])
    for w, got in zip(W, merge_statistics_many(parts, W, chunk_bytes=1)):
        want = merge_statistics(parts, w)
        assert got.n == want.n and (got.state is None) == (want.state is None)
        if want.n == 0:
            continue
        accs = [(got.zy, want.zy)] + ([(got.state, want.state)] if want.state else [])
        for a, b in accs:
            for name in ("mean_x", "mean_y", "s_xx", "s_xy", "s_yy"):
                x, y = getattr(a, name), getattr(b, name)
                assert np.max(np.abs(x - y)) <= 1e-12 * np.max(np.abs(y)), name
        np.testing.assert_allclose(got.tails.m4, want.tails.m4, rtol=1e-10)
    # the operator's moments alone: the same operator, no state moments to read out from
    from structlens.koopman.edmdc import _solve_operator, control_basis

    cfg = EDMDcConfig(alpha=1e-6, control_rank=2)
    (lean,) = merge_statistics_many(parts, W[:1], with_state=False)
    full = merge_statistics(parts, W[0])
    assert lean.state is None
    ops = [_solve_operator(st, cfg, control_basis(st, cfg)[0])[0] for st in (lean, full)]
    np.testing.assert_allclose(ops[0], ops[1], rtol=1e-9, atol=1e-12)
    if full.state is not None:
        with pytest.raises(ValueError, match="no state moments"):
            lean.state_moments(True)
    other = accumulate(dic, [(X, s["U"][:, :2], Y)])[0]  # two controls, not three
    with pytest.raises(ValueError, match="different shapes"):
        merge_statistics_many([parts[0], other], W[:1, :2])


@pytest.mark.parametrize("center", [True, False])
def test_projected_controls_give_the_same_operator(rng, center):
    from structlens.koopman.edmdc import _solve_operator, control_basis

    s = linear_system(rng, LAM, n_controls=5, n_samples=500, noise=0.1)
    dic = RandomFourierDictionary(10, seed=2).fit(s["X"])
    cfg = EDMDcConfig(alpha=1e-6, control_rank=2, center=center)
    stats = EDMDc(dic, cfg).statistics(s["X"], s["U"], s["Y"])[0]
    V = control_basis(stats, cfg)[0]
    full, _ = _solve_operator(stats, cfg, V)
    projected, _ = _solve_operator(stats.project_controls(V), cfg, np.eye(2))
    np.testing.assert_allclose(projected, full, rtol=1e-9, atol=1e-10)


def test_spectrum_invariant_to_change_of_dictionary_basis(rng):
    s = linear_system(rng, LAM, n_samples=500, noise=0.05)
    cfg = EDMDcConfig(alpha=0.0)
    base = EDMDc(IdentityDictionary().fit(s["X"]), cfg).fit(s["X"], s["U"], s["Y"])
    M = rng.standard_normal((4, 4)) + 3 * np.eye(4)
    other = EDMDc(LinearDictionary(M).fit(s["X"]), cfg).fit(s["X"], s["U"], s["Y"])
    np.testing.assert_allclose(
        np.sort_complex(other.eigenvalues), np.sort_complex(base.eigenvalues), atol=1e-9
    )
    assert other.readout == "least_squares"
    np.testing.assert_allclose(other.C, np.linalg.inv(M).T, atol=1e-8)
    # a full-rank PCA dictionary is also a change of basis
    pca = EDMDc(PCADictionary(4).fit(s["X"]), cfg).fit(s["X"], s["U"], s["Y"])
    np.testing.assert_allclose(
        np.sort_complex(pca.eigenvalues), np.sort_complex(base.eigenvalues), atol=1e-9
    )


def test_median_of_means_close_to_pooled_and_robust(rng):
    s = linear_system(rng, LAM, n_samples=4000, noise=0.1)
    est = EDMDc(IdentityDictionary().fit(s["X"]), EDMDcConfig(alpha=0.0))
    mom = est.fit_median_of_means(s["X"], s["U"], s["Y"], s["ids"], n_blocks=9)
    assert mom.estimator == "median_of_means" and mom.n_blocks == 9
    assert np.abs(mom.A - s["A"]).max() < 0.05
    # corrupt one prompt with a gross outlier: pooled moves, median of means barely does
    Y = s["Y"].copy()
    Y[s["ids"] == 3] += 1e4
    bad_plain = est.fit(s["X"], s["U"], Y)
    bad_mom = est.fit_median_of_means(s["X"], s["U"], Y, s["ids"], n_blocks=9)
    assert np.abs(bad_mom.A - s["A"]).max() < 0.1 < np.abs(bad_plain.A - s["A"]).max()


def test_bad_input_raises_clear_errors(rng):
    s = linear_system(rng, LAM, n_samples=50)
    est = EDMDc(IdentityDictionary().fit(s["X"]), EDMDcConfig())
    X = s["X"].copy()
    X[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        est.fit(X, s["U"], s["Y"])
    with pytest.raises(ValueError, match="rows"):
        est.fit(s["X"], s["U"][:-1], s["Y"])
    with pytest.raises(ValueError, match="columns"):
        est.fit(s["X"], s["U"], s["Y"][:, :3])
    wide = RandomFourierDictionary(40, seed=0).fit(s["X"])
    with pytest.raises(ValueError, match="too few"):
        EDMDc(wide).fit(s["X"], s["U"], s["Y"])
    with pytest.raises(ValueError, match="alpha"):
        EDMDcConfig(alpha=-1)
    with pytest.raises(ValueError, match="not fitted"):
        RandomFourierDictionary(4).transform(s["X"])


@pytest.mark.parametrize(
    "make",
    [
        lambda: IdentityDictionary(),
        lambda: PCADictionary(3),
        lambda: RandomFourierDictionary(8, seed=5),
        lambda: RandomReLUDictionary(8, seed=5, include_state=True),
        lambda: SpectralDictionary(n_modes=3, k=4, q=2),
    ],
)
def test_dictionaries_round_trip_and_are_seeded(rng, tmp_path, make):
    s = linear_system(rng, LAM, n_samples=300, noise=0.1)
    d1 = make().fit(s["X"], s["U"], s["Y"])
    d2 = make().fit(s["X"], s["U"], s["Y"])
    np.testing.assert_array_equal(d1.transform(s["X"]), d2.transform(s["X"]))
    back = load_dictionary(d1.save(tmp_path / "dic"))
    np.testing.assert_allclose(back.transform(s["X"]), d1.transform(s["X"]), rtol=1e-14)
    assert back.state_slice == d1.state_slice
    assert d1.transform(s["X"]).shape == (300, d1.n_features)


def test_rff_median_heuristic_and_state_block(rng):
    x = rng.standard_normal((500, 6)) * 50 + 10  # scale must not matter after normalisation
    dic = RandomFourierDictionary(64, seed=0).fit(x)
    xt = (x - x.mean(0)) / np.sqrt(np.mean(np.sum((x - x.mean(0)) ** 2, 1)))
    i, j = np.triu_indices(500, 1)
    med = np.median(np.sum((xt[i] - xt[j]) ** 2, 1))
    assert dic.gamma * med == pytest.approx(1.0, rel=0.1)
    np.testing.assert_array_equal(dic.transform(x)[:, :6], x)
    assert dic.n_features == 6 + 128


def test_sae_dictionary_saelens_convention(rng):
    d_in, d_sae = 5, 12
    W, be, bd = (
        rng.standard_normal((d_in, d_sae)),
        rng.standard_normal(d_sae),
        rng.standard_normal(d_in),
    )
    x = rng.standard_normal((20, d_in))
    relu = SAEDictionary(W, be, bd).transform(x)
    np.testing.assert_allclose(relu, np.maximum((x - bd) @ W + be, 0))
    topk = SAEDictionary(torch.tensor(W), be, bd, activation="topk", k=3).transform(x)
    assert np.all((topk > 0).sum(1) <= 3)
    nz = topk > 0
    np.testing.assert_allclose(topk[nz], relu[nz])
    with pytest.raises(ValueError, match="d_in, d_sae"):
        SAEDictionary(W, be, np.zeros(d_sae))


def test_spectral_dictionary_recovers_linear_spectrum(rng):
    s = linear_system(rng, LAM, n_samples=3000, noise=0.01)
    dic = SpectralDictionary(n_modes=4, k=4, q=0).fit(s["X"], s["U"], s["Y"])
    res = EDMDc(dic, EDMDcConfig(alpha=0.0)).fit(s["X"], s["U"], s["Y"])
    np.testing.assert_allclose(np.sort_complex(res.eigenvalues), np.sort_complex(LAM), atol=0.02)


def test_result_save_load(rng, tmp_path):
    s = linear_system(rng, LAM, n_samples=200, noise=0.1)
    res = EDMDc(IdentityDictionary().fit(s["X"])).fit(s["X"], s["U"], s["Y"])
    back = EDMDcResult.load(res.save(tmp_path / "r"))
    np.testing.assert_array_equal(back.A, res.A)
    np.testing.assert_array_equal(back.eigenvalues, res.eigenvalues)
    assert back.n_samples == 200


def test_invariance_residual(rng):
    s = linear_system(rng, LAM, n_samples=2000, noise=0.0)
    ident = IdentityDictionary().fit(s["X"])
    r = invariance_residual_split(ident, s["X"], s["U"], s["Y"], s["ids"], EDMDcConfig(alpha=0))
    assert r.pooled < 1e-12 and r.n_dead == 0  # linear dynamics: the state span is invariant
    relu = RandomReLUDictionary(16, seed=0).fit(s["X"])
    rr = invariance_residual_split(relu, s["X"], s["U"], s["Y"], s["ids"])
    assert 0.05 < rr.pooled < 1.5
    # in-sample statistics give the same number as the torch penalty
    cfg = EDMDcConfig(alpha=1e-3)
    st = EDMDc(relu, cfg).statistics(s["X"], s["U"], s["Y"])[0]
    ins = invariance_residual(st, st, cfg)
    px = torch.tensor(relu.transform(s["X"]), requires_grad=True)
    pen = invariance_penalty(px, torch.tensor(relu.transform(s["Y"])), torch.tensor(s["U"]), 1e-3)
    assert float(pen.detach()) == pytest.approx(ins.pooled, rel=1e-6)
    pen.backward()
    assert torch.isfinite(px.grad).all() and px.grad.abs().sum() > 0

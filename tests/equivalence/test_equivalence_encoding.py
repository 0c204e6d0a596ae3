import dataclasses
import math

import numpy as np
import pytest
from scipy.stats import ortho_group
from sklearn.linear_model import Ridge
from sklearn.metrics import r2_score

from structlens.equivalence import (
    EncodingConfig,
    LinearMap,
    encoding_r2,
    encoding_score,
    encoding_scores,
    fit_linear_map,
)
from structlens.equivalence.encoding import MIN_REDUCED_WIDTH, supported_width
from structlens.errors import DegenerateInputError, is_user_error


def test_score_is_one_for_exact_linear_map_and_near_zero_for_independent(rng):
    x = rng.normal(size=(300, 10)) * 5.0
    y = x @ rng.normal(size=(10, 4)) + 2.0
    assert encoding_score(x, y) > 0.999
    z = rng.normal(size=(300, 4))
    assert encoding_score(x, z) < 0.25
    assert encoding_r2(x, z)[0] < 0.05


def test_directional_scores(rng):
    x = rng.normal(size=(400, 6))
    y = x[:, :2]  # y is a function of x, not the reverse
    s = encoding_scores(x, y)
    assert s.score_xy > 0.999
    assert s.score_yx < 0.8
    assert s.symmetric == pytest.approx((s.score_xy + s.score_yx) / 2)


def test_matches_sklearn_ridge_on_the_same_split_and_folds(rng):
    n, cfg = 120, EncodingConfig(alphas=(0.01, 1.0, 100.0), n_folds=4, seed=3)
    x = rng.normal(size=(n, 30))
    y = x[:, :3] @ rng.normal(size=(3, 5)) + 1.5 * rng.normal(size=(n, 5))
    r2, alpha = encoding_r2(x, y, cfg)
    perm = np.random.default_rng(3).permutation(n)
    n_test = math.ceil(0.1 * n)
    test, train = perm[:n_test], perm[n_test:]
    folds = np.array_split(np.arange(train.size), 4)
    errs = []
    for a in cfg.alphas:
        e = 0.0
        for val in folds:
            tr = np.setdiff1d(np.arange(train.size), val)
            m = Ridge(alpha=a).fit(x[train][tr], y[train][tr])
            e += np.sum((m.predict(x[train][val]) - y[train][val]) ** 2)
        errs.append(e)
    assert alpha == cfg.alphas[int(np.argmin(errs))]
    m = Ridge(alpha=alpha).fit(x[train], y[train])
    assert r2 == pytest.approx(r2_score(y[test], m.predict(x[test])), abs=1e-10)


def test_deterministic_under_seed(rng):
    x, y = rng.normal(size=(100, 5)), rng.normal(size=(100, 3))
    y = y + x[:, :3]
    assert encoding_score(x, y) == encoding_score(x, y)
    assert encoding_score(x, y) != encoding_score(x, y, EncodingConfig(seed=1))


def test_linear_maps_recover_exact_relations(rng, tmp_path):
    x = rng.normal(size=(200, 6))
    w = rng.normal(size=(6, 9))
    m = fit_linear_map(x, x @ w + 1.0, alpha=1e-8)
    np.testing.assert_allclose(m.weight, w, atol=1e-6)
    np.testing.assert_allclose(m.apply(x[:3]), x[:3] @ w + 1.0, atol=1e-6)
    q = ortho_group.rvs(6, random_state=5)
    p = fit_linear_map(x, 0.5 * x @ q - 2.0, method="procrustes")
    np.testing.assert_allclose(p.weight, 0.5 * q, atol=1e-10)
    wide = q[:4]  # orthonormal rows: an isometric embedding of 4 dims into 6
    e = fit_linear_map(x[:, :4], 3.0 * x[:, :4] @ wide, method="procrustes")
    np.testing.assert_allclose(e.weight, 3.0 * wide, atol=1e-10)
    assert p.r2_train == pytest.approx(1.0)
    back = LinearMap.load(p.save(tmp_path / "map"))
    np.testing.assert_allclose(back.weight, p.weight)


def _split_rows(n, cfg):
    perm = np.random.default_rng(cfg.seed).permutation(n)
    n_test = math.ceil(cfg.test_fraction * n)
    return perm[n_test:], perm[:n_test]


def test_wide_predictor_is_reduced_by_a_pca_of_each_fits_own_rows(rng):
    from sklearn.decomposition import PCA

    n, d, cfg = 60, 200, EncodingConfig(alphas=(0.01, 1.0, 100.0), n_folds=4, seed=2)
    x = rng.normal(size=(n, 8)) @ rng.normal(size=(8, d)) + 0.3 * rng.normal(size=(n, d))
    y = x[:, :4] + rng.normal(size=(n, 4))
    width = supported_width(n, cfg)
    train, test = _split_rows(n, cfg)
    assert width == (train.size - math.ceil(train.size / 4)) // 2 < d
    r2, alpha = encoding_r2(x, y, cfg)
    # the same protocol by hand: PCA fitted on the rows of each fit only, then ridge
    folds = np.array_split(np.arange(train.size), 4)
    xt, yt = x[train], y[train]
    errs = []
    for a in cfg.alphas:
        e = 0.0
        for val in folds:
            tr = np.setdiff1d(np.arange(train.size), val)
            pca = PCA(width).fit(xt[tr])
            m = Ridge(alpha=a).fit(pca.transform(xt[tr]), yt[tr])
            e += np.sum((m.predict(pca.transform(xt[val])) - yt[val]) ** 2)
        errs.append(e)
    assert alpha == cfg.alphas[int(np.argmin(errs))]
    pca = PCA(width).fit(xt)
    m = Ridge(alpha=alpha).fit(pca.transform(xt), yt)
    assert r2 == pytest.approx(r2_score(y[test], m.predict(pca.transform(x[test]))), abs=1e-8)
    s = encoding_scores(x, y, cfg)
    assert (s.reduced_to_xy, s.reduced_to_yx) == (width, None)
    assert f"{d} features" in s.caveat and f"top {width} principal components" in s.caveat


def test_held_out_rows_do_not_shape_the_reduction(rng):
    n, d = 80, 150
    cfg = EncodingConfig()
    x = rng.normal(size=(n, 6)) @ rng.normal(size=(6, d)) + 0.1 * rng.normal(size=(n, d))
    y = x[:, :3] @ rng.normal(size=(3, 2))
    train, test = _split_rows(n, cfg)
    xt = x[train] - x[train].mean(0)
    top = np.linalg.svd(xt, full_matrices=False)[2][: supported_width(n, cfg)]
    # a huge held-out-only direction outside the fit half's components: a PCA that saw the
    # held-out rows would make it the first component; one fitted on the fit half ignores it
    v = rng.normal(size=d)
    v -= top.T @ (top @ v)
    moved = x.copy()
    moved[test] += 1e3 * rng.normal(size=(test.size, 1)) * v / np.linalg.norm(v)
    assert encoding_r2(moved, y, cfg) == pytest.approx(encoding_r2(x, y, cfg), abs=1e-9)


def test_reduction_keeps_a_planted_low_rank_encoding(rng):
    n, d = 100, 400
    latent = rng.normal(size=(n, 5))
    x = latent @ rng.normal(size=(5, d)) + 0.01 * rng.normal(size=(n, d))
    y = latent @ rng.normal(size=(5, 3))
    s = encoding_scores(x, y)
    assert s.reduced_to_xy == supported_width(n) and s.reduced_to_yx is None
    assert s.score_xy > 0.99  # x's leading components are the latent y is made of
    narrow = encoding_scores(latent, y)
    assert narrow.reduced_to_xy is None and narrow.caveat is None


def test_too_few_rows_for_any_reduction_is_refused(rng):
    cfg = EncodingConfig(n_folds=2)
    x, y = rng.normal(size=(12, 50)), rng.normal(size=(12, 2))
    assert supported_width(12, cfg) < MIN_REDUCED_WIDTH
    with pytest.raises(DegenerateInputError, match="principal components") as err:
        encoding_score(x, y, cfg)
    assert is_user_error(err.value)
    # a predictor the rows do support needs no reduction and is scored as before
    assert np.isfinite(encoding_score(x[:, :2], y, cfg))


def _massive_coordinates(rng, n=400, d_x=6, d_y=24, n_massive=3):
    """Planted encoding ``y = x W + noise`` whose first ``n_massive`` target coordinates have
    a large, well-predicted signal (SmolLM2's massive residual dimensions) and whose other
    coordinates are mostly noise: per-coordinate R² near 1 on the few, near 0 on the many."""
    x = rng.normal(size=(n, d_x))
    w = rng.normal(size=(d_x, d_y)) * 0.1
    w[:, :n_massive] *= 300.0
    y = x @ w + rng.normal(size=(n, d_y))
    return x, y


def test_variance_weighted_r2_is_rotation_invariant_and_uniform_is_not(rng):
    """The property behind reporting variance-weighted R² beside the reference's uniform one:
    rotating the encoded representation (``y -> y Q``, ``Q`` orthogonal, the sanity copy's
    change of basis) leaves variance-weighted R² unchanged and moves uniform R², here on
    scikit-learn's r2_score of an independently fitted Ridge as well as on ours."""
    x, y = _massive_coordinates(rng)
    q = ortho_group.rvs(y.shape[1], random_state=7)
    cfg = EncodingConfig(seed=2)
    vw = dataclasses.replace(cfg, multioutput="variance_weighted")
    # the independent computation: the same split and the alpha chosen, sklearn's Ridge and R²
    perm = np.random.default_rng(2).permutation(len(x))
    n_test = math.ceil(0.1 * len(x))
    test, train = perm[:n_test], perm[n_test:]
    for target in (y, y @ q):
        r2_u, alpha = encoding_r2(x, target, cfg)
        r2_w, alpha_w = encoding_r2(x, target, vw)
        assert alpha_w == alpha  # the penalty is chosen by summed squared error: no weighting
        pred = Ridge(alpha=alpha).fit(x[train], target[train]).predict(x[test])
        assert r2_u == pytest.approx(r2_score(target[test], pred), abs=1e-10)
        assert r2_w == pytest.approx(
            r2_score(target[test], pred, multioutput="variance_weighted"), abs=1e-10
        )
    # a fixed prediction rotated with its target: sklearn's variance-weighted R² is invariant
    pred = Ridge(alpha=1.0).fit(x[train], y[train]).predict(x[test])
    for how, invariant in (("variance_weighted", True), ("uniform_average", False)):
        before = r2_score(y[test], pred, multioutput=how)
        after = r2_score(y[test] @ q, pred @ q, multioutput=how)
        assert (abs(before - after) < 1e-10) is invariant
    # ours, fitted on each target: the same weighted R², a uniform R² far apart
    w0, w1 = encoding_r2(x, y, vw)[0], encoding_r2(x, y @ q, vw)[0]
    u0, u1 = encoding_r2(x, y, cfg)[0], encoding_r2(x, y @ q, cfg)[0]
    assert w0 == pytest.approx(w1, abs=1e-10)
    assert w0 > 0.99  # the variance is in the massive, well-predicted coordinates
    assert u0 < 0.4  # most coordinates are noise in the planted basis...
    assert u1 > 0.9  # ...but every rotated coordinate carries some of the massive ones
    # the closed form: 1 - Σ SS_res / Σ SS_tot, and both sums are invariant under y -> y Q
    res = y[test] - pred
    closed = 1 - np.sum(res**2) / np.sum((y[test] - y[test].mean(0)) ** 2)
    assert r2_score(y[test], pred, multioutput="variance_weighted") == pytest.approx(closed)


def test_both_r2_are_invariant_to_rotating_the_predictor(rng):
    """Ridge with one isotropic penalty, and the PCA reduction of wide predictors, see the
    predictor only through its Gram matrix: ``x -> x Q`` changes neither R², so the basis of
    the encoding side never matters, reduced or not."""
    x, y = _massive_coordinates(rng, n=60, d_x=40)  # 40 features > supported_width(60)
    assert x.shape[1] > supported_width(60)
    q = ortho_group.rvs(x.shape[1], random_state=3)
    for how in ("uniform_average", "variance_weighted"):
        cfg = EncodingConfig(multioutput=how)
        assert encoding_r2(x @ q, y, cfg)[0] == pytest.approx(encoding_r2(x, y, cfg)[0], abs=1e-9)

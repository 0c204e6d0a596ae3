import numpy as np
import pytest
from scipy.linalg import subspace_angles
from scipy.stats import ortho_group

from structlens.equivalence import (
    CrossMoments,
    cca_correlations,
    procrustes_similarity,
    pwcca,
    svcca,
    svcca_from_moments,
)


def _data(rng, n=300, d=6, e=5):
    x = rng.normal(size=(n, d)) @ rng.normal(size=(d, d))
    y = x[:, :e] @ rng.normal(size=(e, e)) + 0.8 * rng.normal(size=(n, e))
    return x, y


def test_canonical_correlations_match_principal_angles(rng):
    x, y = _data(rng)
    xc, yc = x - x.mean(0), y - y.mean(0)
    # canonical correlations are the cosines of the principal angles between column spaces
    want = np.sort(np.cos(subspace_angles(xc, yc)))[::-1]
    np.testing.assert_allclose(cca_correlations(x, y), want, atol=1e-10)


def test_cca_invariant_to_invertible_maps_procrustes_is_not(rng):
    x, y = _data(rng)
    a = rng.normal(size=(6, 6)) + 3 * np.eye(6)
    b = rng.normal(size=(5, 5)) + 3 * np.eye(5)
    np.testing.assert_allclose(
        cca_correlations(x @ a + 2.0, y @ b), cca_correlations(x, y), atol=1e-10
    )
    assert pwcca(x @ a, y @ b) == pytest.approx(pwcca(x, y), abs=0.05)  # weights are not invariant
    assert svcca(x @ a, y @ b, keep=1.0) == pytest.approx(svcca(x, y, keep=1.0), abs=1e-10)
    q = ortho_group.rvs(6, random_state=3)
    p = procrustes_similarity(x, y)
    assert procrustes_similarity(2.0 * x @ q + 1.0, y) == pytest.approx(p, abs=1e-12)
    assert abs(procrustes_similarity(x @ a, y) - p) > 1e-3


def test_perfect_linear_relation_gives_one(rng):
    x = rng.normal(size=(200, 5))
    y = x @ rng.normal(size=(5, 7))  # rank-5 image in 7 dims
    assert np.allclose(cca_correlations(x, y), 1.0)
    assert pwcca(x, y) == pytest.approx(1.0, abs=1e-10)
    assert svcca(x, y, keep=1.0) == pytest.approx(1.0, abs=1e-10)
    q = ortho_group.rvs(5, random_state=4)
    assert procrustes_similarity(x, 3.0 * x @ q) == pytest.approx(1.0, abs=1e-12)


def test_svcca_equals_explicit_pca_then_cca(rng):
    x, y = _data(rng, d=8, e=8)
    k = 3

    def reduce(m, k):
        mc = m - m.mean(0)
        _, _, vt = np.linalg.svd(mc, full_matrices=False)
        return mc @ vt[:k].T

    want = cca_correlations(reduce(x, k), reduce(y, k)).mean()
    assert svcca(x, y, keep=k) == pytest.approx(want, abs=1e-10)

    def n_for_share(m, share):
        mc = m - m.mean(0)
        ev = np.sort(np.linalg.eigvalsh(mc.T @ mc))[::-1]
        return int(np.argmax(np.cumsum(ev) / ev.sum() >= share) + 1)

    kx, ky = n_for_share(x, 0.9), n_for_share(y, 0.9)
    want = cca_correlations(reduce(x, kx), reduce(y, ky)).mean()
    assert min(kx, ky) < 8
    assert svcca(x, y, keep=0.9) == pytest.approx(want, abs=1e-10)
    assert svcca_from_moments(CrossMoments(8, 8).update(x, y), keep=0.9) == pytest.approx(want)


def test_independent_data_has_low_similarity(rng):
    x, y = rng.normal(size=(3000, 5)), rng.normal(size=(3000, 5))
    assert svcca(x, y) < 0.05
    assert pwcca(x, y) < 0.05
    assert procrustes_similarity(x, y) < 0.1

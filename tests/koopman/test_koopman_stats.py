import itertools

import numpy as np
import pytest
import scipy.stats

from structlens.stats.matching import (
    bottleneck_distance,
    bottleneck_matching,
    wasserstein_distance,
)
from structlens.stats.moments import ColumnMoments, CrossMoments
from structlens.stats.robust import (
    block_assignment,
    geometric_median,
    median_of_means,
    tail_diagnostic,
)


def test_moment_merge_equals_one_pass(rng):
    x = rng.standard_normal((300, 5)) * 3 + 7
    one = CrossMoments(5)
    one.update(x)
    parts = [CrossMoments(5) for _ in range(3)]
    for p, chunk in zip(parts, np.array_split(x, [17, 150]), strict=True):
        p.update(chunk)
    parts[0].merge(parts[1])
    parts[0].merge(parts[2])
    np.testing.assert_allclose(parts[0].s_xx, one.s_xx, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(one.covariance(), np.cov(x, rowvar=False, bias=True), rtol=1e-12)
    np.testing.assert_allclose(one.gram(), x.T @ x, rtol=1e-12)


def test_cross_moment_merge_equals_one_pass(rng):
    a, b = rng.standard_normal((200, 4)) + 3, rng.standard_normal((200, 2)) - 1
    one = CrossMoments(4, 2, second_y="diag")
    one.update(a, b)
    p, q = CrossMoments(4, 2, second_y="diag"), CrossMoments(4, 2, second_y="diag")
    p.update(a[:50], b[:50])
    q.update(a[50:], b[50:])
    p.merge(q)
    ac, bc = a - a.mean(0), b - b.mean(0)
    for acc in (one, p):
        np.testing.assert_allclose(acc.s_xy, ac.T @ bc, atol=1e-10)
        np.testing.assert_allclose(acc.s_xx, ac.T @ ac, atol=1e-10)
        np.testing.assert_allclose(acc.s_yy, (bc**2).sum(0), atol=1e-10)


def test_cross_moments_of_tensors_equal_numpy_path(rng):
    # torch blocks are reduced with torch on their own device; the result must not depend on it
    torch = pytest.importorskip("torch")
    a = rng.standard_normal((120, 4)) * 5 + 3
    b = a[:, :2] @ rng.standard_normal((2, 3)) + rng.standard_normal((120, 3))
    ref, tor = CrossMoments(4, 3, second_y="diag"), CrossMoments(4, 3, second_y="diag")
    for s in (slice(0, 70), slice(70, 120)):
        ref.update(a[s], b[s])
        tor.update(torch.from_numpy(a[s]).float(), torch.from_numpy(b[s]).float())
    assert tor.n == ref.n == 120
    np.testing.assert_allclose(tor.s_xx, ref.s_xx, rtol=1e-5)
    np.testing.assert_allclose(tor.s_xy, ref.s_xy, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(tor.mean_x, ref.mean_x, rtol=1e-6)
    with pytest.raises(ValueError, match="NaN"):
        bad = torch.zeros(3, 4)
        bad[1, 2] = float("nan")
        CrossMoments(4, 3, second_y="diag").update(bad, torch.zeros(3, 3))
    with pytest.raises(ValueError, match="columns"):
        CrossMoments(4, 3, second_y="diag").update(torch.zeros(3, 5), torch.zeros(3, 3))


def test_column_kurtosis_matches_scipy_and_merges(rng):
    x = rng.standard_t(5, size=(1000, 3))
    acc, p, q = ColumnMoments(3), ColumnMoments(3), ColumnMoments(3)
    acc.update(x)
    p.update(x[:333])
    q.update(x[333:])
    p.merge(q)
    ref = scipy.stats.kurtosis(x, axis=0, fisher=True, bias=True)
    np.testing.assert_allclose(acc.excess_kurtosis(), ref, rtol=1e-10)
    np.testing.assert_allclose(p.excess_kurtosis(), ref, rtol=1e-10)


def test_tail_diagnostic_separates_gaussian_from_heavy(rng):
    gauss = tail_diagnostic(rng.standard_normal((5000, 20)))
    assert abs(gauss.median_kurtosis) < 0.3 and gauss.p95_kurtosis < 1.0
    cauchy = tail_diagnostic(rng.standard_cauchy((5000, 20)))
    assert cauchy.median_kurtosis > 100 and cauchy.p95_kurtosis <= cauchy.max_kurtosis


def test_accumulators_reject_nan_and_bad_shapes():
    acc = CrossMoments(3)
    with pytest.raises(ValueError, match="NaN"):
        acc.update(np.array([[1.0, np.nan, 0.0]]))
    with pytest.raises(ValueError, match="columns"):
        acc.update(np.zeros((2, 4)))
    with pytest.raises(ValueError, match="rows"):
        CrossMoments(2, 2, second_y="diag").update(np.zeros((3, 2)), np.zeros((4, 2)))


def _brute_bottleneck(a, b):
    return min(
        max(abs(a[i] - b[p[i]]) for i in range(len(a)))
        for p in itertools.permutations(range(len(a)))
    )


def _brute_wp(a, b, p):
    return min(
        np.mean([abs(a[i] - b[q[i]]) ** p for i in range(len(a))]) ** (1 / p)
        for q in itertools.permutations(range(len(a)))
    )


@pytest.mark.parametrize("n", [1, 2, 4, 6])
def test_matching_equals_brute_force(rng, n):
    for _ in range(10):
        a = rng.standard_normal(n) + 1j * rng.standard_normal(n)
        b = rng.standard_normal(n) + 1j * rng.standard_normal(n)
        assert bottleneck_distance(a, b) == pytest.approx(_brute_bottleneck(a, b), rel=1e-12)
        assert wasserstein_distance(a, b, 2) == pytest.approx(_brute_wp(a, b, 2), rel=1e-10)
        assert wasserstein_distance(a, b, 1) == pytest.approx(_brute_wp(a, b, 1), rel=1e-10)
        d, perm = bottleneck_matching(a, b)
        assert sorted(perm) == list(range(n))
        assert np.max(np.abs(a - b[perm])) == pytest.approx(d)


def test_matching_is_permutation_invariant_and_rejects_unequal(rng):
    a = rng.standard_normal(7) + 1j * rng.standard_normal(7)
    b = a + 0.01 * rng.standard_normal(7)
    assert bottleneck_distance(a, b) == bottleneck_distance(a[::-1], rng.permutation(b))
    assert bottleneck_distance(a, a[rng.permutation(7)]) == 0.0
    with pytest.raises(ValueError, match="equal-size"):
        bottleneck_distance(a, b[:5])


def test_geometric_median(rng):
    x = rng.standard_normal(11)
    assert geometric_median(x[:, None])[0] == pytest.approx(np.median(x), abs=1e-6)
    pts = rng.standard_normal((30, 4))
    gm = geometric_median(pts)
    # the gradient of Σ‖x_i − y‖ vanishes at the median
    g = ((pts - gm) / np.linalg.norm(pts - gm, axis=1, keepdims=True)).sum(0)
    assert np.linalg.norm(g) < 1e-5
    # robust: one wild point barely moves it
    wild = np.vstack([pts, 1e6 * np.ones(4)])
    assert np.linalg.norm(geometric_median(wild) - gm) < 0.5
    # equivariant under rotation + translation
    Q, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    np.testing.assert_allclose(geometric_median(pts @ Q + 3.0), gm @ Q + 3.0, atol=1e-6)


def test_block_assignment_and_median_of_means(rng):
    ids = np.repeat(np.arange(50), 4)
    b = block_assignment(ids, 5, seed=1)
    assert np.all(b >= 0) and np.all(b < 5)
    for i in range(50):  # every prompt in exactly one block
        assert len(set(b[ids == i])) == 1
    np.testing.assert_array_equal(b, block_assignment(ids, 5, seed=1))
    x = rng.standard_normal((200, 2))
    mom = median_of_means(x, b)
    means = np.stack([x[b == k].mean(0) for k in range(5)])
    np.testing.assert_allclose(mom, np.median(means, axis=0))


@pytest.mark.parametrize("which", ["X", "U", "Y"])
def test_edmdc_names_the_input_that_holds_nan(rng, which):
    # the finiteness check is fused into the moments; the error still names X, U or Y
    from structlens.koopman import EDMDc, IdentityDictionary

    data = {"X": rng.standard_normal((50, 3)), "U": rng.standard_normal((50, 2))}
    data["Y"] = rng.standard_normal((50, 3))
    data[which][7, 1] = np.nan
    est = EDMDc(IdentityDictionary().fit(data["X"][:2] if which != "X" else np.zeros((2, 3))))
    with pytest.raises(ValueError, match=f"{which} contains 1 NaN"):
        est.fit(data["X"], data["U"], data["Y"])

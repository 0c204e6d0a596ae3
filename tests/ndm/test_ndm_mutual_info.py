import numpy as np
import pytest

from structlens.stats.mutual_info import (
    _numba_available,
    mutual_information,
    normalized_mutual_information,
    subspace_mutual_information,
)


def _gaussian_pair(rng, n, d, noise):
    """x ~ N(0, I_d), y = x + noise * e: I(x; y) = d/2 * log(1 + 1/noise^2) nats."""
    x = rng.standard_normal((n, d))
    y = x + noise * rng.standard_normal((n, d))
    return x, y, 0.5 * d * np.log(1 + 1 / noise**2)


def test_ksg_matches_closed_form_1d(rng):
    rho = 0.8
    x = rng.standard_normal(3000)
    y = rho * x + np.sqrt(1 - rho**2) * rng.standard_normal(3000)
    assert mutual_information(x, y, k=3) == pytest.approx(-0.5 * np.log(1 - rho**2), abs=0.04)


def test_ksg_matches_closed_form_multivariate(rng):
    x, y, truth = _gaussian_pair(rng, 3000, 2, 1.0)
    assert mutual_information(x, y, k=3) == pytest.approx(truth, abs=0.06)
    assert mutual_information(x, y, k=3, metric="block") == pytest.approx(truth, abs=0.06)


def test_ksg_near_zero_for_independent_data(rng):
    x = rng.standard_normal((2000, 2))
    y = rng.standard_normal((2000, 3))
    assert abs(mutual_information(x, y, k=3)) < 0.03


@pytest.mark.parametrize("metric", ["chebyshev", "block"])
def test_engines_agree(rng, metric):
    x, y, _ = _gaussian_pair(rng, 400, 3, 0.7)
    ref = mutual_information(x, y, k=2, metric=metric, algorithm="torch")
    if metric == "chebyshev":
        assert mutual_information(x, y, k=2, algorithm="kdtree") == pytest.approx(ref, abs=1e-12)
        if _numba_available():
            assert mutual_information(x, y, k=2, algorithm="numba") == pytest.approx(ref, abs=1e-12)
    assert mutual_information(x, y, k=2, metric=metric) == pytest.approx(ref, abs=1e-12)


def test_block_standardization_gives_scale_invariance(rng):
    x, y, _ = _gaussian_pair(rng, 800, 3, 0.8)
    base = mutual_information(x, y, k=3, metric="block", standardize="block")
    scaled = mutual_information(1e3 * x, 1e-2 * y, k=3, metric="block", standardize="block")
    assert scaled == pytest.approx(base, abs=1e-9)
    # Without the normalisation the relative scale changes the estimate.
    raw = mutual_information(1e3 * x, y, k=3, metric="block")
    assert abs(raw - base) > 0.1


def test_normalized_divides_by_dimension_sum(rng):
    x, y, _ = _gaussian_pair(rng, 500, 2, 1.0)
    assert normalized_mutual_information(x, y, k=3) == pytest.approx(
        mutual_information(x, y, k=3) / 4, abs=1e-12
    )


def test_subspace_matrix_matches_pairwise_estimates(rng):
    x, y, _ = _gaussian_pair(rng, 600, 2, 0.8)
    w = rng.standard_normal((600, 3))
    z = np.hstack([x, y, w])
    mat = subspace_mutual_information(z, [2, 2, 3], k=2, normalize=False)
    blocks = [x, y, w]
    for a in range(3):
        for b in range(a + 1, 3):
            ref = mutual_information(blocks[a], blocks[b], k=2, metric="block", standardize="block")
            assert mat[a, b] == pytest.approx(ref, abs=1e-8)
            assert mat[b, a] == mat[a, b]
    normed = subspace_mutual_information(z, [2, 2, 3], k=2, normalize=True)
    assert normed[0, 2] == pytest.approx(mat[0, 2] / 5, abs=1e-12)


def test_bad_input_raises(rng):
    x = rng.standard_normal((50, 2))
    bad = x.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        mutual_information(bad, x)
    with pytest.raises(ValueError, match="k=50"):
        mutual_information(x, x, k=50)
    with pytest.raises(ValueError, match="samples"):
        mutual_information(x, x[:40])
    with pytest.raises(ValueError, match="sums to 2"):
        subspace_mutual_information(np.hstack([x, x[:, :1]]), [1, 1], k=1)
    with pytest.raises(ValueError, match="duplicate"):
        mutual_information(np.zeros((10, 1)), np.zeros((10, 1)), k=1)


def _ksg_block_brute_force(a, b, k):
    """KSG algorithm 1 in the block metric, every distance a difference (no Gram expansion)."""
    from scipy.spatial.distance import cdist
    from scipy.special import digamma

    da, db = cdist(a, a, "sqeuclidean"), cdist(b, b, "sqeuclidean")
    joint = np.maximum(da, db)
    np.fill_diagonal(joint, np.inf)
    eps = np.sort(joint, axis=1)[:, k - 1]
    na, nb = (da < eps[:, None]).sum(1) - 1, (db < eps[:, None]).sum(1) - 1  # self excluded
    n = len(a)
    return digamma(k) + digamma(n) - np.mean(digamma(na + 1) + digamma(nb + 1))


def test_rows_equal_up_to_float_noise_are_neighbours_at_their_true_distance(rng):
    """Activations of one token read twice differ by float noise (1e-9 here): their squared
    distance (1e-18) is below the Gram expansion's rounding error, which gave zero neighbour
    distances and an error; the estimate equals the one with every distance a difference."""
    x, y, _ = _gaussian_pair(rng, 300, 2, 0.8)
    z = np.hstack([x, y])
    z = np.vstack([z, z[:6] + 1e-9 * rng.standard_normal((6, 4))])
    got = subspace_mutual_information(z, [2, 2], k=1, standardize=False, normalize=False)
    c = z - z.mean(0)
    assert got[0, 1] == pytest.approx(_ksg_block_brute_force(c[:, :2], c[:, 2:], 1), abs=1e-9)


@pytest.mark.parametrize("near_duplicates", [False, True])
def test_fused_pass_equals_the_tensor_operations_bit_for_bit(rng, monkeypatch, near_duplicates):
    """With k = 1 the neighbour distances and counts of every pair come from one numba pass
    (several chunks of query rows, rows equal up to float noise included); the matrix is the
    one the tensor operations give, to the last bit."""
    pytest.importorskip("numba")
    from structlens.stats import mutual_info

    x, y, _ = _gaussian_pair(rng, 700, 3, 0.8)
    z = np.hstack([x, y, rng.standard_normal((700, 2))])
    if near_duplicates:
        z = np.vstack([z, z[:9] + 1e-9 * rng.standard_normal((9, z.shape[1]))])
    fused = subspace_mutual_information(z, [3, 3, 2], k=1, chunk_size=256)
    monkeypatch.setattr(mutual_info, "_numba_available", lambda: False)
    tensor = subspace_mutual_information(z, [3, 3, 2], k=1, chunk_size=256)
    np.testing.assert_array_equal(fused, tensor)
    assert fused[0, 1] > 0.05 > abs(fused[0, 2])


@pytest.mark.parametrize("budget", [1, 2])
def test_the_compiled_kernels_leave_torchs_thread_budget_as_it_was(rng, budget):
    """Numba's OpenMP layer sets the shared runtime's thread count to its own pool size at
    each parallel launch: a process limited to one torch thread (NDM's per-layer training
    processes) went on with two after its first merge round.  Both kernels keep the budget."""
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(budget)
        x = rng.standard_normal((600, 8))
        subspace_mutual_information(x, [4, 4])
        assert torch.get_num_threads() == budget
        mutual_information(x[:, :3], x[:, 3:6] + x[:, :3], k=3, algorithm="numba")
        assert torch.get_num_threads() == budget
    finally:
        torch.set_num_threads(before)

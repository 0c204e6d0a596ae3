import numpy as np
import pytest
import torch
from scipy.stats import ortho_group

from structlens.equivalence import (
    CrossMoments,
    MinibatchCKA,
    cka_from_moments,
    gram_linear,
    gram_rbf,
    hsic,
    kernel_cka,
    linear_cka,
    rbf_cka,
)


def _pair(rng, n=200, d=12, e=8, noise=1.0):
    x = rng.normal(size=(n, d)) @ rng.normal(size=(d, d))
    y = x @ rng.normal(size=(d, e)) + noise * rng.normal(size=(n, e))
    return x, y


def _gram_cka_centering(x, y):
    """Independent biased linear CKA: explicit centring matrix H, tr(KHLH)."""
    n = x.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n
    k, ell = x @ x.T, y @ y.T
    kh, lh = h @ k @ h, h @ ell @ h
    return np.sum(kh * lh) / np.sqrt(np.sum(kh * kh) * np.sum(lh * lh))


@pytest.mark.parametrize("debiased", [False, True])
def test_linear_cka_invariances(rng, debiased):
    x, y = _pair(rng)
    base = linear_cka(x, y, debiased)
    q = ortho_group.rvs(x.shape[1], random_state=1)
    assert linear_cka(x @ q, y, debiased) == pytest.approx(base, abs=1e-12)
    assert linear_cka(3.7 * x, y, debiased) == pytest.approx(base, abs=1e-12)
    assert linear_cka(x + 1e3, y - 5.0, debiased) == pytest.approx(base, abs=1e-10)
    assert linear_cka(y, x, debiased) == pytest.approx(base, abs=1e-12)
    assert linear_cka(x, x, debiased) == pytest.approx(1.0, abs=1e-12)
    # anisotropic scaling changes it
    s = np.diag(np.geomspace(0.01, 100.0, x.shape[1]))
    assert abs(linear_cka(x @ s, y, debiased) - base) > 1e-2


def test_biased_feature_formula_equals_gram_formula(rng):
    x, y = _pair(rng, n=60)
    assert linear_cka(x, y) == pytest.approx(_gram_cka_centering(x, y), abs=1e-12)
    assert linear_cka(x, y) == pytest.approx(kernel_cka(gram_linear(x), gram_linear(y)), abs=1e-12)


def test_debiased_feature_formula_equals_unbiased_hsic_on_grams(rng):
    x, y = _pair(rng, n=40)
    x = x + 3.0  # Song et al.'s estimator on uncentred Grams is translation-invariant too
    want = kernel_cka(gram_linear(x), gram_linear(y), debiased=True)
    assert linear_cka(x, y, debiased=True) == pytest.approx(want, abs=1e-10)


def test_debiased_removes_inflation_for_independent_wide_data(rng):
    n, p = 40, 2000
    vals_b, vals_d = [], []
    for _ in range(5):
        x, y = rng.normal(size=(n, p)), rng.normal(size=(n, p))
        vals_b.append(linear_cka(x, y))
        vals_d.append(linear_cka(x, y, debiased=True))
    assert np.mean(vals_b) > 0.9  # biased CKA is inflated when p >> n
    assert abs(np.mean(vals_d)) < 0.02


def test_chunked_streaming_and_float32_agree(rng):
    x, y = _pair(rng, n=301)
    ref = linear_cka(x, y, debiased=True)
    assert linear_cka(x, y, debiased=True, chunk_rows=17) == pytest.approx(ref, abs=1e-12)
    x32, y32 = x.astype(np.float32), y.astype(np.float32)
    assert linear_cka(torch.from_numpy(x32), torch.from_numpy(y32), True) == pytest.approx(
        linear_cka(x32.astype(np.float64), y32.astype(np.float64), True), abs=1e-12
    )


def test_cross_moments_merge_equals_one_pass_with_large_offsets(rng):
    x, y = _pair(rng, n=500, d=6, e=4)
    x = x + 1e6  # raw-moment formulas would lose every digit here
    one = CrossMoments(6, 4, 3, 2).update(x, y)
    parts = [
        CrossMoments(6, 4, 3, 2).update(x[a:b], y[a:b]) for a, b in [(0, 7), (7, 300), (300, 500)]
    ]
    merged = parts[0].merge(parts[1]).merge(parts[2])
    assert merged.n == 500
    np.testing.assert_allclose(merged.s_xy, one.s_xy, rtol=1e-9, atol=1e-6)
    for deb in (False, True):
        np.testing.assert_allclose(
            cka_from_moments(merged, deb), cka_from_moments(one, deb), atol=1e-9
        )
    direct = np.array(
        [
            [linear_cka(x[:, 2 * g : 2 * g + 2], y[:, 2 * h : 2 * h + 2], True) for h in range(2)]
            for g in range(3)
        ]
    )
    np.testing.assert_allclose(cka_from_moments(one, True), direct, atol=1e-9)


def test_minibatch_single_batch_equals_full_debiased(rng):
    x, y = _pair(rng, n=120)
    mb = MinibatchCKA().update(x, y)
    assert mb.value() == pytest.approx(linear_cka(x, y, debiased=True), abs=1e-12)


def test_minibatch_accumulates_terms_and_merges(rng):
    x, y = _pair(rng, n=400, noise=3.0)
    batches = [(x[i : i + 50], y[i : i + 50]) for i in range(0, 400, 50)]
    whole = MinibatchCKA()
    for a, b in batches:
        whole.update(a, b)
    left, right = MinibatchCKA(), MinibatchCKA()
    for a, b in batches[:3]:
        left.update(a, b)
    for a, b in batches[3:]:
        right.update(a, b)
    assert left.merge(right).value() == pytest.approx(whole.value(), abs=1e-12)
    # the estimator is the ratio of averaged unbiased HSIC terms (Nguyen et al. eq. 3)
    terms = np.array(
        [
            [
                hsic(gram_linear(a), gram_linear(b), True),
                hsic(gram_linear(a), gram_linear(a), True),
                hsic(gram_linear(b), gram_linear(b), True),
            ]
            for a, b in batches
        ]
    ).mean(0)
    assert whole.value() == pytest.approx(terms[0] / np.sqrt(terms[1] * terms[2]), abs=1e-10)


def test_rbf_cka_invariances_and_minibatch(rng):
    x, y = _pair(rng, n=80, noise=2.0)
    base = rbf_cka(x, y)
    assert 0.0 < base < 1.0
    q = ortho_group.rvs(x.shape[1], random_state=2)
    assert rbf_cka(
        x @ q + 4.0,
        2.5 * y,
    ) == pytest.approx(base, abs=1e-10)
    assert rbf_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    one = MinibatchCKA(kernel="rbf", bandwidth=0.8).update(x, y).value()
    assert one == pytest.approx(kernel_cka(gram_rbf(x, 0.8), gram_rbf(y, 0.8), True), abs=1e-12)


def test_large_chunks_and_float32_products_agree_with_small_chunk_float64(rng):
    x, y = _pair(rng, n=700, d=400, e=390, noise=20.0)
    x = x + 100.0
    ref = linear_cka(x, y, chunk_rows=64)  # numpy products
    assert linear_cka(x, y) == pytest.approx(ref, abs=1e-12)  # torch products
    assert linear_cka(x, y, precision="float32") == pytest.approx(ref, abs=1e-5)
    with pytest.raises(ValueError, match="precision"):
        linear_cka(x, y, precision="float16")

import numpy as np
import pytest

from structlens.equivalence import (
    CrossMoments,
    MinibatchCKA,
    Preprocess,
    encoding_score,
    layer_similarity_matrix,
    linear_cka,
    mutual_knn,
    prepare,
    svcca,
)


def test_prepare_bos_mask_clip_standardize(rng):
    x = rng.normal(size=(2, 4, 3))
    x[:, 0] *= 1000.0  # huge BOS rows
    rows = prepare(x, Preprocess(exclude_bos=True))
    assert rows.shape == (6, 3) and np.abs(rows).max() < 100
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=bool)
    assert prepare(x, Preprocess(exclude_bos=True), mask).shape == (5, 3)
    big = rng.normal(size=(1000, 4))
    big[:, 0] *= 100.0
    clipped = prepare(big, Preprocess(clip_quantile=0.9))
    c = np.quantile(np.abs(big), 0.9)
    assert np.abs(clipped).max() == pytest.approx(c)
    z = prepare(big, Preprocess(standardize=True))
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-12)
    np.testing.assert_allclose(z.std(0), 1.0)


def test_mutual_knn(rng):
    x = rng.normal(size=(200, 8))
    assert mutual_knn(x, 3.0 * x, k=5) == 1.0
    y = rng.normal(size=(200, 8))
    assert mutual_knn(x, y, k=5) < 0.1

    # brute-force reference
    def nn(m):
        m = m / np.linalg.norm(m, axis=1, keepdims=True)
        s = m @ m.T
        np.fill_diagonal(s, -np.inf)
        return [set(np.argsort(-r, kind="stable")[:5]) for r in s]

    a, b = nn(x), nn(x + 0.5 * y)
    want = np.mean([len(p & q) / 5 for p, q in zip(a, b, strict=True)])
    assert mutual_knn(x, x + 0.5 * y, k=5, block_rows=37) == pytest.approx(want)


@pytest.mark.parametrize(
    "fn", [linear_cka, svcca, encoding_score, mutual_knn, lambda x, y: linear_cka(x, y, True)]
)
def test_bad_inputs_raise_clear_errors(rng, fn):
    x = rng.normal(size=(50, 4))
    with pytest.raises(ValueError, match="same probe set"):
        fn(x, rng.normal(size=(49, 4)))
    bad = x.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        fn(bad, x)
    with pytest.raises(ValueError, match="at least|too few"):
        fn(x[:1], x[:1])
    with pytest.raises(ValueError, match="2-D"):
        fn(x[:, 0], x[:, 0])


def test_more_bad_inputs(rng):
    x = rng.normal(size=(20, 3))
    with pytest.raises(ValueError, match="too few"):
        encoding_score(x[:8], x[:8])
    with pytest.raises(ValueError, match="zero"):
        linear_cka(np.ones((10, 3)), x[:10])
    with pytest.raises(ValueError, match="at least 4"):
        MinibatchCKA().update(x[:3], x[:3])
    with pytest.raises(ValueError, match="same probe set"):
        layer_similarity_matrix([x], [x[:10]])
    with pytest.raises(ValueError, match="divisor"):
        CrossMoments(6, 4, groups_x=4)
    a, b = CrossMoments(3, 3), CrossMoments(3, 2)
    with pytest.raises(ValueError, match="cannot merge"):
        a.merge(b)

import itertools

import numpy as np
import pytest
from scipy.stats import ortho_group

from structlens.equivalence import (
    head_similarity_matrix,
    layer_similarity_matrix,
    linear_cka,
    match_heads,
    match_hungarian,
    match_monotone,
    svcca,
)


def _brute_assignment(s):
    m, n = s.shape
    if m <= n:
        return max(sum(s[i, c[i]] for i in range(m)) for c in itertools.permutations(range(n), m))
    return _brute_assignment(s.T)


def _brute_monotone(s):
    m, n = s.shape
    if m > n:
        return _brute_monotone(s.T)
    return max(sum(s[i, c[i]] for i in range(m)) for c in itertools.combinations(range(n), m))


@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (5, 3), (1, 4), (6, 6)])
def test_hungarian_and_monotone_equal_brute_force(rng, shape):
    for _ in range(5):
        s = rng.normal(size=shape)
        h = match_hungarian(s)
        assert h.total == pytest.approx(_brute_assignment(s))
        assert len(h.pairs) == min(shape)
        assert len({a for a, _ in h.pairs}) == len({b for _, b in h.pairs}) == min(shape)
        m = match_monotone(s)
        assert m.total == pytest.approx(_brute_monotone(s))
        a_idx, b_idx = zip(*m.pairs, strict=True)
        assert list(a_idx) == sorted(set(a_idx)) and list(b_idx) == sorted(set(b_idx))
        assert m.total <= h.total + 1e-12


def _heads(rng, n=150, layers=3, heads=4, d_head=5):
    return [
        rng.normal(size=(n, heads, d_head)) @ rng.normal(size=(d_head, d_head))
        for _ in range(layers)
    ]


def test_planted_head_permutation_is_recovered(rng):
    za = _heads(rng)
    perms = [rng.permutation(4) for _ in za]
    # model B: heads permuted within each layer, each head rotated and rescaled
    zb = []
    for z, p in zip(za, perms, strict=True):
        rot = np.stack(
            [2.0 * z[:, h] @ ortho_group.rvs(5, random_state=int(h)) for h in range(4)], 1
        )
        zb.append(rot[:, p])
    s = head_similarity_matrix(za, zb)
    for mode in ("global", "per_layer"):
        res = match_heads(s, mode=mode)
        assert len(res.pairs) == 12
        for (la, ha), (lb, hb) in res.pairs:
            assert la == lb and perms[lb][hb] == ha
        assert np.allclose(res.similarities, 1.0)


@pytest.mark.parametrize("metric", ["linear_cka", "linear_cka_debiased"])
def test_batched_similarity_matrices_equal_pairwise(rng, metric):
    za, zb = _heads(rng, layers=2, heads=3), _heads(rng, layers=3, heads=2)
    deb = metric.endswith("debiased")
    s = head_similarity_matrix(za, zb, metric)
    assert s.shape == (2, 3, 3, 2)
    for i, g, j, h in itertools.product(range(2), range(3), range(3), range(2)):
        assert s[i, g, j, h] == pytest.approx(linear_cka(za[i][:, g], zb[j][:, h], deb), abs=1e-10)
    acts_a = [z.reshape(z.shape[0], -1) for z in za]
    acts_b = [z.reshape(z.shape[0], -1) for z in zb]
    layer = layer_similarity_matrix(acts_a, acts_b, metric)
    want = [[linear_cka(x, y, deb) for y in acts_b] for x in acts_a]
    np.testing.assert_allclose(layer, want, atol=1e-10)


def test_named_and_callable_metrics(rng):
    acts = [rng.normal(size=(100, 4)) for _ in range(3)]
    s = layer_similarity_matrix(acts, acts, "svcca")
    assert s[1, 2] == pytest.approx(svcca(acts[1], acts[2]))
    assert np.allclose(np.diag(s), 1.0)
    t = layer_similarity_matrix(acts, acts, lambda x, y: float(x.shape[1] + y.shape[1]))
    assert np.all(t == 8.0)
    with pytest.raises(ValueError, match="unknown metric"):
        layer_similarity_matrix(acts, acts, "cosine")


def test_monotone_matches_layers_of_different_depth(rng):
    base = [rng.normal(size=(120, 6)) for _ in range(4)]
    shallow = [base[1] @ rng.normal(size=(6, 6)), base[3] @ rng.normal(size=(6, 6))]
    s = layer_similarity_matrix(base, shallow)
    assert match_monotone(s).pairs == [[1, 0], [3, 1]]

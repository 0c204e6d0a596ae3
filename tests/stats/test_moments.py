"""The one cross-moment accumulator against one-shot NumPy computations."""

import itertools
import pickle

import numpy as np
import pytest
import torch

from structlens.stats.moments import ColumnMoments, CrossMoments, _tiled_gram, symmetric_gram

SHARDS = [(0, 1), (1, 40), (40, 41), (41, 230), (230, 300)]


def _data(rng, n=300, dx=9, dy=6):
    x = rng.standard_normal((n, dx)) * 3 + 1e4  # a large mean: raw moments would lose digits
    y = x[:, :dy] * 0.5 + rng.standard_normal((n, dy)) - 7
    return x, y


def _relmax(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def _hsic_u(k, ell):
    """Song et al. (2012) unbiased HSIC from Gram matrices (an independent computation)."""
    n = k.shape[0]
    k, ell = k - np.diag(np.diag(k)), ell - np.diag(np.diag(ell))
    one = np.ones(n)
    return (
        np.trace(k @ ell)
        + (one @ k @ one) * (one @ ell @ one) / ((n - 1) * (n - 2))
        - 2.0 / (n - 2) * (one @ k @ ell @ one)
    ) / (n * (n - 3))


@pytest.mark.parametrize("second_y", ["full", "diag"])
def test_merged_shards_equal_one_shot_numpy_in_any_order(rng, second_y):
    x, y = _data(rng)
    xc, yc = x - x.mean(0), y - y.mean(0)
    want = {"xx": xc.T @ xc, "xy": xc.T @ yc}
    want["yy"] = yc.T @ yc if second_y == "full" else (yc**2).sum(0)
    parts = [CrossMoments(9, 6, second_y=second_y).update(x[a:b], y[a:b]) for a, b in SHARDS]
    for order in itertools.islice(itertools.permutations(range(len(parts))), 0, None, 17):
        acc = CrossMoments(9, 6, second_y=second_y)
        for i in order:
            assert acc.merge(pickle.loads(pickle.dumps(parts[i]))) is acc
        assert acc.n == 300
        assert _relmax(acc.mean_x, x.mean(0)) < 1e-12
        assert _relmax(acc.mean_y, y.mean(0)) < 1e-12
        for key, got in (("xx", acc.s_xx), ("xy", acc.s_xy), ("yy", acc.s_yy)):
            assert _relmax(got, want[key]) < 1e-12, key
    np.testing.assert_array_equal(acc.s_xx, acc.s_xx.T)


def test_single_block_covariance_and_gram(rng):
    x, _ = _data(rng, dx=600)  # wider than two tiles: the blocked symmetric product
    acc = CrossMoments(600, chunk_rows=128).update(x[:100]).merge(CrossMoments(600).update(x[100:]))
    np.testing.assert_array_equal(acc.s_xx, acc.s_xx.T)
    assert _relmax(acc.covariance(1), np.cov(x, rowvar=False)) < 1e-12
    assert _relmax(acc.gram(), x.T @ x) < 1e-12
    with pytest.raises(ValueError, match="d_y"):
        acc.update(x, x)


def test_grouped_fourth_order_terms_give_the_unbiased_hsic(rng):
    x, y = _data(rng, n=60, dx=6, dy=4)
    cuts = [(0, 7), (7, 31), (31, 60)]
    parts = [CrossMoments(6, 4, 3, 2).update(x[a:b], y[a:b]) for a, b in cuts]
    acc = parts[2].merge(parts[0]).merge(parts[1])
    t_xy, t_xx, t_yy = acc.hsic_terms(debiased=True)
    n = 60
    xc, yc = x - x.mean(0), y - y.mean(0)
    for g, h in itertools.product(range(3), range(2)):
        # the unbiased HSIC is shift invariant: centre so the Gram matrices keep their digits
        xg, yh = xc[:, 2 * g : 2 * g + 2], yc[:, 2 * h : 2 * h + 2]
        want = _hsic_u(xg @ xg.T, yh @ yh.T)
        assert t_xy[g, h] / (n * (n - 3)) == pytest.approx(want, rel=1e-9, abs=1e-9)
    xg = xc[:, :2]
    assert t_xx[0] / (n * (n - 3)) == pytest.approx(_hsic_u(xg @ xg.T, xg @ xg.T), rel=1e-9)
    with pytest.raises(ValueError, match="second_y"):
        CrossMoments(6, 4, second_y="diag").update(x, y).hsic_terms(debiased=True)


def test_torch_blocks_match_numpy_and_float32_is_close(rng):
    x, y = _data(rng)
    ref = CrossMoments(9, 6).update(x, y)
    tor = CrossMoments(9, 6).update(torch.from_numpy(x), torch.from_numpy(y))
    assert _relmax(tor.s_xy, ref.s_xy) < 1e-12
    f32 = CrossMoments(9, 6, precision="float32").update(x - 1e4, y)
    assert _relmax(f32.s_xy, ref.s_xy) < 1e-5


def test_bad_input_is_rejected_with_a_clear_message(rng):
    x = np.ones((5, 3))
    x[2, 1] = np.inf
    with pytest.raises(ValueError, match="1 NaN or infinite"):
        CrossMoments(3).update(x)
    with pytest.raises(ValueError, match="columns"):
        CrossMoments(4).update(np.ones((5, 3)))
    with pytest.raises(ValueError, match="rows must pair"):
        CrossMoments(3, 3).update(np.ones((5, 3)), np.ones((4, 3)))
    with pytest.raises(ValueError, match="cannot merge"):
        CrossMoments(3, 3).merge(CrossMoments(3, 3, second_y="diag"))
    with pytest.raises(ValueError, match="divisor"):
        CrossMoments(6, 4, groups_x=4)


def test_column_moments_merge_in_any_order(rng):
    x = rng.standard_t(5, size=(300, 3)) + 50
    parts = [ColumnMoments(3).update(x[a:b]) for a, b in SHARDS]
    xc = x - x.mean(0)
    for order in [(0, 1, 2, 3, 4), (4, 2, 0, 3, 1)]:
        acc = ColumnMoments(3)
        for i in order:
            assert acc.merge(parts[i]) is acc
        for k, got in ((2, acc.m2), (3, acc.m3), (4, acc.m4)):
            assert _relmax(got, (xc**k).sum(0)) < 1e-10


def test_second_order_column_moments_of_tensors_give_the_total_scatter(rng):
    x = rng.normal(size=(300, 4)) * 2 + 1e3
    parts = [ColumnMoments(4, order=2).update(torch.from_numpy(x[a:b])) for a, b in SHARDS]
    acc = parts[3].merge(parts[0]).merge(parts[4]).merge(parts[1]).merge(parts[2])
    xc = x - x.mean(0)
    assert _relmax(acc.m2, (xc**2).sum(0)) < 1e-12
    with pytest.raises(ValueError, match="order=4"):
        acc.excess_kurtosis()
    with pytest.raises(ValueError, match="cannot merge"):
        acc.merge(ColumnMoments(4))


def test_column_blocks_and_reused_buffers_equal_one_array(rng):
    # a tuple of column blocks is written into the reused centring buffer: same bits as the
    # concatenated array; pickled and copied accumulators keep working
    x, y = _data(rng, n=700, dx=600)  # wide: the blocked symmetric product
    ref = CrossMoments(600, 6, second_y="diag", chunk_rows=256).update(x, y)
    got = CrossMoments(600, 6, second_y="diag", chunk_rows=256)
    got.update((x[:, :590], x[:, 590:]), y)
    for a, b in ((got.s_xx, ref.s_xx), (got.s_xy, ref.s_xy), (got.s_yy, ref.s_yy)):
        np.testing.assert_array_equal(a, b)
    again = pickle.loads(pickle.dumps(got)).update(x[:10], y[:10])
    assert again.n == 710 and got.copy().update(x[:10], y[:10]).n == 710
    with pytest.raises(ValueError, match="column blocks of x have 599 columns"):
        CrossMoments(600).update((x[:, :590], x[:, 591:]))


def test_column_moments_equal_two_pass_numpy_and_catch_nan(rng):
    x = rng.standard_t(4, size=(500, 7)) * 2 + 3
    xc = x - x.mean(0)
    acc = ColumnMoments(7).update(x)
    for got, want in ((acc.m2, xc**2), (acc.m3, xc**3), (acc.m4, xc**4)):
        assert _relmax(got, want.sum(0)) < 1e-12
    assert _relmax(ColumnMoments(7, order=2).update(x).m2, (xc**2).sum(0)) < 1e-12
    bad = x.copy()
    bad[3, 2] = np.inf
    with pytest.raises(ValueError, match="NaN or infinite"):
        ColumnMoments(7).update(bad)


def _acc(x, y=None, **kw):
    return CrossMoments(x.shape[1], None if y is None else y.shape[1], **kw).update(x, y)


@pytest.mark.parametrize("with_y", [False, True])
def test_pool_equals_one_pass_over_the_repeated_rows(with_y):
    rng = np.random.default_rng(3)
    rows = [rng.normal(loc=5.0, size=(n, 6)) for n in (7, 11, 4, 9)]  # large means: recentring
    ys = [rng.normal(size=(r.shape[0], 3)) for r in rows]
    weights = [2, 0, 1, 3]
    kw = {"second_y": "diag"} if with_y else {}
    parts = [_acc(r, y if with_y else None, **kw) for r, y in zip(rows, ys)]
    pooled = CrossMoments.pool(parts, weights)
    x_all = np.vstack([r for r, k in zip(rows, weights) for _ in range(k)])
    y_all = np.vstack([y for y, k in zip(ys, weights) for _ in range(k)])
    direct = _acc(x_all, y_all if with_y else None, **kw)
    assert pooled.n == direct.n == x_all.shape[0]
    np.testing.assert_allclose(pooled.mean_x, x_all.mean(0), rtol=1e-13)
    np.testing.assert_allclose(pooled.s_xx, direct.s_xx, rtol=1e-11, atol=1e-10)
    assert np.array_equal(pooled.s_xx, pooled.s_xx.T)
    if with_y:
        np.testing.assert_allclose(pooled.s_xy, direct.s_xy, rtol=1e-11, atol=1e-10)
        np.testing.assert_allclose(pooled.s_yy, direct.s_yy, rtol=1e-11, atol=1e-10)
    assert parts[0].n == 7  # inputs unchanged


def test_pool_with_fourth_order_terms_merges_pairwise():
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(20, 4)), rng.normal(size=(20, 2))
    a, b = _acc(x[:8], y[:8], groups_x=2), _acc(x[8:], y[8:], groups_x=2)
    pooled = CrossMoments.pool([a, b])
    np.testing.assert_allclose(pooled.s_yy, _acc(x, y).s_yy, rtol=1e-12, atol=1e-12)
    assert pooled.fourth_order


def test_pool_rejects_bad_weights_and_mixed_widths():
    a = _acc(np.ones((3, 2)) + np.arange(6).reshape(3, 2))
    with pytest.raises(ValueError, match="non-negative integers"):
        CrossMoments.pool([a, a], [1, -1])
    with pytest.raises(ValueError, match="non-negative integers"):
        CrossMoments.pool([a, a], [1])
    with pytest.raises(ValueError, match="different widths"):
        CrossMoments.pool([a, _acc(np.arange(9.0).reshape(3, 3))])


POOL_KINDS = {
    "x only": ({}, None),
    "diag y": ({"second_y": "diag"}, 3),
    "full y": ({"fourth_order": False}, 4),
    "grouped full y": ({"fourth_order": False, "groups_x": 2, "groups_y": 2}, 4),
    "diag y with tails": ({"second_y": "diag", "tails_x": 4}, 3),
    "fourth order": ({"groups_x": 2}, 4),
}
# a row per pooling, a column per part: all once, nothing, only the empty part (both give an
# empty accumulator, as pool does), bootstrap counts, one part, a half
POOL_WEIGHTS = np.array(
    [[1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0], [0, 0, 0, 5, 0, 0], [3, 0, 2, 1, 0, 4],
     [0, 0, 1, 0, 0, 0], [1, 0, 1, 0, 1, 0]]
)  # fmt: skip


def _parts_of(rows, ys, **kw):
    dy = None if ys[0] is None else ys[0].shape[1]
    parts = [CrossMoments(rows[0].shape[1], dy, **kw) for _ in rows]
    return [p.update(r, y) if len(r) else p for p, r, y in zip(parts, rows, ys)]


def _assert_pooled_alike(got, want, tol):
    assert got.n == want.n and got._key == want._key
    if want.n == 0:
        assert got._xx is None
        return
    assert _relmax(got.mean_x, want.mean_x) < tol
    assert _relmax(got.s_xx, want.s_xx) < tol
    np.testing.assert_array_equal(got.s_xx, got.s_xx.T)
    if want._d_y is not None:
        assert _relmax(got.mean_y, want.mean_y) < tol
        assert _relmax(got.s_xy, want.s_xy) < tol
        assert _relmax(got.s_yy, want.s_yy) < tol
        if got.s_yy.ndim == 2:
            np.testing.assert_array_equal(got.s_yy, got.s_yy.T)
    if want.tails is not None:
        assert got.tails.n == want.tails.n
        for name in ("mean", "m2", "m3", "m4"):
            assert _relmax(getattr(got.tails, name), getattr(want.tails, name)) < 100 * tol, name


@pytest.mark.parametrize("kind", list(POOL_KINDS))
def test_pool_many_equals_pool_for_every_row(rng, kind):
    kw, dy = POOL_KINDS[kind]
    rows = [rng.standard_normal((n, 6)) * 2 + 5.0 for n in (7, 1, 12, 0, 30, 5)]
    ys = [None if dy is None else r[:, :dy] * 0.5 + rng.standard_normal((len(r), dy)) for r in rows]
    parts = _parts_of(rows, ys, **kw)
    # one row per product, and every row in one product
    for chunk_bytes in (1, 1 << 20):
        pooled = list(CrossMoments.pool_many(parts, POOL_WEIGHTS, chunk_bytes=chunk_bytes))
        assert len(pooled) == len(POOL_WEIGHTS)
        for w, got in zip(POOL_WEIGHTS, pooled):
            want = CrossMoments.pool(parts, w)
            _assert_pooled_alike(got, want, 1e-12)
            if kw.get("groups_x") and want.n > 4:  # the grouped HSIC terms read the same
                debiased = bool(want.fourth_order)
                for a, b in zip(got.hsic_terms(debiased), want.hsic_terms(debiased)):
                    assert _relmax(a, b) < 1e-10
    assert parts[0].n == 7 and parts[3].n == 0  # inputs unchanged


def test_pool_many_keeps_the_digits_of_a_large_mean(rng):
    # SmolLM2-like "massive" coordinates: mean 1e3 against a spread of 1, where sums about
    # zero would lose six digits; every pooling against a two-pass float64 computation
    rows = [rng.standard_normal((n, 8)) + 1e3 for n in rng.integers(20, 60, size=12)]
    ys = [r[:, :3] * 0.3 + rng.standard_normal((len(r), 3)) - 1e3 for r in rows]
    parts = _parts_of(rows, ys, second_y="diag", tails_x=3)
    W = np.vstack([rng.multinomial(12, np.full(12, 1 / 12), size=20), np.eye(12, dtype=int)])
    W[-1, :6] = 1  # a half
    for w, got in zip(W, CrossMoments.pool_many(parts, W)):
        x = np.vstack([r for r, k in zip(rows, w) for _ in range(k)])
        y = np.vstack([r for r, k in zip(ys, w) for _ in range(k)])
        xc, yc = x - x.mean(0), y - y.mean(0)
        assert got.n == len(x)
        assert _relmax(got.mean_x, x.mean(0)) < 1e-14
        assert _relmax(got.mean_y, y.mean(0)) < 1e-14
        assert _relmax(got.s_xx, xc.T @ xc) < 1e-10
        assert _relmax(got.s_xy, xc.T @ yc) < 1e-10
        assert _relmax(got.s_yy, (yc**2).sum(0)) < 1e-10
        for p, m in ((2, got.tails.m2), (3, got.tails.m3), (4, got.tails.m4)):
            assert _relmax(m, (xc[:, :3] ** p).sum(0)) < 1e-10, p


def test_pool_many_pools_a_row_far_from_the_reference_on_its_own_mean(rng):
    # two parts a million apart: their common reference is half-way, so a row holding one
    # part only would difference sums of 1e11 down to ~30; that row is pooled by pool
    rows = [rng.standard_normal((30, 4)), rng.standard_normal((20, 4)) + 1e6]
    parts = _parts_of(rows, [None, None])
    far, both = CrossMoments.pool_many(parts, [[0, 2], [1, 1]])
    want = CrossMoments.pool(parts, [0, 2])
    np.testing.assert_array_equal(far.s_xx, want.s_xx)
    _assert_pooled_alike(both, CrossMoments.pool(parts, [1, 1]), 1e-12)


def test_pool_many_rejects_bad_weights_and_mixed_widths():
    a = _acc(np.ones((3, 2)) + np.arange(6).reshape(3, 2))
    for bad in ([1, 1], [[1, -1]], [[1, 0.5]], [[1, 1, 1]], [[np.nan, 1]]):
        with pytest.raises(ValueError, match="non-negative integers"):
            CrossMoments.pool_many([a, a], bad)
    with pytest.raises(ValueError, match="different widths"):
        CrossMoments.pool_many([a, _acc(np.arange(9.0).reshape(3, 3))], [[1, 1]])
    with pytest.raises(ValueError, match="nothing to pool"):
        CrossMoments.pool_many([], np.zeros((1, 0)))
    with pytest.raises(ValueError, match="chunk_bytes"):
        CrossMoments.pool_many([a], [[1]], chunk_bytes=0)
    assert list(CrossMoments.pool_many([a, a], np.zeros((0, 2), dtype=int))) == []


def test_project_x_equals_the_moments_of_the_projected_rows():
    rng = np.random.default_rng(5)
    x, y = rng.normal(loc=2.0, size=(40, 6)), rng.normal(size=(40, 3))
    T = rng.normal(size=(6, 2))
    proj = _acc(x, y, second_y="diag").project_x(T)
    direct = _acc(x @ T, y, second_y="diag")
    np.testing.assert_allclose(proj.mean_x, direct.mean_x, rtol=1e-12)
    np.testing.assert_allclose(proj.s_xx, direct.s_xx, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(proj.s_xy, direct.s_xy, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(proj.s_yy, direct.s_yy, rtol=1e-12)
    with pytest.raises(ValueError, match="T must be"):
        _acc(x).project_x(T[:3])


@pytest.mark.parametrize(
    ("d", "dtype", "tol"),
    [(300, torch.float32, 1e-5), (301, torch.float32, 1e-5), (40, torch.float32, 1e-5),
     (300, torch.float64, 1e-13)],
)  # fmt: skip
def test_symmetric_gram_is_exactly_symmetric_and_equals_ct_c(rng, d, dtype, tol):
    # the CPU's syrk, and the blocked product other devices use, cut into uneven tiles
    c = torch.from_numpy(rng.standard_normal((500, d))).to(dtype)
    exact = c.double().numpy().T @ c.double().numpy()
    for g in (symmetric_gram(c), _tiled_gram(c, 64)):
        assert g.dtype == dtype and g.shape == (d, d)
        assert torch.equal(g, g.T)
        assert _relmax(g.double().numpy(), exact) < tol


def test_drifting_updates_and_dtypes_keep_second_order_moments_exact(rng):
    # each update is reduced about the running mean; a stream whose mean drifts far from the
    # first chunk's, with float32 or float64 y, gives the two-pass answer
    n, dx, dy = 900, 7, 4
    drift = np.linspace(0, 5e3, n)[:, None]
    x = rng.standard_normal((n, dx)) * 2 + 1e4 + drift
    y = (x[:, :dy] - drift) * 0.3 + rng.standard_normal((n, dy)) - 50 + drift
    xc = x - x.mean(0)
    for y_in, tol in ((y, 1e-11), (y.astype(np.float32), 1e-6)):
        acc = CrossMoments(dx, dy, second_y="diag", chunk_rows=64)
        for a, b in ((0, 100), (100, 101), (101, 700), (700, 900)):
            acc.update(x[a:b], y_in[a:b])
        y64 = y_in.astype(np.float64)
        y64c = y64 - y64.mean(0)
        assert _relmax(acc.mean_x, x.mean(0)) < 1e-13
        assert _relmax(acc.s_xx, xc.T @ xc) < 1e-11
        assert _relmax(acc.s_xy, xc.T @ y64c) < tol
        assert _relmax(acc.s_yy, (y64c**2).sum(0)) < tol
    # float32 arithmetic gives the same sums
    f32 = CrossMoments(dx, dy, second_y="diag", chunk_rows=64, precision="float32", tails_x=3)
    for a, b in ((0, 450), (450, 900)):
        f32.update(torch.from_numpy(x[a:b]), torch.from_numpy(y[a:b]))
    yc = y - y.mean(0)
    assert _relmax(f32.mean_x, x.mean(0)) < 1e-7
    assert _relmax(f32.s_xx, xc.T @ xc) < 1e-5
    assert _relmax(f32.s_xy, xc.T @ yc) < 1e-5
    assert _relmax(f32.s_yy, (yc**2).sum(0)) < 1e-5
    assert _relmax(f32.tails.m4, (xc[:, :3] ** 4).sum(0)) < 1e-4


@pytest.mark.parametrize("chunk_rows", [50, 16384])
def test_tails_of_leading_columns_equal_two_pass_numpy(rng, chunk_rows):
    # the column tails kept from the shifted buffer equal the standalone accumulator's and the
    # two-pass central moments, through shard merges, pooling and a projection that keeps them
    x = rng.standard_t(4, size=(300, 6)) * 2 + 1e3
    y = rng.standard_normal((300, 2))
    k = 4
    parts = [
        CrossMoments(6, 2, second_y="diag", tails_x=k, chunk_rows=chunk_rows).update(x[a:b], y[a:b])
        for a, b in SHARDS
    ]
    merged = parts[3].copy().merge(parts[0]).merge(parts[4]).merge(parts[1]).merge(parts[2])
    xc = x[:, :k] - x[:, :k].mean(0)
    for acc in (merged, CrossMoments.pool(parts)):
        tails = acc.tails
        assert tails is not None and tails.n == 300 and acc.tails_x == k
        for p, got in ((2, tails.m2), (3, tails.m3), (4, tails.m4)):
            assert _relmax(got, (xc**p).sum(0)) < 1e-10, p
        np.testing.assert_allclose(
            tails.excess_kurtosis(), ColumnMoments(k).update(x[:, :k]).excess_kurtosis(),
            rtol=1e-10,
        )  # fmt: skip
    keep = np.zeros((6, k + 1))
    keep[:k, :k] = np.eye(k)
    keep[k:, k] = 1.0
    assert merged.project_x(keep).tails.n == 300
    assert merged.project_x(np.ones((6, k + 1))).tails is None
    with pytest.raises(ValueError, match="tails_x"):
        CrossMoments(3, tails_x=4)
    with pytest.raises(ValueError, match="tails_x"):
        CrossMoments(3, 2, tails_x=1)  # fourth-order terms: no tails
    with pytest.raises(ValueError, match="tails_x"):
        merged.merge(CrossMoments(6, 2, second_y="diag"))


def test_a_stream_of_chunks_equals_one_update_per_chunk(rng):
    # one set of sums for the whole stream (one merge at the end); chunks whose y needs a
    # cast (float32) are shifted into a buffer and added back in the as-given convention
    x = rng.standard_normal((500, 5)) * 3 + 2e3
    y = x[:, :3] * 0.2 + rng.standard_normal((500, 3)) + 40
    cuts = [(0, 120), (120, 121), (121, 300), (300, 300), (300, 500)]
    ys = [y[a:b].astype(np.float32) if i % 2 else y[a:b] for i, (a, b) in enumerate(cuts)]
    kw = {"second_y": "diag", "tails_x": 2, "chunk_rows": 64}
    stream = CrossMoments(5, 3, **kw).update_chunks((x[a:b], yc) for (a, b), yc in zip(cuts, ys))
    each = CrossMoments(5, 3, **kw)
    for (a, b), yc in zip(cuts, ys):
        each.update(x[a:b], yc)
    y_in = np.vstack([yc.astype(np.float64) for yc in ys])
    xc, yc = x - x.mean(0), y_in - y_in.mean(0)
    for acc in (stream, each):
        assert acc.n == 500
        assert _relmax(acc.s_xx, xc.T @ xc) < 1e-11
        assert _relmax(acc.s_xy, xc.T @ yc) < 1e-11
        assert _relmax(acc.s_yy, (yc**2).sum(0)) < 1e-11
        assert _relmax(acc.tails.m4, (xc[:, :2] ** 4).sum(0)) < 1e-10
    assert CrossMoments(5).update_chunks([]).n == 0
    with pytest.raises(ValueError, match="rows must pair"):
        CrossMoments(5, 3, second_y="diag").update_chunks([(x[:10], y[:9])])


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_full_second_block_without_fourth_order_terms_equals_the_fourth_order_path(rng, precision):
    # biased CKA and the CCA family need S_yy in full but no fourth-order terms: the shifted
    # second-order path gives the same scatters, merged and pooled, and the same biased HSIC
    x, y = _data(rng, n=400, dx=8, dy=6)
    tol = 1e-11 if precision == "float64" else 1e-5
    kw = {"chunk_rows": 64, "precision": precision, "groups_x": 2, "groups_y": 3}
    ref = CrossMoments(8, 6, **{**kw, "precision": "float64"}).update(x, y)
    parts = [
        CrossMoments(8, 6, fourth_order=False, **kw).update(x[a:b], y[a:b])
        for a, b in ((0, 150), (150, 151), (151, 400))
    ]
    merged = parts[2].copy().merge(parts[0]).merge(parts[1])
    for acc in (merged, CrossMoments.pool(parts)):
        assert not acc.fourth_order and acc.n == 400
        for got, want in ((acc.s_xx, ref.s_xx), (acc.s_xy, ref.s_xy), (acc.s_yy, ref.s_yy)):
            assert _relmax(got, want) < tol
        for got, want in zip(acc.hsic_terms(False), ref.hsic_terms(False)):
            assert _relmax(np.asarray(got), np.asarray(want)) < 10 * tol
    with pytest.raises(ValueError, match="fourth_order=True"):
        merged.hsic_terms(True)
    with pytest.raises(ValueError, match="cannot merge"):
        merged.merge(ref)


@pytest.mark.parametrize("fourth_order", [True, False])
def test_the_device_path_forced_on_the_cpu_gives_the_same_moments(rng, monkeypatch, fourth_order):
    # what a GPU runs (torch ops, tiled symmetric products, sums kept as tensors), exercised
    # here by routing CPU tensors away from NumPy
    import structlens.stats.moments as moments

    x, y = _data(rng, n=600, dx=530, dy=6)  # wide enough for the tiled product
    kw = {"chunk_rows": 256, "fourth_order": fourth_order, "tails_x": 3 * (not fourth_order)}
    ref = CrossMoments(530, 6, **kw).update(x, y)
    monkeypatch.setattr(moments, "_in_numpy", lambda t: False)
    dev = CrossMoments(530, 6, **kw).update_chunks(
        (torch.from_numpy(x[a:b]), torch.from_numpy(y[a:b])) for a, b in ((0, 300), (300, 600))
    )
    for got, want in ((dev.s_xx, ref.s_xx), (dev.s_xy, ref.s_xy), (dev.s_yy, ref.s_yy)):
        assert _relmax(got, want) < 1e-11
    assert _relmax(dev.mean_y, ref.mean_y) < 1e-13
    if not fourth_order:
        assert _relmax(dev.tails.m4, ref.tails.m4) < 1e-10

"""The batched neighbour search returns the brute-force nearest key in every subspace, across
runs of equal sizes, several tiles and chunks, padded banks and float32, and the batched loss
equals the per-subspace sum it replaces."""

import pytest
import torch

from structlens.ndm.search import RotatedKeys, neighbor_distance_loss, size_runs


def _brute(queries, keys, R, partition):
    out, start = [], 0
    for size in partition:
        cols = R[:, start : start + size]
        d = torch.cdist(queries @ cols, keys @ cols, compute_mode="donot_use_mm_for_euclid_dist")
        out.append(d.argmin(1))
        start += size
    return torch.stack(out)


def test_size_runs_group_equal_consecutive_sizes():
    assert size_runs([3, 3, 2, 3]) == [(0, 0, 2, 3), (2, 6, 1, 2), (3, 8, 1, 3)]


@pytest.mark.parametrize(
    ("n_keys", "chunk", "dtype"),
    [
        (3000, 2048, torch.float64),  # three tiles, two chunks merged, padded last tile
        (37, 4096, torch.float64),  # fewer keys than a tile: one padded group-aligned tile
        (5000, 1024, torch.float32),  # five chunks of one tile each
    ],
)
def test_search_is_exact_against_brute_force(rng, n_keys, chunk, dtype):
    partition = [3, 3, 3, 2, 2, 1]
    d = sum(partition)
    keys = torch.tensor(rng.standard_normal((n_keys, d)) + 10.0, dtype=dtype)
    queries = torch.tensor(rng.standard_normal((40, d)) + 10.0, dtype=dtype)
    R = torch.linalg.qr(torch.tensor(rng.standard_normal((d, d)), dtype=torch.float64))[0]
    got = RotatedKeys(keys, R, partition, chunk_size=chunk).nearest(queries, R, rerank=6)
    expected = _brute(queries.double(), keys.double(), R, partition)
    # float32 ranking may swap keys whose distances tie to rounding: compare distances
    q, k, start = queries.double(), keys.double(), 0
    for s, size in enumerate(partition):
        cols = R[:, start : start + size]
        ours = torch.linalg.vector_norm((q - k[got[s]]) @ cols, dim=1)
        best = torch.linalg.vector_norm((q - k[expected[s]]) @ cols, dim=1)
        torch.testing.assert_close(ours, best, rtol=1e-6, atol=1e-9)
        start += size
    if dtype == torch.float64:
        assert torch.equal(got, expected)


def test_batched_loss_equals_the_per_subspace_sum(rng):
    partition = [2, 2, 3, 1]
    d = sum(partition)
    keys = torch.tensor(rng.standard_normal((200, d)))
    queries = torch.tensor(rng.standard_normal((16, d)))
    R = torch.linalg.qr(torch.tensor(rng.standard_normal((d, d))))[0]
    nn = torch.tensor(rng.integers(0, 200, (len(partition), 16)))
    total, start = 0.0, 0
    for s, size in enumerate(partition):
        diff = queries - keys[nn[s]]
        total += float(torch.linalg.vector_norm(diff @ R[:, start : start + size], dim=1).mean())
        start += size
    loss = neighbor_distance_loss(queries, keys, nn, R, partition)
    assert float(loss) == pytest.approx(total / len(partition), rel=1e-12)


def test_projection_in_chunks_and_reused_buffers_stay_exact(rng, monkeypatch):
    """A bank projected in several row chunks (one partial), then searched with batches of
    different sizes that reuse the index's buffers: every answer is the brute-force one."""
    monkeypatch.setattr("structlens.ndm.search.PROJECT_ROWS", 700)
    partition = [4, 4, 2, 3]
    d = sum(partition)
    keys = torch.tensor(rng.standard_normal((2500, d)) + 5.0, dtype=torch.float32)
    R = torch.linalg.qr(torch.tensor(rng.standard_normal((d, d)), dtype=torch.float64))[0]
    index = RotatedKeys(keys, R, partition, chunk_size=1024)
    for batch in (40, 7, 40):
        queries = torch.tensor(rng.standard_normal((batch, d)) + 5.0, dtype=torch.float32)
        expected = _brute(queries.double(), keys.double(), R, partition)
        assert torch.equal(index.nearest(queries, R, rerank=6), expected)

"""map_reduce / merge_all with the local executor (no Ray needed)."""

import numpy as np
import pytest
import torch

from structlens.causal_dim.jacobian import EJOPAccumulator
from structlens.execution import LocalExecutor, get_executor, map_reduce, merge_all
from structlens.stats.moments import CrossMoments


class _Rows:
    """Moments of the rows ``start:start + 10`` of a fixed matrix."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x

    def __call__(self, start: int) -> CrossMoments:
        acc = CrossMoments(self.x.shape[1])
        acc.update(self.x[start : start + 10])
        return acc


def test_map_reduce_equals_numpy_moments():
    x = np.random.default_rng(0).normal(size=(50, 3)) * [1.0, 10.0, 0.1] + 1e4
    acc = map_reduce(_Rows(x), list(range(0, 50, 10)), progress=False)
    assert acc.n == 50
    np.testing.assert_allclose(acc.mean_x, x.mean(0), rtol=1e-15)
    cov = np.cov(x, rowvar=False)
    np.testing.assert_allclose(acc.covariance(1), cov, rtol=1e-11, atol=1e-12 * np.abs(cov).max())


def test_merge_all_accepts_in_place_and_returning_merges():
    parts = []
    for i in range(3):
        e = EJOPAccumulator(2, n_groups=1)
        e.update(torch.eye(2, dtype=torch.float64) * (i + 1), count=1)
        parts.append(e)
    merged = merge_all(parts)  # EJOPAccumulator.merge folds in place and returns self
    assert merged.n == 3
    torch.testing.assert_close(merged.sigma(), torch.eye(2, dtype=torch.float64) * 2)
    total = merge_all([1, 2, 3], merge=lambda a, b: a + b)
    assert total == 6
    with pytest.raises(ValueError, match="nothing to merge"):
        merge_all([])
    with pytest.raises(ValueError, match="at least one item"):
        map_reduce(_Rows(np.zeros((1, 1))), [])


def test_local_executor_is_the_default_and_keeps_order():
    ex = get_executor()
    assert isinstance(ex, LocalExecutor) and get_executor(ex) is ex
    assert list(ex.map(lambda i: i * i, [3, 1, 2], resident=True, progress=False)) == [9, 1, 4]

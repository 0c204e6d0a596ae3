"""One input check, one wording of each error."""

import numpy as np
import pytest
import torch

from structlens.stats.validation import check_array, check_shape


def test_converts_tensors_and_sequences_to_checked_arrays():
    a = check_array(torch.ones(3, 2, dtype=torch.bfloat16), name="X")
    assert a.dtype == np.float64 and a.shape == (3, 2)
    kept = check_array(np.ones((3, 2), np.float32), name="X", dtype=None)
    assert kept.dtype == np.float32
    assert check_array([[1, 2]], name="X", dtype=None).dtype == np.float64
    x = np.ones((4, 3))
    assert check_array(x, name="X") is x  # no copy when nothing changes


@pytest.mark.parametrize(
    ("value", "kwargs", "message"),
    [
        (np.ones(3), {}, r"X must be 2-D \(rows = samples, columns = features\), got shape \(3,\)"),
        (np.ones((2, 3)), {"ndim": 3}, r"X must be 3-D, got shape \(2, 3\)"),
        (np.ones((1, 3)), {"min_rows": 2}, r"X has 1 rows \(samples\) but at least 2 are needed"),
        (np.ones((2, 3)), {"n_cols": 4}, r"X has 3 columns but 4 are expected"),
        (np.ones((2, 0)), {}, r"X has no features"),
        (np.array([["a"]]), {}, r"X must be a numeric array"),
        (np.ones((2, 2)) * 1j, {}, r"X must be real"),
        (np.array([[np.nan, 1.0], [np.inf, 2.0]]), {}, r"X contains 2 NaN or infinite values"),
    ],
)
def test_each_failure_has_one_clear_message(value, kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_array(value, name="X", **kwargs)


def test_finite_scan_can_be_skipped_and_shape_checked_alone():
    bad = np.array([[np.nan]])
    assert check_array(bad, name="X", finite=False) is bad
    check_shape((5, 3), name="t", n_cols=3, min_rows=5)
    with pytest.raises(ValueError, match="columns"):
        check_shape((5, 3), name="t", n_cols=2)

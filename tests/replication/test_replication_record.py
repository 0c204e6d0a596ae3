"""A replication's JSON record survives the stage cache exactly (NaN included)."""

from __future__ import annotations

import numpy as np

from structlens.pipeline.cache import Stage, StageCache
from structlens.replication.stage import Record


def test_record_round_trips_nan_and_nested_data(tmp_path):
    cache = StageCache(tmp_path)
    data = {"a": [1.5, float("nan")], "b": {"c": np.float64(2.0)}}
    cache.run(Stage("rec"), Record, lambda _: Record.of(data))
    got = cache.run(Stage("rec"), Record, lambda _: Record.of({}))
    assert got.data["b"] == {"c": 2.0} and np.isnan(got.data["a"][1])
    assert cache.hits() == [False, True]

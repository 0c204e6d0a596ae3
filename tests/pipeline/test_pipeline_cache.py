"""The cached-stage primitive: hits on equal inputs, recomputes on any change or corruption."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from structlens.pipeline.cache import Stage, StageCache, data_digest
from structlens.results import Result
from structlens.verdicts import Caveat, Number, Section


@dataclasses.dataclass(frozen=True)
class Squares(Result):
    values: np.ndarray
    n: int


def _compute(calls: list[int], n: int):
    def compute(directory):
        calls.append(n)
        (directory / "extra.txt").write_text(f"side artifact {n}")
        return Squares(values=np.arange(n, dtype=float) ** 2, n=n)

    return compute


def test_same_inputs_hit_and_return_the_stored_result(tmp_path):
    cache, calls = StageCache(tmp_path), []
    stage = Stage("squares", {"n": 4}, model="m1", data=data_digest([1, 2, 3]))
    first = cache.run(stage, Squares, _compute(calls, 4))
    again = StageCache(tmp_path).run(stage, Squares, _compute(calls, 4))
    assert calls == [4]
    np.testing.assert_array_equal(again.values, first.values)
    assert (cache.path(stage) / "extra.txt").read_text() == "side artifact 4"
    # the key is a content hash: an equal stage built again has the same key
    assert Stage("squares", {"n": 4}, model="m1", data=data_digest([1, 2, 3])).key == stage.key


@pytest.mark.parametrize(
    "change",
    [
        {"config": {"n": 5}},
        {"name": "cubes"},
        {"model": "m2"},
        {"data": data_digest([1, 2, 4])},
        {"inputs": ("upstream-key",)},
    ],
)
def test_any_changed_input_recomputes(tmp_path, change):
    cache, calls = StageCache(tmp_path), []
    stage = Stage("squares", {"n": 4}, model="m1", data=data_digest([1, 2, 3]))
    cache.run(stage, Squares, _compute(calls, 4))
    changed = dataclasses.replace(stage, **change)
    assert changed.key != stage.key
    cache.run(changed, Squares, _compute(calls, 4))
    assert calls == [4, 4]
    assert cache.hits() == [False, False]


def test_upstream_change_reaches_the_consumer():
    up_a, up_b = Stage("up", {"seed": 0}), Stage("up", {"seed": 1})
    down_a = Stage("down", {"x": 1}, inputs=(up_a.key,))
    down_b = Stage("down", {"x": 1}, inputs=(up_b.key,))
    assert down_a.key != down_b.key


@pytest.mark.parametrize("target", ["result.json", "arrays.safetensors", "extra.txt"])
def test_a_corrupted_result_is_recomputed_with_a_warning(tmp_path, target):
    cache, calls = StageCache(tmp_path), []
    stage = Stage("squares", {"n": 3})
    cache.run(stage, Squares, _compute(calls, 3))
    path = cache.path(stage) / target
    path.write_bytes(path.read_bytes()[:-7] + b"garbage")
    with pytest.warns(RuntimeWarning, match="corrupted"):
        res = cache.run(stage, Squares, _compute(calls, 3))
    assert calls == [3, 3]
    np.testing.assert_array_equal(res.values, [0.0, 1.0, 4.0])
    # and the recomputed copy is a clean hit afterwards
    cache.run(stage, Squares, _compute(calls, 3))
    assert calls == [3, 3] and cache.hits() == [False, False, True]


def test_a_failed_stage_leaves_nothing_that_looks_finished(tmp_path):
    cache = StageCache(tmp_path)
    stage = Stage("boom", {})

    def compute(directory):
        (directory / "partial.bin").write_bytes(b"x")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        cache.run(stage, Squares, compute)
    assert not cache.path(stage).exists()
    assert list((tmp_path / "boom").iterdir()) == []


def test_a_section_round_trips_through_the_cache(tmp_path):
    cache = StageCache(tmp_path)
    section = Section(
        {"x": Number.of(1.5, (1.0, float("nan")), "", "x"), "y": Number.of(2, (1, 3))},
        (Caveat("not_run", "why"),),
        {"rows": [{"a": float("nan"), "b": np.float64(2.0)}]},
        seconds=0.5,
    )
    cache.run(Stage("sec"), Section, lambda _: section)
    got = cache.run(Stage("sec"), Section, lambda _: Section({}, (), {}))
    assert cache.hits() == [False, True]
    assert got.to_json() == section.to_json()
    assert got.headline["x"].ci is None and got.headline["y"].ci == (1.0, 3.0)
    assert got.details["rows"][0] == {"a": "nan", "b": 2.0}  # strict JSON, as analysis.json


def test_wrong_result_type_and_bad_names_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="plain, non-empty file name"):
        Stage("a/b")
    with pytest.raises(TypeError, match="returned a Section, not a Squares"):
        StageCache(tmp_path).run(Stage("x"), Squares, lambda _: Section({}, (), {}))


@dataclasses.dataclass(frozen=True)
class Summary(Result):
    slope: float
    per_layer: dict[str, list[float]]
    label: str
    interval: tuple[float, float] | None = None


def test_non_finite_floats_survive_the_cache_in_every_non_str_field(tmp_path):
    cache = StageCache(tmp_path)
    made = Summary(
        slope=float("nan"), per_layer={"3": [1.0, float("inf")]}, label="nan", interval=None
    )
    cache.run(Stage("summary"), Summary, lambda _: made)
    got = StageCache(tmp_path).run(Stage("summary"), Summary, lambda _: pytest.fail("recomputed"))
    assert np.isnan(got.slope) and got.per_layer["3"] == [1.0, float("inf")]
    assert got.label == "nan"  # a str field keeps its text
    assert got.interval is None


@dataclasses.dataclass(frozen=True)
class Layers(Result):
    """A section Result holding stage Results."""

    rows: list[Squares]
    fits: list[Summary]
    note: str


def test_a_result_holding_results_loads_them_typed(tmp_path):
    made = Layers(
        rows=[Squares(values=np.array([0.0, float("nan")]), n=2), Squares(np.zeros(0), 0)],
        fits=[Summary(slope=float("-inf"), per_layer={}, label="inf", interval=(0.0, 1.0))],
        note="nan",
    )
    cache = StageCache(tmp_path)
    cache.run(Stage("layers"), Layers, lambda _: made)
    got = StageCache(tmp_path).run(Stage("layers"), Layers, lambda _: pytest.fail("recomputed"))
    assert all(isinstance(r, Squares) for r in got.rows) and isinstance(got.fits[0], Summary)
    np.testing.assert_array_equal(got.rows[0].values, made.rows[0].values)
    assert got.rows[1].values.shape == (0,) and got.rows[0].n == 2
    assert got.fits[0].slope == float("-inf") and got.fits[0].label == "inf"
    assert got.note == "nan"
    # the JSON form of a command's document rebuilds the same way
    from structlens.results import to_jsonable

    again = Layers.from_dict(to_jsonable(made))
    assert again.fits == got.fits and isinstance(again.rows[0].values, np.ndarray)

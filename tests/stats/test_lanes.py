"""Row lanes of the CPU statistics: the same moments as one lane, BLAS threads restored."""

import multiprocessing
import threading
import time

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info

import structlens.stats.lanes as lanes
import structlens.stats.moments as moments
from structlens.stats.moments import CrossMoments


def _blas_threads() -> list[int]:
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


def _relmax(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.fixture
def forced_lanes(monkeypatch):
    """Three lanes for any chunk, each reducing 16 rows at a time (tiny data, real threads);
    returns the number of tasks of each lane run, as it happens."""
    runs: list[int] = []

    def recorded(tasks):
        runs.append(len(tasks))
        return lanes.run_in_lanes(tasks)

    monkeypatch.setattr(moments, "lane_count", lambda rows, device: 3)
    monkeypatch.setattr(moments, "MIN_LANE_ROWS", 16)
    monkeypatch.setattr(moments, "run_in_lanes", recorded)
    return runs


def _data(rng, n=1000):
    x = rng.standard_normal((n, 7)) * 3 + 1e4  # a large mean: raw moments would lose digits
    y = x[:, :5] * 0.5 + rng.standard_normal((n, 5)) - 7
    return x, y


@pytest.mark.parametrize(
    "kw",
    [
        {"second_y": "diag", "tails_x": 3},
        {"fourth_order": False},
        {"fourth_order": True},
        {"d_y": None},
        {"second_y": "diag", "precision": "float32"},
    ],
    ids=["diag+tails", "full", "fourth-order", "x-only", "float32"],
)
def test_lanes_give_the_moments_of_one_lane_and_of_two_pass_numpy(rng, request, kw):
    x, y = _data(rng)
    kw = dict(kw)
    d_y = kw.pop("d_y", 5)
    yy = None if d_y is None else y
    # chunks that split unevenly, one empty and one smaller than the lane count
    cuts = [(0, 1), (1, 1), (1, 400), (400, 1000)]

    def run():
        return CrossMoments(7, d_y, chunk_rows=64, **kw).update_chunks(
            (x[a:b], None if yy is None else yy[a:b]) for a, b in cuts
        )

    one = run()
    runs = request.getfixturevalue("forced_lanes")
    three, again = run(), run()
    assert runs and max(runs) == 3  # the rows really went through three lanes
    tol = 1e-5 if kw.get("precision") == "float32" else 1e-11
    xc = x - x.mean(0)
    assert three.n == one.n == 1000
    assert _relmax(three.mean_x, x.mean(0)) < max(tol, 1e-14)
    assert _relmax(three.s_xx, xc.T @ xc) < tol
    assert _relmax(three.s_xx, one.s_xx) < tol
    np.testing.assert_array_equal(three.s_xx, again.s_xx)  # lane sums added in lane order
    if yy is not None:
        yc = y - y.mean(0)
        s_yy = (yc**2).sum(0) if kw.get("second_y") == "diag" else yc.T @ yc
        assert _relmax(three.s_xy, xc.T @ yc) < tol
        assert _relmax(three.s_yy, s_yy) < tol
        np.testing.assert_array_equal(three.s_xy, again.s_xy)
    if kw.get("fourth_order"):  # the debiased HSIC's terms, merged part by part in row order
        for got, want in zip(three.hsic_terms(True), one.hsic_terms(True)):
            assert _relmax(np.asarray(got), np.asarray(want)) < 1e-9
    if kw.get("tails_x"):
        k = kw["tails_x"]
        for p, got in ((3, three.tails.m3), (4, three.tails.m4)):
            assert _relmax(got, (xc[:, :k] ** p).sum(0)) < 1e-10, p


def test_lane_count_follows_the_thread_budget_and_the_device():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        big = 4 * lanes.MIN_LANE_ROWS
        assert lanes.lane_count(big, torch.device("cpu")) == (2 if lanes._blas() else 1)
        assert lanes.lane_count(lanes.MIN_LANE_ROWS, torch.device("cpu")) == 1  # too few rows
        assert lanes.lane_count(big, torch.device("cuda")) == 1  # the device's own parallelism
        torch.set_num_threads(1)  # e.g. a Ray worker with one CPU
        assert lanes.lane_count(big, torch.device("cpu")) == 1
    finally:
        torch.set_num_threads(threads)


@pytest.mark.skipif(not lanes._blas(), reason="threadpoolctl finds no BLAS library to limit")
def test_blas_runs_single_threaded_in_lanes_and_is_restored_after_an_error(rng, forced_lanes):
    before = _blas_threads()
    assert lanes.run_in_lanes([_blas_threads, _blas_threads]) == [[1] * len(before)] * 2
    assert _blas_threads() == before
    x, y = _data(rng)
    x[900, 2] = np.nan  # in the last lane's rows
    with pytest.raises(ValueError, match="NaN"):
        CrossMoments(7, 5, second_y="diag").update(x, y)
    assert _blas_threads() == before


@pytest.mark.skipif(not lanes._blas(), reason="threadpoolctl finds no BLAS library to limit")
def test_concurrent_callers_take_turns_and_the_thread_count_is_restored():
    # BLAS's thread count is process-wide: callers in different threads run their lanes one
    # after another, each under its own limit, restored when it is done
    before = _blas_threads()
    seen = []

    def task():
        seen.append(_blas_threads())
        time.sleep(0.02)

    callers = [threading.Thread(target=lanes.run_in_lanes, args=([task, task],)) for _ in range(3)]
    for c in callers:
        c.start()
    for c in callers:
        c.join(timeout=60)
    assert seen == [[1] * len(before)] * 6
    assert _blas_threads() == before


def test_a_lane_takes_no_lanes_of_its_own():
    assert lanes.run_in_lanes([lambda: lanes.lane_count(10**6, torch.device("cpu"))] * 2) == [
        1,
        1,
    ]


def _child(x, y, out):
    out.put(CrossMoments(7, 5, second_y="diag").update(x, y).s_xy)


def test_a_forked_child_runs_lanes_of_its_own(rng, forced_lanes):
    # the parent's lane threads do not exist in a fork: the child must not wait on them
    x, y = _data(rng)
    parent = CrossMoments(7, 5, second_y="diag").update(x, y).s_xy
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child, args=(x, y, out))
    child.start()
    got = out.get(timeout=120)
    child.join(timeout=30)
    assert child.exitcode == 0
    np.testing.assert_array_equal(got, parent)


@pytest.mark.skipif(not lanes._blas(), reason="threadpoolctl finds no BLAS library to limit")
def test_serial_blas_holds_one_thread_inside_restores_after_and_lets_lanes_run(forced_lanes):
    before = _blas_threads()

    @lanes.serial_blas()
    def inside(fail: bool = False) -> list[int]:
        if fail:
            raise RuntimeError("inside")
        return _blas_threads()

    assert inside() == [1] * len(before) and _blas_threads() == before
    with pytest.raises(RuntimeError, match="inside"):
        inside(fail=True)
    assert _blas_threads() == before
    with lanes.serial_blas():  # re-entrant, and lanes started inside still run
        assert lanes.run_in_lanes([inside, inside]) == [[1] * len(before)] * 2
        assert forced_lanes == [] and _blas_threads() == [1] * len(before)
    assert _blas_threads() == before

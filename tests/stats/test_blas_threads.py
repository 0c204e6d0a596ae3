"""BLAS threads matched to the free cores: the idle-core arithmetic on known /proc/stat
readings, the limit inside a block and its restoration after, one limit at a time, and
EDMDc and eigendecompositions that do not depend on the thread count."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from threadpoolctl import ThreadpoolController, threadpool_limits

from structlens.koopman import EDMDc, EDMDcConfig, IdentityDictionary, eigendecomposition
from structlens.stats import threads


def blas_threads() -> int:
    return max(
        info["num_threads"] for info in ThreadpoolController().select(user_api="blas").info()
    )


@pytest.fixture(autouse=True)
def _fresh_measurement(monkeypatch):
    monkeypatch.setattr(threads, "_LAST", None)


def test_idle_cores_is_the_idle_share_of_elapsed_ticks():
    assert threads.idle_cores((0.0, 0.0), (30.0, 40.0), cores=2) == 1.5
    assert threads.idle_cores((5.0, 10.0), (5.0, 30.0), cores=4) == 0.0  # all busy
    assert threads.idle_cores((5.0, 10.0), (5.0, 10.0), cores=4) == 4.0  # no tick: no evidence


def readings(*pairs):
    it = iter(pairs)
    return lambda: next(it)


@pytest.mark.parametrize(
    "idle,expect",
    [(0.0, 1), (10.0, 1), (14.0, 1), (16.0, 2), (20.0, 2)],  # idle ticks of 20 elapsed
)
def test_free_cores_rounds_the_idle_cores_between_one_and_the_usable_cores(
    monkeypatch, idle, expect
):
    monkeypatch.setattr(threads, "_usable_cores", lambda: 2)
    read = readings((100.0, 1000.0), (100.0 + idle, 1020.0))
    assert threads.free_cores(read=read, sleep=lambda s: None) == expect


def test_free_cores_reuses_a_recent_measurement_and_falls_back_off_linux(monkeypatch):
    monkeypatch.setattr(threads, "_usable_cores", lambda: 2)
    read = readings((0.0, 0.0), (0.0, 20.0))  # only two readings: a third call would fail
    assert threads.free_cores(read=read, sleep=lambda s: None) == 1
    assert threads.free_cores(read=read, sleep=lambda s: None) == 1
    monkeypatch.setattr(threads, "_LAST", None)
    assert threads.free_cores(read=lambda: None, sleep=lambda s: None) == 2


def test_the_limit_holds_inside_the_block_and_is_restored_after():
    with threadpool_limits(limits=2, user_api="blas"):
        before = blas_threads()
        assert before == 2
        with threads.matched_blas_threads(lambda: 1) as n:
            assert n == 1 and blas_threads() == 1
        assert blas_threads() == before
        with threads.matched_blas_threads(lambda: 8) as n:  # never more than it had
            assert n == 2 and blas_threads() == 2


def test_a_second_block_while_one_holds_a_limit_changes_nothing():
    seen = []
    with threadpool_limits(limits=2, user_api="blas"):
        with threads.matched_blas_threads(lambda: 1):
            worker = threading.Thread(
                target=lambda: seen.append(threads.matched_blas_threads(lambda: 1).__enter__())
            )
            worker.start()
            worker.join()
            assert blas_threads() == 1
        assert blas_threads() == 2
    assert seen == [1]  # it saw the current count and set no limit of its own


def test_edmdc_and_eigendecomposition_do_not_depend_on_the_thread_count(monkeypatch, rng):
    n, d = 4000, 48
    A = rng.standard_normal((d, d)) / np.sqrt(4 * d)
    X = rng.standard_normal((n, d))
    U = rng.standard_normal((n, 8))
    Y = X @ A.T + U @ rng.standard_normal((8, d)) + 0.1 * rng.standard_normal((n, d))
    fits, asked = {}, []

    def free(cores):
        asked.append(cores)  # the fit and the eigendecomposition ask for the free cores
        return cores

    with threadpool_limits(limits=2, user_api="blas"):
        for cores in (1, 2):
            monkeypatch.setattr(threads, "free_cores", lambda cores=cores: free(cores))
            est = EDMDc(IdentityDictionary().fit(X[:2]), EDMDcConfig(alpha=1e-6))
            res = est.fit(X, U, Y)
            fits[cores] = (res.A, eigendecomposition(res.A).eigenvalues)
    assert asked == [1, 1, 2, 2]
    np.testing.assert_allclose(fits[1][0], fits[2][0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(fits[1][1], fits[2][1], rtol=0, atol=1e-10)

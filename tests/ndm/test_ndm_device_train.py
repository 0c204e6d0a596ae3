"""The device-training script shares the CPU out between its per-layer processes."""

import pytest

from structlens.ndm import device_train


@pytest.mark.parametrize(("cores", "layers", "threads"), [(2, 4, 1), (2, 1, 2), (16, 4, 4)])
def test_cpu_threads_per_layer_share_the_free_cores(monkeypatch, cores, layers, threads):
    monkeypatch.setattr(device_train.os, "sched_getaffinity", lambda _: set(range(cores)))
    assert device_train._threads_per_layer("cpu", layers) == threads


def test_an_accelerator_leaves_two_host_threads_per_layer():
    assert device_train._threads_per_layer("cuda", 4) == 2

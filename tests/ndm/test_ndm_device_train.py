"""The device-training script shares the CPU out between its per-layer processes, and its
settings (defaults included) key its cached run."""

import pytest

from structlens.ndm import device_train


@pytest.mark.parametrize(("cores", "layers", "threads"), [(2, 4, 1), (2, 1, 2), (16, 4, 4)])
def test_cpu_threads_per_layer_share_the_free_cores(monkeypatch, cores, layers, threads):
    monkeypatch.setattr(device_train.os, "sched_getaffinity", lambda _: set(range(cores)))
    assert device_train._threads_per_layer("cpu", layers) == threads


def test_an_accelerator_leaves_two_host_threads_per_layer():
    assert device_train._threads_per_layer("cuda", 4) == 2


def test_settings_are_the_defaults_with_the_overrides():
    got = device_train.settings({"max_steps": 20, "chunk_steps": 10})
    assert got == {**device_train.DEVICE_CONFIG, "max_steps": 20, "chunk_steps": 10}
    assert device_train.settings({})["chunk_steps"] == device_train.CHUNK_STEPS


def test_a_changed_default_is_a_new_device_stage(tmp_path, monkeypatch):
    from structlens.pipeline.cache import Stage
    from structlens.replication.ndm import run as ndm_run

    rep = ndm_run.NDMReplication(ndm_run.PROFILES["smoke"], tmp_path)
    cpu = Stage("train", {"layers": [1]})
    before = rep.device_stage(cpu).key
    assert rep.device_stage(cpu).key == before
    monkeypatch.setitem(device_train.DEVICE_CONFIG, "merge_threshold", 0.05)
    assert rep.device_stage(cpu).key != before

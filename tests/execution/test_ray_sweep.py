"""The SAE width sweep as parallel Ray tasks: same SAEs as in-process, also after a worker dies."""

import dataclasses

import pytest
import torch

from structlens.execution import get_executor
from structlens.sae import SAETrainConfig, train_sweep
from structlens.sae.sweep import shuffled_batches, train_width_sweep

WIDTHS = [16, 32, 48]
BASE = SAETrainConfig(architecture="topk", k=3, lr=3e-3, seed=5)


@pytest.fixture(scope="module")
def acts():
    gen = torch.Generator().manual_seed(0)
    basis = torch.randn(40, 12, generator=gen)
    codes = torch.relu(torch.randn(512, 40, generator=gen) - 1.0)
    return codes @ basis


@pytest.fixture(scope="module")
def local(acts):
    return train_width_sweep(acts, WIDTHS, BASE, batch_size=64, epochs=1, seed=1)


def _same(a, b):
    assert sorted(a) == sorted(b) == WIDTHS
    for w in WIDTHS:
        sa, sb = a[w].sae.state_dict(), b[w].sae.state_dict()
        assert sa.keys() == sb.keys()
        for k in sa:
            assert torch.equal(sa[k], sb[k]), f"width {w}: {k} differs"
        assert a[w].final_fvu == b[w].final_fvu and a[w].steps == b[w].steps


def test_per_width_sweep_equals_one_pass_joint_training(acts, local):
    # independent widths: training them one by one gives what one shared pass gives
    joint = train_sweep(
        [dataclasses.replace(BASE, d_sae=w) for w in WIDTHS],
        shuffled_batches(acts, 64, 1, 1),
        tail_tokens=20_000,
    )
    _same(local, dict(zip(WIDTHS, joint)))
    assert local[48].final_fvu < 1.0


def test_ray_width_sweep_equals_local(ray_cluster, acts, local):
    distributed = train_width_sweep(
        acts, WIDTHS, BASE, batch_size=64, epochs=1, seed=1, executor=get_executor("ray")
    )
    _same(distributed, local)


def test_killed_sweep_worker_is_retried(ray_cluster, acts, local, tmp_path):
    from _ray_faults import KillingRayExecutor

    marker = tmp_path / "killed"
    victim = dataclasses.replace(BASE, d_sae=32)
    distributed = train_width_sweep(
        acts,
        WIDTHS,
        BASE,
        batch_size=64,
        epochs=1,
        seed=1,
        executor=KillingRayExecutor(victim, marker),
    )
    assert marker.exists(), "the worker was never killed"
    _same(distributed, local)

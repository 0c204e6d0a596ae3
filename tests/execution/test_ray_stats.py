"""Streaming statistics computed per shard on Ray workers and merged == one single pass."""

import numpy as np
import pytest
import torch
from _ray_jobs import ShardStat, SiteMoments, shard_data, summary

from structlens.capture import capture
from structlens.capture.statistics import store_statistic
from structlens.execution import get_executor, map_reduce
from structlens.koopman.dictionaries import PCADictionary
from structlens.models import load_model
from structlens.sae.models import TopKSAE
from structlens.stats.moments import CrossMoments

KINDS = ["moments", "cross_moments", "column_moments", "edmdc", "cka", "ejop", "feature_stats"]
N_SHARDS, SEED = 5, 3


def _job(kind: str) -> ShardStat:
    extra = None
    if kind == "edmdc":
        extra = PCADictionary(3).fit(shard_data(SEED, 0)["x"][:, :4])
    elif kind == "feature_stats":
        extra = TopKSAE(6, 32, 4, seed=0)
    return ShardStat(kind, SEED, extra)


def _assert_close(merged: dict, single: dict) -> None:
    for key, ref in single.items():
        scale = max(1.0, float(np.max(np.abs(ref))))
        np.testing.assert_allclose(merged[key], ref, rtol=1e-11, atol=1e-11 * scale, err_msg=key)


@pytest.mark.parametrize("kind", KINDS)
def test_ray_merged_statistic_equals_single_pass(ray_cluster, kind):
    job = _job(kind)
    single = job.build([shard_data(SEED, i) for i in range(N_SHARDS)])
    merged = map_reduce(job, list(range(N_SHARDS)), executor="ray", progress=False)
    local = map_reduce(job, list(range(N_SHARDS)), progress=False)
    _assert_close(summary(kind, merged), summary(kind, single))
    # the merge is in shard order whoever finishes first: Ray and local agree bit for bit
    for key, value in summary(kind, local).items():
        np.testing.assert_array_equal(summary(kind, merged)[key], value, err_msg=key)


def test_ray_store_statistic_equals_moments_of_loaded_site(ray_cluster, tmp_path):
    model = load_model("tiny-llama")
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (12,), generator=gen).tolist() for _ in range(16)]
    store = capture(
        model, prompts, ["blocks.1.hook_resid_post"], root=tmp_path, shard_mb=0.01, progress=False
    )
    assert len(store.metadata["shards"]) >= 3
    merged = store_statistic(
        store,
        SiteMoments("blocks.1.hook_resid_post", 64),
        executor=get_executor("ray"),
        progress=False,
    )
    single = CrossMoments(64)
    single.update(store.load("blocks.1.hook_resid_post"))
    assert merged.n == single.n == store.n_tokens
    np.testing.assert_allclose(merged.mean_x, single.mean_x, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(merged.s_xx, single.s_xx, rtol=1e-11, atol=1e-11)


def test_ray_koopman_store_statistics_equal_in_memory_fit(ray_cluster, tmp_path):
    from structlens.koopman import EDMDc, EDMDcConfig, solve
    from structlens.koopman.data import depth_sites, load_layers, store_statistics

    model = load_model("tiny-llama")
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 256, (16,), generator=gen).tolist() for _ in range(24)]
    sites = depth_sites(model.n_layers, [0, 1])
    store = capture(model, prompts, sites, root=tmp_path, shard_mb=0.05, progress=False)
    assert len(store.metadata["shards"]) >= 3
    X, U, Y, _ = load_layers(store, [0, 1])
    dic = PCADictionary(8).fit(X)
    cfg = EDMDcConfig(alpha=1e-6)
    single = EDMDc(dic, cfg).statistics(X, U, Y)[0]
    local = store_statistics(store, dic, [0, 1])
    on_ray = store_statistics(store, dic, [0, 1], executor="ray")
    # position 0 (the attention sink) is excluded from every Koopman fit: 24 prompts fewer
    assert local.n == on_ray.n == single.n == 2 * (store.n_tokens - len(prompts))
    np.testing.assert_allclose(local.zy.s_xy, single.zy.s_xy, rtol=1e-10, atol=1e-9)
    np.testing.assert_array_equal(on_ray.zy.s_xy, local.zy.s_xy)
    ev_single = solve(single, cfg, dic).eigenvalues
    ev_ray = solve(on_ray, cfg, dic).eigenvalues
    np.testing.assert_allclose(np.sort_complex(ev_ray), np.sort_complex(ev_single), atol=1e-8)

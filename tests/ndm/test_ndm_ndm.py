import dataclasses

import numpy as np
import pytest
import torch

from structlens.ndm.ndm import NDM, NDMConfig, NDMResult, _Rotation, plan_merges
from structlens.ndm.search import RotatedKeys
from structlens.ndm.toy import ToyConfig, planted_partition, recovery_report, train_toy_model
from structlens.stats.mutual_info import subspace_mutual_information


def _planted(rng, n=3000):
    """Two independent 2-D blocks, each a mixture of three rays plus a little isotropic noise,
    rotated at random in R^4.  (Without noise the data are degenerate and KSG detects the
    dependence that even a fraction of a degree of leakage between blocks creates.)"""
    dirs = np.stack([[np.cos(a), np.sin(a)] for a in (0.3, 2.4, 4.5)])
    blocks = [
        dirs[rng.integers(0, 3, n)] * rng.uniform(0, 1, (n, 1)) + 0.02 * rng.standard_normal((n, 2))
        for _ in range(2)
    ]
    q, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    return (np.hstack(blocks) @ q.T).astype(np.float32), q


def _small_config(**kw):
    base = dict(
        unit_size=1,
        batch_size=32,
        lr=3e-2,
        max_steps=40,
        bank_size=1000,
        refresh_interval=10,
        reproject_interval=3,
        merge_start=20,
        merge_interval=10,
        merge_threshold=0.04,
        mi_samples=600,
        log_interval=5,
        init="random",
    )
    base.update(kw)
    return NDMConfig(**base)


def test_rotation_parametrization_is_orthogonal():
    gen = torch.Generator().manual_seed(0)
    rot = _Rotation(torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64, generator=gen))[0])
    with torch.no_grad():
        rot.A.copy_(3 * torch.randn(6, 6, dtype=torch.float64, generator=gen))
    R = rot()
    assert torch.allclose(R.T @ R, torch.eye(6, dtype=torch.float64), atol=1e-12)


def test_trained_rotation_stays_orthogonal(rng):
    h, _ = _planted(rng)
    res = NDM(_small_config(lr=0.2)).fit(h)
    R = res.rotation
    assert np.allclose(R.T @ R, np.eye(4), atol=1e-10)
    assert sum(res.partition) == 4


def test_neighbour_search_is_exact(rng):
    keys = torch.tensor(rng.standard_normal((500, 6)) + 1e3, dtype=torch.float64)
    queries = torch.tensor(rng.standard_normal((20, 6)) + 1e3, dtype=torch.float64)
    R = torch.linalg.qr(torch.tensor(rng.standard_normal((6, 6))))[0]
    nn = RotatedKeys(keys, R, [4, 2], chunk_size=128).nearest(queries, R, rerank=4)
    for s, cols in enumerate([slice(0, 4), slice(4, 6)]):
        d = torch.cdist(
            queries @ R[:, cols], keys @ R[:, cols], compute_mode="donot_use_mm_for_euclid_dist"
        )
        assert torch.equal(nn[s], d.argmin(1))


def test_merge_rebases_without_changing_subspaces(rng):
    h, _ = _planted(rng)
    ndm = NDM(_small_config(merge_threshold=0.0, max_merges_per_round=2))
    R = torch.linalg.qr(torch.tensor(rng.standard_normal((4, 4))))[0]
    keys = torch.tensor(h[:800])
    entry = ndm._merge_round(keys, R, [1, 1, 1, 1], step=0)
    assert entry is not None and entry["partition_after"] == [2, 2]
    new = _Rotation(R[:, entry["_perm"]])()
    assert torch.equal(new, R[:, entry["_perm"]])
    bounds = [0, 1, 2, 3, 4]
    for g, (a, b) in enumerate(entry["pairs"]):
        old_proj = sum(
            R[:, bounds[s] : bounds[s + 1]] @ R[:, bounds[s] : bounds[s + 1]].T for s in (a, b)
        )
        block = new[:, 2 * g : 2 * g + 2]
        assert torch.allclose(block @ block.T, old_proj, atol=1e-12)


def test_resume_gives_identical_result(rng, tmp_path):
    h, _ = _planted(rng)
    cfg = _small_config()
    full = NDM(cfg).fit(h)
    NDM(cfg).fit(h, checkpoint_dir=tmp_path, stop_at_step=25, checkpoint_every=7)
    resumed = NDM(cfg).fit(h, checkpoint_dir=tmp_path)
    assert np.array_equal(full.rotation, resumed.rotation)
    assert full.partition == resumed.partition
    assert full.merge_history == resumed.merge_history
    assert full.loss_history == resumed.loss_history
    again = NDM(cfg).fit(h)
    assert np.array_equal(full.rotation, again.rotation)
    full.save(tmp_path / "result")
    loaded = NDMResult.load(tmp_path / "result")
    assert np.array_equal(loaded.rotation, full.rotation) and loaded.partition == full.partition


def test_stream_source_matches_contract(rng):
    h, _ = _planted(rng)
    chunks = [torch.tensor(h[i : i + 500]) for i in range(0, 3000, 500)]
    res = NDM(_small_config(max_steps=12, merge_start=100)).fit(lambda: iter(chunks))
    assert res.steps == 12 and res.partition == [1, 1, 1, 1]


def test_planted_blocks_recovered(rng):
    h, q = _planted(rng)
    # 300 steps left some seeds short of convergence whichever the exponential's gradient
    # (how many moved with the gradient's round-off); 600 reach it.
    res = NDM(_small_config(unit_size=2, max_steps=600, merge_start=10**6)).fit(h)
    report = recovery_report(res.bases(), [q[:, :2], q[:, 2:]])
    assert report["min_matched_overlap"] > 0.98
    assert res.partition == [2, 2] and not res.converged


def test_merge_round_stops_at_true_partition_only(rng):
    h, q = _planted(rng)
    ndm = NDM(_small_config(mi_samples=1500))
    keys = torch.tensor(h[:1500])
    assert ndm._merge_round(keys, torch.tensor(q), [2, 2], step=0) is None
    # A rotation mixing the two blocks makes them dependent, so they merge.
    mix = torch.tensor(q) @ torch.linalg.qr(torch.tensor(rng.standard_normal((4, 4))))[0]
    assert ndm._merge_round(keys, mix, [2, 2], step=0)["partition_after"] == [4]


@pytest.fixture(scope="module")
def toy():
    return train_toy_model(
        ToyConfig(n_groups=2, group_size=3, hidden_dim=4, steps=300, batch_size=256, lr=1e-2)
    )


def test_toy_model_recovery(toy):
    truth = toy.ground_truth_bases()
    assert [b.shape[1] for b in truth] == [2, 2]
    _, h = toy.sample(4000, seed=1)
    # Small read-out noise, as in real activations: absent groups give exact zeros otherwise,
    # a point mass that biases KSG upwards (it assumes continuous data).
    h = h + 0.02 * np.random.default_rng(2).standard_normal(h.shape).astype(np.float32)
    res = NDM(_small_config(unit_size=2, max_steps=150, merge_start=10**6, seed=1)).fit(h)
    report = recovery_report(res.bases(), truth)
    assert report["min_matched_overlap"] > 0.98
    assert max(max(a) for a in report["principal_angles_deg"]) < 10
    # At the ground-truth split the two groups are independent: far below the merge threshold.
    truth_rot = np.hstack(truth)
    assert subspace_mutual_information(h[:1500] @ truth_rot, [2, 2], k=1)[0, 1] < 0.04


def test_bad_configuration_raises(rng):
    h, _ = _planted(rng)
    with pytest.raises(ValueError, match="summing to d=4"):
        NDM(_small_config(initial_partition=[2, 1])).fit(h)
    with pytest.raises(ValueError, match="does not divide"):
        NDM(_small_config(unit_size=3)).fit(h)
    bad = h.copy()
    bad[:, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        NDM(_small_config()).fit(bad)
    with pytest.raises(ValueError, match="one-shot"):
        NDM(_small_config()).fit(iter([torch.tensor(h)]))
    with pytest.raises(ValueError, match="lower bank_size"):
        NDM(_small_config(bank_size=5000)).fit(h)


def test_plan_merges_known_answer():
    mi = np.zeros((5, 5))
    for a, b, v in [(0, 1, 0.5), (1, 2, 0.9), (3, 4, 0.2), (0, 4, 0.03)]:
        mi[a, b] = mi[b, a] = v
    partition = [3, 2, 2, 1, 1]
    # Greedy, disjoint, highest first: (1, 2) then (3, 4); (0, 1) is blocked by subspace 1.
    plan = plan_merges(mi, partition, 0.04, max_pairs=3)
    assert plan.pairs == [(1, 2), (3, 4)] and plan.mi == [0.9, 0.2] and plan.max_mi == 0.9
    assert plan.partition_after == [4, 3, 2]
    assert plan.permutation == [3, 4, 5, 6, 0, 1, 2, 7, 8]
    # The default cap is max(1, S // 8) = 1 pair; min_subspaces bounds the count after the round.
    assert plan_merges(mi, partition, 0.04).pairs == [(1, 2)]
    assert plan_merges(mi, partition, 0.04, max_pairs=3, min_subspaces=4).pairs == [(1, 2)]
    assert plan_merges(mi, partition, 0.95) is None
    assert plan_merges(mi, partition, 0.04, min_subspaces=5) is None
    with pytest.raises(ValueError, match="mi must be"):
        plan_merges(mi[:4, :4], partition, 0.04)


def test_checkpoint_of_other_inputs_is_never_resumed(rng, tmp_path):
    h, _ = _planted(rng)
    other = h[::-1].copy()  # same rows, another order: other bytes, other digest
    cfg = _small_config()
    NDM(cfg).fit(h, checkpoint_dir=tmp_path, stop_at_step=25)
    fresh_other = NDM(cfg).fit(other)
    with pytest.warns(UserWarning, match="data_digest differ"):
        rerun = NDM(cfg).fit(other, checkpoint_dir=tmp_path)
    assert rerun.provenance["resumed_from_step"] is None
    assert np.array_equal(rerun.rotation, fresh_other.rotation)
    assert rerun.loss_history == fresh_other.loss_history
    # Another model or config: not resumed either; the same inputs: resumed from step 25.
    with pytest.warns(UserWarning, match="model_digest differ"):
        res = NDM(cfg).fit(h, checkpoint_dir=tmp_path, model_digest="abc", stop_at_step=1)
    assert res.provenance["resumed_from_step"] is None and res.steps == 1
    with pytest.warns(UserWarning, match="config differ"):
        res = NDM(_small_config(lr=0.1)).fit(h, checkpoint_dir=tmp_path, stop_at_step=1)
    assert res.provenance["resumed_from_step"] is None
    same = NDM(cfg).fit(h, checkpoint_dir=tmp_path)
    assert same.provenance["resumed_from_step"] == 25
    assert same.provenance["data_digest"] != rerun.provenance["data_digest"]
    assert np.array_equal(same.rotation, NDM(cfg).fit(h).rotation)


def test_stream_digest_covers_every_tensor(rng):
    h, _ = _planted(rng)
    chunks = [torch.tensor(h[i : i + 500]) for i in range(0, 3000, 500)]
    cfg = _small_config(max_steps=1)
    base = NDM(cfg).fit(lambda: iter(chunks)).provenance["data_digest"]
    changed = [c.clone() for c in chunks]
    changed[-1][-1, -1] += 1e-3  # the last row of the last chunk: never drawn in one step
    assert NDM(cfg).fit(lambda: iter(changed)).provenance["data_digest"] != base
    assert NDM(cfg).fit(torch.cat(chunks)).provenance["data_digest"] != base  # one tensor
    given = NDM(cfg).fit(lambda: iter(chunks), data_digest="store-123").provenance
    assert given["data_digest"] == "store-123"


def test_restart_selection_prefers_converged_finer_then_lower_loss(rng):
    h, q = _planted(rng)
    ndm = NDM(_small_config(restarts=4))

    def run(R, partition, converged):
        return NDMResult(R, partition, [], 10, converged, [], {}, {"restart": 0})

    mixed = np.linalg.qr(rng.standard_normal((4, 4)))[0]
    runs = [
        run(q, [2, 1, 1], False),  # finest, but merging had not finished
        run(q, [2, 2], True),  # the planted split
        run(mixed, [2, 2], True),  # same sizes, a worse rotation: higher loss
        run(q, [4], True),
    ]
    best = ndm._select(h, runs)
    assert [r["chosen"] for r in best.restarts] == [False, True, False, False]
    assert best.restarts[1]["selection_loss"] < best.restarts[2]["selection_loss"]
    assert best.partition == [2, 2] and np.array_equal(best.rotation, q)
    assert NDM(_small_config(restarts=2)).fit(h).restarts[0]["restart"] == 0


@pytest.mark.parametrize("seed", [21, 23])
def test_restarts_recover_planted_partition_a_single_run_misses(seed):
    # Two independent 4-D groups, rotated; from 2-D units one run settles with dimensions of
    # one group inside the other's units, merges them and ends at [8].  Restarts recover it.
    # The seeds are witnesses of a chaotic trajectory (a gradient change in the last bits can
    # move which run fails): 21 and 23 have restart 0 at [8] and a best of three at [4, 4]
    # with each of exp_gradient "float64" (the default), "pytorch" and "float32".
    planted = planted_partition([4, 4], 3000, seed=seed)
    cfg = NDMConfig(
        unit_size=2, lr=2e-2, batch_size=64, max_steps=400, bank_size=768, refresh_interval=30,
        reproject_interval=10, merge_start=150, merge_interval=50, mi_samples=600,
        init="random", seed=seed, log_interval=50, restarts=3,
    )  # fmt: skip
    best = NDM(cfg).fit(planted.h)
    assert best.restarts[0]["partition"] == [8]  # restart 0 is the run without restarts
    assert best.partition == [4, 4] and best.converged
    assert recovery_report(best.bases(), planted.bases())["min_matched_overlap"] >= 0.95


def test_planted_recovery_counts_each_seed_against_the_truth():
    from structlens.ndm.pipeline import planted_recovery
    from structlens.stats.intervals import wilson_interval

    cfg = NDMConfig(
        unit_size=2, lr=2e-2, batch_size=64, max_steps=400, bank_size=768, refresh_interval=30,
        reproject_interval=10, merge_start=150, merge_interval=50, mi_samples=600,
        init="random", log_interval=50,
    )  # fmt: skip
    # Both outcomes are set by the configuration, not by which seed a chaotic single run
    # fails on (that moves with the CPU's floating-point kernels): with the split/undo pass
    # every seed recovers [4, 4]; started with both groups in one subspace and no re-split,
    # nothing can merge or split, so every seed ends at [8].
    good = planted_recovery(
        [4, 4], [1, 21], dataclasses.replace(cfg, resplit_trials=4), n_samples=3000
    )
    assert all(r["recovered"] and r["overlap"] >= 0.95 for r in good["rows"])
    assert good["recovered"] == 2 and good["n"] == 2 and good["restarts"] == 1
    assert tuple(good["ci"]) == wilson_interval(2, 2)
    merged = dataclasses.replace(cfg, initial_partition=[8])
    bad = planted_recovery([4, 4], [1, 21], merged, n_samples=3000)
    assert [r["partition"] for r in bad["rows"]] == [[8], [8]]
    # the [8] subspace holds both true ones (overlap 1), yet the sizes are not the truth's
    assert all(r["overlap"] >= 0.95 and not r["recovered"] for r in bad["rows"])
    assert bad["recovered"] == 0 and tuple(bad["ci"]) == wilson_interval(0, 2)
    with pytest.raises(ValueError, match="seed"):
        planted_recovery([4, 4], [], cfg)

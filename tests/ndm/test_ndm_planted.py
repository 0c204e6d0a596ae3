"""NDM escapes the straddling optimum on planted partitions (the re-split check of planned
merges, the split/undo pass of rounds with nothing to merge); neither splits a planted group;
restart selection says when the kept run's loss is not the lowest."""

import dataclasses

import numpy as np
import pytest

from structlens.ndm.ndm import NDM, NDMConfig, NDMResult
from structlens.ndm.toy import planted_partition, recovery_report


def _straddling(n=3000, seed=0):
    """Planted [2, 2] in R^4, un-rotated and interleaved so that the identity start puts one
    dimension of each group in each 2-D unit: units (a0, b0) and (a1, b1).  The two units are
    dependent (a0 and a1 belong to one group), so a merge round joins them into [4]; the true
    split (a0, a1) + (b0, b1) is independent.  Returns the activations and the true bases."""
    planted = planted_partition([2, 2], n, seed=seed)
    h = (planted.h @ planted.rotation)[:, [0, 2, 1, 3]]  # columns a0, b0, a1, b1
    eye = np.eye(4)
    return np.ascontiguousarray(h, dtype=np.float32), [eye[:, [0, 2]], eye[:, [1, 3]]]


def _config(**kw):
    base = dict(
        unit_size=2, lr=1e-2, batch_size=64, max_steps=60, bank_size=1024, refresh_interval=20,
        reproject_interval=10, merge_start=20, merge_interval=20, mi_samples=800,
        init="identity", log_interval=10, resplit_steps=150,
    )  # fmt: skip
    base.update(kw)
    return NDMConfig(**base)


def test_straddling_units_merge_without_resplit():
    h, truth = _straddling()
    res = NDM(_config()).fit(h)
    assert res.partition == [4] and res.converged and res.resplit_history == []
    assert res.merge_history[0]["partition_before"] == [2, 2]
    assert res.merge_history[0]["mi"][0] > 0.04
    # Merged, the block spans both groups: every 2-D truth lies inside it.
    assert recovery_report(res.bases(), truth)["min_matched_overlap"] > 0.99


def test_resplit_recovers_the_straddled_partition():
    h, truth = _straddling()
    res = NDM(_config(resplit_trials=4)).fit(h)
    assert res.partition == [2, 2] and res.converged and res.merge_history == []
    (entry,) = res.resplit_history
    assert entry["step"] == 20 and entry["kind"] == "merge" and entry["subspaces"] == [[0, 1]]
    assert entry["partition_before"] == entry["partition_after"] == [2, 2]
    # The merge round saw dependent units; the learnt split of their span is independent.
    assert entry["mi_merge"][0] > 0.04 >= entry["mi_split"][0]
    report = recovery_report(res.bases(), truth)
    assert report["min_matched_overlap"] >= 0.99
    assert sorted(c for _, c in report["matching"]) == [0, 1]
    assert max(max(a) for a in report["principal_angles_deg"]) < 6
    assert np.allclose(res.rotation.T @ res.rotation, np.eye(4), atol=1e-10)


def test_resplit_keeps_a_group_whole():
    # Two units inside one planted 4-D group: no split of their span is independent, so the
    # round merges them as without re-splitting.
    planted = planted_partition([4], 3000, seed=1)
    res = NDM(_config(resplit_trials=4, merge_start=40)).fit(planted.h)
    assert res.partition == [4] and res.resplit_history == []


def test_resplit_resumes_identically(tmp_path):
    h, _ = _straddling()
    cfg = _config(resplit_trials=4)
    full = NDM(cfg).fit(h)
    NDM(cfg).fit(h, checkpoint_dir=tmp_path, stop_at_step=30, checkpoint_every=7)
    resumed = NDM(cfg).fit(h, checkpoint_dir=tmp_path)
    assert resumed.provenance["resumed_from_step"] == 30
    assert np.array_equal(full.rotation, resumed.rotation)
    assert full.resplit_history == resumed.resplit_history
    assert full.loss_history == resumed.loss_history
    full.save(tmp_path / "result")
    assert NDMResult.load(tmp_path / "result").resplit_history == full.resplit_history


def test_selection_says_when_the_kept_run_does_not_have_the_lowest_loss(rng):
    h, truth = _straddling()
    q = np.hstack(truth)
    mixed = np.linalg.qr(rng.standard_normal((4, 4)))[0]
    ndm = NDM(_config(restarts=2))

    def run(R, converged):
        return NDMResult(R, [2, 2], [], 10, converged, [], {}, {"restart": 0})

    # The true split has the lower loss but did not converge; the converged one is kept.
    best = ndm._select(h, [run(q, False), run(mixed, True)])
    assert [r["chosen"] for r in best.restarts] == [False, True]
    assert [r["lowest_loss"] for r in best.restarts] == [True, False]
    assert best.chosen_loss_is_lowest is False
    assert "restart 0 has a lower selection loss" in best.selection_note
    assert "did not converge" in best.selection_note
    agree = ndm._select(h, [run(mixed, True), run(q, True)])
    assert agree.restarts[1]["chosen"] and agree.chosen_loss_is_lowest is True
    assert agree.selection_note is None
    single = NDM(_config()).fit(h)
    assert single.chosen_loss_is_lowest is None and single.selection_note is None


def test_resplit_settings_are_validated():
    with pytest.raises(ValueError, match="resplit_trials"):
        NDMConfig(resplit_trials=-1).validate()
    with pytest.raises(ValueError, match="resplit_lr"):
        NDMConfig(resplit_lr=0.0).validate()
    with pytest.raises(ValueError, match="resplit_steps"):
        NDMConfig(resplit_steps=0).validate()


def test_planted_instances_that_merged_wrongly_are_recovered():
    # Planted [4, 4] from 2-D units: about half the runs end at [8] (two independent 4-D
    # groups merged), which run is chaotic in round-off (the exponential's gradient option
    # moves it); re-splitting before the merges recovers [4, 4] in each of them.
    merged = 0
    for seed in range(5):
        planted = planted_partition([4, 4], 3000, seed=seed)
        cfg = NDMConfig(
            unit_size=2, lr=2e-2, batch_size=64, max_steps=400, bank_size=768,
            refresh_interval=30, reproject_interval=10, merge_start=150, merge_interval=50,
            mi_samples=600, init="random", seed=seed, log_interval=50,
        )  # fmt: skip
        if NDM(cfg).fit(planted.h).partition != [8]:
            continue
        merged += 1
        res = NDM(dataclasses.replace(cfg, resplit_trials=4)).fit(planted.h)
        assert res.partition == [4, 4] and res.converged and len(res.resplit_history) >= 1
        report = recovery_report(res.bases(), planted.bases())
        assert all(ov >= 0.95 for ov in report["matched_overlap"])
    assert merged >= 1  # the instances exercise the re-split


def _aligned(sizes, n=3000, seed=0):
    """Planted groups of ``sizes`` in their own coordinates (group ``g`` in its column block),
    so that the identity start with ``initial_partition`` puts chosen groups in one block."""
    planted = planted_partition(sizes, n, seed=seed)
    h = np.ascontiguousarray(planted.h @ planted.rotation, dtype=np.float32)
    eye, bounds = np.eye(sum(sizes)), np.cumsum([0, *sizes])
    return h, [eye[:, bounds[g] : bounds[g + 1]] for g in range(len(sizes))]


def test_split_undo_pass_separates_merged_independent_groups():
    # Planted [2, 2, 2] started at [4, 2], the 4-D block holding groups 0 and 1: the block is
    # independent of the other, so no round merges, and only the split/undo pass can undo the
    # (here: initial) merge.  Without re-splitting the run converges at once at [4, 2].  The
    # split is learnt for 300 steps: after 150 its MI sits near the threshold (0.03-0.05,
    # depending on the CPU's floating-point kernels), after 300 at 0.
    h, truth = _aligned([2, 2, 2])
    assert NDM(_config(initial_partition=[4, 2])).fit(h).partition == [4, 2]
    res = NDM(_config(initial_partition=[4, 2], resplit_trials=4, resplit_steps=300)).fit(h)
    assert res.partition == [2, 2, 2] and res.converged and res.merge_history == []
    (entry,) = res.resplit_history
    assert entry["kind"] == "final" and entry["subspaces"] == [[0]] and entry["step"] == 20
    assert entry["mi_merge"] == [None] and entry["mi_split"][0] <= 0.04
    assert entry["partition_before"] == [4, 2] and entry["partition_after"] == [2, 2, 2]
    report = recovery_report(res.bases(), truth)
    assert sorted(c for _, c in report["matching"]) == [0, 1, 2]
    assert report["min_matched_overlap"] >= 0.99


def test_split_undo_pass_never_splits_a_planted_group():
    # Planted [4, 2] started at its own partition: the split/undo pass tries every split of
    # the 4-D group on the units' grid and finds none independent, so the run converges there.
    h, truth = _aligned([4, 2], seed=3)
    res = NDM(_config(initial_partition=[4, 2], resplit_trials=4)).fit(h)
    assert res.partition == [4, 2] and res.converged and res.resplit_history == []
    assert res.steps == 20  # converged at the first round, the pass having split nothing
    assert recovery_report(res.bases(), truth)["min_matched_overlap"] >= 0.99


def test_toy_seeds_guard_only_the_seeds_whose_run_misses():
    """Each seed draws its own autoencoder and NDM run (seed 0 is the protocol's one toy
    run); the guarded rerun, at the number of groups, happens exactly where ``recovers``
    says no."""
    from structlens.ndm.protocol import PROFILES
    from structlens.ndm.stages import toy, toy_seeds

    protocol = PROFILES["smoke"].replace(toy_steps=6, toy_ae_steps=20)
    missed = toy_seeds(protocol, 2, lambda run: run.overlap > 2.0)  # no run can pass
    assert missed.seeds == missed.guarded_seeds == [0, 1]
    assert missed.runs[0].record == toy(protocol).record
    assert [r.record["toy_config"]["seed"] for r in missed.runs] == [0, 1]
    assert missed.runs[0].record["autoencoder_loss"] != missed.runs[1].record["autoencoder_loss"]
    for plain, guarded in zip(missed.runs, missed.guarded, strict=True):
        assert plain.record["ndm_config"]["min_subspaces"] == 1
        assert guarded.record["ndm_config"]["min_subspaces"] == len(plain.truth) == 2
    hit = toy_seeds(protocol, 1, lambda run: True)
    assert hit.guarded == [] and hit.guarded_seeds == []

"""ε by depth at matched FVU: the k search reaches a target FVU in a bounded number of
trainings (on planted FVU(k) curves and on tiny TopK SAEs trained on a synthetic sparse
dictionary), stops where no rung is left, and the depth claim reports the chosen k."""

from __future__ import annotations

import pytest
import torch

from structlens.causal_dim import verdicts as V
from structlens.causal_dim.experiment import DepthEpsilon
from structlens.causal_dim.protocol import CausalProtocol
from structlens.causal_dim.stages import depth_sae_name, match_k, train_sae
from structlens.causal_dim.training import search_k

LADDER = [1, 2, 4, 8, 16, 32, 64, 128]


def _power_law(k):
    return 0.6 * k**-0.7


def _calls(fvu_of):
    calls = []

    def counted(k):
        calls.append(k)
        return fvu_of(k)

    return counted, calls


def test_a_target_several_rungs_away_is_reached_in_three_trainings():
    target = _power_law(2)  # four rungs below the start
    fvu_of, calls = _calls(_power_law)
    found = search_k(fvu_of, LADDER, start=32, target=target, tol=1e-9, max_trials=3)
    assert found.matched and found.k == 2 and found.stop == "matched"
    assert calls == found.ks == [32, 16, 2]  # one rung, then the power law's k
    assert found.fvus == [_power_law(k) for k in calls]
    up = search_k(_power_law, LADDER, start=4, target=_power_law(128), tol=1e-9, max_trials=3)
    assert up.k == 128 and up.ks == [4, 8, 128]


def test_the_search_stops_where_no_rung_is_left_or_the_budget_ends():
    # the target lies between two adjacent rungs: bracketed, the closer one chosen
    between = (_power_law(8) + _power_law(16)) / 2
    found = search_k(_power_law, LADDER, start=32, target=between, tol=1e-6, max_trials=8)
    assert found.stop == "bracketed" and set(found.ks[-2:]) == {8, 16} and not found.matched
    assert found.k == min((8, 16), key=lambda k: abs(_power_law(k) - between))
    # below what the largest k reaches: the ladder ends
    low = search_k(_power_law, LADDER, start=64, target=1e-4, tol=1e-6, max_trials=8)
    assert low.stop == "ladder end" and low.k == 128 and low.ks == [64, 128]
    # one training: the start is all there is
    one = search_k(_power_law, LADDER, start=32, target=0.5, tol=1e-6, max_trials=1)
    assert one.ks == [32] and one.stop == "budget" and one.k == 32
    # the start need not be a rung; flat FVU gives no slope, so the search steps a rung
    flat = search_k(lambda k: 0.2, LADDER, start=5, target=0.1, tol=1e-6, max_trials=3)
    assert flat.ks == [5, 8, 16] and not flat.matched
    with pytest.raises(ValueError, match="max_trials"):
        search_k(_power_law, LADDER, start=4, target=0.1, tol=0.0, max_trials=0)


def _sparse_rows(n=2000, d=8, atoms=32, active=3, seed=0):
    """Rows that are sparse sums of unit atoms (plus a little noise): FVU falls with k."""
    g = torch.Generator().manual_seed(seed)
    dictionary = torch.nn.functional.normalize(torch.randn(atoms, d, generator=g), dim=1)
    codes = torch.zeros(n, atoms)
    which = torch.stack([torch.randperm(atoms, generator=g)[:active] for _ in range(n)])
    codes.scatter_(1, which, torch.rand(n, active, generator=g) + 0.5)
    return codes @ dictionary + 0.01 * torch.randn(n, d, generator=g)


def test_match_k_reaches_the_fvu_of_another_sae_on_a_tiny_problem():
    x = _sparse_rows()
    p = CausalProtocol(
        sweep_widths=(32, 64), min_base_width_ratio=0.0, sae_k=1, sae_batch_size=100,
        sae_max_epochs=4, sae_lr_base=2e-3, sae_dead_tokens=1000, depth_k_ladder=(1, 2, 4, 8),
        depth_k_trials=4, depth_fvu_tol=0.03,
    )  # fmt: skip
    # the target: an SAE of k = 4 trained from another initialisation.  From k = 1 and 2 the
    # power law points between 4 and 8 (about 5.7 on one host), so the rung it rounds to moves
    # with the BLAS's round-off; a fourth trial brackets the target from either side.
    other = p.replace(seed=1)
    target = train_sae(other, x, other.sae_config(32, k=4))[1].val_fvu_by_epoch[-1]
    trained = {}

    def train(config):
        sae, info = train_sae(p, x, config)
        trained[depth_sae_name(3, 32, config.k)] = sae
        return info

    m = match_k(p, train, layer=3, width=32, target_fvu=target)
    assert m.matched and abs(m.fvu - target) <= p.depth_fvu_tol and m.k == 4
    assert m.ks[0] == p.sae_k and len(m.ks) <= p.depth_k_trials
    by_k = [f for _, f in sorted(zip(m.ks, m.fvus, strict=True))]
    assert by_k == sorted(by_k, reverse=True)  # FVU fell with every larger k
    assert m.name in trained and trained[m.name].k == 4
    assert sorted(trained) == sorted(depth_sae_name(3, 32, k) for k in m.ks)


def _depth(k_search, fvu=(0.10, 0.20, 0.40)):
    rows = [
        {"layer": y, "epsilon": e, "k": k, "quality": {"fvu": f}}
        for y, e, k, f in zip((1, 15, 27), (0.02, 0.01, 0.001), (8, 32, 64), fvu, strict=True)
    ]
    return DepthEpsilon(width=2304, rows=rows, k_search=k_search)


def test_the_depth_claim_reports_the_k_of_each_layer():
    search = {
        "1": {"ks": [32, 16, 8], "fvus": [0.05, 0.07, 0.10], "k": 8, "stop": "budget"},
        "27": {"ks": [32, 64], "fvus": [0.5, 0.4], "k": 64, "stop": "ladder end"},
    }
    unmatched = V.epsilon_falls_with_depth(_depth(search))
    assert unmatched.verdict == "unidentified"
    assert "layer 1: k = 8, tried k [32, 16, 8], search budget" in unmatched.note
    assert "layer 27: k = 64, tried k [32, 64], search ladder end" in unmatched.note
    assert unmatched.settings["k"] == [8, 32, 64]
    assert unmatched.per_setting["k_search"] == search
    matched = V.epsilon_falls_with_depth(_depth(search, fvu=(0.19, 0.20, 0.21)))
    assert matched.verdict == "reproduced"  # ε falls 20× between FVU-matched ends

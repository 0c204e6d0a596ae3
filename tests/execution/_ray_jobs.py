"""Per-shard statistic jobs for the merge tests (picklable; shipped to Ray workers by value).

Each job builds the data of shard ``i`` deterministically from ``(seed, i)``, so a worker
needs nothing but the shard index and the test can rebuild every shard in the driver for the
single-pass reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from structlens.causal_dim.jacobian import CausalDimension, JacobianConfig
from structlens.causal_dim.sweep import FeatureStats
from structlens.koopman.edmdc import accumulate
from structlens.stats.moments import ColumnMoments, CrossMoments

D_X, D_Y, D_U = 6, 4, 2


def shard_data(seed: int, i: int) -> dict[str, np.ndarray]:
    """Shard ``i``: unequal row counts, large offsets (centring must be exact), heavy tails."""
    rng = np.random.default_rng([seed, i])
    n = 40 + 17 * i
    x = rng.standard_t(5, size=(n, D_X)) @ rng.normal(size=(D_X, D_X)) + 300.0 + i
    y = np.tanh(x[:, :D_Y] / 50.0) + 0.1 * rng.normal(size=(n, D_Y)) - 7.0
    u = rng.normal(size=(n, D_U))
    # one prompt per row, ids fixed by (shard, row) so blocks match however shards are fed
    prompt_ids = 1000 * i + np.arange(n)
    return {"x": x, "y": y, "u": u, "prompt_ids": prompt_ids}


def _ejop_map(h: torch.Tensor) -> torch.Tensor:
    w = torch.linspace(-1.0, 1.0, D_X * 5, dtype=h.dtype).reshape(5, D_X)
    return torch.tanh((h - 300.0) / 100.0 @ w.T) * torch.arange(1, 6, dtype=h.dtype)


@dataclass
class SiteMoments:
    """Moments of one site of a store shard (for
    :func:`structlens.capture.statistics.store_statistic`)."""

    site: str
    dim: int

    def __call__(self, shard: dict[str, torch.Tensor]) -> CrossMoments:
        acc = CrossMoments(self.dim)
        acc.update(shard[self.site])
        return acc


@dataclass
class ShardStat:
    """``kind`` statistic of shard ``index`` (the same code path a single pass uses)."""

    kind: str
    seed: int
    extra: Any = None

    def __call__(self, index: int) -> Any:
        return self.build([shard_data(self.seed, index)])

    def build(self, shards: list[dict[str, np.ndarray]]) -> Any:
        """One accumulator fed ``shards`` in order: the reference when given every shard."""
        k = self.kind
        if k == "moments":
            acc = CrossMoments(D_X)
            for s in shards:
                acc.update(s["x"])
        elif k == "cross_moments":
            acc = CrossMoments(D_X, D_Y, second_y="diag")
            for s in shards:
                acc.update(s["x"], s["y"])
        elif k == "column_moments":
            acc = ColumnMoments(D_X)
            for s in shards:
                acc.update(s["x"])
        elif k == "edmdc":
            # a Koopman step x -> y is a state map; use the first D_Y columns as the state
            stream = [(s["x"][:, :D_Y], s["u"], s["y"]) for s in shards]
            (acc,) = accumulate(self.extra, stream)
        elif k == "cka":
            acc = CrossMoments(D_X, D_Y * 2, groups_x=2, groups_y=2, chunk_rows=64)
            for s in shards:
                acc.update(s["x"], np.concatenate([s["y"], s["y"] ** 2], axis=1))
        elif k == "ejop":
            cd = CausalDimension(JacobianConfig(method="exact", n_groups=4))
            for s in shards:
                cd.partial_fit((_ejop_map, torch.from_numpy(s["x"])))
            acc = cd.statistics
        elif k == "feature_stats":
            acc = FeatureStats(self.extra.d_sae, n_blocks=8)
            for s in shards:
                acts = torch.from_numpy(s["x"]).float() - 300.0
                grads = torch.from_numpy(np.sin(s["x"])).float()
                acc.update(self.extra, acts, grads, torch.from_numpy(s["prompt_ids"]))
        else:
            raise ValueError(f"unknown statistic {k!r}")
        return acc


def summary(kind: str, acc: Any) -> dict[str, np.ndarray]:
    """The numbers a method reads from each statistic, as float64 arrays."""
    if kind == "moments":
        return {"n": np.array(acc.n), "mean": acc.mean_x, "cov": acc.covariance(1)}
    if kind == "cross_moments":
        return {"mean_a": acc.mean_x, "s_aa": acc.s_xx, "s_ab": acc.s_xy, "s_bb": acc.s_yy}
    if kind == "column_moments":
        return {"mean": acc.mean, "m2": acc.m2, "m3": acc.m3, "kurt": acc.excess_kurtosis()}
    if kind == "edmdc":
        zy = acc.zy
        return {"n": np.array(acc.n), "s_aa": zy.s_xx, "s_ab": zy.s_xy, "m4": acc.tails.m4}
    if kind == "cka":
        xy, xx, yy = acc.hsic_terms(debiased=True)
        bxy, bxx, byy = acc.hsic_terms(debiased=False)
        return {"cov_xy": acc.s_xy, "hsic_u": xy, "xx_u": xx, "yy_u": yy, "hsic": bxy}
    if kind == "ejop":
        return {"n": np.array(acc.n), "sigma": acc.sigma().numpy()}
    if kind == "feature_stats":
        atp, fires = acc.scores()
        return {"atp": atp, "fires": fires, "tokens": np.array(acc.tokens.sum().item())}
    raise ValueError(kind)

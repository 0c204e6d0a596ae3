"""Glue for the NDM evaluation: baseline rotations on real activations, the toy recovery run.

Numerical only (arrays in, arrays and dicts out); the CLI and the replication script load the
model and the activations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from structlens.execution import Executor, get_executor
from structlens.ndm.baselines import (
    identity_rotation,
    pca_rotation,
    random_rotation,
    sae_cluster_rotation,
)
from structlens.ndm.ndm import NDM, NDMConfig
from structlens.ndm.toy import ToyConfig, recovery_report, train_toy_model

METHODS = ("ndm", "identity", "random", "pca", "sae")


@dataclasses.dataclass
class SAEBaselineConfig:
    """The SAE trained for the SAE-feature-clustering baseline (TopK, unit-norm decoder)."""

    width: int = 2048
    k: int = 32
    epochs: int = 4
    batch_size: int = 1024
    seed: int = 0


def sae_decoder(h: np.ndarray | torch.Tensor, config: SAEBaselineConfig) -> np.ndarray:
    """Train a TopK SAE on activations ``h`` ``(n, d)`` and return its decoder ``(width, d)``
    (one feature direction per row) together with nothing else; see ``structlens.sae``."""
    from structlens.sae import SAETrainConfig, train_sae

    x = torch.as_tensor(np.asarray(h), dtype=torch.float32)
    gen = torch.Generator().manual_seed(config.seed)

    def batches():
        for _ in range(config.epochs):
            perm = torch.randperm(x.shape[0], generator=gen)
            for s in range(0, x.shape[0] - config.batch_size + 1, config.batch_size):
                yield x[perm[s : s + config.batch_size]]

    cfg = SAETrainConfig(architecture="topk", d_sae=config.width, k=config.k, seed=config.seed)
    result = train_sae(cfg, batches(), tail_tokens=min(100_000, x.shape[0]))
    return result.sae.W_dec.detach().cpu().numpy().astype(np.float64)


@dataclasses.dataclass
class _Baseline:
    """One baseline rotation; picklable so an executor can compute the baselines in parallel."""

    h: np.ndarray
    partition: list[int]
    seed: int
    sae: SAEBaselineConfig

    def __call__(self, method: str) -> np.ndarray:
        d = self.h.shape[1]
        if method == "identity":
            return identity_rotation(d)
        if method == "random":
            return random_rotation(d, self.seed)
        if method == "pca":
            return pca_rotation(self.h, order="ascending")
        dec = sae_decoder(self.h, self.sae)
        return sae_cluster_rotation(dec, self.partition, seed=self.seed)


def baseline_rotations(
    h: np.ndarray,
    partition: Sequence[int],
    methods: Sequence[str] = ("identity", "random", "pca", "sae"),
    *,
    seed: int = 0,
    sae: SAEBaselineConfig | None = None,
    executor: str | Executor | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Rotations of the baselines with NDM's partition, plus diagnostics (SAE fit).

    ``h`` are activations ``(n, d)`` of the same layer (PCA's covariance and the SAE's training
    data).  PCA uses the reference code's ascending order (smallest-variance directions fill
    the largest subspace).  The baselines are independent; ``executor`` (e.g. ``"ray"``) may
    compute them in parallel.
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method {unknown[0]!r}; choose from {METHODS}.")
    todo = [m for m in methods if m != "ndm"]
    cfg = sae or SAEBaselineConfig(seed=seed)
    job = _Baseline(np.asarray(h, dtype=np.float64), list(partition), seed, cfg)
    out = dict(zip(todo, get_executor(executor).map(job, todo, desc="baselines"), strict=True))
    info: dict[str, Any] = {"sae": dataclasses.asdict(cfg)} if "sae" in todo else {}
    return out, info


def toy_recovery(
    toy: ToyConfig | None = None,
    ndm: NDMConfig | None = None,
    *,
    n_samples: int = 20_000,
    noise: float = 0.02,
    seed: int = 0,
) -> dict[str, Any]:
    """Train the paper's toy autoencoder, run NDM on its hidden activations, and compare the
    found subspaces with the ground truth (one subspace per feature group).

    ``noise`` adds Gaussian read-out noise of that standard deviation to ``h`` (absent groups
    are exact zeros otherwise, a point mass KSG cannot handle).  Returns the partition found,
    ``overlap`` (the smallest matched subspace overlap, 1 = exact recovery; see
    :func:`structlens.ndm.toy.recovery_report`), the full report, the merge history and
    whether the number of subspaces equals the number of groups.
    """
    toy_cfg = toy or ToyConfig(seed=seed)
    model = train_toy_model(toy_cfg)
    _, h = model.sample(n_samples, seed=seed + 1)
    h = h + noise * np.random.default_rng(seed + 2).standard_normal(h.shape).astype(np.float32)
    cfg = ndm or NDMConfig(
        unit_size=2,
        lr=1e-3,
        batch_size=128,
        max_steps=3000,
        bank_size=8192,
        refresh_interval=50,
        merge_start=1000,
        merge_interval=500,
        mi_samples=2000,
        seed=seed,
    )
    result = NDM(cfg).fit(h)
    truth = model.ground_truth_bases()
    report = recovery_report(result.bases(), truth)
    return {
        "partition": result.partition,
        "truth_dims": [b.shape[1] for b in truth],
        "overlap": report["min_matched_overlap"],
        "report": report,
        "merge_history": result.merge_history,
        "steps": result.steps,
        "converged": result.converged,
        "right_number_of_subspaces": len(result.partition) == len(truth),
        "toy_config": dataclasses.asdict(toy_cfg),
        "ndm_config": result.config,
        "autoencoder_loss": model.loss,
    }

"""Glue for the NDM evaluation: baseline rotations on real activations, the toy recovery run
and the recovery rate over seeds on planted partitions.

Numerical only (arrays in, arrays and dicts out); the CLI and the replication script load the
model and the activations.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from structlens.execution import Executor, get_executor
from structlens.ndm.baselines import (
    decoder_directions,
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
    """The SAE trained for the SAE-feature-clustering baseline (TopK, unit-norm decoder).

    Training runs whole epochs over the activations until the epoch's FVU improves by less
    than ``tol`` (relative) on the previous epoch, or ``epochs`` epochs have run (a cap high
    enough that the plateau, not the cap, normally ends training).
    """

    width: int = 2048
    k: int = 32
    epochs: int = 50
    batch_size: int = 1024
    seed: int = 0
    tol: float = 0.01


def train_baseline_sae(h: np.ndarray | torch.Tensor, config: SAEBaselineConfig) -> dict[str, Any]:
    """Train a TopK SAE on activations ``h`` ``(n, d)`` to convergence (see
    :class:`SAEBaselineConfig`).  Returns ``sae`` (the trained
    :class:`structlens.sae.SparseAutoencoder`), ``fvu_history`` (per epoch), ``epochs`` run
    and ``converged``."""
    from structlens.sae import SAETrainConfig
    from structlens.sae.train import SAETrainer

    x = torch.as_tensor(np.asarray(h), dtype=torch.float32)
    if x.ndim != 2 or x.shape[0] < config.batch_size:
        raise ValueError(
            f"the SAE baseline needs (n >= batch_size={config.batch_size}, d) activations, "
            f"got {tuple(x.shape)}; lower SAEBaselineConfig.batch_size or supply more rows."
        )
    gen = torch.Generator().manual_seed(config.seed)
    cfg = SAETrainConfig(architecture="topk", d_sae=config.width, k=config.k, seed=config.seed)
    trainer = SAETrainer(cfg, x.shape[1], tail_tokens=min(100_000, x.shape[0]))
    fvus: list[float] = []
    for _ in range(config.epochs):
        sse = sst = 0.0
        perm = torch.randperm(x.shape[0], generator=gen)
        for s in range(0, x.shape[0] - config.batch_size + 1, config.batch_size):
            batch = x[perm[s : s + config.batch_size]]
            sse += float(trainer.step(batch)["mse"]) * batch.shape[0]
            sst += float((batch - batch.mean(0)).pow(2).sum())
        fvus.append(sse / sst)
        if len(fvus) > 1 and fvus[-2] - fvus[-1] < config.tol * fvus[-2]:
            break
    converged = len(fvus) > 1 and fvus[-2] - fvus[-1] < config.tol * fvus[-2]
    return {"sae": trainer.sae, "fvu_history": fvus, "epochs": len(fvus), "converged": converged}


@dataclasses.dataclass
class _Baseline:
    """One baseline rotation; picklable so an executor can compute the baselines in parallel."""

    h: np.ndarray
    partition: list[int]
    seed: int
    sae_decoder: np.ndarray | None

    def __call__(self, method: str) -> np.ndarray:
        d = self.h.shape[1]
        if method == "identity":
            return identity_rotation(d)
        if method == "random":
            return random_rotation(d, self.seed)
        if method == "pca":
            return pca_rotation(self.h, order="ascending")
        assert self.sae_decoder is not None
        return sae_cluster_rotation(self.sae_decoder, self.partition, seed=self.seed)


def baseline_rotations(
    h: np.ndarray,
    partition: Sequence[int],
    methods: Sequence[str] = ("identity", "random", "pca", "sae"),
    *,
    seed: int = 0,
    sae: Any = None,
    executor: str | Executor | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Rotations of the baselines with NDM's partition, plus diagnostics (SAE fit).

    ``h`` are activations ``(n, d)`` of the same layer (PCA's covariance and the SAE's training
    data).  PCA uses the reference code's ascending order (smallest-variance directions fill
    the largest subspace).  ``sae`` is the SAE whose decoder the ``"sae"`` baseline clusters:
    a trained SAE (anything :func:`structlens.ndm.baselines.decoder_directions` reads), which
    the caller must have trained to convergence on this layer, or an
    :class:`SAEBaselineConfig` (default ``SAEBaselineConfig(seed=seed)``) to train one here with
    :func:`train_baseline_sae`.  The baselines are independent; ``executor`` (e.g. ``"ray"``)
    may compute them in parallel.
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method {unknown[0]!r}; choose from {METHODS}.")
    todo = [m for m in methods if m != "ndm"]
    info: dict[str, Any] = {}
    decoder = None
    if "sae" in todo:
        if sae is None or isinstance(sae, SAEBaselineConfig):
            cfg = sae or SAEBaselineConfig(seed=seed)
            fit = train_baseline_sae(h, cfg)
            info["sae"] = {
                **dataclasses.asdict(cfg),
                **{k: fit[k] for k in ("fvu_history", "epochs", "converged")},
            }
            sae = fit["sae"]
        else:
            info["sae"] = {"given": True, **_sae_source(sae)}
        decoder = decoder_directions(sae)
        info["sae"]["d_sae"] = int(decoder.shape[0])
    job = _Baseline(np.asarray(h, dtype=np.float64), list(partition), seed, decoder)
    out = dict(zip(todo, get_executor(executor).map(job, todo, desc="baselines"), strict=True))
    return out, info


def _sae_source(sae: Any) -> dict[str, Any]:
    """Where a given SAE came from, for the record: a registry name or folder as passed, a
    pretrained dictionary's layout, file and publisher metadata, or the object's type."""
    if isinstance(sae, (str, Path)):
        return {"source": str(sae)}
    if hasattr(sae, "format") and hasattr(sae, "metadata"):  # a PretrainedDictionary
        keep = ("registry", "repo", "model_name", "hook_name", "hook_name_out", "neuronpedia_id")
        meta = {k: sae.metadata[k] for k in keep if k in sae.metadata}
        return {"source": str(sae.path), "format": sae.format, **meta}
    return {"source": type(sae).__name__}


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


def planted_recovery(
    sizes: Sequence[int],
    seeds: Sequence[int],
    ndm: NDMConfig,
    *,
    n_samples: int = 4000,
    min_overlap: float = 0.95,
) -> dict[str, Any]:
    """How often NDM recovers a planted partition, over seeds.

    For each seed, :func:`~structlens.ndm.toy.planted_partition` draws independent groups of
    the given ``sizes`` in a Haar-rotated space (seed ``s``) and NDM (``ndm`` with
    ``seed=s``) is fitted to it.  A run *recovers* the partition when its subspace sizes
    equal ``sizes`` (as multisets) and every true subspace is matched with overlap at least
    ``min_overlap`` (:func:`~structlens.ndm.toy.recovery_report`).  Returns the per-seed rows
    (``seed``, ``partition``, ``overlap``, ``converged``, ``recovered``, ``steps``,
    ``resplits``, the number of accepted re-splits, see ``NDMConfig.resplit_trials``,
    ``final_splits``, how many of them the split/undo pass made, and ``seconds``),
    ``recovered`` (the count), ``n``, the rate's 95 % Wilson interval ``ci``, and the
    ``restarts`` and ``resplit_trials`` of ``ndm``.
    """
    from structlens.ndm.toy import planted_partition
    from structlens.stats.intervals import wilson_interval

    if not seeds:
        raise ValueError("give at least one seed.")
    if not 0.0 < min_overlap <= 1.0:
        raise ValueError(f"min_overlap must be in (0, 1], got {min_overlap}.")
    rows: list[dict[str, Any]] = []
    for s in seeds:
        t0 = time.perf_counter()
        planted = planted_partition(sizes, n_samples, seed=int(s))
        fit = NDM(dataclasses.replace(ndm, seed=int(s))).fit(planted.h)
        report: dict[str, Any] = recovery_report(fit.bases(), planted.bases())
        overlap = float(report["min_matched_overlap"])
        same_sizes = sorted(fit.partition) == sorted(int(k) for k in sizes)
        rows.append(
            {
                "seed": int(s),
                "partition": list(fit.partition),
                "overlap": overlap,
                "converged": bool(fit.converged),
                "recovered": bool(same_sizes and overlap >= min_overlap),
                "steps": int(fit.steps),
                "resplits": len(fit.resplit_history),
                "final_splits": sum(e["kind"] == "final" for e in fit.resplit_history),
                "seconds": time.perf_counter() - t0,
            }
        )
    k = sum(r["recovered"] for r in rows)
    return {
        "sizes": [int(x) for x in sizes],
        "rows": rows,
        "recovered": k,
        "n": len(rows),
        "ci": list(wilson_interval(k, len(rows))),
        "restarts": ndm.restarts,
        "resplit_trials": ndm.resplit_trials,
        "min_overlap": min_overlap,
    }

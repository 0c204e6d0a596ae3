"""SAE width sweeps on one shared activation stream, and the quality numbers of a trained SAE
(FVU, L0, dead fraction on held-out activations; CE loss recovered inside the model)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from structlens.capture.residuals import ce_runner
from structlens.execution import Executor, get_executor
from structlens.sae.evaluate import ce_loss_recovered, evaluate_sae
from structlens.sae.models import SparseAutoencoder
from structlens.sae.train import SAETrainConfig, train_sweep, width_sweep_configs

__all__ = [
    "shuffled_batches",
    "train_width_sweep",
    "sae_quality",
    "ce_recovered_by_width",
]

Model = Any  # a structlens.models.loading.Model


def shuffled_batches(
    acts: torch.Tensor, batch_size: int, epochs: int, seed: int = 0
) -> list[torch.Tensor]:
    """``epochs`` passes over the rows of ``acts`` in fresh random orders, in batches."""
    if batch_size < 2 or epochs < 1:
        raise ValueError(
            f"batch size must be >= 2 (FVU needs a variance) and epochs >= 1; got "
            f"{batch_size} and {epochs}."
        )
    if acts.ndim != 2 or acts.shape[0] < batch_size:
        raise ValueError(f"need a [n ≥ {batch_size}, d] activation matrix, got {acts.shape}.")
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(epochs):
        perm = torch.randperm(acts.shape[0], generator=gen)
        out += [acts[perm[s : s + batch_size]] for s in range(0, acts.shape[0], batch_size)]
    return [b for b in out if b.shape[0] == batch_size]


@dataclasses.dataclass
class _TrainWidth:
    """One width of a sweep; picklable so an executor can train widths in parallel."""

    batches: list[torch.Tensor]
    tail_tokens: int

    def __call__(self, config: SAETrainConfig) -> Any:
        return train_sweep([config], self.batches, tail_tokens=self.tail_tokens)[0]


def train_width_sweep(
    acts: torch.Tensor,
    widths: Sequence[int],
    base: SAETrainConfig,
    *,
    batch_size: int = 1024,
    epochs: int = 1,
    seed: int = 0,
    executor: str | Executor | None = None,
) -> dict[int, Any]:
    """Train one SAE per width on one shared stream (same tokens, same order).

    Widths train independently (each SAE has its own seeded initialisation and optimiser), so
    ``executor`` may run them in parallel (``"ray"``) with the same results as in-process.
    """
    cfgs = width_sweep_configs(base, widths)
    job = _TrainWidth(shuffled_batches(acts, batch_size, epochs, seed), tail_tokens=20_000)
    # training cost grows with the width: the widest start first on parallel executors
    results = get_executor(executor).map(job, cfgs, desc="SAE width sweep", cost=list(widths))
    return {int(w): r for w, r in zip(widths, results, strict=True)}


def sae_quality(
    sae: SparseAutoencoder, eval_acts: torch.Tensor, min_count: int = 1
) -> dict[str, float]:
    """FVU, L0, dead fraction and token count of ``sae`` on held-out ``eval_acts``."""
    res = evaluate_sae(sae, eval_acts, min_count=min_count)
    return {
        "fvu": res.fvu,
        "l0": res.l0,
        "dead_fraction": res.dead_fraction,
        "n_tokens": res.n_tokens,
    }


def ce_recovered_by_width(
    model: Model,
    layer: int,
    saes: dict[int, SparseAutoencoder],
    prompts: Sequence[Sequence[int]],
) -> dict[int, dict[str, float]]:
    """CE loss recovered per width (SAELens ``ce_loss_score``, zero ablation); the clean and
    ablated runs are done once and shared by all widths."""
    run = ce_runner(model, layer, prompts)
    clean = run(None)
    ablated = run(torch.zeros_like)
    out = {}
    for m, cpu_sae in saes.items():
        # The splice runs inside the model's forward, so the SAE must sit on its device.
        sae = copy.deepcopy(cpu_sae).to(model.device)
        first = True

        def shared(fn: Any, sae: SparseAutoencoder = sae) -> float:
            nonlocal first
            if fn is None:
                return clean
            if first:  # ce_loss_recovered's call order: clean, SAE, ablated
                first = False
                return run(fn)
            return ablated

        out[m] = ce_loss_recovered(sae, shared).to_json()
    return out

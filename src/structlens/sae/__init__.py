"""Sparse autoencoders: architectures, streaming training, evaluation, SAELens-format I/O."""

from structlens.sae.evaluate import (
    CELossResult,
    SAEEvalAccumulator,
    SAEEvalResult,
    ce_loss_recovered,
    evaluate_sae,
)
from structlens.sae.io import load_sae, sae_metadata, save_sae
from structlens.sae.models import (
    BatchTopKSAE,
    JumpReLUSAE,
    ReLUSAE,
    SparseAutoencoder,
    TopKSAE,
)
from structlens.sae.train import (
    SAE_ARCHITECTURES,
    SAEArchitecture,
    SAETrainConfig,
    SAETrainer,
    SAETrainingResult,
    build_sae,
    train_sae,
    train_sweep,
    width_sweep_configs,
)

__all__ = [
    "SAE_ARCHITECTURES",
    "BatchTopKSAE",
    "CELossResult",
    "JumpReLUSAE",
    "ReLUSAE",
    "SAEArchitecture",
    "SAEEvalAccumulator",
    "SAEEvalResult",
    "SAETrainConfig",
    "SAETrainer",
    "SAETrainingResult",
    "SparseAutoencoder",
    "TopKSAE",
    "build_sae",
    "ce_loss_recovered",
    "evaluate_sae",
    "load_sae",
    "sae_metadata",
    "save_sae",
    "train_sae",
    "train_sweep",
    "width_sweep_configs",
]

"""Sparse autoencoders: architectures, streaming training, evaluation, SAELens-format I/O, the
published SAE and transcoder layouts (:mod:`structlens.sae.formats`) and the registry of
published releases (:mod:`structlens.sae.registry`)."""

from structlens.sae.evaluate import (
    CELossResult,
    SAEEvalAccumulator,
    SAEEvalResult,
    ce_loss_recovered,
    evaluate_sae,
)
from structlens.sae.formats import (
    FORMATS,
    PretrainedDictionary,
    detect_format,
    load_dictionary,
    read_dictionary,
)
from structlens.sae.io import load_sae, sae_metadata, save_sae
from structlens.sae.models import (
    BatchTopKSAE,
    JumpReLUSAE,
    ReLUSAE,
    SparseAutoencoder,
    TopKSAE,
    Transcoder,
)
from structlens.sae.registry import PretrainedRelease, load_pretrained, pretrained_releases, resolve
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
    "FORMATS",
    "SAE_ARCHITECTURES",
    "BatchTopKSAE",
    "CELossResult",
    "JumpReLUSAE",
    "PretrainedDictionary",
    "PretrainedRelease",
    "ReLUSAE",
    "SAEArchitecture",
    "SAEEvalAccumulator",
    "SAEEvalResult",
    "SAETrainConfig",
    "SAETrainer",
    "SAETrainingResult",
    "SparseAutoencoder",
    "TopKSAE",
    "Transcoder",
    "build_sae",
    "ce_loss_recovered",
    "detect_format",
    "evaluate_sae",
    "load_dictionary",
    "load_pretrained",
    "load_sae",
    "pretrained_releases",
    "read_dictionary",
    "resolve",
    "sae_metadata",
    "save_sae",
    "train_sae",
    "train_sweep",
    "width_sweep_configs",
]

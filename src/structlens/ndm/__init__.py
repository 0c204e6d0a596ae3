"""NDM subspace decomposition: trainer, neighbour search, toy model, baselines, preimage index."""

from structlens.ndm.baselines import (
    decoder_directions,
    identity_rotation,
    pca_rotation,
    random_rotation,
    sae_cluster_rotation,
)
from structlens.ndm.ndm import (
    NDM,
    MergePlan,
    NDMConfig,
    NDMResult,
    TrainState,
    plan_merges,
    subspace_variances,
)
from structlens.ndm.preimage import SubspaceIndex
from structlens.ndm.search import RotatedKeys, neighbor_distance_loss
from structlens.ndm.toy import (
    PlantedPartition,
    ToyConfig,
    ToyModel,
    planted_partition,
    principal_angles,
    recovery_report,
    subspace_overlap,
    train_toy_model,
)

__all__ = [
    "NDM",
    "MergePlan",
    "NDMConfig",
    "NDMResult",
    "PlantedPartition",
    "RotatedKeys",
    "SubspaceIndex",
    "ToyConfig",
    "ToyModel",
    "TrainState",
    "decoder_directions",
    "identity_rotation",
    "neighbor_distance_loss",
    "pca_rotation",
    "plan_merges",
    "planted_partition",
    "principal_angles",
    "random_rotation",
    "recovery_report",
    "sae_cluster_rotation",
    "subspace_overlap",
    "subspace_variances",
    "train_toy_model",
]

"""NDM subspace decomposition: trainer, neighbour search, toy model, baselines, preimage index.

The names below load their submodule on first use, so that ``structlens.ndm.protocol`` (which
the command line reads to build its options) imports neither torch nor the trainer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from structlens.lazy import lazy_attributes

if TYPE_CHECKING:  # the same names, typed, for mypy
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

#: Each public name and the submodule that defines it.
_HOME = {
    "decoder_directions": "baselines",
    "identity_rotation": "baselines",
    "pca_rotation": "baselines",
    "random_rotation": "baselines",
    "sae_cluster_rotation": "baselines",
    "NDM": "ndm",
    "MergePlan": "ndm",
    "NDMConfig": "ndm",
    "NDMResult": "ndm",
    "TrainState": "ndm",
    "plan_merges": "ndm",
    "subspace_variances": "ndm",
    "SubspaceIndex": "preimage",
    "RotatedKeys": "search",
    "neighbor_distance_loss": "search",
    "PlantedPartition": "toy",
    "ToyConfig": "toy",
    "ToyModel": "toy",
    "planted_partition": "toy",
    "principal_angles": "toy",
    "recovery_report": "toy",
    "subspace_overlap": "toy",
    "train_toy_model": "toy",
}

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


__getattr__ = lazy_attributes(__name__, _HOME)

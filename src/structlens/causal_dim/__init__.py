"""Causal dimensionality: Σ = E[JᵀJ] and its effective ranks, AtP over SAE features,
width-sweep analysis (N_repr, N_causal, saturating fits, κ̂) and controls.

The names below load their module on first use, so that :mod:`structlens.causal_dim.protocol`
(which the CLI reads to check its options) imports without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from structlens.lazy import lazy_attributes

# name -> the submodule that defines it
_EXPORTS = {
    "AtPVerification": "atp",
    "CausalDimension": "jacobian",
    "CausalDimensionResult": "jacobian",
    "EJOPAccumulator": "jacobian",
    "FeatureStats": "sweep",
    "FourCellResult": "controls",
    "JacobianConfig": "jacobian",
    "KappaConfig": "kappa",
    "KappaEstimator": "kappa",
    "KappaResult": "kappa",
    "RecallResult": "controls",
    "SyntheticCausalModel": "controls",
    "WidthSweepConfig": "sweep",
    "WidthSweepResult": "sweep",
    "analyze_width_sweep": "sweep",
    "atp_recall": "controls",
    "calibrate_epsilon": "sweep",
    "exact_zero_ablation": "atp",
    "feature_atp": "atp",
    "fit_saturating": "sweep",
    "four_cell_ablation": "controls",
    "jacobians_forward": "jacobian",
    "random_orthonormal_decoder": "controls",
    "random_orthonormal_encoder": "controls",
    "sparse_feature_atp": "atp",
    "splice_with_error": "atp",
    "verify_atp": "atp",
    "vjp_sketch_grads": "jacobian",
}

__all__ = [
    "AtPVerification",
    "CausalDimension",
    "CausalDimensionResult",
    "EJOPAccumulator",
    "FeatureStats",
    "FourCellResult",
    "JacobianConfig",
    "KappaConfig",
    "KappaEstimator",
    "KappaResult",
    "RecallResult",
    "SyntheticCausalModel",
    "WidthSweepConfig",
    "WidthSweepResult",
    "analyze_width_sweep",
    "atp_recall",
    "calibrate_epsilon",
    "exact_zero_ablation",
    "feature_atp",
    "fit_saturating",
    "four_cell_ablation",
    "jacobians_forward",
    "random_orthonormal_decoder",
    "random_orthonormal_encoder",
    "sparse_feature_atp",
    "splice_with_error",
    "verify_atp",
    "vjp_sketch_grads",
]


__getattr__ = lazy_attributes(__name__, _EXPORTS)


if TYPE_CHECKING:
    from structlens.causal_dim.atp import (
        AtPVerification,
        exact_zero_ablation,
        feature_atp,
        sparse_feature_atp,
        splice_with_error,
        verify_atp,
    )
    from structlens.causal_dim.controls import (
        FourCellResult,
        RecallResult,
        SyntheticCausalModel,
        atp_recall,
        four_cell_ablation,
        random_orthonormal_decoder,
        random_orthonormal_encoder,
    )
    from structlens.causal_dim.jacobian import (
        CausalDimension,
        CausalDimensionResult,
        EJOPAccumulator,
        JacobianConfig,
        jacobians_forward,
        vjp_sketch_grads,
    )
    from structlens.causal_dim.kappa import KappaConfig, KappaEstimator, KappaResult
    from structlens.causal_dim.sweep import (
        FeatureStats,
        WidthSweepConfig,
        WidthSweepResult,
        analyze_width_sweep,
        calibrate_epsilon,
        fit_saturating,
    )

"""Causal dimensionality: Σ = E[JᵀJ] and its effective ranks, AtP over SAE features,
width-sweep analysis (N_repr, N_causal, saturating fits, κ̂) and controls."""

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

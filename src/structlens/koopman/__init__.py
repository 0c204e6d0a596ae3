"""Koopman spectral analysis of depth dynamics (EDMDc over layers).

Array-level API: dictionaries (lifts), the streamed EDMDc estimator, spectral tools,
split-half convergence, invariance residuals, the universality test and certified model
reduction.  See docs/koopman.md.
"""

from structlens.koopman.convergence import (
    SplitHalfResult,
    UniversalityResult,
    split_half_convergence,
    universality_test,
)
from structlens.koopman.dictionaries import (
    Dictionary,
    IdentityDictionary,
    PCADictionary,
    RandomFourierDictionary,
    RandomReLUDictionary,
    SAEDictionary,
    SpectralDictionary,
    load_dictionary,
    median_heuristic_gamma,
)
from structlens.koopman.edmdc import (
    EDMDc,
    EDMDcConfig,
    EDMDcResult,
    EDMDcStatistics,
    accumulate,
    control_basis,
    iter_chunks,
    merge_statistics,
    solve,
    solve_median_of_means,
)
from structlens.koopman.invariance import (
    InvarianceResidual,
    invariance_penalty,
    invariance_residual,
    invariance_residual_split,
)
from structlens.koopman.reduction import (
    ReductionResult,
    balanced_truncation,
    markov_parameters,
    toeplitz_operator,
)
from structlens.koopman.spectral import (
    Dissociation,
    Eigendecomposition,
    ModeAblation,
    NonNormality,
    RealMode,
    eigendecomposition,
    modal_principal_dissociation,
    mode_ablation,
    non_normality,
    real_modes,
    spectral_projectors,
)

__all__ = [
    "Dictionary",
    "IdentityDictionary",
    "PCADictionary",
    "RandomFourierDictionary",
    "RandomReLUDictionary",
    "SAEDictionary",
    "SpectralDictionary",
    "load_dictionary",
    "median_heuristic_gamma",
    "EDMDc",
    "EDMDcConfig",
    "EDMDcResult",
    "EDMDcStatistics",
    "accumulate",
    "control_basis",
    "iter_chunks",
    "merge_statistics",
    "solve",
    "solve_median_of_means",
    "InvarianceResidual",
    "invariance_penalty",
    "invariance_residual",
    "invariance_residual_split",
    "ReductionResult",
    "balanced_truncation",
    "markov_parameters",
    "toeplitz_operator",
    "Dissociation",
    "Eigendecomposition",
    "ModeAblation",
    "NonNormality",
    "RealMode",
    "eigendecomposition",
    "modal_principal_dissociation",
    "mode_ablation",
    "non_normality",
    "real_modes",
    "spectral_projectors",
    "SplitHalfResult",
    "UniversalityResult",
    "split_half_convergence",
    "universality_test",
]

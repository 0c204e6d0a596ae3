"""Koopman spectral analysis of depth dynamics (EDMDc over layers).

Array-level API: dictionaries (lifts), the streamed EDMDc estimator, spectral tools,
split-half convergence, invariance residuals, the universality test and certified model
reduction.  See docs/koopman.md.

The names load their submodule on first use, so that :mod:`structlens.koopman.protocol`
(which the command line reads to build its options) imports neither SciPy nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from structlens.lazy import lazy_attributes

if TYPE_CHECKING:  # the same names, typed, for mypy
    from structlens.koopman.convergence import (
        SpectralDistanceTest,
        SplitHalfResult,
        UniversalityResult,
        spectral_distance_test,
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
        decoder_agreement,
        fit_on_rows,
        invariance_penalty,
        invariance_residual,
        invariance_residual_split,
        prompt_split,
        select_sae_features,
        train_sae_dictionary,
    )
    from structlens.koopman.reduction import (
        ReductionResult,
        balanced_truncation,
        markov_parameters,
        operator_distance,
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

#: Each public name and the module that defines it.
_HOME = {
    "Dictionary": "dictionaries",
    "Dissociation": "spectral",
    "EDMDc": "edmdc",
    "EDMDcConfig": "edmdc",
    "EDMDcResult": "edmdc",
    "EDMDcStatistics": "edmdc",
    "Eigendecomposition": "spectral",
    "IdentityDictionary": "dictionaries",
    "InvarianceResidual": "invariance",
    "ModeAblation": "spectral",
    "NonNormality": "spectral",
    "PCADictionary": "dictionaries",
    "RandomFourierDictionary": "dictionaries",
    "RandomReLUDictionary": "dictionaries",
    "RealMode": "spectral",
    "ReductionResult": "reduction",
    "SAEDictionary": "dictionaries",
    "SpectralDictionary": "dictionaries",
    "SpectralDistanceTest": "convergence",
    "SplitHalfResult": "convergence",
    "UniversalityResult": "convergence",
    "accumulate": "edmdc",
    "balanced_truncation": "reduction",
    "control_basis": "edmdc",
    "decoder_agreement": "invariance",
    "eigendecomposition": "spectral",
    "fit_on_rows": "invariance",
    "invariance_penalty": "invariance",
    "invariance_residual": "invariance",
    "invariance_residual_split": "invariance",
    "iter_chunks": "edmdc",
    "load_dictionary": "dictionaries",
    "markov_parameters": "reduction",
    "median_heuristic_gamma": "dictionaries",
    "merge_statistics": "edmdc",
    "modal_principal_dissociation": "spectral",
    "mode_ablation": "spectral",
    "non_normality": "spectral",
    "operator_distance": "reduction",
    "prompt_split": "invariance",
    "real_modes": "spectral",
    "select_sae_features": "invariance",
    "solve": "edmdc",
    "solve_median_of_means": "edmdc",
    "spectral_distance_test": "convergence",
    "spectral_projectors": "spectral",
    "split_half_convergence": "convergence",
    "toeplitz_operator": "reduction",
    "train_sae_dictionary": "invariance",
    "universality_test": "convergence",
}

__all__ = [
    "Dictionary",
    "Dissociation",
    "EDMDc",
    "EDMDcConfig",
    "EDMDcResult",
    "EDMDcStatistics",
    "Eigendecomposition",
    "IdentityDictionary",
    "InvarianceResidual",
    "ModeAblation",
    "NonNormality",
    "PCADictionary",
    "RandomFourierDictionary",
    "RandomReLUDictionary",
    "RealMode",
    "ReductionResult",
    "SAEDictionary",
    "SpectralDictionary",
    "SpectralDistanceTest",
    "SplitHalfResult",
    "UniversalityResult",
    "accumulate",
    "balanced_truncation",
    "control_basis",
    "decoder_agreement",
    "eigendecomposition",
    "fit_on_rows",
    "invariance_penalty",
    "invariance_residual",
    "invariance_residual_split",
    "iter_chunks",
    "load_dictionary",
    "markov_parameters",
    "median_heuristic_gamma",
    "merge_statistics",
    "modal_principal_dissociation",
    "mode_ablation",
    "non_normality",
    "operator_distance",
    "prompt_split",
    "real_modes",
    "select_sae_features",
    "solve",
    "solve_median_of_means",
    "spectral_distance_test",
    "spectral_projectors",
    "split_half_convergence",
    "toeplitz_operator",
    "train_sae_dictionary",
    "universality_test",
]

__getattr__ = lazy_attributes(__name__, _HOME)

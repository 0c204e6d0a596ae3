"""Interpretive equivalence: do two models implement the same mechanism?

The numerical core works on arrays (rows = samples); model loading, capture and patching live
elsewhere. See docs/equivalence.md for conventions and a worked example.

* Similarity suite (all similarities, higher = more similar): :func:`linear_cka`,
  :func:`rbf_cka`, :class:`MinibatchCKA`, :func:`svcca`, :func:`pwcca`,
  :func:`procrustes_similarity`, :func:`encoding_score` / :func:`encoding_scores`,
  :func:`mutual_knn`; streaming moments :class:`CrossMoments`; preparation :func:`prepare`.
* Component matching: :func:`layer_similarity_matrix`, :func:`head_similarity_matrix`,
  :func:`match_hungarian`, :func:`match_monotone`, :func:`match_heads`.
* Equivalence score: :class:`ValidationCriterion`, :func:`equivalence_score`,
  :func:`representational_score`, :func:`fit_linear_map`, :func:`fit_layer_map` (the map
  :func:`choose_layer_map` picks for a copy or for independently trained models).
* CONGRUITY (reference-code statistics): :func:`accumulated_representation`,
  :func:`kl_from_logits`, :func:`rank_heads`, :func:`selectivity_test`, :func:`point_test`,
  :func:`bootstrap_point_test`.

The names load their submodule on first use, so that :mod:`structlens.equivalence.protocol`
(which the command line reads to build its options) imports neither SciPy nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from structlens.lazy import lazy_attributes

if TYPE_CHECKING:  # the same names, typed, for mypy
    from structlens.equivalence.cca import (
        cca_correlations,
        cca_correlations_from_moments,
        procrustes_from_moments,
        procrustes_similarity,
        pwcca,
        pwcca_from_moments,
        svcca,
        svcca_from_moments,
    )
    from structlens.equivalence.cka import (
        MinibatchCKA,
        cka_from_moments,
        gram_linear,
        gram_rbf,
        hsic,
        kernel_cka,
        linear_cka,
        rbf_cka,
    )
    from structlens.equivalence.congruity import (
        PointTestResult,
        SelectivityResult,
        accumulated_representation,
        bootstrap_point_test,
        kl_from_logits,
        point_test,
        rank_heads,
        selectivity_test,
    )
    from structlens.equivalence.encoding import (
        EncodingConfig,
        EncodingScores,
        LinearMap,
        encoding_r2,
        encoding_score,
        encoding_scores,
        fit_linear_map,
    )
    from structlens.equivalence.knn import mutual_knn
    from structlens.equivalence.layer_map import LayerMapChoice, choose_layer_map, fit_layer_map
    from structlens.equivalence.matching import (
        METRICS,
        MatchingResult,
        head_similarity_matrix,
        layer_similarity_matrix,
        match_heads,
        match_hungarian,
        match_monotone,
    )
    from structlens.equivalence.preprocess import Preprocess, prepare
    from structlens.equivalence.score import (
        EquivalenceScore,
        PairedNullDecision,
        ValidationCriterion,
        bootstrap_interval,
        decide_paired_null,
        decide_with_null,
        equivalence_score,
        informative_heads,
        representational_score,
        wilson_interval,
    )
    from structlens.stats.moments import CrossMoments

#: Each public name and the module that defines it.
_HOME = {
    "CrossMoments": "structlens.stats.moments",
    "EncodingConfig": "encoding",
    "EncodingScores": "encoding",
    "EquivalenceScore": "score",
    "LayerMapChoice": "layer_map",
    "LinearMap": "encoding",
    "METRICS": "matching",
    "MatchingResult": "matching",
    "MinibatchCKA": "cka",
    "PairedNullDecision": "score",
    "PointTestResult": "congruity",
    "Preprocess": "preprocess",
    "SelectivityResult": "congruity",
    "ValidationCriterion": "score",
    "accumulated_representation": "congruity",
    "bootstrap_interval": "score",
    "bootstrap_point_test": "congruity",
    "cca_correlations": "cca",
    "cca_correlations_from_moments": "cca",
    "cka_from_moments": "cka",
    "choose_layer_map": "layer_map",
    "decide_paired_null": "score",
    "decide_with_null": "score",
    "encoding_r2": "encoding",
    "encoding_score": "encoding",
    "encoding_scores": "encoding",
    "equivalence_score": "score",
    "fit_layer_map": "layer_map",
    "fit_linear_map": "encoding",
    "gram_linear": "cka",
    "gram_rbf": "cka",
    "head_similarity_matrix": "matching",
    "hsic": "cka",
    "informative_heads": "score",
    "kernel_cka": "cka",
    "kl_from_logits": "congruity",
    "layer_similarity_matrix": "matching",
    "linear_cka": "cka",
    "match_heads": "matching",
    "match_hungarian": "matching",
    "match_monotone": "matching",
    "mutual_knn": "knn",
    "point_test": "congruity",
    "prepare": "preprocess",
    "procrustes_from_moments": "cca",
    "procrustes_similarity": "cca",
    "pwcca": "cca",
    "pwcca_from_moments": "cca",
    "rank_heads": "congruity",
    "rbf_cka": "cka",
    "representational_score": "score",
    "selectivity_test": "congruity",
    "svcca": "cca",
    "svcca_from_moments": "cca",
    "wilson_interval": "score",
}

__all__ = [
    "CrossMoments",
    "EncodingConfig",
    "EncodingScores",
    "EquivalenceScore",
    "LayerMapChoice",
    "LinearMap",
    "METRICS",
    "MatchingResult",
    "MinibatchCKA",
    "PairedNullDecision",
    "PointTestResult",
    "Preprocess",
    "SelectivityResult",
    "ValidationCriterion",
    "accumulated_representation",
    "bootstrap_interval",
    "bootstrap_point_test",
    "cca_correlations",
    "cca_correlations_from_moments",
    "choose_layer_map",
    "cka_from_moments",
    "decide_paired_null",
    "decide_with_null",
    "encoding_r2",
    "encoding_score",
    "encoding_scores",
    "equivalence_score",
    "fit_layer_map",
    "fit_linear_map",
    "gram_linear",
    "gram_rbf",
    "head_similarity_matrix",
    "hsic",
    "informative_heads",
    "kernel_cka",
    "kl_from_logits",
    "layer_similarity_matrix",
    "linear_cka",
    "match_heads",
    "match_hungarian",
    "match_monotone",
    "mutual_knn",
    "point_test",
    "prepare",
    "procrustes_from_moments",
    "procrustes_similarity",
    "pwcca",
    "pwcca_from_moments",
    "rank_heads",
    "rbf_cka",
    "representational_score",
    "selectivity_test",
    "svcca",
    "svcca_from_moments",
    "wilson_interval",
]

__getattr__ = lazy_attributes(__name__, _HOME)

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
  :func:`representational_score`, :func:`fit_linear_map`.
* CONGRUITY (reference-code statistics): :func:`accumulated_representation`,
  :func:`kl_from_logits`, :func:`rank_heads`, :func:`selectivity_test`, :func:`point_test`,
  :func:`bootstrap_point_test`.
"""

from structlens.stats.moments import CrossMoments

from .cca import (
    cca_correlations,
    cca_correlations_from_moments,
    procrustes_from_moments,
    procrustes_similarity,
    pwcca,
    pwcca_from_moments,
    svcca,
    svcca_from_moments,
)
from .cka import (
    MinibatchCKA,
    cka_from_moments,
    gram_linear,
    gram_rbf,
    hsic,
    kernel_cka,
    linear_cka,
    rbf_cka,
)
from .congruity import (
    PointTestResult,
    SelectivityResult,
    accumulated_representation,
    bootstrap_point_test,
    kl_from_logits,
    point_test,
    rank_heads,
    selectivity_test,
)
from .encoding import (
    EncodingConfig,
    EncodingScores,
    LinearMap,
    encoding_r2,
    encoding_score,
    encoding_scores,
    fit_linear_map,
)
from .knn import mutual_knn
from .layer_map import fit_layer_map
from .matching import (
    METRICS,
    MatchingResult,
    head_similarity_matrix,
    layer_similarity_matrix,
    match_heads,
    match_hungarian,
    match_monotone,
)
from .preprocess import Preprocess, prepare
from .score import (
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

__all__ = [
    "CrossMoments",
    "EncodingConfig",
    "EncodingScores",
    "EquivalenceScore",
    "LinearMap",
    "METRICS",
    "MatchingResult",
    "MinibatchCKA",
    "PointTestResult",
    "Preprocess",
    "SelectivityResult",
    "ValidationCriterion",
    "accumulated_representation",
    "bootstrap_interval",
    "bootstrap_point_test",
    "cca_correlations",
    "cca_correlations_from_moments",
    "cka_from_moments",
    "encoding_r2",
    "encoding_score",
    "encoding_scores",
    "equivalence_score",
    "representational_score",
    "fit_linear_map",
    "fit_layer_map",
    "decide_paired_null",
    "decide_with_null",
    "PairedNullDecision",
    "informative_heads",
    "gram_linear",
    "gram_rbf",
    "head_similarity_matrix",
    "hsic",
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
    "selectivity_test",
    "svcca",
    "svcca_from_moments",
    "wilson_interval",
]

"""The equivalence protocol: every scientific choice of an interpretive-equivalence comparison.

An :class:`EquivalenceProtocol` is frozen and validated at construction.  The ``equiv`` CLI,
``structlens analyze`` and the equivalence replication build one instance each (the CLI from
``--protocol`` and its options, ``analyze`` and the replication from their profiles, all
instances of :data:`PROFILES`) and hand it to the stages of
:mod:`structlens.equivalence.stages`, which are the only code that turns two models into
equivalence numbers.  Two drivers given equal protocols therefore give equal stage results.

Probe and split
    ``probe_prompts`` prompts of ``probe`` (bundled corpus sentences, or a circuit task whose
    corrupted prompts then drive CONGRUITY's interventions); a seeded permutation holds out
    ``heldout_fraction`` of them for validation, the rest fit similarities and maps.
    Position 0 is left out of rows, maps and patches (``exclude_position0``).  An
    encoder–decoder language model's encoder reads the ``encoder_context`` tokens of corpus
    text before each probe sentence, its decoder the sentence.
Components
    Layers (``resid_post``) and heads (``hook_z``) of layers ``first_layer`` on are compared
    by ``metric`` and matched (``layer_matching``, ``head_matching``); at most
    ``max_validate_heads`` heads (chosen by ``head_subset`` on the fit prompts only) and
    ``max_validate_layers`` layers are validated by patching through ``map_method`` (heads)
    and ``layer_map`` (whole layers) maps.  How B relates to A (``relation``) decides the
    whole-layer map: a copy shares A's residual basis up to an orthogonal map (Procrustes),
    an independently trained model does not (an affine ridge map, fitted only on at least
    ``layer_map_rows_per_dim`` fit rows per dimension).
Null and decision
    The null mean-ablates the same components of B.  The decision is a paired test on the
    discordant components at level ``null_alpha`` over ``null_unit``
    (:func:`~structlens.equivalence.score.decide_paired_null`), "equivalent" only when the
    score also reaches ``equivalent_at``; scores pooled over model pairs resample whole pairs
    (``pool_resamples`` draws).  The default unit is B's ``layer``: McNemar's test for
    clustered data (:func:`~structlens.stats.intervals.clustered_mcnemar`), since the heads of
    a layer may share their fate.  It replaced two earlier rules, measured in
    ``docs/calibration.md``: McNemar's exact test over heads (``null_unit="head"``, kept for
    heads known to fail independently) said "equivalent" for partners no better than the null
    in 0.105 of planted instances at 12 heads whose layer shares one fate, and the exact
    sign-flip test over layers (the earlier meaning of ``"layer"``) held its level but could
    not decide with 5 layers or fewer.

>>> p = EquivalenceProtocol(probe_prompts=24)
>>> p.probe_prompts, p.replace(congruity=False).congruity
(24, False)
>>> EquivalenceProtocol(heldout_fraction=1.0)
Traceback (most recent call last):
...
structlens.errors.InputError: heldout_fraction must lie in (0, 1); got 1.0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from structlens.config import Protocol, described
from structlens.errors import InputError

__all__ = ["EquivalenceProtocol", "PROFILES", "METRIC_NAMES", "MIN_PROBE_PROMPTS", "PROBE_TASKS"]

#: Fewest probe prompts: half fit the similarities and maps, half validate.
MIN_PROBE_PROMPTS = 12
#: The circuit tasks a probe may be: the names of :data:`structlens.data.tasks.registry.TASKS`,
#: copied because the registry imports torch and a protocol is read before any model loads
#: (a test keeps the two equal).
PROBE_TASKS = ("ioi", "greater_than", "knowledge_conflict", "factual_recall")
#: The similarity metrics: the batched linear CKAs and the names of
#: :data:`structlens.equivalence.matching.METRICS`, copied because that module imports SciPy
#: (a test keeps the two equal).
METRIC_NAMES = (
    "linear_cka", "linear_cka_debiased", "rbf_cka", "svcca", "pwcca", "procrustes", "encoding",
    "mutual_knn",
)  # fmt: skip

_CHOICES = {
    "representation": ("auto", "tokens", "sentence"),
    "layer_matching": ("monotone", "hungarian"),
    "head_matching": ("global", "per_layer"),
    "head_subset": ("null_kl", "random"),
    "relation": ("independent", "copy"),
    "map_method": ("ridge", "procrustes"),
    "layer_map": ("auto", "procrustes", "ridge"),
    "null": ("mean_ablation", "none"),
    "null_unit": ("head", "layer"),
    "ci": ("wilson", "bootstrap"),
}


@dataclass(frozen=True)
class EquivalenceProtocol(Protocol):
    """Every scientific choice of an equivalence comparison (see the module docstring).

    Each field's ``metadata["help"]`` says what it sets; :meth:`key` is a digest of the
    canonical JSON, the part of a stage's cache key that the protocol contributes.
    """

    probe: str = described(
        "corpus", "Probe set: 'corpus' (bundled sentences) or a task (ioi, ...)."
    )
    probe_prompts: int = described(48, "Probe prompts (a seeded share is held out).")
    heldout_fraction: float = described(0.5, "Share of probe prompts held out for validation.")
    exclude_position0: bool = described(True, "Leave position 0 out of rows, maps and patches.")
    representation: str = described("auto", "Rows: tokens, sentence (mean over tokens) or auto.")
    encoder_context: int = described(
        32,
        "Tokens of corpus text before each probe sentence that an encoder–decoder LM's encoder "
        "reads (0: the start token only).",
    )
    first_layer: int = described(
        0, "Compare layers and heads of layers >= this in both models (a fine-tune's trained ones)."
    )
    relation: str = described(
        "independent",
        "B is a copy of A (rotated/permuted copy, fine-tune: one basis) or independent.",
    )
    metric: str = described("linear_cka_debiased", "Similarity of layers and heads.")
    layer_matching: str = described("monotone", "Layer matching: monotone or hungarian.")
    head_matching: str = described("global", "Head matching: global or per_layer.")
    validate: bool = described(True, "Validate matched components by patching (when possible).")
    max_validate_heads: int | None = described(
        None, "Validate at most this many heads (all: null)."
    )
    head_subset: str = described(
        "null_kl",
        "Heads validated when capped: null_kl (B's heads whose mean ablation moves it most on "
        "the fit prompts) or random.",
    )
    validate_layers: bool = described(True, "Also validate matched whole layers.")
    max_validate_layers: int | None = described(None, "Validate at most this many layers.")
    validate_head_groups: bool = described(
        True, "Also replace all heads of each layer of B at once."
    )
    max_validate_head_groups: int | None = described(
        None, "Validate the head groups of at most this many layers of B (a seeded subset)."
    )
    # the unembedding and the KL of every patched forward cost rows x vocabulary: over a
    # 262k vocabulary they are most of validation, over a byte vocabulary nothing
    max_scored_logits: int | None = described(
        None,
        "Without a task probe, score each validation batch (and the sanity copy's logit gap) "
        "at most at this many logits (positions x vocabulary; evenly spaced positions, the "
        "same for every patch; all: null).",
    )
    map_method: str = described("ridge", "Map from A's head to B's: ridge or procrustes.")
    layer_map: str = described(
        "auto",
        "Map of whole layers: auto (Procrustes for a copy, ridge for independent models), "
        "procrustes, ridge.",
    )
    layer_map_rows_per_dim: float = described(
        10.0, "Fit rows per dimension of A's layer an auto ridge layer map needs (else none)."
    )
    max_kl: float = described(0.1, "A patch passes if KL(B || patched B) <= this (nats).")
    min_top1: float = described(0.9, "A patch passes if top-1 agreement >= this.")
    similarity_threshold: float = described(0.5, "Pass threshold without patching (similarity).")
    representational_min_similarity: float = described(
        0.9, "Similarity a matched pair needs for the representational score."
    )
    null: str = described(
        "mean_ablation", "The null: mean ablation of the same components, or none."
    )
    null_alpha: float = described(0.05, "Level of the paired exact test against the null.")
    null_unit: str = described(
        "layer",
        "Independent unit of that test: B's layer (clustered McNemar) or the head (McNemar).",
    )
    equivalent_at: float = described(0.5, "Smallest score that may be called equivalent.")
    ci: str = described("wilson", "Descriptive interval of a pass rate: wilson or bootstrap.")
    pool_resamples: int = described(2000, "Cluster-bootstrap draws over model pairs (pooled).")
    congruity: bool = described(True, "Run CONGRUITY (the reference-code estimator).")
    congruity_top_k: int = described(4, "CONGRUITY implementations per model (top-KL heads).")
    congruity_max_layers: int | None = described(None, "Rank heads of at most this many layers.")
    point_n: int = described(20, "CONGRUITY point-test triples.")
    straps: int = described(40, "CONGRUITY bootstrap repetitions.")
    rotation_seed: int = described(3, "Seed of the sanity copy's rotation and head permutation.")
    batch_size: int = described(16, "Prompts per forward (padding moves float round-off only).")
    seed: int = described(0, "Seed of the split, the head subsets and CONGRUITY.")

    def __post_init__(self) -> None:
        self.check_types()
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise InputError(
                    f"{name} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}."
                )
        self._check_probe()
        self.check_counts(
            {
                "probe_prompts": MIN_PROBE_PROMPTS, "pool_resamples": 100, "congruity_top_k": 1,
                "point_n": 2, "straps": 2, "rotation_seed": 0, "batch_size": 1, "seed": 0,
                "encoder_context": 0, "first_layer": 0,
            }
        )  # fmt: skip
        for name in (
            "max_validate_heads", "max_validate_layers", "congruity_max_layers",
            "max_validate_head_groups", "max_scored_logits",
        ):  # fmt: skip
            if (v := getattr(self, name)) is not None and v < 1:
                raise InputError(f"{name} must be >= 1 or null; got {v}.")
        for name in ("heldout_fraction", "null_alpha"):
            if not 0 < getattr(self, name) < 1:
                raise InputError(f"{name} must lie in (0, 1); got {getattr(self, name)}.")
        for name in ("min_top1", "equivalent_at"):
            if not 0 <= getattr(self, name) <= 1:
                raise InputError(f"{name} must lie in [0, 1]; got {getattr(self, name)}.")
        if self.max_kl < 0:
            raise InputError(f"max_kl must be >= 0 (nats); got {self.max_kl}.")
        if not self.layer_map_rows_per_dim >= 1:
            raise InputError(
                "layer_map_rows_per_dim must be >= 1 (a map needs more fit rows than "
                f"dimensions); got {self.layer_map_rows_per_dim}."
            )

    def _check_probe(self) -> None:
        if self.probe != "corpus" and self.probe not in PROBE_TASKS:
            raise InputError(
                f"unknown probe {self.probe!r}; use 'corpus' or one of {', '.join(PROBE_TASKS)}."
            )
        if self.metric not in METRIC_NAMES:
            raise InputError(
                f"unknown metric {self.metric!r}; choose one of {', '.join(METRIC_NAMES)}."
            )

    def compare_config(self) -> Any:
        """The settings of :func:`structlens.equivalence.compare.compare` this protocol runs."""
        from structlens.equivalence.compare import CompareConfig
        from structlens.equivalence.preprocess import Preprocess
        from structlens.equivalence.score import ValidationCriterion

        return CompareConfig(
            metric=self.metric,
            preprocess=Preprocess(exclude_bos=self.exclude_position0),
            representation=self.representation,  # type: ignore[arg-type]
            layer_matching=self.layer_matching,  # type: ignore[arg-type]
            head_matching=self.head_matching,  # type: ignore[arg-type]
            map_method=self.map_method,  # type: ignore[arg-type]
            layer_map=self.layer_map,  # type: ignore[arg-type]
            relation=self.relation,  # type: ignore[arg-type]
            layer_map_rows_per_dim=self.layer_map_rows_per_dim,
            first_layer=self.first_layer,
            criterion=ValidationCriterion(max_kl=self.max_kl, min_top1=self.min_top1),
            similarity_threshold=self.similarity_threshold,
            heldout_fraction=self.heldout_fraction,
            validate=self.validate,
            max_validate_heads=self.max_validate_heads,
            head_subset=self.head_subset,  # type: ignore[arg-type]
            validate_layers=self.validate_layers,
            max_validate_layers=self.max_validate_layers,
            validate_head_groups=self.validate_head_groups,
            max_validate_head_groups=self.max_validate_head_groups,
            max_scored_logits=self.max_scored_logits,
            null_baseline=self.null != "none",
            congruity=self.congruity,
            congruity_top_k=self.congruity_top_k,
            congruity_max_layers=self.congruity_max_layers,
            point_n=self.point_n,
            straps=self.straps,
            equivalent_at=self.equivalent_at,
            null_alpha=self.null_alpha,
            null_unit=self.null_unit,  # type: ignore[arg-type]
            batch_size=self.batch_size,
            seed=self.seed,
            ci=self.ci,  # type: ignore[arg-type]
        )


_PAPER = EquivalenceProtocol()

#: The protocol instances the drivers start from.  ``paper`` is the replication's protocol of
#: the small byte-level LMs (every head and layer validated; also the CLI's default);
#: ``paper-subset`` its protocol for SmolLM2-sized pairs on a CPU (an IOI probe, the 30 heads
#: whose mean ablation moves B most on the fit prompts, 4 layers); ``paper-sentence`` the one
#: for models whose tokenizers differ (sentence rows, similarity score); ``paper-cross-family``
#: the same rows on an IOI probe whose names are single tokens in both tokenizers, so that
#: CONGRUITY intervenes with the task's corrupted prompts; ``smoke`` shrinks
#: CONGRUITY for the tiny test models and keeps every rule, and bounds the patched forwards
#: of larger models (at most 32 heads, 8 head groups, 2^24 scored logits per batch: a random
#: 32 of Gemma 3 270M's 72 heads, 64 of its ~360 scored positions per batch) at sizes no tiny
#: test model reaches (32 heads and 8 layers at most, a 257-token vocabulary), so that their
#: smoke results are those of the uncapped rules.
PROFILES: dict[str, EquivalenceProtocol] = {
    "paper": _PAPER,
    "paper-subset": _PAPER.replace(
        probe="ioi",
        probe_prompts=96,
        max_validate_heads=30,
        max_validate_layers=4,
        congruity_top_k=2,
        congruity_max_layers=3,
        batch_size=12,
    ),  # fmt: skip
    "paper-sentence": _PAPER.replace(
        probe_prompts=64, representation="sentence", congruity_top_k=2, congruity_max_layers=3
    ),
    "paper-cross-family": _PAPER.replace(
        probe="ioi",
        probe_prompts=96,
        representation="sentence",
        congruity_top_k=2,
        congruity_max_layers=3,
        batch_size=12,
    ),  # fmt: skip
    "smoke": _PAPER.replace(
        probe_prompts=24,
        congruity_top_k=2,
        congruity_max_layers=1,
        point_n=4,
        straps=4,
        max_validate_heads=32,
        head_subset="random",
        max_validate_head_groups=8,
        max_scored_logits=2**24,
    ),
}

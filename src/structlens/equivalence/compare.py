"""Model-level interpretive equivalence: run two models on a probe set and compare them.

:func:`compare` runs both estimators of docs/equivalence.md on two loaded models:

1. **Matched-component equivalence** (an extension of the reference code, which has no
   matching step). On the *fit* half of the probe set it collects ``blocks.{l}.hook_resid_post``
   (layers) and ``blocks.{l}.attn.hook_z`` (heads) of both models, builds the layer and head
   similarity matrices, and matches layers (monotone depth-preserving DP, or Hungarian) and
   heads (global Hungarian, or Hungarian within matched layers). On the *held-out* half it
   validates every matched pair: component ``b`` of model B is overwritten with the
   activations of its partner ``a`` in model A, mapped into B's space by
   :func:`~structlens.equivalence.fit_linear_map` fitted on the fit half, and B's predictions
   are compared with its own (KL in nats, top-1 agreement, task-metric ratio). The score is
   the share of matched heads passing :class:`~structlens.equivalence.ValidationCriterion`
   (the layer score is reported beside it), with a Wilson interval. A null baseline
   mean-ablates the same heads; the score over the heads whose null fails (``informative``)
   and, optionally, whole layers of heads replaced at once (``head_groups``) are reported
   beside it, since single heads of a large model are often redundant.  Only layers
   ``first_layer`` on take part (a fine-tune's trained layers: its frozen ones are A's own).
   When validation is capped, the heads validated are chosen on the fit half alone, by the
   null's own intervention (:func:`~structlens.equivalence.patching.null_kl`), so the choice
   cannot depend on a held-out prompt.  Whole layers are mapped as
   :func:`~structlens.equivalence.choose_layer_map` says for the pair's ``relation``.
2. **CONGRUITY** (as the reference code does it). Representations are the accumulated
   residual stream (``resid_pre`` of block 0, then every ``resid_post``) at the last token
   (task probes) or averaged over positions (corpus probes); implementations of a model are
   its clean run and runs with one of its top-KL heads patched (from the task's corrupted
   prompts, or mean-ablated for corpus probes, which have no corrupted counterpart). The
   selectivity test and the bootstrapped point test compare the two models' groups.

Token-level validation needs the same token sequences in both models (a shared tokenizer)
and a causal model B (KL is over next-token distributions). Otherwise, e.g. an encoder
against a decoder, representations are *sentence-level* (mean over positions of each
prompt), no patching is possible, and the score is the share of matched heads whose
similarity reaches ``similarity_threshold`` (``validation_method = "similarity"``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import numpy as np

from structlens.config import check_choices
from structlens.models.loading import Model
from structlens.results import Result

from .collect import collect_rows, prepare_layers
from .layer_map import choose_layer_map
from .matching import (
    head_similarity_matrix,
    layer_similarity_matrix,
    match_heads,
    match_hungarian,
    match_monotone,
)
from .patching import congruity as run_congruity
from .patching import null_kl, validation_writers
from .patching import validate as validate_patches
from .preprocess import Preprocess
from .probes import Probe, corpus_probe, task_probe
from .score import (
    ValidationCriterion,
    bootstrap_interval,
    component_clusters,
    decide_paired_null,
    equivalence_score,
    informative_heads,
    wilson_interval,
)

__all__ = [
    "Probe",
    "task_probe",
    "corpus_probe",
    "CompareConfig",
    "Comparison",
    "MatchedComponents",
    "ComparisonResult",
    "split_prompts",
    "compare",
]


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    """Settings of :func:`compare`.

    Attributes
    ----------
    metric : str
        Similarity for both matrices (see :func:`layer_similarity_matrix`).
    preprocess : Preprocess
        Applied to fit-set rows before similarities (``exclude_bos`` drops position 0, which
        is then also excluded from map fitting and left unpatched in validation).
    representation : {"auto", "tokens", "sentence"}
        Rows are tokens, or prompts (mean over positions); ``"auto"`` picks tokens when the
        tokenizers agree.
    layer_matching : {"monotone", "hungarian"}
    head_matching : {"global", "per_layer"}
    map_method : {"ridge", "procrustes"}
        Linear map from A's head to B's for validation.
    layer_map : {"auto", "procrustes", "ridge"}
        Map of whole layers (:func:`~structlens.equivalence.choose_layer_map`; ``"auto"``
        follows ``relation``).
    relation : {"independent", "copy"}
        How B relates to A: a copy shares A's residual basis up to an orthogonal map
        (Procrustes layer maps), independently trained models do not (ridge layer maps).
    layer_map_rows_per_dim : float
        Fit rows per dimension of A's layer an auto ridge layer map needs; with fewer the
        layers are not validated (the reason is recorded).
    first_layer : int
        Compare, match and validate only layers (and their heads) from this one on, in both
        models (0: all; a fine-tune's trained layers).
    criterion : ValidationCriterion
        The sufficient condition (default: KL <= 0.1 nats and top-1 >= 0.9).
    similarity_threshold : float
        Pass threshold of the similarity-only score (no patching possible).
    heldout_fraction : float
        Share of probe prompts held out for validation.
    validate : bool
        Validate by patching (when possible); ``False`` gives the similarity-only score.
    max_validate_heads : int or None
        Validate at most this many matched heads (all when None), chosen by ``head_subset``.
    head_subset : {"null_kl", "random"}
        ``"null_kl"``: the matched heads whose mean ablation (the null's intervention) moves
        B's predictions on the *fit* prompts most, keeping those above ``criterion.max_kl``
        (a seeded random subset when none is, or when B cannot be patched); ``"random"``: a
        seeded random subset.
    validate_layers : bool
        Also validate matched layers (``resid_post`` replacement).
    max_validate_layers : int or None
        Validate a seeded random subset of matched layers (all when None).
    validate_head_groups : bool
        Also validate every layer of B as a group: all its heads replaced at once by their
        matched partners (each through its own map), against a null that mean-ablates all of
        them. Demanding where single heads are redundant (large models), at one forward per
        layer of B for each of the two.
    max_validate_head_groups : int or None
        Validate the head groups of a seeded random subset of B's layers (all when None).
    max_scored_logits : int or None
        Without a task, score each validation batch at no more than this many logits
        (scored positions x vocabulary): when its real tokens from ``start`` on exceed it,
        evenly spaced ones of them, the same for the unpatched forward and every patch, and
        only those are unembedded (all when None).
    null_baseline : bool
        Also score a null: each validated head of B mean-ablated (its fit-set mean) instead
        of replaced by its partner. A null score near the real one means the criterion
        cannot tell a matched partner from no information (e.g. heads with little effect).
    congruity : bool
    congruity_top_k : int
        Intervened implementations per model (its top-KL heads).
    congruity_max_layers : int or None
        Rank heads of at most this many evenly spaced layers (all layers when None).
    point_n, straps : int
        Point-test triples and bootstrap repetitions (reference: 20 and 40).
    equivalent_at : float
        Matched-component verdict: "equivalent" when ``score >= equivalent_at`` and the
        paired test against the null passes (:func:`decide_paired_null`), else
        "unidentified" (or "not tested" without a null).
    null_alpha : float
        Level of that paired test (exact, two-sided, on the validated heads).
    null_unit : {"layer", "head"}
        Independent unit of the paired test: ``"layer"`` (McNemar's test for clustered data
        over B's layers, :func:`~structlens.stats.intervals.clustered_mcnemar`: its variance is
        estimated over the layers, so heads of one layer may share their fate) or ``"head"``
        (McNemar's exact test over heads, the unit the score counts; its level holds only if
        heads fail independently).
    batch_size, seed, ci
    """

    metric: str = "linear_cka_debiased"
    preprocess: Preprocess = Preprocess(exclude_bos=True)
    representation: Literal["auto", "tokens", "sentence"] = "auto"
    layer_matching: Literal["monotone", "hungarian"] = "monotone"
    head_matching: Literal["global", "per_layer"] = "global"
    map_method: Literal["ridge", "procrustes"] = "ridge"
    layer_map: Literal["auto", "procrustes", "ridge"] = "auto"
    relation: Literal["independent", "copy"] = "independent"
    layer_map_rows_per_dim: float = 10.0
    first_layer: int = 0
    criterion: ValidationCriterion = ValidationCriterion()
    similarity_threshold: float = 0.5
    heldout_fraction: float = 0.5
    validate: bool = True
    max_validate_heads: int | None = None
    head_subset: Literal["null_kl", "random"] = "null_kl"
    validate_layers: bool = True
    max_validate_layers: int | None = None
    validate_head_groups: bool = False
    max_validate_head_groups: int | None = None
    max_scored_logits: int | None = None
    null_baseline: bool = True
    congruity: bool = True
    congruity_top_k: int = 4
    congruity_max_layers: int | None = None
    point_n: int = 20
    straps: int = 40
    equivalent_at: float = 0.5
    null_alpha: float = 0.05
    null_unit: Literal["head", "layer"] = "layer"
    batch_size: int = 8
    seed: int = 0
    ci: Literal["wilson", "bootstrap"] = "wilson"

    def __post_init__(self) -> None:
        check_choices(self)
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must lie in (0, 1), got {self.heldout_fraction}.")
        if self.congruity_top_k < 1 or self.batch_size < 1:
            raise ValueError("congruity_top_k and batch_size must be positive.")
        if not 0.0 < self.null_alpha < 1.0:
            raise ValueError(f"null_alpha must lie in (0, 1), got {self.null_alpha}.")
        if self.first_layer < 0:
            raise ValueError(f"first_layer must be >= 0, got {self.first_layer}.")


@dataclasses.dataclass(frozen=True)
class MatchedComponents(Result):
    """Similarities and matchings of two models' components on one fit set.

    ``layer_similarity[la, lb]`` and ``head_similarity[la, ha, lb, hb]`` (higher = more
    similar); ``matching["layers"|"heads"]`` holds the ``method``, the matched ``pairs``
    (layers ``(la, lb)``, heads ``((la, ha), (lb, hb))``) and their ``similarities``.
    """

    layer_similarity: np.ndarray
    head_similarity: np.ndarray
    matching: dict


class Comparison:
    """Estimator: similarity matrices and component matching of two models' activations.

    Arrays in, :class:`MatchedComponents` out; the model runs that produce the arrays are
    :func:`structlens.equivalence.collect.collect_rows`, the patching validation is
    :func:`compare`.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> resid = [rng.normal(size=(40, 6)) for _ in range(2)]
    >>> heads = [rng.normal(size=(40, 2, 3)) for _ in range(2)]
    >>> m = Comparison(CompareConfig(metric="linear_cka")).fit((resid, heads), (resid, heads))
    >>> m.matching["layers"]["pairs"]
    [[0, 0], [1, 1]]
    """

    def __init__(self, config: CompareConfig | None = None) -> None:
        self.config = config or CompareConfig()

    def fit(
        self,
        acts_a: tuple[list[np.ndarray], list[np.ndarray]],
        acts_b: tuple[list[np.ndarray], list[np.ndarray]],
    ) -> MatchedComponents:
        """Match ``acts_x = (resid rows [n, d] per layer, head rows [n, H, d_head] per layer)``
        of both models on the same ``n`` rows (tokens or prompts), after ``config.preprocess``
        (position exclusion is the collector's job, so ``exclude_bos`` is not applied here)."""
        cfg = self.config
        (resid_a, z_a), (resid_b, z_b) = acts_a, acts_b
        prep = [prepare_layers(x, cfg.preprocess) for x in (resid_a, resid_b, z_a, z_b)]
        s_layers = layer_similarity_matrix(prep[0], prep[1], cfg.metric)
        s_heads = head_similarity_matrix(prep[2], prep[3], cfg.metric)
        layer_match = (
            match_monotone(s_layers)
            if cfg.layer_matching == "monotone"
            else match_hungarian(s_layers)
        )
        head_match = match_heads(
            s_heads,
            cfg.head_matching,
            layer_pairs=layer_match.pairs if cfg.head_matching == "per_layer" else None,
        )
        matching = {
            "layers": {
                "method": layer_match.method,
                "pairs": layer_match.pairs,
                "similarities": layer_match.similarities,
            },
            "heads": {
                "method": head_match.method,
                "pairs": head_match.pairs,
                "similarities": head_match.similarities,
            },
        }
        return MatchedComponents(s_layers, s_heads, matching)


@dataclasses.dataclass(frozen=True)
class ComparisonResult(Result):
    """Both estimators on one model pair.

    ``score``/``score_ci``: matched-head equivalence score and its interval;
    ``layer_score``/``layer_score_ci``: the same over matched layers (NaN when not validated);
    ``matching``: layer and head pairs with their similarities; ``validation``: one record per
    validated head pair (``pair``, ``passed``, ``kl`` nats, ``top1``, ``metric_ratio``,
    ``similarity``), ``layer_validation`` likewise; ``null_score``: the share of the same heads
    passing when mean-ablated instead (NaN without patching), ``null_validation`` its
    per-head records; ``informative``: the score restricted to the *informative* heads, those
    whose mean ablation fails the criterion (``n_heads``, ``n_passed``, ``score``,
    ``score_ci``; score NaN when there are none, i.e. the criterion cannot tell a partner
    from no information on any validated head); ``congruity``: point-test decision rates and
    p-values in both directions, selectivity scores, the top heads; ``verdicts``: each
    estimator's verdict and whether they agree, with ``matching_test`` the paired test
    behind the matched verdict (:class:`~structlens.equivalence.score.PairedNullDecision`);
    ``head_groups`` (with ``validate_head_groups``): per layer of B, all heads replaced at
    once (``pairs`` are B's layers; ``score``, ``score_ci``, ``validation``, and the same for
    the all-heads mean ablation as ``null_*``, plus ``informative`` and ``paired_test``),
    empty otherwise.  ``score_ci``/``null_score_ci`` are descriptive Wilson intervals.
    ``compared_layers``: the layers of A (``"a"``) and B (``"b"``) whose layers and heads
    were compared (``layer_similarity`` and ``head_similarity`` are NaN at the others);
    ``layer_map``: the whole-layer map and why
    (:class:`~structlens.equivalence.layer_map.LayerMapChoice`; empty when no layer was to be
    patched); ``head_selection``: how the validated heads were chosen (``method``, the fit
    prompts' mean-ablation KL of every candidate pair where measured, and ``reason``).
    """

    model_a: str
    model_b: str
    probe: str
    n_fit: int
    n_heldout: int
    representation: str
    validation_method: str
    score: float
    score_ci: list
    layer_score: float
    layer_score_ci: list
    null_score: float
    null_score_ci: list
    matching: dict
    validation: list
    layer_validation: list
    congruity: dict
    verdicts: dict
    config: dict
    layer_similarity: np.ndarray
    head_similarity: np.ndarray
    null_validation: list = dataclasses.field(default_factory=list)
    informative: dict = dataclasses.field(default_factory=dict)
    head_groups: dict = dataclasses.field(default_factory=dict)
    compared_layers: dict = dataclasses.field(default_factory=dict)
    layer_map: dict = dataclasses.field(default_factory=dict)
    head_selection: dict = dataclasses.field(default_factory=dict)

    def summary(self) -> dict:
        """The JSON payload of the CLI: scalar fields plus the layer similarity matrix (the
        4-D head similarity array stays in ``arrays.safetensors``)."""
        d = self.to_json()
        d["layer_similarity"] = self.layer_similarity.tolist()
        return d


def _score(
    pairs: list,
    sims: list[float],
    records: list[dict] | None,
    config: CompareConfig,
) -> tuple[Any, str]:
    if records is None:
        crit = ValidationCriterion(
            max_kl=None, min_top1=None, min_similarity=config.similarity_threshold
        )
        return equivalence_score(pairs, crit, similarity=sims, ci=config.ci), "similarity"
    crit = config.criterion
    kw: dict[str, Any] = {
        "kl": [r["kl"] for r in records],
        "top1": [r["top1"] for r in records],
        "similarity": sims,
    }
    if all("metric_ratio" in r for r in records):
        kw["metric_ratio"] = [r["metric_ratio"] for r in records]
    elif crit.min_metric_ratio is not None:
        raise ValueError("criterion.min_metric_ratio needs a task probe (a task metric).")
    return equivalence_score(pairs, crit, ci=config.ci, **kw), "patching"


def _informative(partner: list[dict], null: list[dict], ci: str) -> dict[str, Any]:
    """Pass rate of the partner replacement over the heads whose mean ablation fails.

    A head whose mean ablation already passes says nothing about its partner (any input
    would pass), so only the others can show that a matched partner carries the information
    B needs there.
    """
    keep = [p["passed"] for p, q in zip(partner, null, strict=True) if not q["passed"]]
    if not keep:
        return {"n_heads": 0, "n_passed": 0, "score": float("nan"), "score_ci": [float("nan")] * 2}
    k, n = int(sum(keep)), len(keep)
    lo, hi = (
        wilson_interval(k, n)
        if ci == "wilson"
        else bootstrap_interval(np.array(keep, dtype=float), 0.95, 2000, 0)
    )
    return {"n_heads": n, "n_passed": k, "score": k / n, "score_ci": [lo, hi]}


def split_prompts(
    n: int, heldout_fraction: float, rng: np.random.Generator
) -> tuple[list[int], list[int]]:
    """The split of ``n`` probe prompts by a permutation drawn from ``rng``: ``(fit, heldout)``
    indices, each sorted.  It depends on ``n`` and the generator only, never on the prompts'
    content (``compare`` draws it first from ``default_rng(seed)``)."""
    order = rng.permutation(n)
    n_held = int(round(heldout_fraction * n))
    if n_held < 2 or n - n_held < 2:
        raise ValueError(f"{n} probe prompts cannot be split into fit and held-out halves.")
    return sorted(order[n_held:].tolist()), sorted(order[:n_held].tolist())


def _compared(first: int, n_a: int, n_b: int) -> dict[str, list[int]]:
    """The layers of A and B compared from layer ``first`` on (a clear error past either)."""
    if first >= min(n_a, n_b):
        raise ValueError(
            f"first_layer={first} leaves no layer to compare: the models have {n_a} and {n_b} "
            "layers; use a smaller first_layer."
        )
    return {"a": list(range(first, n_a)), "b": list(range(first, n_b))}


def _at_model_layers(
    matched: MatchedComponents, first: int, n_a: int, n_b: int
) -> MatchedComponents:
    """``matched`` of layers ``first`` on (indices from 0) in the models' own layer numbers:
    pairs shifted by ``first``, similarity arrays of every layer with NaN at those not
    compared."""
    if first == 0:
        return matched
    s_l = np.full((n_a, n_b), np.nan)
    s_l[first:, first:] = matched.layer_similarity
    h = matched.head_similarity
    s_h = np.full((n_a, h.shape[1], n_b, h.shape[3]), np.nan)
    s_h[first:, :, first:, :] = h
    layers, heads = matched.matching["layers"], matched.matching["heads"]
    return MatchedComponents(s_l, s_h, {
        "layers": layers | {"pairs": [[la + first, lb + first] for la, lb in layers["pairs"]]},
        "heads": heads | {"pairs": [
            [[la + first, ha], [lb + first, hb]] for (la, ha), (lb, hb) in heads["pairs"]
        ]},
    })  # fmt: skip


def _select_heads(
    model_b: Model,
    probe: Probe,
    fit: list[int],
    start: int,
    pairs: list,
    raw_zb: list,
    cfg: CompareConfig,
    can_patch: bool,
    rng: np.random.Generator,
) -> tuple[list[int], dict[str, Any]]:
    """Indices into ``pairs`` of the heads to validate when capped, and how they were chosen.

    ``"null_kl"`` ranks the matched heads of B by the null's own intervention, mean ablation
    to the fit rows' mean, measured on the fit prompts only (no held-out prompt is read, so
    the choice cannot favour the heads that later pass or fail), and keeps the
    ``max_validate_heads`` largest KLs above ``criterion.max_kl`` (heads whose ablation
    moves B at all); when none does, or B cannot be patched, a seeded random subset.
    """
    k = int(cfg.max_validate_heads or len(pairs))
    record: dict[str, Any] = {"method": cfg.head_subset, "prompts": "fit"}
    if cfg.head_subset == "null_kl" and can_patch:
        heads = [(int(lb), int(hb)) for _, (lb, hb) in pairs]
        context = probe.context_b
        kl = null_kl(model_b, probe.tokens_b, fit, probe.task_b, start, heads, raw_zb,
                     cfg.batch_size, context, max_logits=cfg.max_scored_logits)  # fmt: skip
        max_kl = cfg.criterion.max_kl if cfg.criterion.max_kl is not None else 0.1
        grid = np.zeros((max(lb for lb, _ in heads) + 1, max(hb for _, hb in heads) + 1))
        for (lb, hb), v in zip(heads, kl, strict=True):
            grid[lb, hb] = v
        pick = informative_heads(grid, pairs, k, max_kl)
        record["fit_null_kl"] = kl
        if pick:
            reason = (
                f"the {len(pick)} matched heads of B whose mean ablation moves it most on the "
                f"fit prompts (KL > {max_kl:g} nats)"
            )
            return pick, record | {"reason": reason}
        record["reason"] = (
            f"no matched head's mean ablation moves B by more than {max_kl:g} nats on the fit "
            "prompts: a seeded random subset"
        )
    elif cfg.head_subset == "null_kl":
        record["reason"] = "B cannot be patched (no null to rank by): a seeded random subset"
    else:
        record["reason"] = "a seeded random subset"
    record["method"] = "random"
    return sorted(int(i) for i in rng.choice(len(pairs), k, replace=False)), record


def compare(
    model_a: Model, model_b: Model, probe: Probe, config: CompareConfig | None = None
) -> ComparisonResult:
    """Compare two models on a probe set with both estimators (module docstring).

    Parameters
    ----------
    model_a, model_b : Model
        Loaded models; B is the model whose components get replaced in validation.
    probe : Probe
        From :func:`task_probe` or :func:`corpus_probe` (same inputs for both models).
    config : CompareConfig, optional
    """
    cfg = config or CompareConfig()
    n = len(probe.texts)
    rep = cfg.representation
    if rep == "auto":
        rep = "tokens" if probe.shared_tokens else "sentence"
    if rep == "tokens" and not probe.shared_tokens:
        raise ValueError(
            "token-level comparison needs identical token sequences in both models; the "
            "tokenizers differ, so use representation='sentence'."
        )
    rng = np.random.default_rng(cfg.seed)
    fit, heldout = split_prompts(n, cfg.heldout_fraction, rng)
    layers = _compared(cfg.first_layer, model_a.n_output_layers, model_b.n_output_layers)
    start = 1 if cfg.preprocess.exclude_bos else 0
    sentence = rep == "sentence"

    def context(c: list[list[int]] | None) -> list[list[int]] | None:
        return None if c is None else [c[i] for i in fit]

    raw_a, raw_za = collect_rows(
        model_a, [probe.tokens_a[i] for i in fit], start, sentence, cfg.batch_size,
        context(probe.context_a),
    )  # fmt: skip
    raw_b, raw_zb = collect_rows(
        model_b, [probe.tokens_b[i] for i in fit], start, sentence, cfg.batch_size,
        context(probe.context_b),
    )  # fmt: skip
    first = cfg.first_layer
    matched = _at_model_layers(
        Comparison(cfg).fit((raw_a[first:], raw_za[first:]), (raw_b[first:], raw_zb[first:])),
        first, len(raw_a), len(raw_b),
    )  # fmt: skip
    s_heads, matching = matched.head_similarity, matched.matching
    head_pairs, head_sims = matching["heads"]["pairs"], matching["heads"]["similarities"]
    cong = run_congruity(model_a, model_b, probe, cfg) if cfg.congruity else {}
    can_patch = cfg.validate and not sentence and model_b.causal
    selection: dict[str, Any] = {}
    if cfg.max_validate_heads is not None and cfg.max_validate_heads < len(head_pairs):
        pick, selection = _select_heads(
            model_b, probe, fit, start, head_pairs, raw_zb, cfg, can_patch, rng
        )
        head_pairs = [head_pairs[i] for i in pick]
        head_sims = [head_sims[i] for i in pick]
    layer_pairs, layer_sims = matching["layers"]["pairs"], matching["layers"]["similarities"]
    if cfg.max_validate_layers is not None and cfg.max_validate_layers < len(layer_pairs):
        pick = sorted(rng.choice(len(layer_pairs), cfg.max_validate_layers, replace=False).tolist())
        layer_pairs = [layer_pairs[i] for i in pick]
        layer_sims = [layer_sims[i] for i in pick]
    group_source = matching["heads"]["pairs"]
    group_selection: dict[str, Any] = {}
    n_groups = len({int(lb) for _, (lb, _) in group_source})
    if (
        can_patch
        and cfg.validate_head_groups
        and cfg.max_validate_head_groups is not None
        and cfg.max_validate_head_groups < n_groups
    ):
        layers_b = sorted({int(lb) for _, (lb, _) in group_source})
        drawn = rng.choice(len(layers_b), cfg.max_validate_head_groups, replace=False)
        chosen = {layers_b[i] for i in drawn.tolist()}
        group_source = [p for p in group_source if int(p[1][0]) in chosen]
        group_selection = {"method": "random", "of": n_groups}
    layer_map = None
    if can_patch and cfg.validate_layers:
        (rows, width_a), width_b = raw_a[first].shape, raw_b[first].shape[1]
        layer_map = choose_layer_map(
            rows, width_a, width_b, cfg.layer_map, cfg.relation, cfg.layer_map_rows_per_dim
        )
    validate_layers = layer_map is not None and layer_map.method is not None
    head_records = layer_records = null_records = None
    head_groups: dict[str, Any] = {}
    if can_patch:
        w = validation_writers(
            cfg, head_pairs, group_source, layer_pairs,
            (raw_a, raw_b, raw_za, raw_zb), start, model_b.dtype,
            (model_a.output_stack, model_b.output_stack),
            layer_map.method if layer_map is not None else None,
        )  # fmt: skip
        del raw_a, raw_b, raw_za, raw_zb  # the maps are fitted; the patched runs need no rows
        records = validate_patches(
            model_a, model_b, probe.tokens_b, heldout, probe.task_b, start, w.all(), w.a_sites,
            cfg.batch_size, context_a=probe.context_a, context_b=probe.context_b,
            max_logits=cfg.max_scored_logits,
        )  # fmt: skip
        nh, nl, nn = len(w.heads), len(w.layers), len(w.nulls)
        group_pairs = sorted(w.by_layer)
        head_records = records[:nh]
        layer_records = records[nh : nh + nl] if validate_layers else None
        null_records = records[nh + nl : nh + nl + nn] if cfg.null_baseline else None
        if group_pairs:
            sims = [
                float(np.mean([s_heads[la, ha, lb, hb] for la, ha, hb in w.by_layer[lb]]))
                for lb in group_pairs
            ]
            rest = records[nh + nl + nn :]
            group, _ = _score(group_pairs, sims, rest[: len(group_pairs)], cfg)
            group_null, _ = _score(group_pairs, sims, rest[len(group_pairs) :], cfg)
            head_groups = {
                "pairs": group_pairs,
                "score": group.score,
                "score_ci": group.score_ci,
                "validation": group.validation,
                "null_score": group_null.score,
                "null_score_ci": group_null.score_ci,
                "null_validation": group_null.validation,
                "informative": _informative(group.validation, group_null.validation, cfg.ci),
                "paired_test": decide_paired_null(
                    [v["passed"] for v in group.validation],
                    [v["passed"] for v in group_null.validation],
                    alpha=cfg.null_alpha,
                    min_score=cfg.equivalent_at,
                ).to_json(),
            } | ({"selection": group_selection} if group_selection else {})
    head_score, method = _score(head_pairs, head_sims, head_records, cfg)
    informative: dict[str, Any] = {}
    if null_records is not None:
        null = _score(head_pairs, head_sims, null_records, cfg)[0]
        n_score, n_ci, n_val = null.score, null.score_ci, null.validation
        informative = _informative(head_score.validation, n_val, cfg.ci)
    else:
        n_score, n_ci, n_val = float("nan"), [float("nan"), float("nan")], []
    if layer_records is not None or not can_patch:
        layer_score, _ = _score(layer_pairs, layer_sims, layer_records, cfg)
        l_score, l_ci, l_val = layer_score.score, layer_score.score_ci, layer_score.validation
    else:
        l_score, l_ci, l_val = float("nan"), [float("nan"), float("nan")], []
    # partner and null outcomes are paired by head: the verdict is the paired test's
    paired = decide_paired_null(
        [v["passed"] for v in head_score.validation],
        [v["passed"] for v in n_val] if n_val else None,
        alpha=cfg.null_alpha,
        min_score=cfg.equivalent_at,
        clusters=component_clusters([v["pair"] for v in head_score.validation], cfg.null_unit),
    )
    verdicts: dict[str, Any] = {
        "matching": paired.verdict,
        "matching_reason": paired.reason,
        "matching_test": paired.to_json(),
    }
    matching_verdict = paired.verdict
    if cong:
        # no detected difference is not evidence of equivalence: the point test has no null
        verdicts["congruity"] = "different" if cong["different"] else "unidentified"
        verdicts["agree"] = verdicts["congruity"] == matching_verdict
    return ComparisonResult(
        model_a=model_a.name,
        model_b=model_b.name,
        probe=probe.name,
        n_fit=len(fit),
        n_heldout=len(heldout),
        representation=rep,
        validation_method=method,
        score=head_score.score,
        score_ci=head_score.score_ci,
        layer_score=l_score,
        layer_score_ci=l_ci,
        null_score=n_score,
        null_score_ci=n_ci,
        matching=matching,
        validation=head_score.validation,
        layer_validation=l_val,
        congruity=cong,
        verdicts=verdicts,
        config=dataclasses.asdict(cfg),
        layer_similarity=matched.layer_similarity,
        head_similarity=s_heads,
        null_validation=n_val,
        informative=informative,
        head_groups=head_groups,
        compared_layers=layers,
        layer_map={} if layer_map is None else dataclasses.asdict(layer_map),
        head_selection=selection,
    )

"""The equivalence stages: the only code that turns two models into equivalence numbers.

Each stage is a function ``(protocol, models, ...) -> Result`` of a frozen, typed result; the
``equiv`` CLI, ``structlens analyze`` and the replication call these and only render what they
return, so one :class:`~structlens.equivalence.protocol.EquivalenceProtocol` gives one answer
whichever driver runs it.

:func:`analysis` is ``structlens analyze``'s stage: the sanity check and, when asked, a
comparison with a second model, as one :class:`ModelAnalysis`.

The model runs are :func:`measure` (:func:`structlens.equivalence.compare.compare` under the
protocol's settings; its :class:`~structlens.equivalence.compare.ComparisonResult` holds every
per-component record and is what a driver caches); :func:`summarize` turns those records into
a :class:`ModelComparison` (scores, nulls, the paired decision, the representational score,
CONGRUITY and caveats).  A stage takes ``measure=`` so that a driver can put its cache, or a
recorder, in front of the model runs without changing what is computed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from structlens.equivalence.compare import ComparisonResult, compare
from structlens.equivalence.layer_map import LayerMapChoice
from structlens.equivalence.probes import Probe, corpus_probe, task_probe
from structlens.equivalence.protocol import EquivalenceProtocol
from structlens.equivalence.score import (
    PairedNullDecision,
    component_clusters,
    decide_paired_null,
    representational_score,
)
from structlens.results import Result

if TYPE_CHECKING:
    from structlens.equivalence.train_small import SmallLMConfig

__all__ = [
    "Caveat",
    "RateScore",
    "ComponentScores",
    "CongruityEstimate",
    "CongruityScores",
    "ModelComparison",
    "SanityCheck",
    "probe_for",
    "measure",
    "summarize",
    "compare_models",
    "sanity",
    "congruity_only",
    "ModelAnalysis",
    "analysis",
    "FoldCheck",
    "fold_check",
    "SmallLMTraining",
    "small_lm",
    "FineTuneTraining",
    "finetune",
]

Measure = Callable[[EquivalenceProtocol, Any, Any, Probe], ComparisonResult]


@dataclass(frozen=True)
class Caveat:
    """A caveat of a stage result: a machine-readable ``kind`` and a one-line ``message``."""

    kind: str
    message: str


@dataclass(frozen=True)
class RateScore(Result):
    """A pass rate ``n_passed / n`` with its descriptive interval (``score`` NaN when
    ``n == 0``)."""

    n: int
    n_passed: int
    score: float
    score_ci: tuple[float, float]


@dataclass(frozen=True)
class ComponentScores(Result):
    """Validation of one kind of component (``kind``: heads, layers or head_groups).

    ``pairs`` are the validated pairs in order (heads ``((la, ha), (lb, hb))``, layers
    ``(la, lb)``, head groups B's layers); ``passed``, ``kl`` (nats), ``top1`` and
    ``similarity`` one value per pair (``kl``/``top1`` empty without patching).  ``null_*``:
    the same components mean-ablated (``None`` without a null); ``informative``: the score
    over the components whose null fails; ``decision``: McNemar's exact paired test of
    partner against null (:func:`~structlens.equivalence.score.decide_paired_null`).
    """

    kind: str
    method: str
    pairs: list
    passed: tuple[bool, ...]
    kl: tuple[float, ...]
    top1: tuple[float, ...]
    similarity: tuple[float, ...]
    score: float
    score_ci: tuple[float, float]
    null_passed: tuple[bool, ...] | None
    null_score: float | None
    null_score_ci: tuple[float, float] | None
    informative: RateScore | None
    decision: PairedNullDecision


@dataclass(frozen=True)
class CongruityEstimate(Result):
    """CONGRUITY's statistics under one way of averaging per-coordinate ``R^2``.

    Attributes
    ----------
    multioutput : {"uniform_average", "variance_weighted"}
        How the encoding ``R^2`` of each target coordinate were combined
        (:class:`~structlens.equivalence.encoding.EncodingConfig`): the reference's uniform
        mean, which changes when the encoded representation's basis is rotated, or the
        variance-weighted one ``1 - Σ SS_res / Σ SS_tot``, which does not.
    decision_rate_ab, decision_rate_ba : float
        Share of the point test's straps calling the models different, A's group first
        (A → B) and B's first (B → A).
    mean_p_ab, mean_p_ba : float
        Mean over straps of the share of triples whose within-group encoding wins.
    selectivity_ab, selectivity_ba : float
        Selectivity scores (A's interventions against B's implementations, and back).
    base_r2_ab, base_r2_ba : float
        Held-out ``R^2`` of A's clean accumulated residual encoding B's, and back (NaN in a
        result recorded before this was measured).
    decision : str
        "different" when either decision rate exceeds 0.5, else "unidentified".
    """

    multioutput: str
    decision_rate_ab: float
    decision_rate_ba: float
    mean_p_ab: float
    mean_p_ba: float
    selectivity_ab: float
    selectivity_ba: float
    base_r2_ab: float
    base_r2_ba: float
    decision: str


@dataclass(frozen=True)
class CongruityScores(Result):
    """CONGRUITY in both directions: point-test decision rates (share of straps calling the
    models different) and mean p-values, selectivity scores, the top-KL heads of each model;
    ``decision`` is "different" when either rate exceeds 0.5, else "unidentified" (the test
    has no null, so no detected difference is no evidence of equivalence).  ``caveat`` says
    when the encodings were reduced to ``reduced_to`` principal components of the fit rows.

    The flat scores and ``decision`` use the reference's estimator, the uniform average of
    per-coordinate ``R^2`` (pre-registered; :attr:`uniform`); ``variance_weighted`` holds the
    same statistics on the same triples with variance-weighted ``R^2``, reported beside them
    and never deciding (``None`` in a result recorded before it was measured).
    ``base_r2_ab`` / ``base_r2_ba``: uniform held-out ``R^2`` of A's clean accumulated
    residual encoding B's, and back.
    """

    representation: str
    intervention: str
    decision_rate_ab: float
    decision_rate_ba: float
    mean_p_ab: float
    mean_p_ba: float
    selectivity_ab: float
    selectivity_ba: float
    top_heads_a: list
    top_heads_b: list
    top_kl_a: list
    top_kl_b: list
    decision: str
    reason: str
    reduced_to: int | None
    caveat: str | None
    base_r2_ab: float = float("nan")
    base_r2_ba: float = float("nan")
    variance_weighted: CongruityEstimate | None = None

    @property
    def uniform(self) -> CongruityEstimate:
        """The flat scores (the reference's uniform average) as a :class:`CongruityEstimate`."""
        return CongruityEstimate(
            multioutput="uniform_average",
            decision_rate_ab=self.decision_rate_ab, decision_rate_ba=self.decision_rate_ba,
            mean_p_ab=self.mean_p_ab, mean_p_ba=self.mean_p_ba,
            selectivity_ab=self.selectivity_ab, selectivity_ba=self.selectivity_ba,
            base_r2_ab=self.base_r2_ab, base_r2_ba=self.base_r2_ba, decision=self.decision,
        )  # fmt: skip

    @property
    def estimates(self) -> tuple[CongruityEstimate, ...]:
        """The uniform estimate (the decision's) and the variance-weighted one, if measured."""
        return (self.uniform,) + ((self.variance_weighted,) if self.variance_weighted else ())


@dataclass(frozen=True)
class ModelComparison(Result):
    """Both estimators on one model pair under one protocol (``protocol`` is its key).

    ``heads`` is the matched-head validation (the score's component), ``layers`` and
    ``head_groups`` the whole-layer validations (``None`` where not run); ``representational``
    the share of validated head pairs whose similarity reaches the protocol's threshold;
    ``decision`` and ``decision_reason`` the paired test on the heads ("equivalent",
    "unidentified" or "not tested"); ``agree`` whether CONGRUITY's decision is the same
    (``None`` without CONGRUITY); ``caveats`` everything a reader must know to trust it.
    ``matched_layer_similarity`` / ``matched_head_similarity``: the similarity of every
    matched pair (validated or not), in matching order.  ``compared_layers``: the layers of
    A (``"a"``) and B (``"b"``) whose layers and heads were compared (all, or a fine-tune's
    trained ones); ``layer_map``: the whole-layer map and why (``None`` when no layer was to
    be patched); ``head_selection``: how the validated heads were chosen when capped (empty
    when every matched head was validated).
    """

    model_a: str
    model_b: str
    probe: str
    n_fit: int
    n_heldout: int
    representation: str
    heads: ComponentScores
    layers: ComponentScores | None
    head_groups: ComponentScores | None
    representational: RateScore
    congruity: CongruityScores | None
    decision: str
    decision_reason: str
    agree: bool | None
    layer_similarity: np.ndarray
    matched_layer_similarity: tuple[float, ...]
    matched_head_similarity: tuple[float, ...]
    caveats: tuple[Caveat, ...]
    protocol: str
    compared_layers: dict | None = None
    layer_map: LayerMapChoice | None = None
    head_selection: dict | None = None


@dataclass(frozen=True)
class SanityCheck(Result):
    """The model against its rotated, head-permuted copy, whose answer is known (equivalent).

    ``max_abs_logit_diff``: largest logit change of the copy on the probe's first batch
    (0 up to float round-off: the copy is the same function); ``heads_recovered``: share of
    matched heads that are the planted partner; ``passed``: the copy is recovered (the head
    score's interval reaches ``equivalent_at`` and the paired test decides "equivalent"),
    with ``reason``.  A failed check means the method, not the model, is at fault.

    ``unrotated``: CONGRUITY of the model against its head-permuted copy with the basis kept
    (the same head permutation and folded gains, no rotation; also known to be equivalent),
    ``unrotated_max_abs_logit_diff`` that copy's logit change; both ``None`` when the
    protocol runs no CONGRUITY.  The two copies differ by the rotation only, so CONGRUITY
    answering differently on them is the basis's doing: the matched-component estimator is
    basis-free by construction (rotation-invariant CKA, heads that are not rotated), so only
    CONGRUITY is run on the unrotated copy.
    """

    comparison: ModelComparison
    rotation_seed: int
    max_abs_logit_diff: float
    heads_recovered: float
    passed: bool
    reason: str
    unrotated: CongruityScores | None = None
    unrotated_max_abs_logit_diff: float | None = None


def probe_for(protocol: EquivalenceProtocol, model_a: Any, model_b: Any) -> Probe:
    """The protocol's probe set for two models (corpus sentences, or a circuit task)."""
    if protocol.probe == "corpus":
        return corpus_probe(
            model_a, model_b, n=protocol.probe_prompts, encoder_context=protocol.encoder_context
        )
    return task_probe(
        model_a, model_b, protocol.probe, n=protocol.probe_prompts, seed=protocol.seed
    )


def measure(
    protocol: EquivalenceProtocol, model_a: Any, model_b: Any, probe: Probe
) -> ComparisonResult:
    """The model runs: matching, patching validation and CONGRUITY of ``model_b`` against
    ``model_a`` on ``probe`` under the protocol (the records :func:`summarize` reads)."""
    return compare(model_a, model_b, probe, protocol.compare_config())


def _ci(values: Sequence[float]) -> tuple[float, float]:
    lo, hi = (float(v) for v in values)
    return lo, hi


def _rate(d: dict[str, Any]) -> RateScore | None:
    if not d:
        return None
    return RateScore(int(d["n_heads"]), int(d["n_passed"]), float(d["score"]), _ci(d["score_ci"]))


def _components(
    protocol: EquivalenceProtocol,
    kind: str,
    method: str,
    records: list[dict],
    null_records: list[dict] | None,
    informative: dict[str, Any],
    score_ci: Sequence[float],
    null_ci: Sequence[float] | None,
    pairs: list | None = None,
) -> ComponentScores:
    passed = tuple(bool(r["passed"]) for r in records)
    null = tuple(bool(r["passed"]) for r in null_records) if null_records else None
    decision = decide_paired_null(
        list(passed), list(null) if null else None,
        alpha=protocol.null_alpha, min_score=protocol.equivalent_at,
        clusters=component_clusters([r["pair"] for r in records], protocol.null_unit),
    )  # fmt: skip
    return ComponentScores(
        kind=kind,
        method=method,
        pairs=pairs if pairs is not None else [r["pair"] for r in records],
        passed=passed,
        kl=tuple(float(r["kl"]) for r in records if "kl" in r),
        top1=tuple(float(r["top1"]) for r in records if "top1" in r),
        similarity=tuple(float(r["similarity"]) for r in records),
        score=float(np.mean(passed)),
        score_ci=_ci(score_ci),
        null_passed=null,
        null_score=float(np.mean(null)) if null else None,
        null_score_ci=_ci(null_ci) if null and null_ci is not None else None,
        informative=_rate(informative),
        decision=decision,
    )


def _congruity(c: dict[str, Any]) -> CongruityScores | None:
    if not c:
        return None
    ab, ba = c["point_test_ab"], c["point_test_ba"]
    rate = max(ab["decision_rate"], ba["decision_rate"])
    decision = "different" if c["different"] else "unidentified"
    reason = (
        f"the point test calls the models different in {rate:.0%} of straps (> 50%)"
        if c["different"]
        else f"the point test calls them different in at most {rate:.0%} of straps; it has "
        "no null, so finding no difference is no evidence of equivalence"
    )
    w = c.get("variance_weighted")
    weighted = None
    if w:
        wab, wba = w["point_test_ab"], w["point_test_ba"]
        weighted = CongruityEstimate(
            multioutput="variance_weighted",
            decision_rate_ab=float(wab["decision_rate"]),
            decision_rate_ba=float(wba["decision_rate"]),
            mean_p_ab=float(wab["mean_p"]), mean_p_ba=float(wba["mean_p"]),
            selectivity_ab=float(w["selectivity_ab"]), selectivity_ba=float(w["selectivity_ba"]),
            base_r2_ab=float(w["base_r2_ab"]), base_r2_ba=float(w["base_r2_ba"]),
            decision="different" if w["different"] else "unidentified",
        )  # fmt: skip
    nan = float("nan")
    return CongruityScores(
        representation=c["representation"], intervention=c["intervention"],
        decision_rate_ab=float(ab["decision_rate"]), decision_rate_ba=float(ba["decision_rate"]),
        mean_p_ab=float(ab["mean_p"]), mean_p_ba=float(ba["mean_p"]),
        selectivity_ab=float(c["selectivity_ab"]), selectivity_ba=float(c["selectivity_ba"]),
        top_heads_a=c["top_heads_a"], top_heads_b=c["top_heads_b"],
        top_kl_a=c["top_kl_a"], top_kl_b=c["top_kl_b"],
        decision=decision, reason=reason,
        reduced_to=c.get("reduced_to"), caveat=c.get("caveat"),
        base_r2_ab=float(c.get("base_r2_ab", nan)), base_r2_ba=float(c.get("base_r2_ba", nan)),
        variance_weighted=weighted,
    )  # fmt: skip


def _caveats(
    heads: ComponentScores, cong: CongruityScores | None, layer_map: LayerMapChoice | None
) -> tuple[Caveat, ...]:
    out = []
    if layer_map is not None and layer_map.method is None:
        out.append(Caveat("layers_not_validated", layer_map.reason))
    d = heads.decision
    if (
        heads.null_passed is not None
        and d.verdict != "equivalent"
        and d.partner_only <= d.null_only
    ):
        out.append(
            Caveat(
                "null_passes",
                f"mean-ablating B's heads passes as often as the matched partners (partner "
                f"only on {d.partner_only} heads, null only on {d.null_only}; {d.test}: "
                f"p = {d.p_value:.3g}; null {heads.null_score:.2f} vs score {heads.score:.2f}): "
                "the score does not show that the partners carry the mechanism",
            )
        )
    if heads.method == "similarity":
        out.append(
            Caveat(
                "no_patching",
                "no patching was possible (different token sequences, a non-causal B or "
                "validation off): the score is the share of matched heads whose similarity "
                "reaches the threshold, and it has no null",
            )
        )
    if cong is not None and cong.caveat:
        out.append(Caveat("encoding_reduced", cong.caveat))
    return tuple(out)


def summarize(protocol: EquivalenceProtocol, raw: ComparisonResult) -> ModelComparison:
    """The typed comparison of one model pair from its records (:func:`measure`)."""
    null = raw.null_validation or None
    heads = _components(
        protocol, "heads", raw.validation_method, raw.validation, null, raw.informative,
        raw.score_ci, raw.null_score_ci,
    )  # fmt: skip
    layers = None
    if raw.layer_validation:
        layers = _components(
            protocol, "layers", raw.validation_method, raw.layer_validation, None, {},
            raw.layer_score_ci, None,
        )  # fmt: skip
    groups = None
    if g := raw.head_groups:
        groups = _components(
            protocol, "head_groups", raw.validation_method, g["validation"], g["null_validation"],
            g["informative"], g["score_ci"], g["null_score_ci"], pairs=g["pairs"],
        )  # fmt: skip
    rs = representational_score(
        heads.pairs, list(heads.similarity), protocol.representational_min_similarity,
        ci=protocol.ci,
    )  # fmt: skip
    cong = _congruity(raw.congruity)
    layer_map = LayerMapChoice(**raw.layer_map) if raw.layer_map else None
    return ModelComparison(
        model_a=raw.model_a,
        model_b=raw.model_b,
        probe=raw.probe,
        n_fit=int(raw.n_fit),
        n_heldout=int(raw.n_heldout),
        representation=raw.representation,
        heads=heads,
        layers=layers,
        head_groups=groups,
        representational=RateScore(rs.n_matched, rs.n_passed, rs.score, _ci(rs.score_ci)),
        congruity=cong,
        decision=heads.decision.verdict,
        decision_reason=heads.decision.reason,
        agree=None if cong is None else cong.decision == heads.decision.verdict,
        layer_similarity=np.asarray(raw.layer_similarity, dtype=np.float64),
        matched_layer_similarity=tuple(float(v) for v in raw.matching["layers"]["similarities"]),
        matched_head_similarity=tuple(float(v) for v in raw.matching["heads"]["similarities"]),
        caveats=_caveats(heads, cong, layer_map),
        protocol=protocol.key(),
        compared_layers=raw.compared_layers or None,
        layer_map=layer_map,
        head_selection=raw.head_selection or None,
    )


def compare_models(
    protocol: EquivalenceProtocol,
    model_a: Any,
    model_b: Any,
    *,
    probe: Probe | None = None,
    measure: Measure = measure,
) -> ModelComparison:
    """Compare ``model_b`` (whose components get replaced) with ``model_a`` on the protocol's
    probe (or ``probe``)."""
    probe = probe if probe is not None else probe_for(protocol, model_a, model_b)
    return summarize(protocol, measure(protocol, model_a, model_b, probe))


def _logit_gap(protocol: EquivalenceProtocol, model: Any, twin: Any, probe: Probe) -> float:
    """Largest absolute difference of the two models' outputs at every real token of the
    first batch of probe prompts (only those rows are unembedded), or at as many evenly
    spaced ones as ``protocol.max_scored_logits`` allows."""
    import torch

    from structlens.equivalence.collect import forward
    from structlens.equivalence.patching import rows_within

    tokens = probe.tokens_a[: protocol.batch_size]
    rows = rows_within(model, protocol.max_scored_logits)
    with torch.no_grad():
        a, _ = forward(model, tokens, rows_from=0, max_rows=rows)
        b, _ = forward(twin, tokens, rows_from=0, max_rows=rows)
    return float((a.double() - b.double()).abs().max())


def congruity_only(protocol: EquivalenceProtocol) -> EquivalenceProtocol:
    """``protocol`` with every patching validation and the null turned off: what a
    :func:`measure` call needs to run CONGRUITY exactly as ``protocol`` runs it (CONGRUITY
    reads none of the fields changed), plus the cheap matching, and nothing else."""
    return protocol.replace(
        validate=False, validate_layers=False, validate_head_groups=False, null="none",
        max_validate_heads=None, max_validate_layers=None,
    )  # fmt: skip


def _unrotated(
    protocol: EquivalenceProtocol, model: Any, probe: Probe, measure: Measure
) -> tuple[CongruityScores | None, float | None]:
    """CONGRUITY of ``model`` against its head-permuted, unrotated copy, and that copy's
    logit gap (``(None, None)`` when the protocol runs no CONGRUITY)."""
    from structlens.equivalence.scenarios import rotate_and_permute

    if not protocol.congruity:
        return None, None
    plain, _, _ = rotate_and_permute(model, seed=protocol.rotation_seed, rotate=False)
    raw = measure(congruity_only(protocol), model, plain, probe)
    return _congruity(raw.congruity), _logit_gap(protocol, model, plain, probe)


def sanity(protocol: EquivalenceProtocol, model: Any, *, measure: Measure = measure) -> SanityCheck:
    """``model`` against its rotated, head-permuted copy (seed ``protocol.rotation_seed``),
    under ``protocol`` with ``relation="copy"``: the copy shares the model's residual basis up
    to the rotation, which is what its whole-layer maps assume.

    With CONGRUITY on, CONGRUITY also runs against the copy with the same head permutation
    but the residual basis kept (:attr:`SanityCheck.unrotated`): the matched-component
    estimator cannot depend on the basis, CONGRUITY's uniform ``R^2`` can, and the two copies
    differ by the rotation only.  The unrotated copy's run goes through ``measure`` too, under
    :func:`congruity_only` (no patching), so a driver's cache keeps it.

    Raises ``ValueError`` for models the fold does not support (LayerNorm models).
    """
    from structlens.equivalence.scenarios import rotate_and_permute

    protocol = protocol.replace(relation="copy")
    twin, head_map, _ = rotate_and_permute(model, seed=protocol.rotation_seed)
    probe = probe_for(protocol, model, twin)
    raw = measure(protocol, model, twin, probe)
    res = summarize(protocol, raw)
    unrotated, unrotated_gap = _unrotated(protocol, model, probe, measure)
    pairs = raw.matching["heads"]["pairs"]
    found = [la == lb and head_map[la][ha] == hb for (la, ha), (lb, hb) in pairs]
    lo = res.heads.score_ci[0]
    if res.decision == "equivalent" and lo >= protocol.equivalent_at:
        passed, reason = True, f"head score interval reaches {lo:.2f} >= {protocol.equivalent_at}"
    else:
        passed, reason = (
            False,
            (
                f"the copy is the same function, yet the decision is {res.decision!r} and the head "
                f"score's interval starts at {lo:.2f} (need >= {protocol.equivalent_at}): do not "
                "trust comparisons under this protocol"
            ),
        )
    return SanityCheck(
        comparison=res,
        rotation_seed=protocol.rotation_seed,
        max_abs_logit_diff=_logit_gap(protocol, model, twin, probe),
        heads_recovered=float(np.mean(found)) if found else float("nan"),
        passed=passed,
        reason=reason,
        unrotated=unrotated,
        unrotated_max_abs_logit_diff=unrotated_gap,
    )


@dataclass(frozen=True)
class ModelAnalysis(Result):
    """What ``structlens analyze`` measures of one model under ``protocol``: the sanity check
    (``None`` when it could not run, ``sanity_error`` says why: a LayerNorm model, too few
    probe tokens) and the comparison with a second model (``None`` when none was given)."""

    protocol: EquivalenceProtocol
    sanity: SanityCheck | None
    sanity_error: str | None
    compare: ModelComparison | None


def analysis(
    protocol: EquivalenceProtocol,
    model: Any,
    *,
    compare: str | None = None,
    device: str = "cpu",
    step: Callable[[str], None] = lambda what: None,
) -> ModelAnalysis:
    """``model`` against a rotated, head-permuted copy of itself (the answer is known:
    equivalent) and against the model named ``compare`` (loaded on ``device`` at the
    protocol's seed) when given; ``step(what)`` is called before each of the two."""
    from structlens.errors import InputError
    from structlens.models import load_model

    step("sanity copy")
    check, error = None, None
    try:
        check = sanity(protocol, model)
    except (ValueError, InputError) as err:  # a LayerNorm model; too few probe tokens
        error = str(err)
    other = None
    if compare:
        step(f"vs {compare}")
        b = load_model(compare, device=device, seed=protocol.seed)
        other = compare_models(protocol, model, b)
    return ModelAnalysis(protocol=protocol, sanity=check, sanity_error=error, compare=other)


@dataclass(frozen=True)
class FoldCheck(Result):
    """The rotated, head-permuted copy on one prompt, site by site: the largest logit change
    (against the largest logit), whether every top-1 token is unchanged, the largest change of
    a moved head's ``hook_z`` at ``layer`` and of ``resid_post · R`` against the copy's
    residual (against the largest residual entry)."""

    layer: int
    max_abs_logit_diff: float
    max_abs_logit: float
    top1_unchanged: bool
    max_abs_z_diff: float
    max_abs_resid_rotation_error: float
    max_abs_resid: float


def fold_check(model: Any, prompt: str, *, seed: int, layer: int) -> FoldCheck:
    """Whether the fold of :func:`~structlens.equivalence.scenarios.rotate_and_permute`
    preserves the function at the logits, the moved heads and the rotated residual stream."""
    from structlens.equivalence.scenarios import rotate_and_permute
    from structlens.interventions import run_with_cache
    from structlens.sites import site_name

    twin, head_map, r = rotate_and_permute(model, seed=seed)
    ids, mask = model.tokenize([prompt])
    z, resid = site_name("z", layer), site_name("resid_post", layer)
    la, ca = run_with_cache(model, ids, mask, [z, resid])
    lb, cb = run_with_cache(twin, ids, mask, [z, resid])
    return FoldCheck(
        layer=layer,
        max_abs_logit_diff=float((la - lb).abs().max()),
        max_abs_logit=float(la.abs().max()),
        top1_unchanged=bool((la.argmax(-1) == lb.argmax(-1)).all()),
        max_abs_z_diff=max(
            float((ca[z][:, :, h] - cb[z][:, :, head_map[layer][h]]).abs().max())
            for h in range(model.n_heads)
        ),
        max_abs_resid_rotation_error=float((ca[resid] @ r - cb[resid]).abs().max()),
        max_abs_resid=float(ca[resid].abs().max()),
    )


@dataclass(frozen=True)
class SmallLMTraining(Result):
    """The training record of one small byte-level LM (the ``train.json`` of
    :func:`~structlens.equivalence.train_small.train_small_lm`): its config, the training and
    held-out loss curves ``[[step, nats/byte]]``, the steps run, whether the stopping rule
    fired (``None`` without held-out evaluations) and the wall seconds."""

    config: dict[str, Any]
    loss: list[list[float]]
    held_out_loss: list[list[float]]
    steps_run: int
    converged: bool | None
    seconds: float

    @property
    def plateaued(self) -> bool:
        """The stopping rule ended the run before its step budget (a stall at the budget's
        last evaluation is the cosine schedule reaching 0, not a plateau)."""
        return bool(self.converged) and self.steps_run < self.config["steps"]


def small_lm(config: SmallLMConfig, folder: Path) -> SmallLMTraining:
    """Train the small LM of ``config`` into ``folder / "model"`` (a loadable model)."""
    import json

    from structlens.equivalence.train_small import train_small_lm

    path = train_small_lm(config, folder / "model")
    return SmallLMTraining(**json.loads((path / "train.json").read_text()))


@dataclass(frozen=True)
class FineTuneTraining(Result):
    """The training record of one fine-tune (``finetune_scenario`` of
    :mod:`structlens.equivalence.scenarios`): its task and settings, the loss of every step
    (nats), the held-out KL curve ``[[step, KL(base ‖ tuned)]]``, the steps run, whether the
    target KL was reached and the wall seconds."""

    task: str
    n_prompts: int
    n_train: int
    steps: int
    lr: float
    batch_size: int
    train_layers: list[int]
    eval_every: int
    seed: int
    losses: list[float]
    held_out_kl: list[list[float]]
    target_kl: float
    steps_run: int
    reached: bool | None
    seconds: float


def finetune(base: Any, name: str, folder: Path) -> FineTuneTraining:
    """Fine-tune ``base`` as :data:`~structlens.equivalence.scenarios.FINETUNES` ``[name]``
    says and save the tuned model (with the base's tokenizer) to ``folder / name``."""
    from structlens.equivalence.scenarios import finetune_scenario

    run, info = finetune_scenario(base, name)
    hf: Any = run.model.hf
    hf.save_pretrained(folder / name, safe_serialization=True)
    base.tokenizer.save_pretrained(folder / name)
    return FineTuneTraining(**info | {"held_out_kl": [list(p) for p in info["held_out_kl"]]})

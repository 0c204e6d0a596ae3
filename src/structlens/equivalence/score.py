"""Equivalence score: the share of matched components that pass validation, with a CI.

Validation (done by the caller through head/layer patching): on a held-out probe set, the
activations of each matched component of model B are replaced by those of its partner in
model A (through a :class:`~structlens.equivalence.LinearMap` when the spaces differ), and
the downstream predictions of B are compared with B's unpatched predictions.

**Sufficient condition** (our documented choice; the public material states none): a matched
pair passes when every criterion that is set holds

* ``kl <= max_kl`` -- mean ``KL(p_original || p_patched)`` over held-out predicted positions,
  in **nats** (default 0.1 nats);
* ``top1 >= min_top1`` -- share of positions whose arg-max token is unchanged (default 0.9);
* ``metric_ratio >= min_metric_ratio`` -- patched / original task metric (e.g. logit
  difference), off by default;
* ``similarity >= min_similarity`` -- the pair's representation similarity, off by default.

The score is ``passed / matched`` in ``[0, 1]`` (1 = every matched component can stand in
for its partner), reported with a Wilson score interval (default) or a percentile bootstrap
over components.

**Representational sufficient condition** (:func:`representational_score`, reported next to
the behavioural one): a matched pair passes when its representations are aligned, i.e. their
similarity (debiased linear CKA by default in :mod:`~structlens.equivalence.compare`, which is
invariant to rotations, permutations and isotropic scaling of either side) reaches
``min_similarity`` (default 0.9; the paper derives such a condition from CKA/SVCCA but
publishes no threshold, so this one is our documented choice).  It needs no patching, and
says nothing about whether B *uses* what the aligned representation carries: that is the
behavioural condition's job.

**Decisions need a null** (:func:`decide_paired_null`).  A component whose mean ablation
already passes says nothing about its partner, so a score alone decides nothing.  The null
is the same components mean-ablated instead of replaced, so partner and null outcomes come in
pairs, one per component, and are dependent (a head that is easy to replace is easy to
ablate).  Comparing the two Wilson intervals as if independent is no test of that paired
design; the verdict comes from McNemar's exact test on the discordant components (partner
passes and null fails, ``b``; the reverse, ``c``): ``"equivalent"`` when ``b > c`` with
two-sided ``p < alpha`` (and the score reaches ``min_score``), ``"unidentified"`` with the
reason otherwise, and ``"not tested"`` (with the reason) when no null was measured.  Heads
of one layer may share their fate, and McNemar's test, counting heads as independent, then
says "equivalent" too often.  Given each component's cluster (its layer of model B,
:func:`component_clusters`) the test is McNemar's test for clustered data
(:func:`~structlens.stats.intervals.clustered_mcnemar`: Durkalski et al.'s statistic, the
variance of ``Σ (b_L − c_L)`` estimated over the layers, referred to Student's t with one
degree of freedom fewer than layers), whose statistic is McNemar's when every cluster holds
one component.  The Wilson intervals stay as descriptive numbers.  Scores pooled over
several model pairs resample whole pairs
(:func:`~structlens.stats.intervals.cluster_bootstrap_ratio_interval`): heads of one pair
are not independent of each other.
:func:`informative_heads` picks the components worth validating: those whose mean ablation
changes B's output most (top-KL), where the null fails.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..results import Result
from ..stats.intervals import (
    bootstrap_interval,
    clustered_mcnemar,
    mcnemar_exact,
    wilson_interval,
)
from ._checks import to_numpy

__all__ = [
    "ValidationCriterion",
    "EquivalenceScore",
    "wilson_interval",
    "bootstrap_interval",
    "equivalence_score",
    "representational_score",
    "decide_with_null",
    "decide_paired_null",
    "PairedNullDecision",
    "informative_heads",
]


@dataclasses.dataclass(frozen=True)
class ValidationCriterion:
    """Thresholds of the sufficient condition; ``None`` switches a criterion off."""

    max_kl: float | None = 0.1
    min_top1: float | None = 0.9
    min_metric_ratio: float | None = None
    min_similarity: float | None = None

    def __post_init__(self) -> None:
        if all(
            v is None
            for v in (self.max_kl, self.min_top1, self.min_metric_ratio, self.min_similarity)
        ):
            raise ValueError("a ValidationCriterion needs at least one threshold set.")
        if self.max_kl is not None and self.max_kl < 0:
            raise ValueError(f"max_kl must be non-negative (nats), got {self.max_kl}.")
        if self.min_top1 is not None and not 0.0 <= self.min_top1 <= 1.0:
            raise ValueError(f"min_top1 must lie in [0, 1], got {self.min_top1}.")

    def passes(
        self,
        kl: object | None = None,
        top1: object | None = None,
        metric_ratio: object | None = None,
        similarity: object | None = None,
    ) -> np.ndarray:
        """Per-pair pass/fail (bool array) from per-pair validation measurements."""
        checks = (
            ("kl", kl, self.max_kl, np.less_equal),
            ("top1", top1, self.min_top1, np.greater_equal),
            ("metric_ratio", metric_ratio, self.min_metric_ratio, np.greater_equal),
            ("similarity", similarity, self.min_similarity, np.greater_equal),
        )
        out: np.ndarray | None = None
        for name, values, threshold, op in checks:
            if threshold is None:
                continue
            if values is None:
                raise ValueError(
                    f"the criterion sets a threshold on {name!r} but no {name} values were given."
                )
            v = to_numpy(values, name).astype(np.float64).ravel()
            if np.isnan(v).any():
                raise ValueError(f"{name} contains NaN; a failed patch run must be recomputed.")
            if out is not None and v.shape != out.shape:
                raise ValueError(f"{name} has {v.size} values, other measurements {out.size}.")
            ok = op(v, threshold)
            out = ok if out is None else out & ok
        assert out is not None
        return out


@dataclasses.dataclass(frozen=True)
class EquivalenceScore(Result):
    """Share of matched components satisfying the sufficient condition, with its interval.

    ``validation`` holds one record per matched pair: ``pair``, ``passed`` and the
    measurements that were given (``kl`` in nats, ``top1``, ``metric_ratio``, ``similarity``).
    """

    score: float
    score_ci: list
    n_matched: int
    n_passed: int
    ci_method: str
    confidence: float
    criterion: dict
    validation: list


def equivalence_score(
    pairs: list,
    criterion: ValidationCriterion | None = None,
    *,
    kl: object | None = None,
    top1: object | None = None,
    metric_ratio: object | None = None,
    similarity: object | None = None,
    ci: str = "wilson",
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> EquivalenceScore:
    """Equivalence score of a matching from per-pair validation measurements.

    Parameters
    ----------
    pairs : list
        The matched pairs (``MatchingResult.pairs``), in the order of the measurements.
    criterion : ValidationCriterion, optional
        Thresholds; defaults to ``max_kl=0.1`` nats and ``min_top1=0.9``.
    kl, top1, metric_ratio, similarity : array_like, optional
        One value per pair; those the criterion uses are required.
    ci : {"wilson", "bootstrap"}
        Interval for the pass rate over components.
    """
    crit = criterion or ValidationCriterion()
    if not pairs:
        raise ValueError("no matched pairs to score.")
    passed = crit.passes(kl=kl, top1=top1, metric_ratio=metric_ratio, similarity=similarity)
    if passed.size != len(pairs):
        raise ValueError(f"{passed.size} validation outcomes for {len(pairs)} matched pairs.")
    k, n = int(passed.sum()), int(passed.size)
    if ci == "wilson":
        interval = wilson_interval(k, n, confidence)
    elif ci == "bootstrap":
        interval = bootstrap_interval(passed, confidence, n_boot, seed)
    else:
        raise ValueError(f"ci must be 'wilson' or 'bootstrap', got {ci!r}.")
    given = {
        name: to_numpy(v, name).astype(np.float64).ravel()
        for name, v in (
            ("kl", kl),
            ("top1", top1),
            ("metric_ratio", metric_ratio),
            ("similarity", similarity),
        )
        if v is not None
    }
    for name, v in given.items():
        if v.size != n:
            raise ValueError(f"{name} has {v.size} values for {n} matched pairs.")
    records = []
    for i, pair in enumerate(pairs):
        rec = {"pair": pair, "passed": bool(passed[i])}
        rec.update({name: float(v[i]) for name, v in given.items()})
        records.append(rec)
    return EquivalenceScore(
        score=k / n,
        score_ci=list(interval),
        n_matched=n,
        n_passed=k,
        ci_method=ci,
        confidence=confidence,
        criterion=dataclasses.asdict(crit),
        validation=records,
    )


def representational_score(
    pairs: list,
    similarity: object,
    min_similarity: float = 0.9,
    *,
    ci: str = "wilson",
    confidence: float = 0.95,
) -> EquivalenceScore:
    """Share of matched pairs whose representations are aligned (``similarity >=
    min_similarity``), with its interval: the representational sufficient condition.

    ``similarity`` holds one value per pair (e.g. the matched-head similarities of a
    comparison, in its metric's convention: 1 = identical up to the metric's invariances).
    This is :func:`equivalence_score` with only the similarity criterion set.

    >>> representational_score([(0, 0), (1, 1), (2, 2), (3, 3)], [1.0, 0.95, 0.5, 0.2]).n_passed
    2
    """
    crit = ValidationCriterion(max_kl=None, min_top1=None, min_similarity=min_similarity)
    return equivalence_score(pairs, crit, similarity=similarity, ci=ci, confidence=confidence)


@dataclasses.dataclass(frozen=True)
class PairedNullDecision(Result):
    """Verdict of :func:`decide_paired_null` and the paired test behind it.

    ``partner_only`` (``b``): components where the partner passes and the null fails;
    ``null_only`` (``c``): the reverse; ``both``/``neither``: the concordant ones.
    ``p_value`` is McNemar's exact two-sided p-value (NaN without a null), ``alpha`` its level;
    ``score``/``null_score`` the two pass rates over the ``n_heads`` components.  With
    clusters, ``p_value`` is the clustered McNemar test over the ``n_clusters`` clusters
    (``test`` says which).
    """

    verdict: str
    reason: str
    n_heads: int
    partner_only: int
    null_only: int
    both: int
    neither: int
    p_value: float
    alpha: float
    score: float
    null_score: float
    test: str = "McNemar exact, two-sided, on the discordant components"
    n_clusters: int = 0


def _bools(values: object, name: str) -> np.ndarray:
    a = np.asarray(values)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(
            f"{name} must be a non-empty 1-D sequence of booleans, got shape {a.shape}."
        )
    if a.dtype != bool:
        if not np.all(np.isin(a, (0, 1))):
            raise ValueError(f"{name} must hold booleans (pass/fail per component).")
        a = a.astype(bool)
    return a


def component_clusters(pairs: list, unit: str) -> list | None:
    """The independent unit of each matched pair for :func:`decide_paired_null`: with
    ``unit="layer"`` the layer of model B the component sits in (a head pair is
    ``[[layer_a, head_a], [layer_b, head_b]]``, a layer pair ``(layer_a, layer_b)``, a head
    group B's layer), with ``"head"`` ``None`` (every component its own unit)."""
    if unit == "head":
        return None
    if unit != "layer":
        raise ValueError(f"unit must be 'layer' or 'head', got {unit!r}.")

    def layer_b(pair: Any) -> Any:
        if not isinstance(pair, (list, tuple)):
            return pair
        b = pair[1]
        return b[0] if isinstance(b, (list, tuple)) else b

    return [layer_b(p) for p in pairs]


def decide_paired_null(
    partner_passed: object,
    null_passed: object | None,
    *,
    alpha: float = 0.05,
    min_score: float = 0.0,
    clusters: object | None = None,
) -> PairedNullDecision:
    """Decide equivalence from per-component pass/fail of the partner and of the null.

    Parameters
    ----------
    partner_passed : sequence of bool
        Per validated component: does replacing it by its matched partner pass?
    null_passed : sequence of bool or None
        The same components, in the same order, mean-ablated instead.  ``None`` (no null
        measured, e.g. validation by similarity only) gives ``"not tested"``.
    alpha : float
        Level of the two-sided test, in (0, 1).
    min_score : float
        Smallest partner pass rate that may be called equivalent.
    clusters : sequence or None
        The independent unit of each component (e.g. the layer of model B a head sits in):
        components of one cluster may share their fate, so the test is McNemar's test for
        clustered data (:func:`~structlens.stats.intervals.clustered_mcnemar`), its variance
        estimated over the clusters.  ``None``, or one component per cluster: the components
        are the units, and the test McNemar's exact test.

    Returns
    -------
    PairedNullDecision
        ``verdict`` is ``"equivalent"`` when more components pass with their partner only
        than with the null only (``b > c``), the paired test's ``p < alpha`` and the score is at
        least ``min_score``; else ``"unidentified"`` (``"not tested"`` without a null);
        ``reason`` says why.

    Examples
    --------
    >>> partner = [True] * 10 + [False] * 2
    >>> null = [False] * 9 + [True, False, False]
    >>> d = decide_paired_null(partner, null)
    >>> d.verdict, d.partner_only, d.null_only, round(d.p_value, 4)
    ('equivalent', 9, 0, 0.0039)
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}.")
    partner = _bools(partner_passed, "partner_passed")
    score = float(partner.mean())
    nan = float("nan")
    if null_passed is None or np.asarray(null_passed).size == 0:
        return PairedNullDecision(
            "not tested", "no null score to calibrate against (validation without patching)",
            int(partner.size), 0, 0, 0, 0, nan, alpha, score, nan,
        )  # fmt: skip
    null = _bools(null_passed, "null_passed")
    if null.shape != partner.shape:
        raise ValueError(
            f"null_passed has {null.size} components, partner_passed {partner.size}; give the "
            "null of every validated component, in the same order."
        )
    b, c = int(np.sum(partner & ~null)), int(np.sum(~partner & null))
    both, neither = int(np.sum(partner & null)), int(np.sum(~partner & ~null))
    labels = list(range(partner.size)) if clusters is None else list(clusters)  # type: ignore[call-overload]
    if len(labels) != partner.size:
        raise ValueError(
            f"clusters has {len(labels)} labels for {partner.size} components; give one "
            "per component, in the same order."
        )
    index = {x: k for k, x in enumerate(dict.fromkeys(labels))}
    n_clusters = len(index)
    if n_clusters == partner.size:
        # one component per cluster: the components are the units, for which McNemar's is exact
        p, test, how = mcnemar_exact(b, c), PairedNullDecision.test, "McNemar exact p"
    else:
        idx = np.array([index[x] for x in labels])
        b_l = np.bincount(idx, weights=partner & ~null, minlength=n_clusters)
        c_l = np.bincount(idx, weights=~partner & null, minlength=n_clusters)
        _, p = clustered_mcnemar(np.rint(b_l).astype(np.int64), np.rint(c_l).astype(np.int64))
        test = (
            f"clustered McNemar over {n_clusters} clusters (variance over clusters, "
            f"t with {n_clusters - 1} df), two-sided"
        )
        how = f"clustered McNemar over {n_clusters} clusters p"
    counts = (
        f"partner passes where the null fails on {b} of {partner.size} components, the null "
        f"where the partner fails on {c} ({how} = {p:.3g})"
    )
    if not (b > c and p < alpha):
        verdict, reason = (
            "unidentified",
            (
                f"{counts}, not below α = {alpha:g} with b > c: partners do no better than mean "
                "ablation"
            ),
        )
    elif score < min_score:
        verdict, reason = "unidentified", f"score {score:.3f} is below the required {min_score:.3f}"
    else:
        verdict, reason = "equivalent", f"{counts} < α = {alpha:g}"
    return PairedNullDecision(
        verdict, reason, int(partner.size), b, c, both, neither, p, alpha, score,
        float(null.mean()), test, n_clusters,
    )  # fmt: skip


def decide_with_null(
    score: float, score_ci: object, null_ci: object | None, min_score: float = 0.0
) -> tuple[str, str]:
    """``("equivalent", reason)`` when ``score >= min_score`` and the score's interval lies
    above the null's, else ``("unidentified", reason)`` (``"not tested"`` without a null).

    Descriptive only: the two intervals come from the same components, so their overlap is
    not a test of the paired design (it is both conservative and blind to the pairing).
    Verdicts use :func:`decide_paired_null`; this reads documents that hold intervals only.

    ``score_ci``/``null_ci`` are ``[lo, hi]`` intervals of the pass rates of the partners and
    of the null (mean ablation) on the same components.  Without a null (``None`` or NaN) no
    decision is possible.
    """
    lo, hi = (float(v) for v in np.asarray(score_ci, dtype=np.float64).ravel()[:2])
    if null_ci is None or not np.all(np.isfinite(np.asarray(null_ci, dtype=np.float64))):
        return "not tested", "no null score to calibrate against (validation without patching)"
    n_lo, n_hi = (float(v) for v in np.asarray(null_ci, dtype=np.float64).ravel()[:2])
    if not lo > n_hi:
        return "unidentified", (
            f"score interval [{lo:.3f}, {hi:.3f}] does not lie above the null's "
            f"[{n_lo:.3f}, {n_hi:.3f}]: partners do no better than mean ablation"
        )
    if score < min_score:
        return "unidentified", f"score {score:.3f} is below the required {min_score:.3f}"
    return "equivalent", (
        f"score interval [{lo:.3f}, {hi:.3f}] lies above the null's [{n_lo:.3f}, {n_hi:.3f}]"
    )


def informative_heads(null_kl: object, pairs: list, k: int, max_kl: float = 0.1) -> list[int]:
    """Indices into ``pairs`` of the (at most) ``k`` pairs whose B-side mean ablation moves
    B's output most, keeping only those whose null fails (``null_kl > max_kl`` nats).

    ``null_kl`` is ``[n_layers_B, n_heads_B]`` (KL in nats of B's output with that head
    mean-ablated; ``compare`` measures it on the fit prompts only, so the choice reads no
    held-out prompt); ``pairs`` are ``((la, ha), (lb, hb))``.
    """
    grid = to_numpy(null_kl, "null_kl").astype(np.float64)
    if grid.ndim != 2:
        raise ValueError(f"null_kl must be [n_layers, n_heads], got shape {grid.shape}.")
    if k < 1:
        raise ValueError(f"k must be positive, got {k}.")
    kl = np.array([grid[int(b[0]), int(b[1])] for _, b in pairs])
    order = [int(i) for i in np.argsort(-kl, kind="stable") if kl[i] > max_kl]
    return sorted(order[:k])

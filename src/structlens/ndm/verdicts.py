"""NDM's claims, caveats and ``analyze`` section, computed from the stages' results.

:data:`PAPER` is the one table of the paper's values (Huang & Hahn, *Decomposing
Representation Space into Interpretable Subspaces with Unsupervised Learning*, ICLR 2026).
The replication's claims are computed from its stages' typed Results (the ``ndm train`` /
``evaluate`` / ``browse`` runs of :mod:`structlens.ndm.runs`, the toy and planted-partition
recoveries) by the ``*_claim`` functions; ``structlens analyze``'s section from
:class:`structlens.ndm.stages.Analysis` by :func:`section`.  Renderers only format what
these return.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from structlens.stats.multiplicity import holm
from structlens.verdicts import Caveat, Claim, Number, Section, count_verdict, finite_ci

if TYPE_CHECKING:
    from structlens.ndm.runs import BrowseRun, EvaluationRun, TrainingRun
    from structlens.ndm.stages import (
        Analysis,
        GiniSummary,
        PlantedRecovery,
        ScreenRow,
        ToyRecovery,
        ToySeeds,
    )  # fmt: skip

PAPER: dict[str, Mapping[str, Any]] = {
    "mean_gini_ndm_vs_baselines": {
        "text": "mean dimension-normalised Gini over 5 tests: NDM 0.71 vs baselines 0.21–0.38",
        "model": "GPT-2 small",
        "ndm": 0.71,
        "baselines": (0.21, 0.38),
    },
    "toy_recovery": {"text": "toy: one subspace per mutually exclusive feature group"},
    "planted_partition_recovery": {
        "text": "the toy's groups are recovered (here: planted rotated partitions, over seeds)"
    },
    "knowledge_conflict_single_subspace": {
        "text": "a single subspace nearly matches whole-space patching of the routing",
        "model": "Qwen2.5-1.5B",
        "layer": "11 of 28",
    },
    "preimage_browser_scale": {
        "text": "preimage browser over ≥ 100,000 activations (authors: ≈ 1M)",
        "min_activations": 100_000,
    },
    # the paper's setting beside each of ours (GPT-2 small, d = 768, 12 layers)
    "settings": {
        "layers (resid_post)": "4, 6, 8, 9 of 12",
        "training data": "MiniPile, ≈ 400k-key bank per step",
        "bank / batch": "409,600 keys / 128",
        "initial subspaces": "32 dims (24)",
        "steps, merges": "100k; merges every 8k from 20k",
        "optimiser": "Adam 3e-4, matrix-exponential map",
        "KSG": "k = 1, 98,304 reference keys",
        "patching prompts": "1000 per test",
    },
    # the training schedule as numbers, for the distance of ours from it
    "schedule": {"steps": 100_000, "merge_start": 20_000, "merge_interval": 8_000, "bank": 409_600},
}

#: NDM's mean Gini counts as the paper's within this distance of it.
GINI_TOLERANCE = 0.1
#: One-sided level of "NDM's mean Gini is above a baseline's" (the lower bound of the
#: paired two-sided 95% bootstrap interval above 0, before the adjustment over baselines).
GINI_ALPHA = 0.025
#: The toy's groups count as recovered above this smallest matched subspace overlap.
TOY_OVERLAP = 0.9
#: A subspace "nearly matches" whole-space patching at this share of its context-rate drop.
CONFLICT_SHARE = 0.8


# --- the replication's claims -------------------------------------------------------------


def gini_verdict(
    screened: Sequence[str],
    open_layers: Sequence[int],
    steps: int | None,
    value: float | None,
    p_above: Mapping[str, float],
) -> tuple[str, str]:
    """The verdict on NDM's mean Gini against the baselines, and its reason.

    Not tested when no test passes the screen (``screened`` empty) or when a screened test's
    layer was not trained to the stopping rule (``open_layers``; a partition mid-training is
    not the method's answer).  Otherwise NDM is above a baseline when its one-sided bootstrap
    p-value (``p_above``) survives Holm's adjustment over the baselines at
    :data:`GINI_ALPHA` (:func:`above_baselines`); reproduced when above every baseline at a
    Gini within :data:`GINI_TOLERANCE` of the paper's, partly when above some or all of them
    (far from the paper's value), not reproduced when above none.
    """
    if not screened:
        return "not tested", "no patching test passes the whole-space-effect screen"
    if open_layers:
        return "not tested", (
            f"training not converged at layer(s) {sorted(open_layers)}: the stopping rule (no "
            f"pair above the MI threshold) was not reached in {steps} steps"
        )
    above = above_baselines(p_above)
    below = sorted(set(p_above) - set(above))
    paper = PAPER["mean_gini_ndm_vs_baselines"]["ndm"]
    if not above:
        return "not reproduced", f"NDM is not significantly above any baseline ({below})"
    if below:
        return "partly", f"NDM is significantly above {above}, not above {below}"
    if value is not None and value >= paper - GINI_TOLERANCE:
        return "reproduced", f"NDM {value:.2f} is significantly above every baseline"
    return "partly", (
        f"NDM is significantly above every baseline but {value:.2f} is far below the "
        f"paper's {paper}"
    )


def above_baselines(p_above: Mapping[str, float]) -> list[str]:
    """The baselines NDM is significantly above: their one-sided bootstrap p-values adjusted
    by Holm over the baselines at :data:`GINI_ALPHA` (a baseline without a finite p-value
    is not beaten).  Holm holds the chance of calling NDM above any baseline it is not
    above, which a "partly" verdict rests on."""
    finite = {m: p for m, p in p_above.items() if math.isfinite(p)}
    tests = holm(list(finite.values()), GINI_ALPHA)
    return sorted(m for m, r in zip(finite, tests.rejected, strict=True) if r)


def best_baseline(ev: EvaluationRun) -> dict[str, Any] | None:
    """The baseline with the highest mean dimension-normalised Gini (its value and CI)."""
    gm = ev.gini_mean
    if gm is None:
        return None
    return max(
        (gm[m]["dimension"] for m in ev.methods if m != "ndm"),
        key=lambda e: e["value"],
        default=None,
    )


def gini_claim(ev: EvaluationRun, tr: TrainingRun) -> Claim:
    """``mean_gini_ndm_vs_baselines`` from an ``ndm evaluate`` run ``ev`` and the training
    run ``tr`` of its rotations."""
    screened = ev.screened
    layers = sorted({int(ev.layers[t]) for t in screened})
    open_layers = [layer for layer in layers if not tr.layer(layer)["converged"]]
    steps = tr.layer(open_layers[0])["steps"] if open_layers else None
    settings = {"methods": ev.methods, "n_prompts": ev.n_prompts, "n_boot": ev.n_boot,
                "screened_tests": screened, "min_share": ev.min_share}  # fmt: skip
    paper = PAPER["mean_gini_ndm_vs_baselines"]["text"]
    if not screened:
        verdict, reason = gini_verdict(screened, [], None, None, {})
        return Claim("mean_gini_ndm_vs_baselines", paper, None, None, verdict, settings,
                     ci_reason=reason)  # fmt: skip
    assert ev.gini_mean is not None and ev.gini_mean_diff is not None  # a screened test
    ndm = ev.gini_mean["ndm"]["dimension"]
    p_above = {m: float(d["dimension"]["p_above"]) for m, d in ev.gini_mean_diff.items()}
    verdict, reason = gini_verdict(screened, open_layers, steps, float(ndm["value"]), p_above)
    settings |= {"alpha": GINI_ALPHA, "adjustment": "holm", "p_above": p_above}
    best = best_baseline(ev)
    ci = finite_ci(ndm.get("ci"))
    if best is not None:
        settings["best_baseline"] = {"value": best["value"], "ci": list(best["ci"])}
    return Claim(
        "mean_gini_ndm_vs_baselines", paper, float(ndm["value"]), ci, verdict, settings,
        ci_reason=None if ci else "no finite bootstrap interval", note=reason,
    )  # fmt: skip


def toy_recovers(run: ToyRecovery) -> bool:
    """Whether one toy run recovers the feature groups: subspaces of the groups' dimensions
    (as multisets, as the planted recoveries require), each matched with overlap above
    :data:`TOY_OVERLAP`.  The overlap alone cannot tell: it is normalised by the smaller
    dimension, so an 8-d subspace holding a 6-d group overlaps it fully."""
    return sorted(run.partition) == sorted(run.truth) and run.overlap > TOY_OVERLAP


def toy_claim(toy: ToySeeds) -> Claim:
    """``toy_recovery``: the share of seeds whose merge rule stops at the toy's feature
    groups (Wilson interval); ``partly`` when some do, or when none does but the stop guard
    recovers the groups on some seed (one seeded run flips between CPUs: a rate is the
    claim's evidence)."""
    from structlens.stats.intervals import wilson_interval

    n = len(toy.runs)
    k = sum(map(toy_recovers, toy.runs))
    k_guard = k + sum(map(toy_recovers, toy.guarded))
    verdict = count_verdict(k, n)
    if verdict == "reproduced":
        reason = f"the merge rule stops at the ground-truth split on every seed ({n})"
    elif k:
        reason = f"the merge rule stops at the ground-truth split on {k} of {n} seeds"
    elif k_guard:
        verdict = "partly"
        reason = f"groups recovered only with the stop guard ({k_guard} of {n} seeds)"
    else:
        reason = f"no seed recovers the groups, with or without the stop guard ({n} seeds)"
    guard = f"min_subspaces={len(toy.runs[0].truth)}" if n else "min_subspaces"
    per_setting = {
        f"{guard} where the merge rule misses": {
            "recovered": k_guard, "n": n, "ci": list(wilson_interval(k_guard, n)),
            "partitions": {str(s): list(r.partition) for s, r in zip(toy.guarded_seeds,
                                                                     toy.guarded, strict=True)},
        },
    }  # fmt: skip
    settings = {
        "seeds": list(toy.seeds), "recovered": k,
        "truth": list(toy.runs[0].truth) if n else [], "min_overlap": TOY_OVERLAP,
        "partitions": {str(s): list(r.partition) for s, r in zip(toy.seeds, toy.runs, strict=True)},
        "overlaps": {str(s): r.overlap for s, r in zip(toy.seeds, toy.runs, strict=True)},
    }  # fmt: skip
    return Claim(
        "toy_recovery", PAPER["toy_recovery"]["text"], k / n if n else None,
        wilson_interval(k, n) if n else None, verdict, settings,
        ci_reason=None if n else "no toy run", note=reason, per_setting=per_setting,
    )  # fmt: skip


def planted_claim(planted: Sequence[PlantedRecovery]) -> Claim | None:
    """``planted_partition_recovery``: the recovery rate over seeds at the most restarts run
    (Wilson interval); every run goes to ``per_setting``."""
    from structlens.stats.intervals import wilson_interval

    if not planted:
        return None
    best = max(p.restarts for p in planted)
    headline = [p for p in planted if p.restarts == best]
    k, n = sum(p.recovered for p in headline), sum(p.n for p in headline)
    per_setting = {
        f"{list(p.sizes)}, {p.restarts} run(s)": {"recovered": p.recovered, "n": p.n,
                                                  "ci": list(p.ci)}
        for p in planted
    }  # fmt: skip
    settings = {"restarts": best, "partitions": [list(p.sizes) for p in headline],
                "seeds": headline[0].n, "min_overlap": headline[0].min_overlap}  # fmt: skip
    return Claim(
        "planted_partition_recovery", PAPER["planted_partition_recovery"]["text"], k / n,
        wilson_interval(k, n), count_verdict(k, n), settings, per_setting=per_setting,
    )  # fmt: skip


def conflict_routing(conflict: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per corruption: the clean and whole-space context rates, the subspace whose patch
    drops the context rate most (``best``, its rate) and whether that drop reaches
    :data:`CONFLICT_SHARE` of the whole-space drop (``close``)."""
    out = []
    for name, v in conflict["corruptions"].items():
        base = v["clean"]["context_rate"]
        full_drop = base - v["full"]["context_rate"]
        drops = [base - sub["context_rate"] for sub in v["subspaces"]]
        best = int(max(range(len(drops)), key=lambda i: drops[i]))
        out.append({
            "corruption": name, "clean": base, "full": v["full"]["context_rate"], "best": best,
            "best_rate": v["subspaces"][best]["context_rate"],
            "close": bool(full_drop > 0 and drops[best] >= CONFLICT_SHARE * full_drop),
        })  # fmt: skip
    return out


def conflict_claim(conflict: Mapping[str, Any] | None) -> Claim | None:
    """``knowledge_conflict_single_subspace`` over the corruptions run (``None`` when the
    tokenizer could not build the task)."""
    if not (conflict or {}).get("corruptions"):
        return None
    assert conflict is not None
    close = [r["close"] for r in conflict_routing(conflict)]
    return Claim(
        "knowledge_conflict_single_subspace", PAPER["knowledge_conflict_single_subspace"]["text"],
        f"{sum(close)} of {len(close)} corruptions", None, count_verdict(sum(close), len(close)),
        {"layer": conflict["layer"], "n": conflict["n"],
         "corruptions": list(conflict["corruptions"])},
        ci_reason=f"a count of corruptions where the best subspace reaches {CONFLICT_SHARE:.0%} "
        "of the whole-space drop; rates over one prompt set",
    )  # fmt: skip


def browser_claim(browse: Sequence[BrowseRun]) -> Claim:
    """``preimage_browser_scale``: the activations indexed by the first browser run."""
    paper = PAPER["preimage_browser_scale"]
    if not browse:
        return Claim("preimage_browser_scale", paper["text"], None, None, "not tested", {},
                     ci_reason="the preimage browser was not run")  # fmt: skip
    n, layer = int(browse[0].n_activations), browse[0].layer
    return Claim(
        "preimage_browser_scale", paper["text"], n, None,
        "reproduced" if n >= paper["min_activations"] else "partly", {"layer": layer},
        ci_reason="a count of indexed activations",
    )  # fmt: skip


def claims(
    ev: EvaluationRun,
    train: TrainingRun,
    toy: ToySeeds,
    planted: Sequence[PlantedRecovery] = (),
    browse: Sequence[BrowseRun] = (),
) -> list[Claim]:
    """Every claim of one replication run, in the table's order: from its evaluation and
    the training run behind it, the toy recoveries over seeds, the planted recoveries and
    the browser runs."""
    found = [
        gini_claim(ev, train),
        toy_claim(toy),
        planted_claim(planted),
        conflict_claim(ev.conflict),
        browser_claim(browse),
    ]
    return [c for c in found if c is not None]


# --- the analyze section ------------------------------------------------------------------


def _null_effect(row: ScreenRow, min_share: float) -> Caveat:
    share = row.whole_space_share
    removed = (
        f"removes {share:.1%} of the clean metric"
        if math.isfinite(share)
        else "cannot remove a behaviour the model lacks (mean clean metric <= 0)"
    )
    lo, hi = row.full_effect_ci
    return Caveat(
        "null_effect",
        f"{row.test}: patching the whole space at layer {row.layer} {removed} (effect "
        f"{row.full_effect:+.3f}, CI [{lo:+.3f}, {hi:+.3f}]), below the {min_share:.0%} "
        "screen: no signal, no Gini.",
    )


def gini_details(summary: GiniSummary) -> dict[str, Any]:
    """The report's Gini table (dimension-normalised variant) of a
    :class:`~structlens.ndm.stages.GiniSummary`; empty without a screened test."""
    if summary.mean is None:
        return {}
    doc = summary.to_json()
    diff = doc["gini_mean_diff"] if summary.ndm_minus is not None else {}
    return {
        "mean": {m: v["dimension"] for m, v in doc["gini_mean"].items()},
        "per_test": {
            t: by if by == "no signal" else {m: v["dimension"] for m, v in by.items()}
            for t, by in doc["gini"].items()
        },
        "ndm_minus": {m: v["dimension"] for m, v in diff.items()},
        "variant": "dimension-normalised Gini of the mean subspace patching effects, over "
        "the tests that pass the screen",
    }


def caveats(a: Analysis) -> tuple[Caveat, ...]:
    """What qualifies :class:`~structlens.ndm.stages.Analysis` ``a``: tests not built, tests
    below the screen, a browser-only layer, training stopped at the step limit, and NDM's
    Gini not significantly above a baseline."""
    out = []
    if a.skipped:
        out.append(Caveat("not_run", f"patching tests {list(a.skipped)} need tasks this "
                          "tokenizer cannot build."))  # fmt: skip
    out += [_null_effect(row, a.protocol.min_share) for row in a.tests if not row.screened]
    if a.browser_only:
        out.append(Caveat(
            "null_effect", f"no patching test passes the screen; NDM is trained at layer "
            f"{a.trained[0].layer} for the preimage browser only.",
        ))  # fmt: skip
    out += [
        Caveat("not_converged", f"layer {t.layer}: NDM stopped at the step limit ({t.steps} "
               "steps) with subspace pairs still above the MI threshold; the partition is not "
               "the method's fixed point.")
        for t in a.trained if not t.converged
    ]  # fmt: skip
    for m, v in gini_details(a.gini).get("ndm_minus", {}).items():
        if v["ci"][0] <= 0:
            out.append(Caveat(
                "not_significant", f"NDM's Gini is not above the {m} baseline "
                f"({v['value']:+.3f}, CI [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]).",
            ))  # fmt: skip
    return tuple(out)


def section(a: Analysis) -> Section:
    """``analysis.json``'s NDM section of :class:`~structlens.ndm.stages.Analysis` ``a``."""
    gini = gini_details(a.gini)
    headline = {
        f"gini_{m}": Number.of(v["value"], v["ci"], "", f"Gini ({m})")
        for m, v in gini.get("mean", {}).items()
    }
    first = a.trained[0]
    headline["n_subspaces"] = Number.of(
        len(first.partition), None, "", f"subspaces (layer {first.layer})"
    )
    details = {
        "protocol": a.protocol.to_json(),
        "trained": [t.to_json() for t in a.trained],
        "tests": [row.to_json() for row in a.tests],
        "layer_sweep": a.sweep.to_json(),
        "gini": gini,
        "browser": dict(a.browser),
    }
    return Section(headline, caveats(a), details)

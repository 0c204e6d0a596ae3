"""NDM's verdicts follow the evidence: every branch of every claim and caveat, from planted
stage records and Results, asserted on the Claim, Caveat and Number fields."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from structlens.ndm import verdicts as V
from structlens.ndm.protocol import PROFILES
from structlens.ndm.runs import BrowseRun, EvaluationRun, TrainingRun
from structlens.ndm.stages import (
    Analysis,
    Estimate,
    GiniSummary,
    LayerChoice,
    LayerSweep,
    PlantedRecovery,
    Screen,
    ScreenRow,
    ToyRecovery,
    ToySeeds,
    TrainedLayer,
)
from structlens.verdicts import VERDICTS


def _evaluation(screened, converged, value, p_above, methods=("ndm", "pca", "random"), **more):
    """An evaluation and training run: test t at layer 5, NDM's mean Gini ``value`` (CI
    value ± 0.05), each baseline's mean 0.3 and the one-sided bootstrap p-value of NDM
    above each baseline ``p_above`` (``more``: further fields of the evaluation)."""
    gm = {m: {"dimension": {"value": 0.3, "ci": [0.25, 0.35]}} for m in methods}
    gm["ndm"] = {"dimension": {"value": value, "ci": [value - 0.05, value + 0.05]}}
    ev = {
        "methods": list(methods), "n_prompts": 16, "n_boot": 200, "min_share": 0.3,
        "screen": [{"test": "t", "layer": 5, "screened": screened}],
        "layers": {"t": 5},
        "gini_mean": gm if screened else "no signal",
        "gini_mean_diff": {
            m: {"dimension": {"ci": [0.0, 0.2], "p_above": p}} for m, p in p_above.items()
        },
        "protocol": {}, "partition": {"5": [4, 4]}, "gini": {}, "effects": {},
    }  # fmt: skip
    train = {"layers": [5], "partition": {"5": [4, 4]}, "protocol": {},
             "results": {"5": {"converged": converged, "steps": 60}}}  # fmt: skip
    return EvaluationRun.of(ev | more), TrainingRun.of(train)


@pytest.mark.parametrize(
    ("screened", "converged", "value", "p_above", "verdict", "reason"),
    [
        (True, False, 0.7, {"pca": 0.0}, "not tested", "not converged at layer(s) [5]"),
        (True, True, 0.7, {"pca": 0.0, "random": 0.01}, "reproduced", "every baseline"),
        (True, True, 0.4, {"pca": 0.0, "random": 0.01}, "partly", "far below the paper's 0.71"),
        (True, True, 0.7, {"pca": 0.0, "random": 0.3}, "partly", "not above ['random']"),
        (True, True, 0.7, {"pca": 0.4, "random": 0.5}, "not reproduced", "not significantly"),
        # 0.02 alone is below 0.025, not after Holm over two baselines (0.04)
        (True, True, 0.7, {"pca": 0.02, "random": 0.02}, "not reproduced", "not significantly"),
        (True, True, 0.7, {"pca": 0.01, "random": float("nan")}, "partly", "not above"),
    ],
)
def test_gini_claim_follows_the_evidence(screened, converged, value, p_above, verdict, reason):
    c = V.gini_claim(*_evaluation(screened, converged, value, p_above))
    assert c.id == "mean_gini_ndm_vs_baselines" and c.verdict == verdict
    assert c.paper == V.PAPER[c.id]["text"]
    assert c.ours == value and c.ci == pytest.approx((value - 0.05, value + 0.05))
    assert reason in c.note
    assert c.settings["screened_tests"] == ["t"]
    assert c.settings["best_baseline"] == {"value": 0.3, "ci": [0.25, 0.35]}


def test_gini_claim_without_a_screened_test_is_not_tested_with_its_reason():
    c = V.gini_claim(*_evaluation(False, True, 0.7, {"pca": 0.0}))
    assert c.verdict == "not tested" and c.ours is None and c.ci is None
    assert c.ci_reason == "no patching test passes the whole-space-effect screen"
    assert c.settings["screened_tests"] == []


def test_gini_reproduced_needs_the_paper_value_within_the_tolerance():
    """At the edge: the paper's value minus the tolerance reproduces, just below it does not."""
    edge = V.PAPER["mean_gini_ndm_vs_baselines"]["ndm"] - V.GINI_TOLERANCE
    p_above = {"pca": 0.0}
    assert V.gini_claim(*_evaluation(True, True, edge, p_above)).verdict == "reproduced"
    assert V.gini_claim(*_evaluation(True, True, edge - 0.01, p_above)).verdict == "partly"


def _toy(right, overlap, partition=(4, 4)):
    return ToyRecovery(partition, (4, 4), overlap, right, True, {})


_HIT, _MERGED, _LOOSE = _toy(True, 0.95), _toy(False, 1.0, (8,)), _toy(True, 0.5)


def _seeds(runs, guarded=()):
    """Seeds 0.. of ``runs``; the ``guarded`` runs belong to the seeds whose run misses."""
    missed = [s for s, r in enumerate(runs) if not V.toy_recovers(r)]
    return ToySeeds(list(range(len(runs))), list(runs), missed[: len(guarded)], list(guarded))


@pytest.mark.parametrize(
    ("runs", "guarded", "verdict", "reason"),
    [
        ([_HIT, _HIT, _HIT], [], "reproduced", "every seed (3)"),
        ([_HIT, _MERGED, _LOOSE], [_MERGED, _LOOSE], "partly", "1 of 3 seeds"),
        ([_MERGED, _MERGED], [_HIT, _MERGED], "partly", "only with the stop guard (1 of 2"),
        ([_MERGED, _LOOSE], [_MERGED, _LOOSE], "not reproduced", "no seed recovers"),
    ],
)
def test_toy_claim_is_a_rate_over_seeds(runs, guarded, verdict, reason):
    """The verdict follows the count of seeds that recover the groups (one subspace per
    group above the overlap threshold); the stop guard only rescues an all-miss."""
    c = V.toy_claim(_seeds(runs, guarded))
    k = sum(r is _HIT for r in runs)
    assert c.verdict == verdict and reason in c.note
    assert c.ours == k / len(runs) and c.settings["recovered"] == k
    lo, hi = c.ci
    assert lo <= c.ours <= hi and (lo > 0) == (k > 0)
    ((key, fallback),) = c.per_setting.items()
    assert key.startswith("min_subspaces=2")
    assert fallback["recovered"] == k + sum(r is _HIT for r in guarded)
    assert fallback["n"] == len(runs)


def test_toy_recovers_needs_the_group_dimensions_and_the_overlap():
    """A single merged subspace contains both groups (overlap 1), and so does a [6, 2] split
    of [4, 4] groups: neither is a recovery."""
    assert V.toy_recovers(_HIT)
    assert not V.toy_recovers(_MERGED) and not V.toy_recovers(_LOOSE)
    assert not V.toy_recovers(_toy(True, V.TOY_OVERLAP))
    assert not V.toy_recovers(_toy(True, 1.0, (6, 2)))


def test_toy_recovery_reads_the_pipeline_record():
    record = {"partition": [8], "truth_dims": [4, 4], "overlap": 0.7, "converged": False,
              "right_number_of_subspaces": False}  # fmt: skip
    toy = ToyRecovery.of(record)
    assert (toy.partition, toy.truth, toy.overlap) == ((8,), (4, 4), 0.7)
    assert not toy.right_number_of_subspaces and not toy.converged


def _wilson(k, n, z=1.959963984540054):
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


@pytest.mark.parametrize(
    ("recovered", "verdict"),
    [((10, 10), "reproduced"), ((7, 9), "partly"), ((0, 0), "not reproduced")],
)
def test_planted_claim_reports_the_rate_at_the_most_restarts(recovered, verdict):
    """One run recovers 2 of 10 (ignored for the headline); three restarts ``recovered`` on
    each of two partitions."""
    records = [{"sizes": [4, 4], "restarts": 1, "recovered": 2, "n": 10, "ci": [0.06, 0.51],
                "min_overlap": 0.9}]  # fmt: skip
    records += [{"sizes": s, "restarts": 3, "recovered": k, "n": 10, "ci": [0.0, 1.0],
                 "min_overlap": 0.9} for s, k in zip([[4, 4], [4, 4, 8]], recovered)]  # fmt: skip
    planted = [PlantedRecovery.of(r) for r in records]
    c = V.planted_claim(planted)
    k = sum(recovered)
    assert c.verdict == verdict and c.ours == pytest.approx(k / 20)
    lo, hi = _wilson(k, 20)
    assert c.ci == pytest.approx((lo, hi), abs=1e-12)
    assert (c.ci[0] == 0.0) == (k == 0) and (c.ci[1] == 1.0) == (k == 20)  # exact at the ends
    assert c.settings["restarts"] == 3 and c.settings["partitions"] == [[4, 4], [4, 4, 8]]
    assert c.per_setting["[4, 4], 1 run(s)"]["recovered"] == 2  # reported, not the headline
    assert V.planted_claim([]) is None


def _corruption(clean, full, subspaces):
    rate = lambda r: {"context_rate": r, "param_rate": 1 - r}  # noqa: E731
    return {"clean": rate(clean), "full": rate(full), "subspaces": [rate(r) for r in subspaces]}


@pytest.mark.parametrize(
    ("corruptions", "close", "verdict"),
    [
        # the best subspace drops 0.8 → 0.24 (0.56 of a 0.6 drop: 93%) and 0.9 → 0.5 (89%)
        ({"a": _corruption(0.8, 0.2, [0.7, 0.24]), "b": _corruption(0.9, 0.45, [0.5])},
         [True, True], "reproduced"),
        # 0.8 → 0.6 is 33% of the drop; no whole-space drop means no routing to match
        ({"a": _corruption(0.8, 0.2, [0.6]), "b": _corruption(0.5, 0.5, [0.5])},
         [False, False], "not reproduced"),
        ({"a": _corruption(0.8, 0.2, [0.3]), "b": _corruption(0.5, 0.6, [0.1])},
         [True, False], "partly"),
    ],
)  # fmt: skip
def test_conflict_claim_counts_corruptions_a_subspace_nearly_matches(corruptions, close, verdict):
    record = {"layer": 3, "n": 8, "corruptions": corruptions}
    assert [r["close"] for r in V.conflict_routing(record)] == close
    c = V.conflict_claim(record)
    assert c.verdict == verdict and c.ours == f"{sum(close)} of 2 corruptions"
    assert c.ci is None and "80%" in c.ci_reason
    assert c.settings == {"layer": 3, "n": 8, "corruptions": ["a", "b"]}
    assert V.conflict_claim(None) is None and V.conflict_claim({"corruptions": {}}) is None


def _browse(n):
    return BrowseRun(layer=12, partition=[4, 4], n_activations=n, query={}, subspaces=[])


def test_browser_claim_needs_the_papers_scale():
    at = V.browser_claim([_browse(100_000)])
    below = V.browser_claim([_browse(99_999)])
    assert (at.verdict, at.ours, at.settings) == ("reproduced", 100_000, {"layer": 12})
    assert below.verdict == "partly"
    none = V.browser_claim([])
    assert none.verdict == "not tested" and none.ours is None and none.ci_reason


def test_claims_of_a_run_are_in_the_vocabulary_and_replications():
    ev, tr = _evaluation(True, True, 0.7, {"pca": 0.1}, conflict=None)
    found = V.claims(ev, tr, _seeds([_HIT, _MERGED], [_MERGED]))
    assert [c.id for c in found] == [
        "mean_gini_ndm_vs_baselines", "toy_recovery", "preimage_browser_scale",
    ]  # fmt: skip
    assert all(c.verdict in VERDICTS and c.kind == "replication" for c in found)


# --- the analyze section ------------------------------------------------------------------

PROTOCOL = PROFILES["smoke"]


def _gini(methods, lows):
    e = Estimate(0.5, (0.4, 0.6))
    variants = {k: e for k in ("unnormalized", "dimension", "variance")}
    diff = {m: {k: Estimate(lo + 0.1, (lo, lo + 0.2)) for k in variants} for m, lo in lows.items()}
    return {m: variants for m in methods}, diff


def _screen(name, screened):
    """A screen record; the test and its run are not read by the verdicts."""
    return Screen(SimpleNamespace(name=name), 2, None, 0.6 if screened else 0.05, screened)


def _analysis(screened, converged=True, lows=None):
    rows = (
        ScreenRow("a", 1, 0.02, (-0.01, 0.05), 0.05, False),
        ScreenRow("b", 2, -0.3, (-0.4, -0.2), math.nan, False),
    )
    if screened:
        rows += (ScreenRow("c", 2, 0.9, (0.8, 1.0), 0.6, True, {"ndm": [0.5, 0.5]}),)
    trained = (TrainedLayer(2, (4, 4), 30, converged, 30, 0.04, (), 100),)
    if screened:
        mean, diff = _gini(["ndm", "pca", "random"], lows or {})
        screens = (_screen("a", False), _screen("b", False), _screen("c", True))
        summary = GiniSummary(0.3, screens, {"c": mean}, mean, diff)
    else:
        summary = GiniSummary(0.3, (), {}, None, None)
    browser = {"layer": 2, "entries": [], "top": [], "neighbours": [], "partition": [4, 4]}
    sweep = LayerSweep(PROTOCOL.layer_selection(), [
        LayerChoice("a", 1, (0, 1, 2), (0.01, 0.05, 0.02), (0.01,) * 3, 1, ("x-0016",),
                    (0.9, math.nan, 0.8)),
        LayerChoice("b", 2, (1, 2), (math.nan, math.nan), (math.nan, math.nan), 2, ("x-0016",),
                    (math.nan, math.nan)),
    ])  # fmt: skip
    return Analysis(PROTOCOL, ("induction",), rows, trained, summary, browser, sweep)


def test_section_without_a_screened_test_flags_every_test_and_the_browser_layer():
    s = V.section(_analysis(screened=False, converged=False))
    kinds = [c.kind for c in s.caveats]
    assert kinds == ["not_run", "null_effect", "null_effect", "null_effect", "not_converged"]
    a, b, browser = (c.message for c in s.caveats[1:4])
    assert a.startswith("a: ") and "removes 5.0% of the clean metric" in a
    assert b.startswith("b: ") and "cannot remove a behaviour the model lacks" in b
    assert "layer 2 for the preimage browser only" in browser
    assert list(s.headline) == ["n_subspaces"]
    assert s.headline["n_subspaces"].value == 2 and s.headline["n_subspaces"].ci is None
    assert s.details["gini"] == {}
    assert [t["test"] for t in s.details["tests"]] == ["a", "b"]
    assert "normalized" not in s.details["tests"][0]  # never patched


def test_section_with_a_screened_test_reports_each_gini_and_flags_insignificant_baselines():
    s = V.section(_analysis(screened=True, lows={"pca": 0.05, "random": -0.02}))
    assert [c.kind for c in s.caveats] == ["not_run", "null_effect", "null_effect",
                                           "not_significant"]  # fmt: skip
    assert "random baseline" in s.caveats[-1].message
    assert {k: (n.value, n.ci) for k, n in s.headline.items() if k.startswith("gini_")} == {
        f"gini_{m}": (0.5, (0.4, 0.6)) for m in ("ndm", "pca", "random")
    }
    g = s.details["gini"]
    assert g["per_test"] == {
        "a": "no signal",
        "b": "no signal",
        "c": {m: {"value": 0.5, "ci": [0.4, 0.6]} for m in g["mean"]},
    }
    assert g["ndm_minus"]["random"]["ci"] == pytest.approx([-0.02, 0.18])
    assert s.details["tests"][2]["normalized"] == {"ndm": [0.5, 0.5]}
    assert s.to_json()["details"]["trained"][0]["stop_reason"].startswith("no subspace pair")


def test_section_details_hold_the_whole_layer_sweep():
    a = _analysis(screened=True)
    s = V.section(a)
    assert s.details["layer_sweep"] == a.sweep.to_json()
    back = LayerSweep.from_dict(s.to_json()["details"]["layer_sweep"])  # NaN shares as "nan"
    assert [c.candidates for c in back.choices] == [(0, 1, 2), (1, 2)]
    assert back.choices[0].shares == (0.01, 0.05, 0.02) and math.isnan(back.choices[1].shares[0])

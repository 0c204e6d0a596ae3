"""The Koopman verdicts on planted stage Results: every branch of every claim, judged on the
Claim's fields (verdict, ours, ci, reason), never on rendered text."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from structlens.koopman import verdicts as v
from structlens.koopman.stages import (
    AblationEffects,
    DepthAnalysis,
    InvarianceFit,
    ReductionRow,
    SAESeedRun,
    SpectralComparison,
    SpectrumFit,
    SplitHalfFit,
)
from structlens.results import to_jsonable
from structlens.verdicts import VERDICTS


def split(slope=-0.5, ci=(-0.7, -0.3), layer=1, cond=2.0, m=1000, dictionary="pca8"):
    return SplitHalfFit(
        layers=[layer], dictionary=dictionary, n_features=8, n_samples_total=m,
        blocks_requested=32, blocks_used=30, slope=slope, slope_ci=list(ci), slope_se=0.1,
        slope_last4=slope, slope_w2=slope, n_samples=np.array([10.0, 20.0, 40.0]),
        w_inf_mean=np.array([0.3, 0.2, 0.15]), w2_mean=np.array([0.2, 0.1, 0.07]),
        eig_condition_max=cond, eig_condition_median=1.5, n_repeats=10,
    )  # fmt: skip


def tails(max_kurt, spread=2.0):
    """Tail statistics whose heaviest coordinate's kurtosis is ``max_kurt`` ± ``spread``."""
    return {
        "max_excess_kurtosis": max_kurt, "p95_excess_kurtosis": 1.0, "norm_kurtosis": 1.1,
        "max_kurtosis_lower": max_kurt - spread, "max_kurtosis_upper": max_kurt + spread,
        "kurtosis_blocks": 32, "norm_kurtosis_gaussian": 1.0, "gram_max_excess_kurtosis": 3.0,
        "gram_tail_ratio": 5.0,
    }  # fmt: skip


def spec(dictionary="pca8", layer=1, henrici=0.3, extrapolated=0.2, cos2=0.2, state=2.0, lift=1.0):
    return SpectrumFit(
        layers=[layer], dictionary=dictionary, n_features=8, n_samples=1000,
        eigenvalues=np.array([0.9 + 0.1j, 0.9 - 0.1j, 0.5]), spectral_radius=0.906,
        spectral_radius_ci=[0.88, 0.93], henrici_relative=henrici,
        henrici_noise_floor_relative=None if extrapolated is None else 0.05,
        henrici_extrapolated_relative=extrapolated,
        noise_floor_reason=None if extrapolated is not None else "too few samples",
        kappa_V=3.0, eig_condition_max=2.0, eig_condition_median=1.2, dissociation_k=2,
        dissociation_mean_cos2=cos2, dissociation_largest_angle_deg=40.0, control_rank=4,
        control_energy_kept=0.91, cond_gram=10.0, state_tails=tails(state),
        lifted_tails=None if dictionary == "identity" else tails(lift),
        mom_eigenvalues=None, mom_bottleneck=None, mom_reason="mom_blocks is 0",
    )  # fmt: skip


def inv(dictionary, pooled, layer=1):
    return InvarianceFit(
        layers=[layer], dictionary=dictionary, n_features=16, pooled=pooled, mean=pooled,
        median=pooled, n_dead=0, dictionary_fit_split="train", n_train_prompts=32,
        n_test_prompts=32,
    )  # fmt: skip


def effects(pca, modes, random):
    cis = [list(pca), list(modes), list(random)]
    return AblationEffects(
        layer=6, dictionary="pca8", positions="all", dimension=4, clean_metric=3.0,
        depth_to_readout=24, methods=["pca", "modes", "random"],
        mean=[sum(c) / 2 for c in cis], ci=cis, mode_eigenvalues=np.array([0.9, 0.8]),
    )  # fmt: skip


def red(order, error=1.0, eg=10.0, instance=5.0, flagged=True):
    return ReductionRow(
        layers=[5, 6, 7], dictionary="pca32", order=order, horizon=3, error=error,
        enns_glover=eg, certified=error <= eg, markov_bound=2.0, instance_error=0.5,
        instance_bound=instance, effective_rank=4.0, rho0=1.1, control_error=3 * eg,
        control_flagged=flagged,
    )  # fmt: skip


def seeds(penalty, mean_cos, share, residual=(0.5, 0.6)):
    n = len(residual)
    pairs = [[i, j] for i in range(n) for j in range(i + 1, n)]
    return SAESeedRun(
        layer=6, penalty=penalty, d_sae=256, seeds=list(range(n)), residual=list(residual),
        n_dead=[0] * n, fvu=[0.2] * n, pairs=pairs, mean_cos=[mean_cos] * len(pairs),
        share_above=[share] * len(pairs),
    )  # fmt: skip


def comparison(pair, p, kind="seeds", d=0.3, n_resamples=200):
    return SpectralComparison(
        pair=pair, kind=kind, test="split-half null, own PCA-8", distance=d, null_q95=0.2,
        p_value=p, n_resamples=n_resamples, n_samples=[500, 500], shared_distance=None,
        shared_null_q95=None,
        shared_p_value=None,
    )  # fmt: skip


def _valid(c, verdict):
    assert c.verdict == verdict and c.verdict in VERDICTS
    assert c.paper == v.PAPER[c.id].text
    if c.verdict == "not tested":
        assert c.note and c.ci_reason  # "not tested" always says why


# ---------------------------------------------------------------- 1. split-half rate
@pytest.mark.parametrize(
    ("ci", "decision"),
    [
        ((-0.7, -0.3), "reproduced"),  # holds -1/2, excludes -1/4
        ((-0.7, -0.2), "unidentified"),  # holds both rates
        ((-0.45, -0.1), "not reproduced"),  # excludes -1/2
        ((float("nan"), 0.1), "not reproduced"),  # no interval holds no rate
    ],
)
def test_the_rate_decision_needs_the_slower_rate_excluded(ci, decision):
    assert v.rate_decision(ci) == decision


def test_split_half_judges_only_the_headline_dictionary():
    fits = {
        "L6/spectral32": split(-0.45, (-0.6, -0.3), dictionary="spectral32"),
        "L6/pca8": split(-0.1, (-0.2, 0.0)),  # would fail: listed, never chosen from
        "L10/spectral32": split(-0.55, (-0.9, -0.45), dictionary="spectral32"),
    }
    c = v.split_half_claim(fits, "spectral32")
    _valid(c, "reproduced")
    assert c.ours == -0.45 and c.ci == (-0.6, -0.3) and c.ci_reason is None
    assert c.settings["fits"] == ["L6/spectral32", "L10/spectral32"]
    assert c.per_setting["L6/pca8"]["decision"] == "not reproduced"
    assert "-0.25 is excluded at 2 of 2" in c.note


@pytest.mark.parametrize(
    ("first", "second", "verdict"),
    [
        ((-0.6, -0.3), (-0.8, -0.1), "partly"),  # one reproduced, one undecided
        ((-0.6, -0.1), (-0.8, -0.2), "unidentified"),  # neither interval excludes -1/4
        ((-0.6, -0.1), (-0.4, -0.1), "not reproduced"),  # undecided and excluded
        ((-0.2, 0.1), (-0.4, -0.1), "not reproduced"),
    ],
)
def test_split_half_over_the_probe_layers(first, second, verdict):
    fits = {"L6/pca8": split(-0.45, first), "L10/pca8": split(-0.3, second)}
    c = v.split_half_claim(fits, "pca8")
    _valid(c, verdict)
    assert c.ours == -0.45 and c.ci == first


def test_split_half_without_a_finite_interval_gives_its_reason():
    c = v.split_half_claim({"L6/pca8": split(-0.5, (float("nan"), 0.1))}, "pca8")
    assert c.ci is None and c.ci_reason == "no finite jackknife interval"
    _valid(c, "not reproduced")  # a NaN interval holds no rate


def test_split_half_without_the_headline_is_not_tested():
    _valid(v.split_half_claim({"L6/pca8": split()}, "spectral32"), "not tested")


# ---------------------------------------------------------------- 2. non-normality
def test_non_normal_reproduced_judges_only_the_headline_dictionary():
    fits = {
        "L6/identity": spec("identity", 6, henrici=0.01, extrapolated=0.0, cos2=0.9),
        "L6/pca8": spec("pca8", 6, extrapolated=0.2, cos2=0.2),
        "L10/pca8": spec("pca8", 10, extrapolated=0.15, cos2=0.3),
    }
    c = v.non_normal_claim(fits, "pca8", 0.9)
    _valid(c, "reproduced")  # the identity fit fails both rules, and is not the headline
    assert c.ours == 0.2 and c.ci is None and c.ci_reason
    assert c.settings["fits"] == ["L6/pca8", "L10/pca8"]
    assert set(c.per_setting) == set(fits)


@pytest.mark.parametrize(
    ("extrapolated", "cos2", "verdict"),
    [(0.2, 0.9, "partly"), (0.05, 0.2, "partly"), (0.05, 0.9, "not reproduced")],
)
def test_non_normal_partly_and_not_reproduced(extrapolated, cos2, verdict):
    c = v.non_normal_claim({"L6/pca8": spec(extrapolated=extrapolated, cos2=cos2)}, "pca8", 0.9)
    _valid(c, verdict)
    assert c.ours == extrapolated


def test_a_fit_without_noise_floor_is_judged_by_its_plain_departure():
    fit = spec(henrici=0.3, extrapolated=None, cos2=0.2)
    c = v.non_normal_claim({"L6/pca8": fit}, "pca8", 0.9)
    assert c.ours == 0.3 and c.settings["no_noise_floor"] == ["L6/pca8"]
    _valid(c, "reproduced")


def test_non_normal_without_the_headline_is_not_tested():
    _valid(v.non_normal_claim({"L6/pca8": spec()}, "pca32", 0.9), "not tested")


# ---------------------------------------------------------------- 3. invariance gap
def _gap(variance, frequency, spectral=0.2, relu=0.4):
    fits = [inv("sae_variance16", variance), inv("sae_frequency16", frequency)]
    return fits + [inv("spectral16", spectral), inv("relu16", relu)]


@pytest.mark.parametrize(
    ("variance", "frequency", "verdict"),
    [(0.6, 0.5, "reproduced"), (0.6, 0.3, "partly"), (0.1, 0.15, "not reproduced")],
)
def test_invariance_gap(variance, frequency, verdict):
    c = v.invariance_gap_claim(_gap(variance, frequency), 16)
    _valid(c, verdict)
    assert c.ours == min(variance, frequency) and c.ci is None and c.ci_reason


def test_invariance_gap_missing_a_dictionary_is_not_tested():
    c = v.invariance_gap_claim(_gap(0.6, 0.5)[:3], 16)
    _valid(c, "not tested")
    assert "relu16" in c.note


# ---------------------------------------------------------------- 4. IOI ablation ordering
HOLDS = ((-0.9, -0.7), (-0.5, -0.3), (-0.1, 0.05))
TIE = ((-0.9, -0.4), (-0.5, -0.3), (-0.1, 0.05))  # point estimates ordered, intervals overlap
REVERSED = ((-0.3, -0.2), (-0.9, -0.7), (-0.1, 0.05))  # modes separate above PCA


@pytest.mark.parametrize(
    ("ci", "want"),
    [([-0.5, -0.2], (0.2, 0.5)), ([0.1, 0.3], (0.1, 0.3)), ([-0.2, 0.4], (0.0, 0.4))],
)
def test_abs_interval(ci, want):
    assert v.abs_interval(ci) == pytest.approx(want)


@pytest.mark.parametrize(
    ("settings", "verdict", "ours"),
    [
        ([HOLDS, HOLDS], "reproduced", "2 of 2 settings"),
        ([HOLDS, TIE], "partly", "1 of 2 settings"),
        ([REVERSED, TIE], "not reproduced", "0 of 2 settings"),
        ([TIE, TIE], "unidentified", "0 of 2 settings"),
    ],
)
def test_ioi_ordering_counts_only_separated_intervals(settings, verdict, ours):
    c = v.ioi_claim({f"L{6 + i}/all": effects(*s) for i, s in enumerate(settings)})
    _valid(c, verdict)
    assert c.ours == ours and c.ci is None and c.ci_reason
    want = {HOLDS: "holds", TIE: "tie", REVERSED: "reversed"}
    assert list(c.per_setting.values()) == [want[s] for s in settings]


def test_ioi_without_prompts_is_not_tested():
    c = v.ioi_claim({})
    _valid(c, "not tested")
    assert c.ours is None and "ioi_layers is empty" in c.note


def at_depth(depth, pca, modes, positions="all"):
    import dataclasses

    return dataclasses.replace(
        effects(pca, modes, (-0.01, 0.01)), depth_to_readout=depth, layer=30 - depth,
        positions=positions,
    )  # fmt: skip


def test_the_gap_interval_is_the_widest_the_marginals_allow():
    gap, ci = v.ablation_gap(effects((-0.6, -0.4), (-0.3, -0.1), (0, 0)))
    assert gap == pytest.approx(0.5 - 0.2) and ci == pytest.approx((0.4 - 0.3, 0.6 - 0.1))


@pytest.mark.parametrize(
    ("near", "far", "verdict", "order"),
    [
        (((0.8, 1.0), (0.1, 0.2)), ((0.3, 0.4), (0.2, 0.3)), "reproduced", "holds"),
        (((0.3, 0.4), (0.2, 0.3)), ((0.8, 1.0), (0.1, 0.2)), "not reproduced", "reversed"),
        (((0.5, 0.9), (0.1, 0.4)), ((0.4, 0.8), (0.1, 0.3)), "unidentified", "tie"),
    ],
)
def test_the_depth_half_needs_separated_gaps(near, far, verdict, order):
    """Nearest gap [0.6, 0.9] above the farthest [0.0, 0.2] holds (ratio 0.75 / 0.1); the
    same the other way round is reversed; overlapping gaps tie."""
    c = v.ioi_depth_claim({"L26/all": at_depth(4, *near), "L6/all": at_depth(24, *far)})
    _valid(c, verdict)
    row = c.per_setting["all"]
    assert row["ordering"] == order and row["nearest"]["depth_to_readout"] == 4
    g_near, g_far = (sum(p) / 2 - sum(m) / 2 for p, m in (near, far))
    assert c.ours == pytest.approx(g_near / g_far)


def test_the_depth_half_without_two_depths_is_not_tested():
    c = v.ioi_depth_claim({"L6/all": at_depth(24, (0.3, 0.4), (0.1, 0.2))})
    _valid(c, "not tested")
    assert "two depths" in c.note


# ---------------------------------------------------------------- 5. heavy tails
@pytest.mark.parametrize(
    ("state", "lifts", "verdict"),
    [
        (50.0, (1.0, 2.0), "reproduced"),
        (50.0, (1.0, 20.0), "partly"),
        (50.0, (30.0, 20.0), "not reproduced"),
        (50.0, (30.0, 10.0), "not reproduced"),  # one heavy, one unidentified, none light
        (50.0, (1.0, 10.0), "unidentified"),  # one light, one unidentified
        (5.0, (1.0, 20.0), "not tested"),  # light states: nothing to remove
        (10.0, (1.0, 2.0), "unidentified"),  # the states' bounds straddle HEAVY
    ],
)
def test_heavy_tails(state, lifts, verdict):
    fits = {
        "L6/identity": spec("identity", state=state),
        "L6/pca8": spec("pca8", state=state, lift=lifts[0]),
        "L6/rff64": spec("rff64", state=state, lift=lifts[1]),
    }
    c = v.heavy_tails_claim(fits)
    _valid(c, verdict)
    assert c.ours == state  # the states' max sample excess kurtosis
    assert c.settings["lifted_max_excess_kurtosis"] == {
        "L6/pca8_lifted": lifts[0], "L6/rff64_lifted": lifts[1]
    }  # fmt: skip
    if verdict == "not tested":
        assert "not heavy-tailed" in c.note


def test_only_the_lifts_of_heavy_layers_count():
    """A layer whose states are light has nothing for its lifts to remove: its heavy lift does
    not turn the claim at the heavy layer."""
    fits = {
        "L6/identity": spec("identity", layer=6, state=50.0),
        "L6/pca8": spec("pca8", layer=6, state=50.0, lift=1.0),
        "L9/identity": spec("identity", layer=9, state=1.0),
        "L9/pca8": spec("pca8", layer=9, state=1.0, lift=30.0),
    }
    c = v.heavy_tails_claim(fits)
    _valid(c, "reproduced")
    assert c.settings["classes"]["L9/pca8_lifted"] == "heavy"


def test_the_heavy_tail_decision_is_one_function_the_claim_calls(monkeypatch):
    """tail_class is strict at HEAVY on both bounds, and the claim decides through it (the
    calibration scores the same function): raising HEAVY turns heavy states light, and the
    claim "not tested"."""
    at = {"max_kurtosis_lower": v.HEAVY, "max_kurtosis_upper": v.HEAVY}
    assert v.tail_class(at) == "light" and not v.is_heavy(at)
    above = {"max_kurtosis_lower": v.HEAVY + 1e-9, "max_kurtosis_upper": v.HEAVY + 1}
    assert v.tail_class(above) == "heavy" and v.is_heavy(above)
    nan = {"max_kurtosis_lower": float("nan"), "max_kurtosis_upper": float("nan")}
    assert v.tail_class(nan) == "unidentified"
    fits = {"L6/identity": spec("identity", state=50.0), "L6/pca8": spec("pca8", lift=1.0)}
    assert v.heavy_tails_claim(fits).verdict == "reproduced"
    monkeypatch.setattr(v, "HEAVY", 100.0)
    assert v.heavy_tails_claim(fits).verdict == "not tested"


def test_tails_lists_each_layers_states_once():
    fits = {"L6/identity": spec("identity", 6), "L6/pca8": spec("pca8", 6)}
    assert list(v.tails(fits)) == ["L6/state", "L6/pca8_lifted"]


# ---------------------------------------------------------------- 6. reduction
def test_reduction_bound_and_certificate():
    bound, cert = v.reduction_claims([red(4), red(8, instance=4.0), red(16)])
    _valid(bound, "reproduced")
    assert bound.ours == 4.0 and bound.settings["enns_glover_order8"] == 10.0
    _valid(cert, "reproduced")
    assert cert.kind == "check" and cert.ours == pytest.approx(10.0)
    assert cert.positive_control["passed"] is True


def test_reduction_bound_partly_and_a_failed_certificate():
    bound, cert = v.reduction_claims([red(4, instance=20.0), red(8), red(16, error=11.0)])
    _valid(bound, "partly")  # order 4's instance bound is looser, order 16 not certified
    _valid(cert, "partly")
    assert cert.ours == pytest.approx(10.0 / 11.0)


def test_the_certificates_positive_control_fails_when_the_wrong_model_is_not_flagged():
    _, cert = v.reduction_claims([red(4), red(8, flagged=False), red(16)])
    assert cert.positive_control["passed"] is False


# ---------------------------------------------------------------- 7. SAE seeds
@pytest.mark.parametrize(("share", "verdict"), [(0.0, "not reproduced"), (0.2, "partly")])
def test_penalty_identifiability(share, verdict):
    c = v.penalty_claim([seeds(0.0, 0.3, 0.0), seeds(10.0, 0.4, share)])
    _valid(c, verdict)
    assert c.ours == pytest.approx(0.4) and c.ci is None and c.ci_reason


def test_penalty_with_one_seed_is_not_tested():
    c = v.penalty_claim([seeds(0.0, 0.3, 0.0, (0.5,)), seeds(10.0, 0.4, 0.0, (0.5,))])
    _valid(c, "not tested")


# ---------------------------------------------------------------- 8. universality
def test_universality_counts_seed_pairs_only():
    pairs = [
        comparison("L4-s0@2 vs L4-s1@2", 0.3),
        comparison("L4-s0@2 vs L4-s2@2", 0.01),
        comparison("L4-s0@2 vs L8-s0@4", 0.001, kind="depth"),
    ]
    c = v.universality_claim(pairs, None)
    _valid(c, "partly")
    assert c.ours == "1 of 2 seed pairs differ beyond sampling error"
    assert c.settings["pairs"] == ["L4-s0@2 vs L4-s1@2", "L4-s0@2 vs L4-s2@2"]


@pytest.mark.parametrize(("p", "verdict"), [(0.5, "reproduced"), (0.01, "not reproduced")])
def test_universality_all_or_none(p, verdict):
    c = v.universality_claim([comparison("a", p), comparison("b", p)], None)
    _valid(c, verdict)


def test_universality_adjusts_for_the_number_of_pairs():
    """Two pairs at p = 0.03 and 0.04 each differ at 0.05 alone, not after Holm (0.06)."""
    c = v.universality_claim([comparison("a", 0.03), comparison("b", 0.04)], None)
    _valid(c, "reproduced")
    assert c.settings["adjustment"] == "holm"
    assert c.settings["adjusted_p_values"] == pytest.approx([0.06, 0.06])
    c = v.universality_claim([comparison("a", 0.01), comparison("b", 0.04)], None)
    _valid(c, "not reproduced")  # 0.02 and 0.04: both differ


def test_universality_with_too_few_resamples_to_reject_is_not_tested():
    """20 resamples give p >= 1/21 = 0.048 > 0.05 / 3: three pairs could never differ after
    Holm's adjustment, so "universal" would be a verdict that cannot fail."""
    c = v.universality_claim([comparison(x, 1 / 21, n_resamples=20) for x in "abc"], None)
    _valid(c, "not tested")
    assert "resamples" in c.note
    c = v.universality_claim([comparison(x, 1 / 201, n_resamples=200) for x in "abc"], None)
    _valid(c, "not reproduced")


def test_universality_without_replicas_gives_the_reason():
    c = v.universality_claim([comparison("ft", 0.5, kind="fine-tune")], "replicas are missing")
    _valid(c, "not tested")
    assert c.note == "replicas are missing"


# ---------------------------------------------------------------- analyze's section
def _analysis(halves, not_run=None):
    layers = [h.layers[0] for h in halves]
    return DepthAnalysis(
        protocol={"name": "planted"}, layers=layers, split_half=halves,
        spectra=[spec(layer=layer) for layer in layers],
        invariance_layer=layers[len(layers) // 2], invariance=[inv("spectral16", 0.2)],
        invariance_not_run=not_run or {}, n_prompts=64,
    )  # fmt: skip


def test_section_headline_is_the_middle_layer_and_converged_layers_have_no_caveat():
    halves = [split(-0.4, layer=0), split(-0.6, (-0.8, -0.4), layer=1), split(layer=2)]
    sec = v.section(_analysis(halves))
    assert sec.caveats == ()
    assert sec.headline["slope"].value == -0.6 and sec.headline["slope"].ci == (-0.8, -0.4)
    assert sec.headline["spectral_radius"].ci == (0.88, 0.93)
    assert [r["layer"] for r in sec.details["layers"]] == [0, 1, 2]
    assert sec.details["invariance"] == [
        {"dictionary": "spectral16", "n_features": 16, "pooled": 0.2, "median": 0.2, "n_dead": 0}
    ]


def test_section_caveats():
    halves = [
        split(-1.5, (-2.0, -1.0), layer=0),  # excludes the M^-1/2 rate
        split(layer=1, cond=40.0, m=1000),  # 40² > 1000 / 2
        split(layer=2, cond=20.0, m=1000),  # 20² < 500: well conditioned
        split(-0.4, (-0.7, -0.2), layer=3),  # holds -1/2 and -1/4 alike
    ]
    sec = v.section(_analysis(halves, {"relu16": "too few rows"}))
    assert [(c.kind, c.message.split(":")[0]) for c in sec.caveats] == [
        ("not_converged", "layer 0"), ("ill_conditioned", "layer 1"),
        ("rate_unidentified", "layer 3"), ("not_run", "invariance residual of relu16"),
    ]  # fmt: skip


def test_section_maps_a_nonfinite_headline_to_null():
    halves = [split(float("nan"), (float("nan"), float("nan")), layer=0)]
    sec = v.section(_analysis(halves)).to_json()
    assert sec["headline"]["slope"] == {
        "value": None, "ci": None, "unit": "", "label": "split-half slope (layer 0)"
    }  # fmt: skip


# ---------------------------------------------------------------- stored Results
def test_a_spectrum_fit_survives_a_save_and_a_load(tmp_path):
    fit = dataclasses.replace(spec(), henrici_relative=float("nan"))
    back = SpectrumFit.load(fit.save(tmp_path))
    np.testing.assert_array_equal(back.eigenvalues, fit.eigenvalues)
    assert np.iscomplexobj(back.eigenvalues) and math.isnan(back.henrici_relative)
    assert back.state_tails == fit.state_tails and back.mom_eigenvalues is None


def test_results_holding_results_load_them_typed(tmp_path):
    """The section Results that hold a list of stage Results give them back as those Results
    (with their NaN), not as the JSON dicts a plain load would."""
    from structlens.koopman.stages import Reduction, SAEInvariance, Universality

    u = Universality([comparison("a vs b", float("nan"))], {"fine-tune": "missing"})
    r = Reduction([red(4), red(8, error=float("inf"))])
    s = SAEInvariance(16, {"d_sae": 64, "final_fvu": 0.5}, [inv("relu16", 0.4)])
    for i, result in enumerate((u, r, s)):
        back = type(result).load(result.save(tmp_path / str(i)))
        assert to_jsonable(back) == to_jsonable(result)
    back_u = Universality.load(tmp_path / "0")
    assert isinstance(back_u.comparisons[0], SpectralComparison)
    assert math.isnan(back_u.comparisons[0].p_value) and back_u.not_run == u.not_run
    back_r = Reduction.load(tmp_path / "1")
    assert [x.order for x in back_r.rows] == [4, 8] and back_r.rows[1].bound_ratio == 0.0
    assert SAEInvariance.load(tmp_path / "2").fits == s.fits


# ---------------------------------------------------------------- the comparison stage
def test_a_model_compared_with_itself_is_at_distance_zero(tmp_path):
    """The known answer behind the fine-tune's unchanged layer: the same model, layer and
    prompts give W∞ = 0 in both bases; another layer does not (the comparison can fail)."""
    from structlens.koopman.data import depth_prompts
    from structlens.koopman.protocol import PROFILES
    from structlens.koopman.stages import spectral_comparison
    from structlens.models import load_model

    model = load_model("tiny-llama")
    prompts = depth_prompts(model.tokenizer, n_corpus=48, max_tokens=32, n_task=0)
    kw = {"root": tmp_path, "n_resamples": 10, "shared_size": 8}
    same = spectral_comparison(
        PROFILES["smoke"], ("a", model, 1), ("b", model, 1), prompts, kind="fine-tune", **kw
    )
    assert same.distance == 0.0 and same.shared_distance == 0.0
    assert same.pair == "a@1 vs b@1" and same.p_value > v.ALPHA
    other = spectral_comparison(
        PROFILES["smoke"], ("a", model, 0), ("b", model, 1), prompts, kind="depth", **kw
    )
    assert other.distance > 0.0 and other.shared_distance > 0.0

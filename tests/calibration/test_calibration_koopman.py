"""The Koopman calibration runs the production split-half stage on planted linear systems
whose convergence rate is known, and the heavy-tail decision on planted states whose kurtosis
is known, and its documents report what it measured."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from structlens.calibration.koopman import (
    FAMILIES,
    MASSIVE_COORDINATES,
    MASSIVE_SHARE,
    calibrate_heavy_tails,
    calibrate_slope,
    calibrate_universality,
    planted_kurtosis,
    planted_rows,
    planted_states,
    spike_size,
)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_planted_slope_is_recovered_through_the_stage(family):
    """Known answers: W∞ falls as M^-1/2 for simple eigenvalues and M^-1/4 for a Jordan
    block; the mean slope over instances lands on it."""
    c = calibrate_slope(family, 8, first_seed=0)
    assert c.truth == FAMILIES[family]
    assert abs(c.mean_slope - c.truth) < 0.1, c
    assert 0 <= c.coverage_ci[0] <= c.coverage <= c.coverage_ci[1] <= 1
    assert c.mean_width > 0 and c.n == 8


def test_the_universality_rule_sees_a_moved_eigenvalue_and_holm_only_removes_rejections():
    """Known answer: replicas whose last one has its second eigenvalue moved by 0.4 differ
    in every instance (60 resamples: p can fall to 1/61, below Holm's 0.05 / 3); on
    replicas of one system the adjusted rule never says "differ" where the unadjusted one
    does not."""
    moved = calibrate_universality("4-d", "identity", 0.4, 3, first_seed=0, n_resamples=60)
    assert moved.expected and moved.rate == 1.0 == moved.raw_rate
    same = calibrate_universality("4-d", "identity", 0.0, 3, first_seed=0, n_resamples=60)
    assert not same.expected and same.rate <= same.raw_rate
    assert same.seeds == (0, 2) and same.replicas == 3


def test_planted_rows_group_rows_into_prompts_and_are_seeded():
    a, b = planted_rows("simple", seed=3), planted_rows("simple", seed=3)
    np.testing.assert_array_equal(a.Y, b.Y)
    assert a.X.shape == (256 * 16, 4) and a.U.shape == (256 * 16, 2)
    assert np.bincount(a.prompt_ids).tolist() == [16] * 256
    with pytest.raises(ValueError, match="family"):
        planted_rows("defective")  # type: ignore[arg-type]


def test_the_command_writes_both_documents(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from structlens.calibration import run as calibration
    from structlens.cli.main import app

    tiny = calibration.Profile(
        3, merge_rhos=(0.0,), gini_effects=(0.0,), universality_instances=1,
        universality_families=(("4-d", "identity", 0.0),), tail_sizes=((16, 256),),
        wedges=(1.5,), kappa_hat_families=(("saturating", 1.5),), kappa_hat_intervals=1,
        scale_ratios=(1.0,),
        congruity_families=(("copy, rotated basis", 0.0),), layer_map_noise=(0.0,),
    )  # fmt: skip
    monkeypatch.setitem(calibration.PROFILES, "smoke", tiny)
    r = CliRunner().invoke(app, ["calibrate", "--profile", "smoke", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "calibration.json").read_text())
    families = doc["koopman"]["split_half_slope"]["families"]
    assert [f["family"] for f in families] == ["simple", "jordan"] and families[0]["n"] == 3
    assert doc["koopman"]["split_half_slope"]["summary"].startswith("coverage of the true slope")
    assert {"causal_dim", "equivalence"} <= set(doc)
    assert all("summary" in doc[m][r] for m in ("causal_dim", "equivalence") for r in doc[m])
    md = (tmp_path / "calibration.md").read_text()
    assert f"| simple | -0.50 | 3 | {families[0]['mean_slope']:+.3f}" in md


def _sample_excess_kurtosis(x: np.ndarray) -> np.ndarray:
    """Per-column excess kurtosis, computed here and not by the code under test."""
    z = x - x.mean(0)
    return (z**4).mean(0) / (z**2).mean(0) ** 2 - 3


@pytest.mark.parametrize("kurtosis", [5.0, 8.0, 15.0, 50.0])
def test_the_massive_coordinates_have_the_stated_kurtosis(kurtosis):
    """Known answer: the spike size solved from the cumulant formula gives the planted
    excess kurtosis exactly in the mixture (1 − p)·N(0, 1) + p·N(a, 1), whose central moments
    are computed here from its raw moments; 400 000 rows land within 5% of it on each massive
    coordinate, and the other coordinates stay Gaussian."""
    a, p = spike_size(kurtosis), MASSIVE_SHARE
    normal = (1.0, 0.0, 1.0, 0.0, 3.0)  # E Z^k, k = 0..4
    raw = [(1 - p) * normal[k] + p * sum(
        math.comb(k, j) * a ** (k - j) * normal[j] for j in range(k + 1)
    ) for k in range(5)]  # fmt: skip
    mu = raw[1]
    m2 = raw[2] - mu**2
    m4 = raw[4] - 4 * mu * raw[3] + 6 * mu**2 * raw[2] - 3 * mu**4
    assert m4 / m2**2 - 3 == pytest.approx(kurtosis, rel=1e-9)
    assert planted_kurtosis("massive coordinates", kurtosis) == kurtosis
    k = np.sort(_sample_excess_kurtosis(planted_states("massive coordinates", kurtosis, 8,
                                                       400_000, seed=1)))  # fmt: skip
    assert k[-MASSIVE_COORDINATES:] == pytest.approx(kurtosis, rel=0.05)
    assert np.abs(k[:-MASSIVE_COORDINATES]).max() < 0.06


def test_the_gaussian_and_student_t_states_have_the_stated_kurtosis():
    """Known answers: Gaussian coordinates (isotropic or correlated) have excess kurtosis 0;
    t_ν has 6 / (ν − 4) (scipy's value), which 400 000 rows of t_10 reproduce (its eighth
    moment is finite, so the sample kurtosis converges)."""
    from scipy import stats

    for family in ("isotropic Gaussian", "correlated Gaussian"):
        assert planted_kurtosis(family, 0.0) == 0.0
        k = _sample_excess_kurtosis(planted_states(family, 0.0, 8, 400_000, seed=2))
        assert np.abs(k).max() < 0.06, family
    for nu in (10.0, 6.0, 5.0, 4.5):
        assert planted_kurtosis("Student-t", nu) == pytest.approx(float(stats.t(nu).stats("k")))
    k = _sample_excess_kurtosis(planted_states("Student-t", 10.0, 8, 400_000, seed=3))
    assert k.mean() == pytest.approx(1.0, abs=0.1)
    with pytest.raises(ValueError, match="ν > 4"):
        planted_kurtosis("Student-t", 4.0)
    with pytest.raises(ValueError, match="family"):
        planted_states("Cauchy", 1.0, 4, 10)
    with pytest.raises(ValueError, match="share"):
        spike_size(1000.0)


def test_the_heavy_tail_rule_is_scored_through_the_production_decision(monkeypatch):
    """Gaussian states are light and 50-kurtosis massive coordinates heavy; the rates are the
    production decision's (raising koopman.verdicts.HEAVY turns the heavy states light), and
    the old statistic (the largest sample kurtosis) is reported beside them."""
    from structlens.koopman import verdicts

    null = calibrate_heavy_tails("correlated Gaussian", 0.0, 32, 1000, 5, first_seed=7)
    assert not null.expected and null.rate == 0.0 and null.light_rate == 1.0
    assert null.n == 5 and null.seeds == (7, 11)
    assert null.quantiles[0] <= null.quantiles[1] <= null.quantiles[2] < null.raw_quantiles[2]
    heavy = calibrate_heavy_tails("massive coordinates", 50.0, 32, 2000, 5, first_seed=7)
    assert heavy.expected and heavy.kurtosis == 50.0 and heavy.rate == 1.0
    assert heavy.light_rate == 0.0 and heavy.raw_rate == 1.0
    assert heavy.rate_ci[0] < 1.0 == heavy.rate_ci[1]
    monkeypatch.setattr(verdicts, "HEAVY", 1e9)
    silenced = calibrate_heavy_tails("massive coordinates", 50.0, 32, 2000, 5, first_seed=7)
    assert silenced.rate == 0.0 and silenced.light_rate == 1.0 and not silenced.expected
    assert silenced.quantiles == heavy.quantiles


def test_the_bounds_do_not_call_t_tails_of_a_small_kurtosis_heavy():
    """t_5 (population excess kurtosis 6 < HEAVY): over 64 coordinates the largest sample
    kurtosis passes the threshold in most instances, the largest jackknife lower bound in
    none (the old rule's false positive, which the bounds remove)."""
    t5 = calibrate_heavy_tails("Student-t", 5.0, 64, 1984, 8, first_seed=3)
    assert not t5.expected and t5.raw_rate >= 0.75
    assert t5.rate == 0.0


def test_reports_print_the_committed_calibration_beside_their_verdicts():
    """The package's calibration is the committed docs/calibration.json, and every rule
    with a summary there becomes one note of its method."""
    from pathlib import Path

    from structlens.verdicts import calibration_notes

    doc = json.loads((Path(__file__).parents[2] / "docs" / "calibration.json").read_text())
    for method in ("koopman", "ndm", "causal_dim", "equivalence"):
        rules = [r for r in doc.get(method, {}).values() if "summary" in r]
        notes = calibration_notes(method)
        assert len(notes) == len(rules)
        assert all(r["rule"] in n and r["summary"] in n for r, n in zip(rules, notes))
        assert all(n.startswith("NOT CALIBRATED") == bool(r["misses"])
                   for r, n in zip(rules, notes))  # fmt: skip
    assert calibration_notes("no such method") == ()
    # CONGRUITY calls a rotated copy different
    assert doc["equivalence"]["congruity_decision"]["misses"]


def test_a_rule_misses_its_target_only_at_the_protocols_own_setting():
    from structlens.calibration.run import misses

    doc = {"target_false_positive_rate": 0.05, "target_coverage": [0.9, 0.98]}
    null = {"family": "null", "expected": False, "rate": 0.1, "rate_ci": [0.07, 0.15]}
    ok = {"family": "alt", "expected": True, "rate": 0.9, "rate_ci": [0.85, 0.93]}
    assert misses({"families": [ok]}, doc) == []
    (found,) = misses({"families": [null, ok]}, doc)
    assert "0.10 [0.07, 0.15]" in found and "family null" in found
    # a row of another resampling unit than the protocol's is a comparison, not the rule
    assert misses({"unit": "layer", "families": [null | {"unit": "head"}]}, doc) == []
    covered = {"family": "c", "coverage": 0.8, "coverage_ci": [0.74, 0.85]}
    assert "coverage 0.80" in misses({"families": [covered]}, doc)[0]
    assert misses({"families": [covered | {"coverage_ci": [0.85, 0.93]}]}, doc) == []

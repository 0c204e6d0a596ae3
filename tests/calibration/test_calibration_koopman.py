"""The Koopman calibration runs the production split-half stage on planted linear systems
whose convergence rate is known, and its documents report what it measured."""

from __future__ import annotations

import json

import numpy as np
import pytest

from structlens.calibration.koopman import (
    FAMILIES,
    calibrate_slope,
    calibrate_universality,
    planted_rows,
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
        universality_families=(("4-d", "identity", 0.0),),
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
    assert calibration_notes("no such method") == ()

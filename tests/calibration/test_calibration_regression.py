"""The smoke calibration runs the production code path on the first planted instances of the
committed families, and fails when any rule's rate has moved from the committed document."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from structlens.calibration.regression import LEVEL, shifts
from structlens.calibration.run import PROFILES, run

COMMITTED = json.loads((Path(__file__).parents[2] / "docs" / "calibration.json").read_text())


@pytest.fixture(scope="module")
def smoke() -> dict:
    return run("smoke", jobs=2)


def test_no_rule_has_moved_from_the_committed_calibration(smoke):
    moved = shifts(smoke, COMMITTED)
    assert not moved, (
        "calibration moved; fix the rule or rerun `python -m structlens.calibration "
        "--profile cpu --doc-dir docs`:\n" + "\n".join(map(str, moved))
    )


def test_the_smoke_run_covers_every_committed_rule_and_family_kind(smoke):
    """Nothing is skipped silently: every committed rule is scored, on its null and its
    alternative families alike."""
    for method in ("koopman", "ndm", "causal_dim", "equivalence"):
        assert set(smoke[method]) == set(COMMITTED[method])
        for rule, block in smoke[method].items():
            rows = block.get("families", block.get("effects"))
            n = PROFILES["smoke"].instances_of(rule)
            assert rows and all(r["n"] == n for r in rows), rule
            if "expected" in rows[0]:
                assert {r["expected"] for r in rows} == {True, False}, rule


def _one(doc: dict, method: str, rule: str, **key) -> dict:
    rows = doc[method][rule].get("families", doc[method][rule].get("effects"))
    (row,) = [r for r in rows if all(r[k] == v for k, v in key.items())]
    return row


def test_a_planted_regression_is_caught_and_an_unchanged_count_is_not():
    """Positive control: null families whose false-positive rate rose from the committed
    0.00 to 5 in 20 (the merge rule's, and the heavy-tail rule's on Gaussian states of one
    size of two), and an interval whose coverage fell to 12 in 20, are reported; the
    committed rates themselves, at 20 instances, are not."""
    doc = copy.deepcopy(COMMITTED)
    methods = ("koopman", "ndm", "causal_dim", "equivalence")
    for block in (b for m in methods for b in doc[m].values()):
        for row in block.get("families", block.get("effects", [])):
            for m in ("rate", "coverage", "accepted"):
                if m in row:
                    row[m] = round(row[m] * 20) / 20
            row["n"] = 20
    assert shifts(doc, COMMITTED) == []
    null = _one(doc, "ndm", "merge_rule", d=2, rho=0.0)
    assert _one(COMMITTED, "ndm", "merge_rule", d=2, rho=0.0)["rate"] == 0.0
    null["rate"] = 5 / 20
    kappa = _one(doc, "causal_dim", "kappa_interval", rho=0.0, unit="chunk")
    kappa["coverage"] = 12 / 20
    gaussian = dict(family="isotropic Gaussian", d=64)
    assert _one(COMMITTED, "koopman", "heavy_tails", **gaussian)["rate"] == 0.0
    _one(doc, "koopman", "heavy_tails", **gaussian)["rate"] = 5 / 20
    moved = shifts(doc, COMMITTED)
    assert {(s.rule, s.measure) for s in moved} == {
        ("merge_rule", "rate"),
        ("kappa_interval", "coverage"),
        ("heavy_tails", "rate"),
    }
    (tails,) = [s for s in moved if s.rule == "heavy_tails"]
    assert tails.family == {"family": "isotropic Gaussian", "effect": 0.0, "d": 64, "m": 1984}
    assert all(s.p_value < LEVEL for s in moved)
    assert "5/20" in str(next(s for s in moved if s.rule == "merge_rule"))

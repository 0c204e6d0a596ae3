"""``structlens analyze gemma3-270m --profile smoke`` end to end (issue 26).

The smoke profile on a real model with a 262,144-token vocabulary and 72 heads: every stage
computes, the report is written, and the numbers a reader gets are real ones (the circuit
tasks solved, a finite κ inside its interval, the sanity copy recovered under the smoke
protocol's bounds on patched forwards and NDM subspaces).  Nothing here is timed.
"""

import json
import math

import pytest
from typer.testing import CliRunner

from structlens.analyze import PROFILES, STAGES
from structlens.cli.main import app

pytestmark = pytest.mark.slow

SMOKE = PROFILES["smoke"]


@pytest.fixture(scope="module")
def gemma_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gemma3-smoke")
    args = ["analyze", "gemma3-270m", "--profile", "smoke", "--out", str(out), "--quiet"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out, json.loads((out / "analysis.json").read_text())


def _inside(h):
    lo, hi = h["ci"]
    return math.isfinite(h["value"]) and lo <= h["value"] <= hi


def test_every_stage_computes_and_the_report_is_written(gemma_run):
    out, doc = gemma_run
    assert (out / "report.html").stat().st_size > 0
    run = doc["run"]
    assert (run["model"], run["profile"], run["d_model"], run["n_layers"]) == (
        "gemma3-270m", "smoke", 640, 18,
    )  # fmt: skip
    assert {s: v["status"] for s, v in run["stages"].items()} == dict.fromkeys(STAGES, "computed")


def test_tasks_are_solved_with_intervals(gemma_run):
    head = gemma_run[1]["tasks"]["headline"]
    for task in ("ioi", "greater_than"):  # Gemma 3 with its <bos> gets both right
        acc = head[f"{task}_accuracy"]
        assert _inside(acc) and 0 <= acc["ci"][0] and acc["ci"][1] <= 1
        assert acc["ci"][0] > 0.5, acc  # well above chance over the smoke's prompts
        assert _inside(head[f"{task}_metric"]) and head[f"{task}_metric"]["ci"][0] > 0


def test_kappa_is_finite_inside_its_interval(gemma_run):
    section = gemma_run[1]["causal_dim"]
    kappas = {k: h for k, h in section["headline"].items() if k.startswith("kappa_L")}
    assert kappas
    for h in kappas.values():
        assert _inside(h) and 1 <= h["value"] <= 640, h


def test_sanity_copy_is_recovered_within_the_smoke_bounds(gemma_run):
    section = gemma_run[1]["equivalence"]
    row = section["details"]["rows"][0]
    assert "copy" in row["pair"] and row["score"] == 1.0  # the same function: every head passes
    assert row["sanity"]["passed"] and row["decisions"]["matching"] == "equivalent"
    comparison, protocol = row["comparison"], SMOKE.equivalence
    # 32 of the 72 matched heads, a seeded random subset, each with its null
    assert len(comparison["heads"]["pairs"]) == protocol.max_validate_heads < 72
    assert comparison["head_selection"]["method"] == "random"
    # the head groups of 8 of B's 18 layers
    groups = comparison["head_groups"]["pairs"]
    assert len(set(groups)) == protocol.max_validate_head_groups and set(groups) <= set(range(18))


def test_ndm_trains_at_most_the_bounded_subspaces(gemma_run):
    section = gemma_run[1]["ndm"]
    assert 1 <= section["headline"]["n_subspaces"]["value"] <= SMOKE.ndm.max_units
    for name, h in section["headline"].items():
        if name.startswith("gini_"):
            assert 0 <= h["value"] <= 1 and h["ci"][0] <= h["ci"][1]

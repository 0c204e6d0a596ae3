import json
import shutil

import pytest
from typer.testing import CliRunner

from structlens.analyze import STAGES, AnalyzeConfig, parse_layers
from structlens.causal_dim.stages import kappa_layers
from structlens.causal_dim.verdicts import MIN_KAPPA_VECTORS
from structlens.cli.main import app
from structlens.pipeline.progress import ProgressBars


def test_smoke_analysis_writes_every_method_with_headlines_and_caveats(analysis_dir, analysis):
    assert (analysis_dir / "report.html").exists()
    assert analysis["run"]["model"] == "tiny-llama"
    for method in STAGES:
        section = analysis[method]
        assert isinstance(section["caveats"], list)
        assert all({"kind", "message"} <= set(c) for c in section["caveats"])
        for h in section["headline"].values():
            assert {"value", "ci", "unit", "label"} <= set(h)
            if h["ci"] is not None and h["value"] is not None:
                assert h["ci"][0] <= h["ci"][1]
    # the tokenizer of tiny-llama (bytes) cannot build IOI: said, not silently dropped
    assert any("ioi" in c["message"] for c in analysis["tasks"]["caveats"])
    # at most 8 vectors per layer in the smoke protocol: κ must be flagged as from too few
    kinds = {c["kind"] for c in analysis["causal_dim"]["caveats"]}
    assert "too_few_vectors" in kinds
    rows = analysis["causal_dim"]["details"]["layers"]
    cap = AnalyzeConfig(profile="smoke").settings.causal_dim.kappa_max_vectors
    assert all(r["n_vectors"] <= cap < MIN_KAPPA_VECTORS for r in rows)


def test_sanity_row_recovers_the_rotated_copy(analysis):
    row = analysis["equivalence"]["details"]["rows"][0]
    assert "copy" in row["pair"]
    assert row["score"] == 1.0  # a function-preserving copy: every matched head passes


def test_second_run_is_a_cache_hit(analysis_dir, analysis, tmp_path):
    out = tmp_path / "again"
    shutil.copytree(analysis_dir, out)
    result = CliRunner().invoke(
        app, ["analyze", "tiny-llama", "--profile", "smoke", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    # not quiet: headline numbers and every caveat are printed, then the report's path
    assert "caveats" in result.output and "too_few_vectors" in result.output
    assert str(out / "report.html") in result.output.replace("\n", "")
    again = json.loads((out / "analysis.json").read_text())
    assert {s["status"] for s in again["run"]["stages"].values()} == {"cached"}
    assert {m: again[m] for m in STAGES} == {m: analysis[m] for m in STAGES}


def test_report_rerenders_identically(analysis_dir, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(analysis_dir, out)
    (out / "report.html").unlink()
    shutil.rmtree(out / "cache")  # nothing is recomputed: the cache is not even needed
    result = CliRunner().invoke(app, ["report", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "report.html").read_bytes() == (analysis_dir / "report.html").read_bytes()


def test_report_without_analysis_fails_clearly(tmp_path):
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "structlens analyze" in result.output


def test_bad_profile_is_a_one_line_error(tmp_path):
    result = CliRunner().invoke(app, ["analyze", "tiny-llama", "--profile", "gpu"])
    assert result.exit_code == 2
    assert "--profile must be one of smoke, cpu, full" in result.output


def test_progress_bars_run_and_close():
    progress = ProgressBars(True)
    with progress.session(), progress.stage("stage", 2) as step:
        step("first")
        with step.loop("inner", 5) as done:
            done(3)
        step("second")
    assert progress._bar is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"profile": "huge"}, "profile must be one of"),
        ({"executor": "slurm"}, "executor must be"),
        ({"stages": ("koopman", "sae")}, "stages must name"),
        ({"layers": (-1,)}, "layers must be"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AnalyzeConfig(**kwargs)


def test_parse_layers():
    assert parse_layers("3,1,3", 4) == (1, 3)
    assert parse_layers("blocks.2.hook_resid_pre,blocks.0.attn.hook_z", 4) == (0, 2)
    assert parse_layers("all", 3) == (0, 1, 2)
    with pytest.raises(ValueError, match="out of range"):
        parse_layers("7", 4)
    with pytest.raises(ValueError, match="cannot read a layer"):
        parse_layers("resid", 4)


def test_compare_adds_a_row_and_reuses_the_other_stages(analysis_dir, analysis, tmp_path):
    out = tmp_path / "compare"
    shutil.copytree(analysis_dir, out)
    args = ["analyze", "tiny-llama", "--profile", "smoke", "--out", str(out), "--quiet"]
    result = CliRunner().invoke(app, [*args, "--compare", "tiny-llama"])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "analysis.json").read_text())
    status = {s: v["status"] for s, v in doc["run"]["stages"].items()}
    assert status == {**dict.fromkeys(STAGES, "cached"), "equivalence": "computed"}
    rows = doc["equivalence"]["details"]["rows"]
    assert [r["pair"] for r in rows][1:] == ["vs tiny-llama"]
    assert rows[1]["score"] == 1.0  # the same weights: every matched head passes
    assert "compare_score" in doc["equivalence"]["headline"]


def test_kappa_layers_are_spread_and_keep_the_sweep_layer():
    assert kappa_layers([1, 10, 19, 29], 2) == [1, 19]  # 19 is the middle (sweep) layer
    assert kappa_layers([1, 10, 19, 29], 1) == [19]
    assert kappa_layers([0, 1, 2], 5) == [0, 1, 2]


def test_analysis_uses_the_issue15_protocol(analysis):
    """Koopman: 90% control energy (rank reported), Henrici noise floor, max/norm kurtosis;
    causal: the held-out FVU gate and the base-width check are reported."""
    for row in analysis["koopman"]["details"]["layers"]:
        assert row["control_rank"] >= 1 and row["control_energy_kept"] >= 0.9 - 1e-9
        floor = row["henrici_noise_floor_relative"]
        assert floor is None or 0 <= floor
        assert row["max_excess_kurtosis"] >= -2 and row["norm_kurtosis"] >= 1
    sweep = analysis["causal_dim"]["details"]["sweep"]
    fvu, allow = sweep["heldout_fvu"], sweep["fvu_rise_allowance"]
    assert sweep["fvu_monotone"] == all(
        b - a <= tol for a, b, tol in zip(fvu, fvu[1:], allow, strict=True)
    )
    assert (sweep["sweep_cause"] is None) == sweep["fvu_monotone"]
    assert sweep["sweep_status"] == (
        "interpretable" if sweep["fvu_monotone"] else "not interpretable"
    )
    kinds = {c["kind"] for c in analysis["causal_dim"]["caveats"]}
    d = analysis["causal_dim"]["details"]["d_model"]
    assert ("base_width" in kinds) == (sweep["base_width"] < 4 * d)

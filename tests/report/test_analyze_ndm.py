"""The analyze report's NDM section screens each patching test by its whole-space effect."""

import json

import pytest

from structlens.analyze.config import AnalyzeConfig
from structlens.analyze.run import run_analysis
from structlens.models import load_model
from structlens.ndm.protocol import PROFILES


@pytest.fixture(scope="module")
def ndm(tmp_path_factory):
    out = tmp_path_factory.mktemp("analysis-ndm")
    cfg = AnalyzeConfig(profile="smoke", out=out, stages=("ndm",), progress=False)
    run_analysis(cfg, load_model("tiny-llama"))
    return json.loads((out / "analysis.json").read_text())["ndm"]


def test_gini_only_for_tests_that_pass_the_screen(ndm):
    tests, gini = ndm["details"]["tests"], ndm["details"]["gini"]
    assert tests
    flagged = [c["message"] for c in ndm["caveats"] if c["kind"] == "null_effect"]
    for t in tests:
        share = float(t["whole_space_share"])  # NaN (written "nan") when the clean metric <= 0
        assert t["screened"] == (share >= PROFILES["smoke"].min_share)
        if t["screened"]:
            assert "normalized" in t and set(gini["per_test"][t["test"]]) == set(gini["mean"])
        else:
            assert "normalized" not in t  # its subspaces were never patched
            assert any(m.startswith(f"{t['test']}: ") and "no signal" in m for m in flagged)
            assert not gini or gini["per_test"][t["test"]] == "no signal"
    if not any(t["screened"] for t in tests):
        assert gini == {} and not any(k.startswith("gini_") for k in ndm["headline"])


def test_ndm_is_trained_only_where_a_test_passes_the_screen(ndm):
    trained = {t["layer"] for t in ndm["details"]["trained"]}
    passing = {t["layer"] for t in ndm["details"]["tests"] if t["screened"]}
    if passing:
        assert trained == passing
    else:  # one layer for the preimage browser, said so
        assert len(trained) == 1
        assert any("browser only" in c["message"] for c in ndm["caveats"])
    assert ndm["details"]["browser"]["layer"] == min(trained)

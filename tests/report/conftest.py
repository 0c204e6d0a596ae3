"""One smoke analysis of tiny-llama shared by every test of the report (about a minute)."""

import json

import pytest
from typer.testing import CliRunner

from structlens.cli.main import app


@pytest.fixture(scope="session")
def analysis_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("analysis")
    result = CliRunner().invoke(
        app, ["analyze", "tiny-llama", "--profile", "smoke", "--out", str(out), "--quiet"]
    )
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="session")
def analysis(analysis_dir):
    return json.loads((analysis_dir / "analysis.json").read_text())

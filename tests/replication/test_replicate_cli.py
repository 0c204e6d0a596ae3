"""`structlens replicate` and `python -m structlens.replication` share one entry point."""

from __future__ import annotations

from typing import get_args

import pytest
from typer.testing import CliRunner

from structlens.cli import replicate
from structlens.cli.main import app
from structlens.replication import METHODS
from structlens.replication.__main__ import main


def test_replicate_lists_every_method_and_rejects_an_unknown_one():
    assert set(get_args(replicate.Method)) == set(METHODS)
    assert CliRunner().invoke(app, ["replicate", "--help"]).exit_code == 0
    res = CliRunner().invoke(app, ["replicate", "nope"])
    assert res.exit_code != 0 and "nope" in res.output


def test_module_entry_point_rejects_an_unknown_profile(capsys):
    with pytest.raises(SystemExit):
        main(["koopman", "--profile", "huge"])
    assert "invalid choice: 'huge'" in capsys.readouterr().err

"""One protocol, one answer: the ``causal-dim`` CLI, ``structlens analyze`` and the
causal-dimension replication run the same stages, so at the same protocol instance
(``smoke``) on the same model they give the same exact κ and the same width sweep at the same
layer; a protocol that differs in one field gives another κ (so the comparison can fail)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from structlens.causal_dim.protocol import PROFILES
from structlens.causal_dim.stages import KappaFit, SweepFit
from structlens.cli import causal as ccli
from structlens.results import to_jsonable

LAYER = 1


def _assert_same(got, want, path="result"):
    """Equal structure, equal strings and flags, numbers equal to float64 round-off."""
    if isinstance(want, dict):
        assert set(got) == set(want), path
        for key in want:
            _assert_same(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            _assert_same(a, b, f"{path}[{i}]")
    elif isinstance(want, bool) or want is None or isinstance(want, str):
        assert got == want, path
    else:
        assert isinstance(got, (int, float)) and not isinstance(got, bool), path
        if math.isnan(want):
            assert math.isnan(got), path
        else:
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=path)


@pytest.fixture(scope="module")
def drivers(tmp_path_factory):
    """Exact κ and the width sweep at LAYER from each driver, as typed stage results."""
    from structlens.analyze import AnalyzeConfig, run_analysis
    from structlens.models import load_model
    from structlens.replication.causal_dim import run as rep

    protocol = PROFILES["smoke"]
    tmp = tmp_path_factory.mktemp("parity")
    out = {}

    # the CLI, at the named protocol
    args = ["sweep", "tiny-llama", "--protocol", "smoke", "--layer", str(LAYER), "-q"]
    r = CliRunner().invoke(ccli.app, [*args, "--out", str(tmp / "cli")])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp / "cli" / "causal_sweep.json").read_text())
    assert doc["protocol"] == protocol.to_json()
    (k,) = doc["by_layer"]["layers"]
    out["cli"] = (KappaFit.from_dict(k), SweepFit.from_dict(doc["sweep"]))

    # analyze, whose smoke profile holds the same protocol instance
    cfg = AnalyzeConfig(
        profile="smoke", layers=(LAYER,), stages=("causal_dim",), out=tmp / "analyze",
        progress=False,
    )  # fmt: skip
    assert cfg.settings.causal_dim == protocol
    details = run_analysis(cfg, load_model("tiny-llama")).sections["causal_dim"]["details"]
    assert details["protocol"] == protocol.to_json()
    (k,) = details["kappa_fits"]
    out["analyze"] = (KappaFit.from_dict(k), SweepFit.from_dict(details["sweep_fit"]))

    # the replication's κ and sweep sections, at its smoke profile (the same protocol)
    assert rep.PROFILES["smoke"].protocol == protocol
    s = rep.PROFILES["smoke"].replace(jacobian_layers=(LAYER,), sweep_layer=LAYER)
    replication = rep.CausalReplication(s, tmp / "replication")
    replication.jacobian()
    replication.analyze(replication.train())
    R = replication.run_
    assert not R.failures, R.failures
    assert R.sweep is not None
    (k,) = R.kappa
    out["replication"] = (k, R.sweep)
    return out


@pytest.mark.parametrize("driver", ["analyze", "replication"])
def test_exact_kappa_equals_the_cli(drivers, driver):
    want, _ = drivers["cli"]
    got, _ = drivers[driver]
    _assert_same(to_jsonable(got), to_jsonable(want))
    # one estimand: the point is the centre of its own interval, the plug-in beside it
    lo, hi = want.erank_ci
    assert lo <= want.erank <= hi and want.layer == LAYER
    assert want.participation_ratio_plugin <= want.erank_plugin * (1 + 1e-9)
    assert want.n_vectors == PROFILES["smoke"].kappa_max_vectors or want.identified


@pytest.mark.parametrize("driver", ["analyze", "replication"])
def test_width_sweep_equals_the_cli(drivers, driver):
    _, want = drivers["cli"]
    _, got = drivers[driver]
    _assert_same(to_jsonable(got), to_jsonable(want))
    assert want.widths.tolist() == list(PROFILES["smoke"].sweep_widths)
    assert want.exact_erank == drivers["cli"][0].erank  # κ̂ sits beside the exact κ
    assert set(want.quality) == {str(w) for w in PROFILES["smoke"].sweep_widths}


def test_another_protocol_changes_the_answer(drivers, tmp_path):
    """The comparison can fail: shorter Jacobian windows give another κ."""
    path = tmp_path / "protocol.json"
    path.write_text(json.dumps(PROFILES["smoke"].to_json() | {"jacobian_tokens": 6}))
    args = ["jacobian", "tiny-llama", "--layers", str(LAYER), "--protocol", str(path), "-q"]
    r = CliRunner().invoke(ccli.app, [*args, "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "causal_jacobian.json").read_text())
    assert doc["protocol"]["jacobian_tokens"] == 6
    (other,) = doc["by_layer"]["layers"]
    want, _ = drivers["cli"]
    assert abs(other["erank"] - want.erank) > 1e-6
    assert abs(other["erank_plugin"] - want.erank_plugin) > 1e-6

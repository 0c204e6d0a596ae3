"""One protocol, one answer: the ``koopman`` CLI, ``structlens analyze`` and the Koopman
replication run the same stages, so at the same protocol instance (``smoke``) and the same data
they give the same split-half and spectrum results for the same layer and dictionary."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from structlens.cli import koopman as kcli
from structlens.koopman.protocol import PROFILES
from structlens.results import to_jsonable

LAYER, SPEC, LABEL = 1, "pca:8", "pca8"
DATA = {"n_corpus": 48, "prompt_tokens": 48}  # analyze's smoke profile sizes
SPECTRUM = (
    "spectral_radius", "spectral_radius_ci", "henrici_relative", "henrici_noise_floor_relative",
    "henrici_extrapolated_relative", "kappa_V", "control_rank", "control_energy_kept",
    "dissociation_mean_cos2",
)  # fmt: skip


@pytest.fixture(scope="module")
def drivers(tmp_path_factory):
    """The headline dictionary's split-half and spectrum numbers from each driver."""
    from structlens.analyze import AnalyzeConfig, run_analysis
    from structlens.models import load_model
    from structlens.replication.koopman import run as rep

    protocol = PROFILES["smoke"]
    assert protocol.headline_dictionary == SPEC
    tmp = tmp_path_factory.mktemp("parity")
    out = {}

    # the CLI, at the named protocol
    args = ["tiny-llama", "--protocol", "smoke", "--layers", str(LAYER), "--dictionary", "pca"]
    args += ["--size", "8", "--n-corpus", "48", "--prompt-tokens", "48", "--n-task", "0", "-q"]
    for command in ("fit", "convergence"):
        r = CliRunner().invoke(kcli.app, [command, *args, "--out", str(tmp / "cli")])
        assert r.exit_code == 0, r.output
    fit = json.loads((tmp / "cli" / "fit.json").read_text())
    conv = json.loads((tmp / "cli" / "convergence.json").read_text())
    # --dictionary names the dictionaries of the command; every other field is the protocol's
    assert fit["protocol"] == protocol.replace(fit_dictionaries=(SPEC,)).to_json()
    assert conv["protocol"] == protocol.to_json()
    out["cli"] = (conv["results"][str(LAYER)][LABEL], fit["results"][str(LAYER)][LABEL])

    # analyze, whose smoke profile holds the same protocol instance
    cfg = AnalyzeConfig(
        profile="smoke", layers=(LAYER,), stages=("koopman",), out=tmp / "analyze",
        progress=False,
    )  # fmt: skip
    assert cfg.settings.koopman == protocol
    section = run_analysis(cfg, load_model("tiny-llama")).sections["koopman"]
    row = section["details"]["layers"][0]
    assert section["details"]["protocol"] == protocol.to_json()
    split = {"slope": row["slope"], "slope_ci": row["slope_ci"], "n_samples": row["half_samples"]}
    out["analyze"] = (split | {"w_inf_mean": row["w_inf_mean"]}, row)

    # the replication's sections, at its smoke profile (same protocol) and the same data
    s = rep.PROFILES["smoke"].replace(
        **DATA, split_half_corpus=DATA["n_corpus"], probe_layers=(LAYER,)
    )
    replication = rep.KoopmanReplication(s, tmp / "replication")
    key = f"L{LAYER}/{LABEL}"
    split, fits = replication.split_half()[key], replication.fits()[key]
    out["replication"] = (to_jsonable(split), to_jsonable(fits))
    return out


@pytest.mark.parametrize("driver", ["analyze", "replication"])
def test_split_half_equals_the_cli(drivers, driver):
    want, _ = drivers["cli"]
    got, _ = drivers[driver]
    for key in ("slope", "slope_ci", "n_samples", "w_inf_mean"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-10, atol=1e-12, err_msg=key)
    assert np.isfinite(want["slope"])


@pytest.mark.parametrize("driver", ["analyze", "replication"])
def test_spectrum_equals_the_cli(drivers, driver):
    _, want = drivers["cli"]
    _, got = drivers[driver]
    for key in SPECTRUM:
        if want[key] is None:
            assert got[key] is None, key
        else:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-10, atol=1e-12, err_msg=key)
    ev = [np.sort_complex(np.array([complex(*z) for z in d["eigenvalues"]])) for d in (got, want)]
    np.testing.assert_allclose(ev[0], ev[1], rtol=1e-10, atol=1e-12)
    assert len(ev[1]) == 8


def test_another_protocol_changes_the_answer(drivers, tmp_path):
    """The comparison can fail: a different dictionary split gives a different spectrum."""
    args = ["fit", "tiny-llama", "--layers", str(LAYER), "--dictionary", "pca", "--size", "8"]
    args += ["--n-corpus", "48", "--prompt-tokens", "48", "--n-task", "0", "-q"]
    path = tmp_path / "protocol.json"
    path.write_text(json.dumps(PROFILES["smoke"].to_json() | {"dictionary_fit": "all"}))
    r = CliRunner().invoke(kcli.app, [*args, "--protocol", str(path), "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    other = json.loads((tmp_path / "fit.json").read_text())["results"][str(LAYER)][LABEL]
    _, want = drivers["cli"]
    assert abs(other["henrici_relative"] - want["henrici_relative"]) > 1e-9

"""The Koopman experiment in the library: its config rejects bad values at construction, its
``run`` equals the CLI's output and an independent in-memory fit, and EDMDc's streaming
estimator protocol (partial_fit / mergeable statistics / fit_from_statistics)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from structlens.cli import koopman as kcli
from structlens.koopman import EDMDc, EDMDcConfig, PCADictionary
from structlens.koopman.data import load_layer
from structlens.koopman.edmdc import merge_statistics
from structlens.koopman.experiment import KoopmanExperimentConfig, KoopmanReport, run
from structlens.models import load_model

DATA = dict(n_corpus=16, prompt_tokens=32, n_task=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(analysis="spectrum"), "analysis must be one of"),
        (dict(dictionaries=("pca", "bogus")), "unknown dictionary 'bogus'"),
        (dict(dictionaries=("sae",)), "--sae PATH"),
        (dict(layers=()), "at least one layer"),
        (dict(size=0), "size must be >= 1"),
        (dict(n_blocks=2), "n_blocks >= 4"),
        (dict(analysis="modes", k=9, size=8), r"k must be in \[1, size=8\]"),
        (dict(analysis="reduce", dictionaries=("pca", "rff")), "one dictionary"),
        (dict(alpha=-1.0), "alpha must be >= 0"),
        (dict(control_energy=1.5), "control_energy"),
        (dict(n_corpus=0, n_task=0), "not both 0"),
    ],
)
def test_config_rejects_bad_values_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KoopmanExperimentConfig(**kwargs)


def test_run_equals_cli_and_an_in_memory_fit(tmp_path):
    cfg = KoopmanExperimentConfig(
        analysis="fit", layers=(1, 2), dictionaries=("identity", "pca"), size=8, **DATA
    )
    model = load_model("tiny-llama")
    report = run(cfg, model, root=tmp_path / "lib" / "activations")
    args = ["fit", "tiny-llama", "--layers", "1-2", "--dictionary", "identity,pca"]
    args += ["--size", "8", "--n-corpus", "16", "--prompt-tokens", "32", "--n-task", "0"]
    r = CliRunner().invoke(kcli.app, [*args, "--out", str(tmp_path / "cli"), "-q"])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "cli" / "fit.json").read_text())
    assert json.loads(json.dumps(report.to_json()["results"])) == doc["results"]
    # the report's per-shard statistics agree with one in-memory pass over the same stream
    X, U, Y, _ = load_layer(report_store(tmp_path / "lib" / "activations"), 1)
    direct = EDMDc(PCADictionary(8).fit(X, U, Y), cfg.edmdc).fit(X, U, Y)
    got = np.array([complex(*z) for z in report.results["1"]["pca"]["eigenvalues"]])
    np.testing.assert_allclose(np.sort_complex(got), np.sort_complex(direct.eigenvalues), atol=1e-8)
    again = KoopmanReport.load(report.save(tmp_path / "report"))
    assert again.results == json.loads(json.dumps(report.to_json()["results"]))


def report_store(root):
    from structlens.capture.store import ActivationStore

    (path,) = [p for p in root.iterdir() if p.is_dir()]
    return ActivationStore(path)


def test_estimator_protocol_streams_and_merges(rng):
    n, d, m = 600, 5, 3
    X = rng.normal(size=(n, d))
    U = rng.normal(size=(n, m))
    Y = X @ (0.5 * rng.normal(size=(d, d))) + U @ rng.normal(size=(m, d))
    dic = PCADictionary(4).fit(X, U, Y)
    cfg = EDMDcConfig(alpha=1e-8, control_rank=2)
    whole = EDMDc(dic, cfg).fit(X, U, Y)
    streamed = EDMDc(dic, cfg)
    for s in range(0, n, 128):
        assert streamed.partial_fit((X[s : s + 128], U[s : s + 128], Y[s : s + 128])) is streamed
    a = EDMDc(dic, cfg).partial_fit((X[:250], U[:250], Y[:250])).statistics_
    b = EDMDc(dic, cfg).partial_fit((X[250:], U[250:], Y[250:])).statistics_
    merged = merge_statistics([a, b])
    assert a.merge(b) is a  # merge folds in place and returns self
    for stats in (streamed.statistics_, merged, a):
        res = EDMDc(dic, cfg).fit_from_statistics(stats)
        assert res.n_samples == n
        np.testing.assert_allclose(res.A, whole.A, atol=1e-9)
        np.testing.assert_allclose(res.B, whole.B, atol=1e-9)

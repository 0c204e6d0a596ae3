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
from structlens.koopman.invariance import prompt_split
from structlens.koopman.protocol import KoopmanProtocol
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
        (dict(analysis="modes", k=9, size=8), r"k must be in \[1, size=8\]"),
        (dict(analysis="reduce", dictionaries=("pca", "rff")), "one dictionary"),
        (dict(n_corpus=0, n_task=0), "not both 0"),
    ],
)
def test_config_rejects_bad_values_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KoopmanExperimentConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(split_half_blocks=2), "split_half_blocks must be an integer >= 4"),
        (dict(split_half_repeats=1), "split_half_repeats must be an integer >= 2"),
        (dict(alpha=-1.0), "alpha must be >= 0"),
        (dict(control_energy=1.5), "control_energy"),
        (dict(control_rank=0), "control_rank"),
        (dict(dictionary_fit="test"), "dictionary_fit"),
        (dict(fit_dictionaries=("pca:0",)), "size must be >= 1"),
        (dict(fit_dictionaries=("pca:x",)), "must be an integer"),
        (dict(headline_dictionary="bogus"), "unknown dictionary 'bogus'"),
        (dict(block_min_ratio=0.5), "block_min_ratio"),
    ],
)
def test_protocol_rejects_bad_values_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KoopmanProtocol(**kwargs)


def test_protocol_key_is_its_canonical_json():
    a, b = (
        KoopmanProtocol(),
        KoopmanProtocol(fit_dictionaries=["identity", "pca:64", "pca:32", "rff:256"]),
    )
    assert a == b and a.key() == b.key()  # lists are frozen to tuples
    assert a.key() != a.replace(seed=1).key()
    assert json.loads(json.dumps(a.to_json())) == a.to_json()


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
    # an independent fit: PCA on the training prompts, the operator on every row
    X, U, Y, pid = load_layer(report_store(tmp_path / "lib" / "activations"), 1)
    train = ~prompt_split(pid, cfg.protocol.seed)
    dic = PCADictionary(8).fit(X[train])
    direct = EDMDc(dic, EDMDcConfig(alpha=1e-6, control_energy=0.9)).fit(X, U, Y)
    got = np.array([complex(*z) for z in report.results["1"]["pca8"]["eigenvalues"]])
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

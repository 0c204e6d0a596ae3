"""Depth streams from a real (tiny) model, in-model mode ablation, and the koopman CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from structlens.cli import koopman as kcli
from structlens.koopman import (
    EDMDc,
    EDMDcConfig,
    IdentityDictionary,
    PCADictionary,
    accumulate,
    merge_statistics,
    solve,
)
from structlens.koopman.data import (
    capture_depth,
    depth_prompts,
    iter_layer_chunks,
    layer_sites,
    load_layer,
    load_layers,
)
from structlens.koopman.interventions import _position_lists, compare_ablations, select_modes
from structlens.models import load_model


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama", seed=0)


@pytest.fixture(scope="module")
def store(tiny, tmp_path_factory):
    prompts = depth_prompts(tiny.tokenizer, n_corpus=24, max_tokens=24, task=None)
    return capture_depth(tiny, prompts, [0, 1, 2], root=tmp_path_factory.mktemp("act"))


def test_layer_sites_and_errors():
    assert layer_sites(3, 0) == (
        "blocks.0.hook_resid_pre",
        "blocks.0.hook_attn_out",
        "blocks.1.hook_resid_pre",
    )
    assert layer_sites(3, 2)[2] == "blocks.2.hook_resid_post"
    with pytest.raises(ValueError, match="out of range"):
        layer_sites(3, 3)
    with pytest.raises(ValueError, match="no prompts"):
        depth_prompts(None, n_corpus=0, task=None)


def test_streams_chain_and_keep_prompts(store):
    X0, U0, Y0, p0 = load_layer(store, 0, exclude_position0=False)
    X1, _, _, p1 = load_layer(store, 1, exclude_position0=False)
    # y_l is literally x_{l+1}: the same tensor at the same rows.
    np.testing.assert_array_equal(Y0, X1)
    np.testing.assert_array_equal(p0, p1)
    index = store.load_index()
    counts = np.bincount(p0)
    assert counts.sum() == len(X0) == store.n_tokens
    assert len(counts) == len(store.prompt_ids)
    assert np.all(index["position"].numpy()[np.r_[0, np.cumsum(counts)[:-1]]] == 0)
    with pytest.raises(ValueError, match="lacks"):
        load_layer(store, 5)


def test_position0_and_bos_are_excluded_by_default(store):
    index = store.load_index()
    pos, tok = index["position"].numpy(), index["token_id"].numpy()
    X_all, _, _, p_all = load_layer(store, 1, exclude_position0=False)
    X, U, Y, p = load_layer(store, 1)
    assert len(X) == len(U) == len(Y) == len(p) == int(np.sum(pos != 0))
    np.testing.assert_array_equal(X, X_all[pos != 0])
    np.testing.assert_array_equal(p, p_all[pos != 0])
    # a BOS id drops those tokens at every position as well
    bos = int(tok[pos == 3][0])
    Xb = load_layer(store, 1, bos_token_id=bos)[0]
    np.testing.assert_array_equal(Xb, X_all[(pos != 0) & (tok != bos)])
    streamed = np.concatenate([c[0] for c in iter_layer_chunks(store, [1], batch_size=50)])
    np.testing.assert_array_equal(streamed, X)


def test_pooled_stream_equals_stacked_layers_and_streaming(store):
    X, U, Y, p = load_layers(store, [0, 1])
    parts = [load_layer(store, layer) for layer in (0, 1)]
    np.testing.assert_array_equal(X, np.concatenate([parts[0][0], parts[1][0]]))
    np.testing.assert_array_equal(p, np.concatenate([parts[0][3], parts[1][3]]))
    dic = PCADictionary(6).fit(X)
    streamed = merge_statistics(
        accumulate(dic, iter_layer_chunks(store, [0, 1], batch_size=97), n_blocks=4)
    )
    cfg = EDMDcConfig(alpha=1e-6)
    whole = EDMDc(dic, cfg).statistics(X, U, Y)[0]
    assert streamed.n == whole.n
    a, b = solve(streamed, cfg, dic), solve(whole, cfg, dic)
    np.testing.assert_allclose(a.A, b.A, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(a.B, b.B, rtol=1e-7, atol=1e-9)


class _FakeTask:
    """Task protocol of structlens.data.tasks on byte tokens: metric = logit a − logit b at
    the END position (the tiny byte tokenizer cannot build IOI)."""

    def __init__(self, clean: list[list[int]]) -> None:
        self.clean = clean
        self.positions = {"END": [len(c) - 1 for c in clean]}

    def gather_logits(self, logits: torch.Tensor, index: list[int]) -> torch.Tensor:
        end = torch.tensor([self.positions["END"][i] for i in index])
        return logits[torch.arange(len(index)), end]

    def metric(self, g: torch.Tensor, index: list[int]) -> torch.Tensor:
        return g[:, 101] - g[:, 102]


def test_full_dimension_ablations_coincide(tiny, store):
    """Ablating every mode (identity dictionary, P = I) sets the state to its mean, as does
    mean-ablating a full orthonormal basis: all three methods must agree."""
    X, U, Y, _ = load_layer(store, 1)
    dic = IdentityDictionary().fit(X)
    res = EDMDc(dic, EDMDcConfig(alpha=1e-6)).fit(X, U, Y)
    ids, dim = select_modes(res, tiny.d_model)
    assert dim == tiny.d_model
    rng = np.random.default_rng(0)
    task = _FakeTask([list(rng.integers(1, 250, size=12)) for _ in range(6)])
    for positions in ("all", "END"):
        cmp = compare_ablations(
            tiny, task, 1, res, dic, tiny.d_model, positions=positions, n_random=2
        )
        np.testing.assert_allclose(cmp.change[0], cmp.change[1], atol=1e-3)
        np.testing.assert_allclose(cmp.change[1], cmp.change[2], atol=1e-3)
    small = compare_ablations(tiny, task, 1, res, dic, 3, n_random=2)
    assert small.positions == "END" and small.exclude_position0
    assert (
        small.dimension == 3
        and sum(1 if abs(ev[1]) == 0 else 2 for ev in small.mode_eigenvalues) == 3
    )
    with pytest.raises(ValueError, match="positions"):
        compare_ablations(tiny, task, 1, res, dic, 3, positions="IO")


def test_all_position_ablation_leaves_position0_alone():
    task = _FakeTask([[5, 6, 7, 8], [9, 10, 11]])
    assert _position_lists(task, [0, 1], "all", True) == [[1, 2, 3], [1, 2]]
    assert _position_lists(task, [0, 1], "all", False) is None
    assert _position_lists(task, [0, 1], "END", True) == [[3], [2]]


def test_select_modes_counts_pairs():
    from structlens.koopman import EDMDcResult  # noqa: F401  (type only)

    class R:
        A = np.array([[0.0, -0.9, 0], [0.9, 0.0, 0], [0, 0, 0.5]])

    chosen, dim = select_modes(R, 1)
    assert dim == 1  # the pair (|λ| = 0.9) would overshoot; the real 0.5 fills the slot
    chosen, dim = select_modes(R, 2)
    assert dim == 2
    with pytest.raises(ValueError, match="k must be"):
        select_modes(R, 0)


COMMON = ["tiny-llama", "--n-corpus", "16", "--prompt-tokens", "32", "--n-task", "0"]


def _invoke(args: list[str]):
    return CliRunner().invoke(kcli.app, args)


def test_cli_end_to_end(tmp_path):
    out = str(tmp_path)
    r = _invoke(
        [
            "fit",
            *COMMON,
            "--layers",
            "1-2",
            "--dictionary",
            "identity,pca",
            "--size",
            "8",
            "--out",
            out,
            "-q",
        ]
    )
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "fit.json").read_text())
    e = doc["results"]["1"]["pca8"]
    assert len(e["eigenvalues"]) == 8
    assert 0 <= e["henrici_relative"] <= 1 and e["kappa_V"] >= 1
    assert doc["protocol"]["fit_dictionaries"] == ["identity", "pca:8"]
    assert (tmp_path / "eigenvalues.png").stat().st_size > 0
    r = _invoke(
        [
            "convergence",
            *COMMON,
            "--layers",
            "1",
            "--size",
            "4",
            "--n-blocks",
            "8",
            "--n-repeats",
            "3",
            "--control-rank",
            "4",
            "--out",
            out,
            "-q",
        ]
    )
    assert r.exit_code == 0, r.output
    sh = json.loads((tmp_path / "convergence.json").read_text())["results"]["1"]["pca4"]
    assert sh["slope_ci"][0] <= sh["slope_ci"][1] and np.isfinite(sh["slope"])
    assert (tmp_path / "split_half.png").exists()
    r = _invoke(
        [
            "invariance",
            *COMMON,
            "--layers",
            "1",
            "--dictionary",
            "pca,relu",
            "--size",
            "8",
            "--out",
            out,
            "-q",
        ]
    )
    assert r.exit_code == 0, r.output
    inv = json.loads((tmp_path / "invariance.json").read_text())["results"]["1"]
    assert 0 <= inv["pca8"]["pooled"] < 2
    r = _invoke(
        ["reduce", *COMMON, "--layers", "0-2", "--size", "8", "--order", "2,4", "--out", out, "-q"]
    )
    assert r.exit_code == 0, r.output
    red = json.loads((tmp_path / "reduce.json").read_text())["results"]
    for v in red.values():
        assert v["error"] <= v["enns_glover"] * (1 + 1e-9)
        assert v["instance_error"] <= v["instance_bound"] * (1 + 1e-9)
        # the positive control: a reduced model known to be wrong is rejected by the same check
        assert v["control_flagged"] is True and v["control_error"] > 2 * v["enns_glover"] * (
            1 - 1e-9
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["fit", *COMMON, "--layers", "7"], "out of range"),
        (["fit", *COMMON, "--layers", "x"], "--layers"),
        (["fit", *COMMON, "--layers", "1", "--dictionary", "pca,bogus"], "unknown dictionary"),
        (["fit", *COMMON, "--layers", "1", "--dictionary", "sae"], "--sae"),
        (["convergence", *COMMON, "--layers", "1", "--n-blocks", "2"], "n-blocks"),
        (["reduce", *COMMON, "--layers", "0-1", "--order", "99", "--size", "4"], "order"),
        (["modes", *COMMON, "--layers", "1", "--size", "8"], "IOI"),
    ],
)
def test_cli_bad_input(tmp_path, args, message):
    r = _invoke([*args, "--out", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert message in r.output


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"seed": "1"}', "seed must be int"),
        ('{"fit_dictionaries": "pca:8"}', "must be a list of strings"),
        ('{"bogus_field": 1}', "not Koopman protocol fields"),
        ('{"seed": 1', "damaged"),
        ("[1, 2]", "JSON object"),
    ],
)
def test_cli_bad_protocol_file(tmp_path, content, message):
    path = tmp_path / "protocol.json"
    path.write_text(content)
    out = tmp_path / "out"
    r = _invoke(["fit", *COMMON, "--layers", "1", "--protocol", str(path), "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert not (out / "fit.json").exists()


def test_cli_unknown_protocol_name(tmp_path):
    r = _invoke(["fit", *COMMON, "--layers", "1", "--protocol", "papr", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "neither a protocol name (paper, smoke)" in r.output

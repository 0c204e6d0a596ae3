"""End-to-end CLI runs of `sae` and `causal-dim` on tiny-llama (tiny sizes)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from structlens.cli import causal as causal_cli
from structlens.cli import sae as sae_cli

COMMON = [
    "--prompts",
    "12",
    "--eval-prompts",
    "2",
    "--prompt-tokens",
    "32",
    "--batch-size",
    "64",
    "--k",
    "4",
    "--quiet",
]


def test_causal_dim_sweep_writes_documented_keys(tmp_path):
    res = CliRunner().invoke(
        causal_cli.app,
        [
            "sweep",
            "tiny-llama",
            "--out",
            str(tmp_path),
            "--layer",
            "1",
            "--widths",
            "256,512,1024",
            "--bootstrap",
            "10",
            "--blocks",
            "8",
            "--jacobian-prompts",
            "2",
            "--jacobian-tokens",
            "8",
            "--extra-prompts",
            "4",
            "--generated-prompts",
            "4",
            *COMMON,
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "causal_sweep.json").read_text())
    # 12 + 4 corpus chunks and 4 generated texts of 32 tokens, position 0 (and any massive
    # activation) dropped
    assert all(19 * 31 < t["n_train_tokens"] <= 20 * 31 for t in doc["training"].values())
    assert doc["sweep"]["train_fvu"] == [doc["training"][w]["final_fvu"] for w in doc["training"]]
    assert doc["kappa"]["participation_ratio"] <= doc["kappa"]["erank"] <= 64
    sw = doc["sweep"]
    assert sw["widths"] == [256, 512, 1024]
    assert len(sw["n_repr"]) == len(sw["n_causal"]) == 3
    assert "kappa_hat" in sw and len(sw["kappa_hat_ci"]) == 2
    # ε is calibrated at the base width: N_causal(256) = ceil(0.02·256) = 6 up to ties.
    assert sw["n_causal"][0] <= 6
    # the protocol that ran: the paper's, with the options given
    assert doc["protocol"]["sweep_widths"] == [256, 512, 1024] and doc["protocol"]["sae_k"] == 4
    assert (tmp_path / "width_sweep.png").stat().st_size > 0
    assert (tmp_path / "saes" / "512" / "cfg.json").exists()

    res = CliRunner().invoke(
        causal_cli.app,
        [
            "ablate",
            "tiny-llama",
            "--sae",
            str(tmp_path / "saes" / "512"),
            "--out",
            str(tmp_path),
            "--layer",
            "1",
            "--eval-prompts",
            "2",
            "--prompt-tokens",
            "32",
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    four = json.loads((tmp_path / "causal_ablate.json").read_text())["four_cell"]
    assert four["inflation"]["learned_enc/learned_dec"] == 1.0


def test_causal_dim_jacobian(tmp_path):
    res = CliRunner().invoke(
        causal_cli.app,
        [
            "jacobian",
            "tiny-llama",
            "--out",
            str(tmp_path),
            "--layers",
            "0,2",
            "--jacobian-prompts",
            "2",
            "--jacobian-tokens",
            "8",
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "causal_jacobian.json").read_text())
    layers = doc["by_layer"]["layers"]
    assert [e["layer"] for e in layers] == [0, 2]
    assert doc["kappa"]["erank"] == layers[0]["erank"]
    # --jacobian-prompts caps the vectors (and starts the doubling there)
    assert all(e["n_vectors"] == 2 and e["max_vectors"] == 2 for e in layers)
    assert all(e["erank_ci"][0] <= e["erank"] <= e["erank_ci"][1] for e in layers)
    assert (tmp_path / "sigma_spectrum.png").exists()


def test_sae_train_and_eval(tmp_path):
    res = CliRunner().invoke(
        sae_cli.app,
        ["train", "tiny-llama", "--out", str(tmp_path), "--layer", "1", "--width", "128", *COMMON],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "sae_train.json").read_text())
    w = doc["per_width"]["128"]
    assert w["eval"]["l0"] == 4.0  # TopK: exactly k active features
    assert 0 <= w["eval"]["fvu"] < 1.5
    res = CliRunner().invoke(
        sae_cli.app,
        [
            "eval",
            "tiny-llama",
            "--sae",
            str(tmp_path / "saes" / "128"),
            "--out",
            str(tmp_path),
            "--layer",
            "1",
            "--eval-prompts",
            "2",
            "--prompt-tokens",
            "32",
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    ev = json.loads((tmp_path / "sae_eval.json").read_text())
    assert ev["eval"]["fvu"] == w["eval"]["fvu"]


def test_bad_input_exits_2(tmp_path):
    r = CliRunner()
    bad = [
        (causal_cli.app, ["sweep", "tiny-llama", "--out", str(tmp_path), "--widths", "64"]),
        (causal_cli.app, ["sweep", "tiny-llama", "--out", str(tmp_path), "--widths", "a,b"]),
        (causal_cli.app, ["jacobian", "tiny-llama", "--out", str(tmp_path), "--layers", "9"]),
        (causal_cli.app, ["jacobian", "tiny-llama", "--out", str(tmp_path), "--output", "x"]),
        (sae_cli.app, ["train", "tiny-llama", "--out", str(tmp_path), "--arch", "gated"]),
        (sae_cli.app, ["eval", "tiny-llama", "--out", str(tmp_path), "--sae", str(tmp_path)]),
        (causal_cli.app, ["ablate", "tiny-llama", "--out", str(tmp_path), "--sae", str(tmp_path)]),
    ]
    for app, args in bad:
        res = r.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)

"""`structlens ndm` end to end on a tiny random Llama with SmolLM2's tokenizer."""

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from structlens.cli import ndm as ndm_cli
from structlens.models import load_model
from structlens.ndm.experiment import load_rotation

# SmolLM2's tokenizer comes from loading the real model
pytestmark = pytest.mark.slow
runner = CliRunner()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # The shared CI machine is oversubscribed; intra-op threads then mostly wait on each other.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_model("smollm2-135m").tokenizer
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=256,
    )
    path = tmp_path_factory.mktemp("tiny-llama-smol")
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def trained(tiny_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("ndm")
    args = [
        "train", tiny_dir, "--layers", "0,1,2", "--corpus-prompts", "12", "--task-prompts", "4",
        "--unit-size", "8", "--steps", "20", "--bank-size", "512", "--batch-size", "16",
        "--refresh-interval", "5", "--merge-start", "10", "--merge-interval", "10",
        "--mi-samples", "300", "--activations", str(root / "acts"), "--out", str(root / "train"),
        "-q",
    ]  # fmt: skip
    res = runner.invoke(ndm_cli.app, args)
    assert res.exit_code == 0, res.output
    return root


def test_train_writes_rotations_and_json(trained):
    meta = json.loads((trained / "train" / "ndm_train.json").read_text())
    assert meta["layers"] == [0, 1, 2]
    for layer in ("0", "1", "2"):
        R, partition = load_rotation(trained / "train" / f"R-L{layer}.safetensors")
        assert sum(partition) == 32 and partition == meta["partition"][layer]
        np.testing.assert_allclose(R.T @ R, np.eye(32), atol=1e-8)
        assert meta["results"][layer]["steps"] <= 20
    assert (trained / "train" / "merge_history.png").exists()


def test_evaluate_writes_documented_keys(tiny_dir, trained):
    out = trained / "eval"
    args = [
        "evaluate", tiny_dir, "--train", str(trained / "train"), "--patch-prompts", "4",
        "--gini-bootstrap", "20", "--baselines", "identity,random,pca,sae", "--sae-width", "64",
        "--sae-k", "4", "--sae-epochs", "3", "--conflict-prompts", "4",
        "--toy-steps", "30", "--toy-ae-steps", "50", "--batch-size", "4", "--out", str(out), "-q",
        "--min-share", "0",  # a random model has no behaviour: a zero screen still splits it
    ]  # fmt: skip
    res = runner.invoke(ndm_cli.app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "ndm_evaluate.json").read_text())
    methods = ["ndm", "identity", "random", "pca", "sae"]
    # a Llama has rotary embeddings: the position-swap tests are replaced by relative ones
    tests = ["previous_token_relative", "induction", "s_inhibition_name", "greater_than"]
    assert set(doc["partition"]) == {"0", "1", "2"}
    assert [row["test"] for row in doc["screen"]] == tests and set(doc["gini"]) == set(tests)
    screened = []
    for row in doc["screen"]:
        e = doc["effects"][row["test"]]
        clean = e["clean_metric_mean"]
        share = e["full_effect_mean"] / clean if clean > 0 else float("nan")
        np.testing.assert_allclose(float(row["whole_space_share"]), share)  # NaN as "nan"
        assert row["screened"] == (share >= 0.0) == e["screened"]
        if not row["screened"]:
            assert doc["gini"][row["test"]] == "no signal" and e["methods"] == {}
            continue
        screened.append(row["test"])
        assert set(doc["gini"][row["test"]]) == set(methods)
        g = doc["gini"][row["test"]]["ndm"]["dimension"]
        assert 0.0 <= g["value"] < 1.0 and g["ci"][0] <= g["ci"][1]
    for m in methods if screened else []:
        mean = np.mean([doc["gini"][t][m]["unnormalized"]["value"] for t in screened])
        assert doc["gini_mean"][m]["unnormalized"]["value"] == pytest.approx(mean)
    assert 0 < len(screened) < len(tests)  # both paths run (clean metric > 0 and <= 0)
    assert doc["baselines"]["0"]["sae"]["epochs"] <= 3
    assert 0.0 <= doc["toy"]["overlap"] <= 1.0 + 1e-9
    rates = doc["conflict"]["corruptions"]["true_answer"]
    assert len(rates["subspaces"]) == len(doc["partition"][str(doc["conflict"]["layer"])])
    assert all((out / f"effects-{t}.png").exists() for t in screened)


def test_browse_returns_highlighted_contexts(tiny_dir, trained):
    out = trained / "browse"
    args = [
        "browse", tiny_dir, "--train", str(trained / "train"), "--prompt",
        "When Mary and John went to the store", "--position", "-2", "--k", "3",
        "--extra-corpus-prompts", "3", "--activations", str(trained / "acts"), "--out", str(out),
        "-q",
    ]  # fmt: skip
    res = runner.invoke(ndm_cli.app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "ndm_browse.json").read_text())
    meta = json.loads((trained / "train" / "ndm_train.json").read_text())
    assert doc["n_activations"] > meta["data"]["n_tokens_captured"]
    (query,) = doc["queries"]
    assert query["query"]["token"] == " the"
    assert len(query["subspaces"]) == len(doc["partition"])
    for sub in query["subspaces"]:
        sims = [h["similarity"] for h in sub["hits"]]
        assert len(sims) == 3 and sims == sorted(sims, reverse=True)
        assert all("[[" in h["context"] and "]]" in h["context"] for h in sub["hits"])


def test_bad_input_exits_with_a_message(tiny_dir, trained, tmp_path):
    train = str(trained / "train")
    cases = [
        (["evaluate", tiny_dir, "--train", str(tmp_path)], "not found"),
        (["evaluate", tiny_dir, "--train", train, "--tests", "nope"], "unknown tests"),
        (["evaluate", tiny_dir, "--train", train, "--baselines", "ica"], "--baselines: unknown"),
        (["evaluate", tiny_dir, "--train", train, "--patch-prompts", "1"], "--patch-prompts"),
        (["evaluate", tiny_dir, "--train", train, "--protocol", "nope"], "neither a protocol"),
        (["evaluate", tiny_dir, "--train", train, "--tests", "previous_token"], "do not suit"),
        (["evaluate", tiny_dir, "--train", train, "--min-share", "2"], "--min-share"),
        (["train", tiny_dir, "--layers", "7", "--out", str(tmp_path)], "--layers"),
        (["train", tiny_dir, "--unit-size", "0", "--out", str(tmp_path)], "--unit-size"),
        (["browse", tiny_dir, "--train", train], "--prompt"),
        (["browse", tiny_dir, "--train", train, "--prompt", "a b", "--subspace", "99"], "subspace"),
    ]
    for args, message in cases:
        res = runner.invoke(ndm_cli.app, args)
        assert res.exit_code == 2, (args, res.output)
        assert message in " ".join(res.output.split()), (args, res.output)

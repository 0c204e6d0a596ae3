"""Model loading and per-family site adapters."""

from structlens.models.families import Family, families, register_family, unregister_family
from structlens.models.loading import ALIASES, Model, ModelUnavailableError, load_model

__all__ = [
    "ALIASES",
    "Family",
    "Model",
    "ModelUnavailableError",
    "families",
    "load_model",
    "register_family",
    "unregister_family",
]

"""Model loading and per-family site adapters."""

from structlens.models.families import (
    Family,
    register_family,
    registered_families,
    unregister_family,
)
from structlens.models.loading import ALIASES, Model, ModelUnavailableError, load_model

__all__ = [
    "ALIASES",
    "Family",
    "Model",
    "ModelUnavailableError",
    "load_model",
    "register_family",
    "registered_families",
    "unregister_family",
]

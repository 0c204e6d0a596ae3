"""Model loading and per-family site adapters."""

from structlens.models.loading import ALIASES, Model, ModelUnavailableError, load_model

__all__ = ["ALIASES", "Model", "ModelUnavailableError", "load_model"]

"""Activation capture and the on-disk activation store."""

from structlens.capture.capture import capture, collect, iter_activations, select_positions
from structlens.capture.store import ActivationStore, StoreError

__all__ = [
    "ActivationStore",
    "StoreError",
    "capture",
    "collect",
    "iter_activations",
    "select_positions",
]

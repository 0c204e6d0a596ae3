"""Model to arrays for the Koopman experiments: prompts, depth-site capture, per-layer streams.

The numerical modules of :mod:`structlens.koopman` only see the ``(X, U, Y, prompt_ids)``
arrays returned here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from structlens.koopman.data import capture_depth, depth_prompts, load_layer, load_layers

__all__ = ["DepthData", "collect_depth"]

Stream = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class DepthData:
    """Depth streams of one model: ``streams[label] = (X, U, Y, prompt_ids)``.

    ``label`` is the layer (``"8"``) or, pooled, the layer range (``"4-12"``); ``store`` is the
    activation store the streams were read from (for per-shard statistics).
    """

    layers: list[int]
    pooled: bool
    streams: dict[str, Stream]
    store: Any


def check_layers(layers: Sequence[int], n_layers: int) -> list[int]:
    """Sorted distinct ``layers``; ``ValueError`` if one is outside ``0..n_layers - 1``."""
    bad = [layer for layer in layers if not 0 <= layer < n_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range; the model has layers 0..{n_layers - 1}.")
    return sorted(set(layers))


def collect_depth(
    model: Any,
    layers: Sequence[int],
    *,
    pooled: bool,
    n_corpus: int,
    prompt_tokens: int,
    n_task: int,
    seed: int,
    root: str | Path,
    executor: Any = None,
    progress: bool = False,
) -> DepthData:
    """Capture ``resid_pre(l)``, ``attn_out(l)``, ``resid_pre(l+1)`` of ``layers`` over
    ``n_corpus`` corpus chunks plus ``n_task`` IOI prompts into a content-hashed store under
    ``root``, and read the per-layer (or pooled) streams."""
    layers = check_layers(layers, model.n_layers)
    prompts = depth_prompts(
        model.tokenizer,
        n_corpus=n_corpus,
        max_tokens=prompt_tokens,
        task="ioi" if n_task else None,
        n_task=n_task,
        seed=seed,
    )
    store = capture_depth(model, prompts, layers, root=root, progress=progress, executor=executor)
    if pooled:
        label = f"{layers[0]}-{layers[-1]}" if len(layers) > 1 else str(layers[0])
        streams = {label: load_layers(store, layers)}
    else:
        streams = {str(layer): load_layer(store, layer) for layer in layers}
    return DepthData(layers, pooled, streams, store)

"""Model to arrays for the Koopman experiments: prompts, depth-site capture, per-layer streams.

The numerical modules of :mod:`structlens.koopman` only see the ``(X, U, Y, prompt_ids)``
arrays (:class:`~structlens.koopman.stages.LayerRows`) read here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structlens.koopman.data import capture_depth, depth_prompts
from structlens.koopman.protocol import KoopmanProtocol
from structlens.koopman.stages import LayerRows, layer_rows

__all__ = ["DepthData", "collect_depth"]


@dataclass(frozen=True)
class DepthData:
    """Depth rows of one model: ``rows[label]`` (:class:`~structlens.koopman.stages.LayerRows`).

    ``label`` is the layer (``"8"``) or, pooled, the layer range (``"4-12"``); ``store`` is the
    activation store the rows were read from.
    """

    layers: list[int]
    pooled: bool
    rows: dict[str, LayerRows]
    store: Any


def check_layers(layers: Sequence[int], n_layers: int) -> list[int]:
    """Sorted distinct ``layers``; ``ValueError`` if one is outside ``0..n_layers - 1``."""
    bad = [layer for layer in layers if not 0 <= layer < n_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range; the model has layers 0..{n_layers - 1}.")
    return sorted(set(layers))


def collect_depth(
    protocol: KoopmanProtocol,
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
    ``root``, and read the per-layer (or pooled) rows by the protocol's row rule."""
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
        rows = layer_rows(protocol, store, layers)
        return DepthData(layers, pooled, {rows.label: rows}, store)
    per_layer = {str(layer): layer_rows(protocol, store, [layer]) for layer in layers}
    return DepthData(layers, pooled, per_layer, store)

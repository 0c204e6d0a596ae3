"""Patched forwards that reuse the unpatched forward's layers below the first patched one.

A patch at a site of layer ``L`` leaves every layer below ``L`` with the inputs it had in
the unpatched forward of the same batch, so those layers compute the same outputs (the same
kernels on the same inputs).  :class:`LayerOutputs` records each layer's output in the
unpatched forward; in :meth:`LayerOutputs.below` the layers under ``L`` return them instead
of recomputing, so a validation run of many patches pays for the layers from ``L`` on only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from structlens.models.loading import Model
from structlens.models.placement import forward_replaced

__all__ = ["LayerOutputs", "first_layer"]


def first_layer(model: Model, site: str) -> int:
    """Index into ``model.layers`` of the layer ``site`` belongs to (0 for model-level
    sites such as the embedding, which precede every layer)."""
    s = model.site(site)
    return 0 if s.layer is None else model.global_layer(s)


def _fresh(out: Any) -> Any:
    """``out`` with its first tensor (the hidden states) copied, so that a layer writing into
    its input changes neither the recorded output nor the next patched forward's."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
        return (out[0].clone(), *out[1:])
    return out


class LayerOutputs:
    """Every layer's output in one unpatched forward of ``model``, for the patched forwards
    of the same batch.

    Reuse needs a single stack of layers run in order on one device, with forwards that are
    the modules' own (an offloading wrapper replaces them); for any other model
    :meth:`below` recomputes every layer, as an ordinary forward does.
    """

    def __init__(self, model: Model | Sequence[torch.nn.Module]) -> None:
        """``model``: a loaded model, or the layers of one stack run in that order (a module
        being trained, which a :class:`Model` would freeze)."""
        if isinstance(model, Model):
            self.layers = list(model.layers)
            single = model.stacks is None and len(model.devices) == 1
        else:
            self.layers = list(model)
            single = len({p.device for m in self.layers for p in m.parameters()}) <= 1
        self.outputs: dict[int, Any] = {}
        self.enabled = single and all("forward" not in layer.__dict__ for layer in self.layers)

    @contextmanager
    def record(self) -> Iterator[None]:
        """Forwards in this context record each layer's output (the last forward's kept)."""
        self.outputs = {}
        handles = []
        if self.enabled:
            for k, layer in enumerate(self.layers):

                def keep(_m: Any, _args: Any, out: Any, k: int = k) -> None:
                    self.outputs[k] = _fresh(out)

                handles.append(layer.register_forward_hook(keep))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    @contextmanager
    def below(self, layer: int) -> Iterator[None]:
        """Forwards in this context take the recorded outputs of the layers below ``layer``
        (their hooks still run) and compute the rest."""
        layers = self.layers
        upto = layer if self.enabled and all(k in self.outputs for k in range(layer)) else 0
        with ExitStack() as replaced:
            for k in range(upto):
                out = _fresh(self.outputs[k]) if k == upto - 1 else self.outputs[k]
                replaced.enter_context(
                    forward_replaced(layers[k], lambda _m, *_a, _out=out, **_kw: _out)
                )
            yield

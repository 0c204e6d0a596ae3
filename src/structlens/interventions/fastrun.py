"""Cheaper forward passes for residual-stream work on decoder models.

Two context managers temporarily swap decoder layers for stand-ins, so code that calls
``model.forward`` (capture, the hook sessions of :mod:`structlens.interventions`) runs less:

* :func:`truncated` drops every layer after ``last_layer`` and the unembedding: activations at
  sites up to ``blocks.{last_layer}.hook_resid_post`` are exactly those of the full model, the
  "logits" are meaningless. Use it to capture early-layer activations.
* :func:`resumed` replaces layers ``0..layer`` by a stand-in that returns a given
  ``resid_post`` of ``layer``, so a forward pass only computes the layers after it. Writes
  registered at ``blocks.{layer}.hook_resid_post`` still apply (they hook the stand-in), so
  patching at that site gives the same logits as the full model, with ``layer + 1`` fewer
  layers computed.

:func:`metric_logits` unembeds only the positions a metric reads.

These rely on the Hugging Face decoder convention that each layer is called with the hidden
states as its first argument and returns them (alone or first in a tuple), and that the model
iterates over its ``ModuleList`` of layers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from structlens.models.loading import Model


class _Passthrough(torch.nn.Module):
    """Stands in for a decoder layer: returns its input hidden states unchanged."""

    def __init__(self, as_tuple: bool) -> None:
        super().__init__()
        self.as_tuple = as_tuple

    def forward(self, hidden_states: torch.Tensor, *args: object, **kwargs: object):
        return (hidden_states,) if self.as_tuple else hidden_states


class _Constant(torch.nn.Module):
    """Stands in for a decoder layer: returns a fixed hidden-state tensor."""

    def __init__(self, value: torch.Tensor, as_tuple: bool) -> None:
        super().__init__()
        self.value = value
        self.as_tuple = as_tuple

    def forward(self, hidden_states: torch.Tensor, *args: object, **kwargs: object):
        if hidden_states.shape != self.value.shape:
            raise ValueError(
                f"the cached residual has shape {tuple(self.value.shape)} but the batch gives "
                f"{tuple(hidden_states.shape)}; resume with the same input_ids."
            )
        out = self.value.to(dtype=hidden_states.dtype, device=hidden_states.device)
        return (out,) if self.as_tuple else out


class _Probed(Exception):
    """Raised by the probe's hook to stop the forward pass after the first layer."""


def _layer_returns_tuple(model: Model) -> bool:
    """Whether the model's decoder layers return a tuple (probed on a one-token input).

    The probe stops the pass at the first layer: a whole forward would unembed over the full
    vocabulary each time a run is resumed or truncated (a tenth of a second at 262k tokens).
    """
    seen: list[bool] = []

    def hook(_m: torch.nn.Module, _a: Any, out: Any) -> None:
        seen.append(isinstance(out, tuple))
        raise _Probed

    handle = model.layers[0].register_forward_hook(hook)
    try:
        ids = torch.zeros(1, 1, dtype=torch.long, device=model.device)
        with torch.no_grad():
            model.forward(ids, torch.ones_like(ids))
    except _Probed:
        pass
    finally:
        handle.remove()
    return seen[0]


def _check_decoder(model: Model, layer: int) -> None:
    if not model.causal:
        raise ValueError("truncated/resumed runs need a causal decoder model.")
    if not 0 <= layer < model.n_layers:
        raise ValueError(f"layer must be in [0, {model.n_layers}), got {layer}.")


@contextlib.contextmanager
def truncated(model: Model, last_layer: int) -> Iterator[Model]:
    """Run only layers ``0..last_layer`` (and no unembedding) inside the block."""
    _check_decoder(model, last_layer)
    as_tuple = _layer_returns_tuple(model)
    saved = {i: model.layers[i] for i in range(last_layer + 1, model.n_layers)}
    head_owner, head_name, head = _output_embedding(model)
    try:
        for i in saved:
            model.set_layer(i, _Passthrough(as_tuple))
        setattr(head_owner, head_name, torch.nn.Identity())
        yield model
    finally:
        for i, mod in saved.items():
            model.set_layer(i, mod)
        setattr(head_owner, head_name, head)


@contextlib.contextmanager
def resumed(model: Model, layer: int, resid_post: torch.Tensor) -> Iterator[Model]:
    """Inside the block, a forward pass takes ``resid_post`` ``[b, seq, d]`` as the output of
    ``layer`` and computes only the layers after it (the input ids still fix the batch shape,
    padding mask and positions)."""
    _check_decoder(model, layer)
    as_tuple = _layer_returns_tuple(model)
    saved = {i: model.layers[i] for i in range(layer + 1)}
    try:
        for i in range(layer):
            model.set_layer(i, _Passthrough(as_tuple))
        model.set_layer(layer, _Constant(resid_post, as_tuple))
        yield model
    finally:
        for i, mod in saved.items():
            model.set_layer(i, mod)


def _output_embedding(model: Model) -> tuple[torch.nn.Module, str, torch.nn.Module]:
    head = model.hf.get_output_embeddings()
    if head is None:
        raise ValueError("the model has no output embedding to unembed with.")
    for name, mod in model.hf.named_modules():
        if mod is head:
            owner_name, _, attr = name.rpartition(".")
            return model.hf.get_submodule(owner_name) if owner_name else model.hf, attr, head
    raise ValueError("could not locate the output embedding module.")  # pragma: no cover


def metric_logits(
    model: Model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    positions: Sequence[Sequence[int]],
) -> torch.Tensor:
    """Logits ``[b, k, vocab]`` at ``positions[i]`` (``k`` per prompt) of a forward pass.

    Runs the base model (any active hooks apply), gathers the final hidden states at the given
    positions and unembeds only those, then applies what the family's head does after the
    unembedding (Gemma-2/3's soft-capping, Granite's ``logits_scaling``, Cohere's
    ``logit_scale``): the values of the full logits at those positions.
    """
    out = model.base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    hidden = out.last_hidden_state
    idx = torch.as_tensor([list(p) for p in positions], device=hidden.device)
    picked = hidden.gather(1, idx[..., None].expand(-1, -1, hidden.shape[-1]))
    return _unembed(model, picked)


def row_logits(
    model: Model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    rows: torch.Tensor,
) -> torch.Tensor:
    """Logits ``[n, vocab]`` at the ``n`` positions where the boolean ``rows`` ``[b, seq]``
    is true, in the order of ``logits[rows]``: the values of the full logits there, with only
    those positions unembedded (over a 262k vocabulary the unembedding of padding and of
    unscored positions is most of a forward's arithmetic).

    Runs the base model (any active hooks apply), as :func:`metric_logits` does.  The
    unembedding's matrix product then has ``n`` rows instead of ``b * seq``; the BLAS gives
    each row the same value at either count from a dozen rows on (below that it may switch
    kernels and move the last bit).
    """
    out = model.base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return _unembed(model, out.last_hidden_state[rows.to(out.last_hidden_state.device)])


def _unembed(model: Model, hidden: torch.Tensor) -> torch.Tensor:
    """The language-model head on final hidden states: the output embedding, then what the
    family's head does after it."""
    logits = model.hf.get_output_embeddings()(hidden)
    scaling = getattr(model.config, "logits_scaling", None)  # Granite divides by it
    if scaling:
        logits = logits / scaling
    scale = getattr(model.config, "logit_scale", None)  # Cohere multiplies by it
    if scale:
        logits = logits * scale
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits

"""An eager attention path that exposes TransformerLens's attention internals.

Hugging Face attention modules project and rotate queries and keys, then call an *attention
function* chosen by ``config._attn_implementation`` (``sdpa``, ``eager``, ...).  structlens
registers one more, :data:`IMPLEMENTATION`, that computes eager attention in TransformerLens's
convention and passes each intermediate through the *taps* a hook session attached to the
module (``module._structlens_taps``, kind -> function returning the possibly replaced value):

``rot_q``/``rot_k``  queries/keys as the function receives them, i.e. after QK-norm and rotary,
                     ``[batch, pos, head, d_head]`` (keys per KV head);
``attn_scores``      ``q·k * scaling`` (soft-capped where the model soft-caps), plus any additive
                     bias in the mask, with masked entries ``-inf``: ``[batch, head, q, k]``;
``pattern``          the softmax of the scores (NaN rows of fully masked queries set to 0).

:func:`eager_path` switches a model onto this path for the duration of a ``with`` block;
:func:`check_eager_path` verifies once per model that it reproduces the model's own output.
Only models whose attention modules call the attention-function interface can use it
(:func:`uses_attention_interface`); BLOOM and Falcon, for instance, do not.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch

IMPLEMENTATION = "structlens_eager"
_registered = False


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, tl_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, eager_mask)
    _registered = True


def _tap(taps: dict, kind: str, value: torch.Tensor) -> torch.Tensor:
    fn = taps.get(kind)
    return value if fn is None else fn(value)


def tl_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention with taps; same signature and return as HF's attention functions.

    ``query`` is ``[batch, head, q, d]``, ``key``/``value`` ``[batch, kv_head, k, d]``; returns
    the per-head outputs ``[batch, q, head, d]`` and the pattern.
    """
    if kwargs.get("s_aux") is not None or kwargs.get("sinks") is not None:
        raise NotImplementedError("attention sinks are not supported on the structlens eager path")
    taps = getattr(module, "_structlens_taps", None) or {}
    query = _tap(taps, "rot_q", query.transpose(1, 2)).transpose(1, 2)
    key = _tap(taps, "rot_k", key.transpose(1, 2)).transpose(1, 2)
    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, dim=1)
    v = value.repeat_interleave(groups, dim=1)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    scores = torch.matmul(query, k.transpose(-1, -2)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        mask = attention_mask[:, :, :, : k.shape[-2]]
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            # HF's eager masks add dtype-min where masked; TL puts -inf there.
            blocked = mask <= torch.finfo(mask.dtype).min / 2
            scores = (scores + mask.masked_fill(blocked, 0)).masked_fill(blocked, float("-inf"))
    scores = _tap(taps, "attn_scores", scores)
    # softmax in float32 at least (HF's eager convention), in float64 for float64 models
    pattern = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    pattern = torch.nan_to_num(pattern, nan=0.0).to(query.dtype)
    pattern = _tap(taps, "pattern", pattern)
    pattern_d = torch.nn.functional.dropout(pattern, p=dropout, training=module.training)
    out = torch.matmul(pattern_d, v).transpose(1, 2).contiguous()
    return out, pattern


def uses_attention_interface(attn_module: torch.nn.Module) -> bool:
    """Whether this attention module calls HF's attention-function interface."""
    try:
        src = inspect.getsource(type(attn_module).forward)
    except (OSError, TypeError):
        return False
    return "ALL_ATTENTION_FUNCTIONS" in src


def _configs(hf: torch.nn.Module) -> list[Any]:
    seen: dict[int, Any] = {id(hf.config): hf.config}
    for m in hf.modules():
        c = getattr(m, "config", None)
        if c is not None and hasattr(c, "_attn_implementation"):
            seen.setdefault(id(c), c)
    return list(seen.values())


@contextlib.contextmanager
def eager_path(hf: torch.nn.Module) -> Iterator[None]:
    """Run ``hf`` on the structlens eager attention path inside the block."""
    _register()
    configs = _configs(hf)
    before = [c._attn_implementation for c in configs]
    for c in configs:
        c._attn_implementation = IMPLEMENTATION
    try:
        yield
    finally:
        for c, b in zip(configs, before):
            c._attn_implementation = b


@torch.no_grad()
def check_eager_path(model: Any) -> None:
    """Raise if the eager path does not reproduce ``model``'s own output (checked once)."""
    if getattr(model, "_eager_path_ok", False):
        return
    ids = torch.arange(3, 11, device=model.device).reshape(1, 8) % model.config.vocab_size
    mask = torch.ones_like(ids)
    ref = model.forward(ids, mask)
    with eager_path(model.hf):
        got = model.forward(ids, mask)
    err = float((ref - got).abs().max() / ref.abs().max().clamp_min(1e-12))
    tol = 1e-4 if model.dtype in (torch.float32, torch.float64) else 3e-2
    if not err <= tol:
        raise RuntimeError(
            f"{model.name}: structlens's eager attention path does not reproduce the model's "
            f"output (relative error {err:.2e}), so attention-internal sites (hook_rot_q/k, "
            f"hook_attn_scores, hook_pattern) cannot be used for this model."
        )
    model._eager_path_ok = True

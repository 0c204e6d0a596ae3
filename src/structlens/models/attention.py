"""An eager attention path that exposes TransformerLens's attention internals.

Hugging Face attention modules project and rotate queries and keys, then call an *attention
function* chosen by ``config._attn_implementation`` (``sdpa``, ``eager``, ...).  structlens
registers one more, :data:`IMPLEMENTATION`, that computes eager attention in TransformerLens's
convention and passes each intermediate through the *taps* a hook session attached to the
module (``module._structlens_taps``, kind -> function returning the possibly replaced value):

``rot_q``/``rot_k``  queries/keys as the function receives them, i.e. after QK-norm and rotary,
                     ``[batch, pos, head, d_head]`` (keys per KV head);
``attn_scores``      ``q·k * scaling`` (soft-capped where the model soft-caps), plus T5's relative
                     position bias and any additive bias in the mask, with masked entries
                     ``-inf``: ``[batch, head, q, k]``;
``pattern``          the softmax of the scores (NaN rows of fully masked queries set to 0); with
                     attention sinks (gpt-oss) the softmax includes each head's sink logit, whose
                     share is dropped, so rows sum to less than one.

Attention modules that compute attention inline instead of calling the interface (BLOOM,
Falcon) get a family-specific forward, :data:`OWN_ATTENTION`, that recomputes their attention
from the module's own projections through the same tapped function: BLOOM's scores include its
ALiBi bias (as TransformerLens's do), Falcon's are taken after rotary.

:func:`eager_path` switches a model onto this path for the duration of a ``with`` block;
:func:`check_eager_path` verifies once per model that it reproduces the model's own output.
Models whose attention modules neither call the interface nor have an entry in
:data:`OWN_ATTENTION` cannot use it (:func:`uses_attention_interface`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from structlens.models.placement import forward_replaced

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
    sinks = next((kwargs[k] for k in ("s_aux", "sinks") if kwargs.get(k) is not None), None)
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
    if kwargs.get("position_bias") is not None:  # T5's relative position bias
        scores = scores + kwargs["position_bias"]
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
    dtype = torch.promote_types(scores.dtype, torch.float32)
    if sinks is None:
        pattern = torch.softmax(scores, dim=-1, dtype=dtype)
    else:
        # gpt-oss: one learned sink logit per head joins each row's softmax and takes its share
        # of the mass, so a row of the pattern sums to less than one
        sink = sinks.reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1).to(scores.dtype)
        pattern = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1, dtype=dtype)[..., :-1]
    pattern = torch.nan_to_num(pattern, nan=0.0).to(query.dtype)
    pattern = _tap(taps, "pattern", pattern)
    pattern_d = torch.nn.functional.dropout(pattern, p=dropout, training=module.training)
    out = torch.matmul(pattern_d, v).transpose(1, 2).contiguous()
    return out, pattern


def _additive(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """An HF attention mask as an additive float mask (dtype-min where blocked)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    zero = torch.zeros((), dtype=like.dtype, device=like.device)
    return zero.masked_fill(~mask, torch.finfo(like.dtype).min)


def bloom_attention(
    # self: a Hugging Face BloomAttention, whose attributes are known only at run time
    self: Any,
    hidden_states: torch.Tensor,
    residual: torch.Tensor,
    alibi: torch.Tensor,
    attention_mask: torch.Tensor | None,
    layer_past: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``BloomAttention.forward`` through :func:`tl_attention`: the scores are TransformerLens's,
    ``q·k / sqrt(d_head) + slope_h * (key_pos - query_pos)``, masked ``-inf``."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor, dropout_add

    batch, n_query, _ = hidden_states.shape
    query, key, value = self._reshape(self.query_key_value(hidden_states))
    if layer_past is not None:
        key, value = layer_past.update(key, value, self.layer_idx)
    # HF's ALiBi is slope * (key's position among the unpadded tokens); TL's is
    # slope * (key_index - query_index).  The two differ by a constant per query row, so give
    # the same pattern and output; the scores are TL's.
    n_key = key.shape[-2]
    slopes = build_alibi_tensor(torch.ones(1, 2, device=query.device), self.num_heads, query.dtype)
    rel = torch.arange(n_key, device=query.device)
    rel = rel[None, :] - rel[n_key - n_query :, None]
    bias = (slopes[:, 0, 1, None, None] * rel)[None]
    mask = _additive(attention_mask, query)
    bias = bias if mask is None else bias + mask
    out, pattern = tl_attention(
        self,
        query,
        key,
        value,
        bias,
        scaling=self.inv_norm_factor,
        dropout=self.attention_dropout.p,
    )
    output = self.dense(out.reshape(batch, n_query, self.num_heads * self.head_dim))
    return dropout_add(output, residual, self.hidden_dropout, self.training), pattern


def falcon_attention(
    # self: a Hugging Face FalconAttention, whose attributes are known only at run time
    self: Any,
    hidden_states: torch.Tensor,
    alibi: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None = None,
    layer_past: Any = None,
    use_cache: bool = False,
    output_attentions: bool = False,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``FalconAttention.forward`` (rotary Falcon) through :func:`tl_attention`."""
    from transformers.models.falcon.modeling_falcon import apply_rotary_pos_emb

    if alibi is not None or position_embeddings is None:
        raise NotImplementedError(
            "Falcon with ALiBi (config.alibi=True) is not supported on the structlens eager path; "
            "its attention-internal sites are unavailable"
        )
    n_kv = self.num_heads if self.new_decoder_architecture else self.num_kv_heads
    query, key, value = self._split_heads(self.query_key_value(hidden_states))
    batch, n_query = query.shape[:2]
    query = query.transpose(1, 2).reshape(batch, self.num_heads, n_query, self.head_dim)
    key = key.transpose(1, 2).reshape(batch, n_kv, n_query, self.head_dim)
    value = value.transpose(1, 2).reshape(batch, n_kv, n_query, self.head_dim)
    query, key = apply_rotary_pos_emb(query, key, *position_embeddings)
    if layer_past is not None:
        key, value = layer_past.update(key, value, self.layer_idx)
    mask = _additive(attention_mask, query)
    # rotary Falcon applies no attention dropout
    out, pattern = tl_attention(self, query, key, value, mask, scaling=self.inv_norm_factor)
    return self.dense(out.reshape(batch, n_query, self.num_heads * self.head_dim)), pattern


#: Attention classes with inline attention -> their forward on the eager path.
OWN_ATTENTION: dict[str, Callable[..., Any]] = {
    "BloomAttention": bloom_attention,
    "FalconAttention": falcon_attention,
}


def uses_attention_interface(attn_module: torch.nn.Module) -> bool:
    """Whether this attention module can run on the eager path: it calls HF's
    attention-function interface, or has a forward in :data:`OWN_ATTENTION`."""
    cls: Any = type(attn_module)  # torch types Module classes as unhashable
    return _calls_interface(cls)


@functools.cache  # asked once per layer: read each class's source once
def _calls_interface(cls: Any) -> bool:
    if cls.__name__ in OWN_ATTENTION:
        return True
    try:
        src = inspect.getsource(cls.forward)
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
    own = [m for m in hf.modules() if type(m).__name__ in OWN_ATTENTION]
    for c in configs:
        c._attn_implementation = IMPLEMENTATION
    try:
        with contextlib.ExitStack() as forwards:
            for m in own:
                forwards.enter_context(forward_replaced(m, OWN_ATTENTION[type(m).__name__]))
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

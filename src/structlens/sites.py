"""The site grammar: TransformerLens names for places in a transformer, with TL's meaning.

Valid names (shapes after ``[batch, pos]`` unless the layout says otherwise)::

    hook_embed                       token embeddings                      [d_model]
    hook_pos_embed                   learned absolute position embeddings  [d_model]
    blocks.{l}.hook_resid_pre        input of layer l                      [d_model]
    blocks.{l}.ln1.hook_scale        the norm's scale (RMS or std) before attention   [1]
    blocks.{l}.ln1.hook_normalized   its input / scale (centred first for LayerNorm),
                                     BEFORE the gain and bias              [d_model]
    blocks.{l}.attn.hook_q           queries x W_Q + b_Q, before rotary    [n_heads, d_head]
    blocks.{l}.attn.hook_k/hook_v    keys and values, one per KV head      [n_kv_heads, d_head]
    blocks.{l}.attn.hook_rot_q/_k    queries/keys after rotary (RoPE models only)
    blocks.{l}.attn.hook_attn_scores scaled, masked (-inf) scores          [batch, head, q, k]
    blocks.{l}.attn.hook_pattern     softmax of the scores                 [batch, head, q, k]
    blocks.{l}.attn.hook_z           per-head outputs before W_O           [n_heads, d_head]
    blocks.{l}.hook_attn_out         attention's residual contribution     [d_model]
    blocks.{l}.hook_resid_mid        between attention and MLP             [d_model]
    blocks.{l}.ln2.hook_scale/hook_normalized   the norm before the MLP
    blocks.{l}.mlp.hook_pre          MLP pre-activation (gate for gated MLPs)        [d_mlp]
    blocks.{l}.mlp.hook_pre_linear   gated MLPs: the linear (up) branch    [d_mlp]
    blocks.{l}.mlp.hook_post         MLP neurons after the activation (x up branch)  [d_mlp]
    blocks.{l}.hook_mlp_out          MLP's residual contribution           [d_model]
    blocks.{l}.hook_resid_post       output of layer l                     [d_model]
    ln_final.hook_scale / ln_final.hook_normalized   the final norm (causal LMs)
    unembed.hook_out                 logits (causal LMs); ``logits`` is an alias

Encoder–decoder models (T5, BART) name their two stacks as TransformerLens's
``HookedEncoderDecoder`` does, ``encoder.{l}.…`` and ``decoder.{l}.…`` instead of ``blocks.{l}.…``,
with the decoder's cross-attention sublayer between attention and MLP::

    decoder.{l}.cross_attn.hook_q/k/v/attn_scores/pattern/z   as attn.*, keys and values (and
                                     key_pos) from the encoder's output
    decoder.{l}.hook_cross_attn_out  cross-attention's residual contribution   [d_model]
    decoder.{l}.hook_resid_mid_cross resid_mid + cross_attn_out (the MLP's input side)

and no model-level sites but ``unembed.hook_out``/``logits``.

Layer indices are zero-based; negative indices count from the end (``blocks.-1.hook_resid_post``)
and are normalised to non-negative ones.  Which sites a model has depends on its family
(``Model.site_names()``); ``docs/sites.md`` gives every site's meaning per family.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from structlens.errors import InputError

#: kind -> the name after ``blocks.{l}.``, in forward order.
_LAYER_SUFFIX = {
    "resid_pre": "hook_resid_pre",
    "ln1_scale": "ln1.hook_scale",
    "ln1_normalized": "ln1.hook_normalized",
    "q": "attn.hook_q",
    "k": "attn.hook_k",
    "v": "attn.hook_v",
    "rot_q": "attn.hook_rot_q",
    "rot_k": "attn.hook_rot_k",
    "attn_scores": "attn.hook_attn_scores",
    "pattern": "attn.hook_pattern",
    "z": "attn.hook_z",
    "attn_out": "hook_attn_out",
    "resid_mid": "hook_resid_mid",
    "ln2_scale": "ln2.hook_scale",
    "ln2_normalized": "ln2.hook_normalized",
    "cross_q": "cross_attn.hook_q",
    "cross_k": "cross_attn.hook_k",
    "cross_v": "cross_attn.hook_v",
    "cross_attn_scores": "cross_attn.hook_attn_scores",
    "cross_pattern": "cross_attn.hook_pattern",
    "cross_z": "cross_attn.hook_z",
    "cross_attn_out": "hook_cross_attn_out",
    "resid_mid_cross": "hook_resid_mid_cross",
    "mlp_pre": "mlp.hook_pre",
    "mlp_pre_linear": "mlp.hook_pre_linear",
    "mlp_post": "mlp.hook_post",
    "mlp_out": "hook_mlp_out",
    "resid_post": "hook_resid_post",
}
#: kind -> name of the model-level sites, in forward order.
_MODEL_NAMES = {
    "embed": "hook_embed",
    "pos_embed": "hook_pos_embed",
    "ln_final_scale": "ln_final.hook_scale",
    "ln_final": "ln_final.hook_normalized",
    "logits": "logits",
}
#: Other accepted spellings (TransformerLens's) of model-level sites.
ALIASES = {"unembed.hook_out": "logits"}

LAYER_KINDS = tuple(_LAYER_SUFFIX)
MODEL_KINDS = tuple(_MODEL_NAMES)
#: The kinds every family provides (the residual decomposition and hook_z).
CORE_LAYER_KINDS = ("resid_pre", "z", "attn_out", "resid_mid", "mlp_out", "resid_post")
#: Sites laid out ``[batch, head, query_pos, key_pos]`` instead of ``[batch, pos, ...]``.
HEAD_FIRST_KINDS = ("attn_scores", "pattern", "cross_attn_scores", "cross_pattern")
#: Sites with a head axis (axis 2 for token-major sites, axis 1 for head-first ones).
HEAD_KINDS = ("q", "k", "v", "rot_q", "rot_k", "attn_scores", "pattern", "z") + (
    "cross_q",
    "cross_k",
    "cross_v",
    "cross_attn_scores",
    "cross_pattern",
    "cross_z",
)

_SUFFIX_KIND = {v: k for k, v in _LAYER_SUFFIX.items()}
_BLOCK_RE = re.compile(r"^(blocks|encoder|decoder)\.(-?\d+)\.(.+)$")
#: The layer stacks of an encoder–decoder model, in forward order.
STACKS = ("encoder", "decoder")


class SiteError(InputError):
    """An unknown or malformed site name, or a site the model does not have."""


@dataclass(frozen=True, order=True)
class Site:
    """A parsed site: ``kind`` (one of LAYER_KINDS or MODEL_KINDS), ``layer`` (or None), and
    ``stack`` (``"encoder"``/``"decoder"`` in encoder–decoder models, else None)."""

    kind: str
    layer: int | None = None
    stack: str | None = None

    @property
    def name(self) -> str:
        if self.layer is None:
            return _MODEL_NAMES[self.kind]
        return f"{self.stack or 'blocks'}.{self.layer}.{_LAYER_SUFFIX[self.kind]}"

    @property
    def head_first(self) -> bool:
        """True for ``[batch, head, query_pos, key_pos]`` sites (scores, pattern)."""
        return self.kind in HEAD_FIRST_KINDS

    @property
    def has_heads(self) -> bool:
        return self.kind in HEAD_KINDS

    def __str__(self) -> str:
        return self.name


def site_name(
    kind: str,
    layer: int | None = None,
    *,
    n_layers: int | None = None,
    stack: str | None = None,
) -> str:
    """The one way to build a site name from its parts.

    ``site_name("resid_pre", 3)`` is ``"blocks.3.hook_resid_pre"``,
    ``site_name("pattern", 0)`` is ``"blocks.0.attn.hook_pattern"``; model-level kinds take no
    layer (``site_name("logits")``).  With ``n_layers`` the layer is checked and a negative one
    counts from the end.  ``stack`` (``"encoder"``/``"decoder"``) names a layer of an
    encoder–decoder's stack (``n_layers`` is then that stack's).

    >>> site_name("resid_post", -1, n_layers=30)
    'blocks.29.hook_resid_post'
    >>> site_name("mlp_post", 2)
    'blocks.2.mlp.hook_post'
    >>> site_name("cross_attn_out", 1, stack="decoder")
    'decoder.1.hook_cross_attn_out'
    """
    if stack is not None and stack not in STACKS:
        raise SiteError(f"unknown stack {stack!r}; expected one of {STACKS}.")
    if kind in MODEL_KINDS:
        if layer is not None:
            raise SiteError(f"site kind {kind!r} has no layer, got layer={layer}.")
        return Site(kind).name
    if kind not in LAYER_KINDS:
        raise SiteError(f"unknown site kind {kind!r}; expected one of {LAYER_KINDS + MODEL_KINDS}.")
    if layer is None:
        raise SiteError(f"site kind {kind!r} needs a layer.")
    if n_layers is not None:
        if not -n_layers <= layer < n_layers:
            raise SiteError(
                f"layer {layer} is out of range for a model with {n_layers} layers "
                f"(valid: 0..{n_layers - 1}, or negative from the end)."
            )
        layer %= n_layers
    return Site(kind, layer, stack).name


def _model_kinds(causal: bool, pos_embed: bool) -> list[str]:
    kinds = ["embed"] + (["pos_embed"] if pos_embed else [])
    return kinds + (["ln_final_scale", "ln_final", "logits"] if causal else [])


def all_site_names(
    n_layers: int,
    *,
    causal: bool = True,
    pos_embed: bool = False,
    kinds: Iterable[str] = CORE_LAYER_KINDS,
    stacks: Mapping[str, tuple[int, Iterable[str]]] | None = None,
) -> list[str]:
    """Every site name of a model with ``n_layers`` layers and these layer ``kinds``, in
    forward order (``unembed.hook_out`` is listed after its alias ``logits``).

    An encoder–decoder model passes ``stacks`` (stack -> ``(n_layers, kinds)``) instead.
    """
    if stacks is not None:
        names = [
            Site(k, layer, stack).name
            for stack, (n, stack_kinds) in stacks.items()
            for layer in range(n)
            for k in LAYER_KINDS
            if k in set(stack_kinds)
        ]
        return names + ["logits", "unembed.hook_out"]
    kinds = set(kinds)
    names = ["hook_embed"] + (["hook_pos_embed"] if pos_embed else [])
    for layer in range(n_layers):
        names += [Site(k, layer).name for k in LAYER_KINDS if k in kinds]
    if causal:
        names += ["ln_final.hook_scale", "ln_final.hook_normalized", "logits", "unembed.hook_out"]
    return names


def parse_site(
    name: str | Site,
    n_layers: int,
    *,
    causal: bool = True,
    pos_embed: bool = False,
    kinds: Iterable[str] = CORE_LAYER_KINDS,
    missing: dict[str, str] | None = None,
    stacks: Mapping[str, tuple[int, Iterable[str]]] | None = None,
) -> Site:
    """Parse and validate a site name for a model with ``n_layers`` layers.

    ``kinds`` are the layer kinds the model has; ``missing`` maps a kind it lacks to the reason
    (quoted in the error).  An encoder–decoder model passes ``stacks`` (stack ->
    ``(n_layers, kinds)``) instead of ``n_layers`` and ``kinds``.

    Raises
    ------
    SiteError
        If the name is malformed, names a layer out of range, or a site the model lacks; the
        message lists the closest valid names.
    """
    if isinstance(name, Site):
        name = name.name
    if not isinstance(name, str):
        raise SiteError(f"site names are strings like 'blocks.3.hook_resid_pre', got {name!r}")
    kinds = tuple(kinds)
    m = _BLOCK_RE.match(name)
    if m and m.group(3) in _SUFFIX_KIND:
        prefix, layer, kind = m.group(1), int(m.group(2)), _SUFFIX_KIND[m.group(3)]
        stack = None if prefix == "blocks" else prefix
        if (stack is None) != (stacks is None):
            expected = "encoder.{l}./decoder.{l}." if stacks is not None else "blocks.{l}."
            raise SiteError(
                f"site {name!r}: this model's layer sites are named {expected}... "
                f"(`structlens sites MODEL` lists them)."
            )
        if stacks is not None:
            n_layers, stack_kinds = stacks[prefix]
            kinds = tuple(stack_kinds)
        if not -n_layers <= layer < n_layers:
            raise SiteError(
                f"site {name!r}: layer {layer} is out of range for a model with {n_layers} "
                f"layers (valid: 0..{n_layers - 1}, or negative from the end)."
            )
        if kind in kinds:
            return Site(kind, layer % n_layers, stack)
        reason = (missing or {}).get(kind, "this model's family does not provide it")
        raise SiteError(f"site {name!r} is not available for this model: {reason}.")
    name = ALIASES.get(name, name)
    model_kinds = ["logits"] if stacks is not None else _model_kinds(causal, pos_embed)
    model_names = {Site(k).name: k for k in model_kinds}
    if name in model_names:
        return Site(model_names[name])
    valid = all_site_names(n_layers, causal=causal, pos_embed=pos_embed, kinds=kinds, stacks=stacks)
    close = difflib.get_close_matches(name, valid, n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise SiteError(
        f"unknown site {name!r}.{hint} Run `structlens sites MODEL` to list this model's sites "
        f"(the grammar is in docs/sites.md)."
    )

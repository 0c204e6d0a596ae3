"""Site adapters: where each TransformerLens-style site lives in a Hugging Face model.

A :class:`Family` names module paths; :func:`register_family` adds one (users can add their
own without editing the package) and :func:`family_for` finds the family of a
``config.model_type``.  Models of an unregistered type get a family discovered from their
module structure (:mod:`structlens.models.adapters`), verified on one forward pass at load.

Module paths are relative to ``model.base_model`` (the inner ``LlamaModel``, ``GPT2Model``, ...)
for model-level modules, and relative to one decoder layer for per-layer modules.

Site semantics per family (what the adapter reads and writes)
-------------------------------------------------------------
``hook_resid_pre``  the layer's input hidden states.
``hook_resid_post`` the layer's output hidden states (= ``hook_resid_pre`` of the next layer).
``hook_attn_out``   the attention sublayer's *residual contribution*. On pre-norm families this
                    is the attention module output; on sandwich/post-sublayer-norm families
                    (Gemma-2/3, OLMo-2) it is the output of the norm applied to it.
``hook_mlp_out``    likewise for the MLP.
``hook_resid_mid``  the residual stream between the sublayers, read as the input of the module
                    that reads it (``mid_reader``); equal to ``resid_pre + attn_out``.  Parallel
                    families (GPT-J, Phi, Cohere, GPT-NeoX with ``use_parallel_residual``) have
                    no such tensor: the MLP reads ``resid_pre``, and ``resid_mid`` is defined as
                    ``resid_pre + attn_out`` so the identity holds.
``attn.hook_z``     per-head attention outputs before the output projection (``z_reader``'s
                    input), shape ``[..., n_heads, d_head]``.
``attn.hook_q/k/v`` projection outputs (``q_proj``/``k_proj``/``v_proj``, or the fused
                    ``qkv_proj`` split by ``qkv_layout``), before any QK-norm and rotary.
``ln1``/``ln2``     the norms read by attention and MLP (``ln1``/``ln2`` paths).
``mlp.hook_*``      ``mlp_pre``'s output, ``mlp_pre_linear``'s output (gated MLPs; or the two
                    halves of a fused ``mlp_gate_up``), and ``mlp_post_reader``'s input; for
                    mixture-of-experts MLPs (``moe_experts``) every expert's neurons side by
                    side, zero where a token is not routed to the expert
                    (:mod:`structlens.models.moe`).

Encoder–decoder models (T5, BART) register the encoder's family, whose ``decoder`` field is the
decoder's; module paths of both are relative to ``model.base_model``.  Decoder layers have a
cross-attention sublayer: ``hook_cross_attn_out`` is ``cross_write``'s output (pre-LN) and
``hook_resid_mid_cross = resid_mid + cross_attn_out`` is ``cross_mid_reader``'s input (pre-LN)
or ``cross_writer``'s output (post-LN BART, where ``cross_attn_out`` is a difference).

Post-LN encoders (BERT) apply LayerNorm *after* each residual addition, so no sublayer output
is additive.  There ``hook_resid_mid`` is the attention block's (normalised) output and
``hook_attn_out``/``hook_mlp_out`` are *defined* as the differences ``resid_mid - resid_pre`` and
``resid_post - resid_mid``: the effective write of each sublayer, LayerNorm included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    """Module paths of one architecture family.

    ``mid_reader`` is the per-layer module whose input is ``resid_mid`` (None for parallel
    families and post-LN ones); ``mid_writer`` is set only for post-LN families, whose
    ``resid_mid`` is a module output.  ``attn_write``/``mlp_write`` are None when the
    contribution is a difference (post-LN).  ``attn`` is the module that runs attention (the
    one handed to the attention function; default ``attn_write``).  Optional paths left None
    make the corresponding sites unavailable.
    """

    name: str
    model_types: tuple[str, ...]
    layers: str
    embed: str
    final_norm: str | None
    attn_write: str | None
    mlp_write: str | None
    mid_reader: str | None
    z_reader: str | None  # None: the layer has no attention heads (linear attention)
    mid_writer: str | None = None
    pos_embed: str | None = None
    parallel_attr: str | None = None  # config flag that makes attention and MLP parallel
    parallel: bool = False  # attention and MLP always read resid_pre
    causal: bool = True
    attn: str | None = None
    ln1: str | None = None
    ln2: str | None = None
    q_proj: str | None = None
    k_proj: str | None = None
    v_proj: str | None = None
    qkv_proj: str | None = None
    qkv_layout: str = "concat"  # "concat": [q | k | v]; "per_head": [head, (q, k, v), d_head]
    rotary: bool = False
    mlp_pre: str | None = None
    mlp_pre_linear: str | None = None
    mlp_gate_up: str | None = None  # one Linear whose output is [gate | up] (Phi-3)
    mlp_post_reader: str | None = None
    moe_experts: str | None = None  # experts module of an MoE MLP (structlens.models.moe)
    # encoder–decoder decoder layers: the cross-attention sublayer between attention and MLP
    cross_write: str | None = None  # whose output is cross_attn_out (pre-LN)
    cross_mid_reader: str | None = None  # whose input is resid_mid_cross (pre-LN)
    cross_writer: str | None = None  # whose output is resid_mid_cross (post-LN)
    cross_attn: str | None = None  # the module running cross-attention
    cross_q_proj: str | None = None
    cross_k_proj: str | None = None
    cross_v_proj: str | None = None
    cross_z_reader: str | None = None  # whose input is cross_attn.hook_z
    decoder: Family | None = None  # encoder–decoder models: the family is the encoder's
    copy_mlp_out: bool = False  # the layer adds into the MLP's output in place (Falcon)
    residual_multiplier: str | None = None  # config attribute scaling sublayer outputs (Granite)
    # hybrid models: the families of layers whose token mixer this family's attn_write does not
    # find (linear-attention layers), tried in order (structlens.models.adapters.layer_family)
    variants: tuple[Family, ...] = ()
    layer_name: str | None = None  # what its layers are, in messages ("linear-attention layer")
    head_dim_attr: str = "head_dim"  # config attribute giving hook_z's per-head width
    # site kinds the family never provides, each with the reason a request for it is refused
    lacks: tuple[tuple[str, str], ...] = ()

    @property
    def cross(self) -> bool:
        """Whether layers have a cross-attention sublayer (encoder–decoder decoders)."""
        return bool(self.cross_write or self.cross_writer)

    @property
    def post_ln(self) -> bool:
        return self.mid_writer is not None

    @property
    def attn_module(self) -> str:
        return self.attn or self.attn_write or ""


_FAMILIES: dict[str, Family] = {}


_GEMMA4 = (
    "Gemma 4 is not supported: each layer adds a per-layer input embedding after its MLP and "
    "scales the residual stream by a learned layer_scalar (so resid_post is not resid_mid + "
    "mlp_out), later layers reuse earlier layers' keys and values, and full-attention layers "
    "have wider heads than sliding ones (one hook_z width per model); structlens has no sites "
    "for these"
)

#: Model types refused with the reason (what structlens's sites cannot express), unless a
#: family is registered for them.
UNSUPPORTED: dict[str, str] = {"gemma4": _GEMMA4, "gemma4_text": _GEMMA4}


def register_family(family: Family, *, replace: bool = False) -> Family:
    """Register ``family`` for each of its ``model_types``; returns it.

    A model type that already has a family is an error unless ``replace`` is true.  See
    ``docs/sites.md`` for a worked example.
    """
    if not isinstance(family, Family):
        raise TypeError(f"register_family takes a Family, got {type(family).__name__}")
    if not family.model_types:
        raise ValueError(f"family {family.name!r} names no model_types")
    taken = [t for t in family.model_types if t in _FAMILIES and _FAMILIES[t] != family]
    if taken and not replace:
        raise ValueError(
            f"model types {taken} already have a family ({_FAMILIES[taken[0]].name!r}); pass "
            f"replace=True to override it."
        )
    for t in family.model_types:
        _FAMILIES[t] = family
    return family


def unregister_family(model_type: str) -> None:
    """Forget the family registered for ``model_type`` (KeyError if none)."""
    del _FAMILIES[model_type]


def registered_families() -> tuple[Family, ...]:
    """The registered families, each once, in registration order."""
    return tuple(dict.fromkeys(_FAMILIES.values()))


def family_for(model_type: str) -> Family:
    """The family registered for a HF ``config.model_type``; ValueError listing supported ones."""
    if model_type in _FAMILIES:
        return _FAMILIES[model_type]
    raise ValueError(
        f"structlens has no site adapter for model_type {model_type!r}. Registered model types: "
        f"{', '.join(sorted(_FAMILIES))}. Add one with structlens.models.register_family "
        f"(docs/sites.md)."
    )


_GATED: dict[str, Any] = dict(
    mlp_pre="mlp.gate_proj", mlp_pre_linear="mlp.up_proj", mlp_post_reader="mlp.down_proj"
)
_SEPARATE_QKV: dict[str, Any] = dict(
    q_proj="self_attn.q_proj", k_proj="self_attn.k_proj", v_proj="self_attn.v_proj"
)
_LLAMA_LIKE: dict[str, Any] = dict(
    layers="layers",
    embed="embed_tokens",
    final_norm="norm",
    attn_write="self_attn",
    mlp_write="mlp",
    mid_reader="post_attention_layernorm",
    z_reader="self_attn.o_proj",
    ln1="input_layernorm",
    ln2="post_attention_layernorm",
    rotary=True,
    **_SEPARATE_QKV,
)

_PARALLEL_LLAMA: dict[str, Any] = {**_LLAMA_LIKE, "mid_reader": None, "ln2": None, "parallel": True}
_GEMMA2_LIKE: dict[str, Any] = {
    **_LLAMA_LIKE,
    "attn_write": "post_attention_layernorm",
    "mlp_write": "post_feedforward_layernorm",
    "mid_reader": "pre_feedforward_layernorm",
    "ln2": "pre_feedforward_layernorm",
    "attn": "self_attn",
    **_GATED,
}
_MLA = (
    "latent attention has no per-head query, key and value projections (keys and values are "
    "expanded from one shared latent) and its queries and keys are wider than hook_z's heads"
)


def _in_tower(paths: dict[str, Any], tower: str) -> dict[str, Any]:
    """The model-level paths of ``paths`` inside the submodule ``tower`` of the base model
    (a multimodal model's text tower)."""
    return {k: f"{tower}.{paths[k]}" for k in ("layers", "embed", "final_norm") if paths.get(k)}


for _family in (
    Family(
        name="llama",
        model_types=("llama", "mistral", "qwen2", "qwen3", "gemma", "olmo", "smollm3"),
        **_LLAMA_LIKE,
        **_GATED,
    ),
    # Granite adds residual_multiplier * (sublayer output) to the residual stream.
    Family(
        name="granite",
        model_types=("granite",),
        **_LLAMA_LIKE,
        **_GATED,
        residual_multiplier="residual_multiplier",
    ),
    # Mixture-of-experts MLPs: the neurons of all experts side by side (structlens.models.moe).
    Family(
        name="moe",
        model_types=("mixtral", "qwen3_moe", "gpt_oss"),
        **_LLAMA_LIKE,
        moe_experts="mlp.experts",
    ),
    # Qwen2-MoE adds a gated shared expert to the routed ones: no mlp.hook_* sites.
    Family(name="qwen2_moe", model_types=("qwen2_moe",), **_LLAMA_LIKE),
    Family(
        name="phi3",
        model_types=("phi3",),
        **{**_LLAMA_LIKE, "q_proj": None, "k_proj": None, "v_proj": None},
        qkv_proj="self_attn.qkv_proj",
        mlp_gate_up="mlp.gate_up_proj",
        mlp_post_reader="mlp.down_proj",
    ),
    Family(
        name="starcoder2",
        model_types=("starcoder2",),
        **_LLAMA_LIKE,
        mlp_pre="mlp.c_fc",
        mlp_post_reader="mlp.c_proj",
    ),
    Family(
        name="stablelm",
        model_types=("stablelm",),
        **_LLAMA_LIKE,
        **_GATED,
        parallel_attr="use_parallel_residual",
    ),
    # OLMo-2 normalises each sublayer's output instead of its input: no ln1/ln2 sites.
    Family(
        name="olmo2",
        model_types=("olmo2", "olmo3"),
        **{
            **_LLAMA_LIKE,
            "ln1": None,
            "ln2": None,
            "attn_write": "post_attention_layernorm",
            "mlp_write": "post_feedforward_layernorm",
            "mid_reader": "mlp",
        },
        attn="self_attn",
        **_GATED,
    ),
    Family(name="cohere", model_types=("cohere",), **_PARALLEL_LLAMA, **_GATED),
    Family(
        name="phi",
        model_types=("phi",),
        **{**_PARALLEL_LLAMA, "final_norm": "final_layernorm", "z_reader": "self_attn.dense"},
        mlp_pre="mlp.fc1",
        mlp_post_reader="mlp.fc2",
    ),
    Family(
        name="gptj",
        model_types=("gptj",),
        layers="h",
        embed="wte",
        final_norm="ln_f",
        attn_write="attn",
        mlp_write="mlp",
        mid_reader=None,
        parallel=True,
        z_reader="attn.out_proj",
        ln1="ln_1",
        q_proj="attn.q_proj",
        k_proj="attn.k_proj",
        v_proj="attn.v_proj",
        rotary=True,
        mlp_pre="mlp.fc_in",
        mlp_post_reader="mlp.fc_out",
    ),
    # Falcon's parallel layers add attention into the MLP output in place; reads copy it.  The
    # q/k/v split assumes the multi-query layout (falcon-7b, the config default).
    Family(
        name="falcon",
        model_types=("falcon",),
        layers="h",
        embed="word_embeddings",
        final_norm="ln_f",
        attn_write="self_attention",
        mlp_write="mlp",
        mid_reader="post_attention_layernorm",
        parallel_attr="parallel_attn",
        z_reader="self_attention.dense",
        ln1="input_layernorm",
        ln2="post_attention_layernorm",
        qkv_proj="self_attention.query_key_value",
        rotary=True,
        mlp_pre="mlp.dense_h_to_4h",
        mlp_post_reader="mlp.dense_4h_to_h",
        copy_mlp_out=True,
    ),
    # BLOOM's attention and MLP modules add the residual themselves: their outputs are
    # resid_mid and resid_post, so attn_out and mlp_out are differences (as for post-LN).
    Family(
        name="bloom",
        model_types=("bloom",),
        layers="h",
        embed="word_embeddings_layernorm",  # TL's hook_embed is after the embedding LayerNorm
        final_norm="ln_f",
        attn_write=None,
        mlp_write=None,
        mid_reader=None,
        mid_writer="self_attention",
        z_reader="self_attention.dense",
        attn="self_attention",
        ln1="input_layernorm",
        ln2="post_attention_layernorm",
        qkv_proj="self_attention.query_key_value",
        qkv_layout="per_head",
        mlp_pre="mlp.dense_h_to_4h",
        mlp_post_reader="mlp.dense_4h_to_h",
    ),
    Family(
        name="opt",
        model_types=("opt",),
        layers="decoder.layers",
        embed="decoder.embed_tokens",
        pos_embed="decoder.embed_positions",
        final_norm="decoder.final_layer_norm",
        attn_write="self_attn",
        mlp_write="fc2",
        mid_reader="final_layer_norm",
        z_reader="self_attn.out_proj",
        ln1="self_attn_layer_norm",
        ln2="final_layer_norm",
        **_SEPARATE_QKV,
        mlp_pre="fc1",
        mlp_post_reader="fc2",
    ),
    Family(name="gemma2", model_types=("gemma2", "gemma3_text"), **_GEMMA2_LIKE),
    # Gemma-3 multimodal checkpoints (Gemma3ForConditionalGeneration): the text tower's sites.
    Family(
        name="gemma3_multimodal",
        model_types=("gemma3",),
        **{**_GEMMA2_LIKE, **_in_tower(_GEMMA2_LIKE, "language_model")},
    ),
    # Hybrids (Qwen3-Next, Qwen3.5): full-attention layers with an output gate, whose q_proj
    # computes the queries and the gate, interleaved per head; the linear-attention layers are
    # the variant.  MoE layers (shared expert) have no mlp.hook_* sites, dense ones do.
    Family(
        name="qwen3_next",
        model_types=(
            "qwen3_next",
            "qwen3_5",
            "qwen3_5_text",
            "qwen3_5_moe",
            "qwen3_5_moe_text",
        ),
        **{**_LLAMA_LIKE, "q_proj": None},
        **_GATED,
        layer_name="full-attention layer",
        lacks=(
            (
                "q",
                "q_proj computes the queries and the attention output gate together; "
                "hook_rot_q has the queries after QK-norm and rotary",
            ),
        ),
        variants=(
            Family(
                name="qwen3_next.linear",
                model_types=(),
                **{
                    **_LLAMA_LIKE,
                    **dict.fromkeys(("q_proj", "k_proj", "v_proj"), None),
                    "attn_write": "linear_attn",
                    "z_reader": None,
                    "rotary": False,
                },
                **_GATED,
                layer_name="linear-attention (Gated DeltaNet) layer",
            ),
        ),
    ),
    # DeepSeek-V3's latent attention: queries and keys are qk_nope + qk_rope wide, values
    # v_head_dim (hook_z's width); keys and values come from one shared latent.  Its first
    # first_k_dense_replace layers have a dense MLP (mlp.hook_* sites), the others a
    # mixture of experts with shared experts (none).
    Family(
        name="deepseek_v3",
        model_types=("deepseek_v3",),
        **{**_LLAMA_LIKE, **dict.fromkeys(("q_proj", "k_proj", "v_proj"), None)},
        **_GATED,
        head_dim_attr="v_head_dim",
        lacks=tuple((kind, _MLA) for kind in ("q", "k", "v", "rot_q", "rot_k")),
    ),
    Family(
        name="gpt2",
        model_types=("gpt2", "gpt_bigcode"),
        layers="h",
        embed="wte",
        pos_embed="wpe",
        final_norm="ln_f",
        attn_write="attn",
        mlp_write="mlp",
        mid_reader="ln_2",
        z_reader="attn.c_proj",
        ln1="ln_1",
        ln2="ln_2",
        qkv_proj="attn.c_attn",
        mlp_pre="mlp.c_fc",
        mlp_post_reader="mlp.c_proj",
    ),
    Family(
        name="gpt_neox",
        model_types=("gpt_neox",),
        layers="layers",
        embed="embed_in",
        final_norm="final_layer_norm",
        attn_write="attention",
        mlp_write="mlp",
        mid_reader="post_attention_layernorm",
        z_reader="attention.dense",
        parallel_attr="use_parallel_residual",
        ln1="input_layernorm",
        ln2="post_attention_layernorm",
        qkv_proj="attention.query_key_value",
        qkv_layout="per_head",
        rotary=True,
        mlp_pre="mlp.dense_h_to_4h",
        mlp_post_reader="mlp.dense_4h_to_h",
    ),
    Family(
        name="bert",
        model_types=("bert", "roberta"),
        layers="encoder.layer",
        embed="embeddings",
        final_norm=None,
        attn_write=None,
        mlp_write=None,
        mid_reader=None,
        mid_writer="attention.output",
        z_reader="attention.output.dense",
        causal=False,
        attn="attention.self",
        ln1="attention.output.LayerNorm",
        ln2="output.LayerNorm",
        q_proj="attention.self.query",
        k_proj="attention.self.key",
        v_proj="attention.self.value",
        mlp_pre="intermediate.dense",
        mlp_post_reader="output.dense",
    ),
):
    register_family(_family)


def _t5_stack(layers: str, mlp: int, **decoder: str) -> dict:
    ff = f"layer.{mlp}"
    return dict(
        layers=layers,
        embed=layers.split(".")[0] + ".embed_tokens",  # each stack's own embedding module
        final_norm=None,
        attn_write="layer.0.SelfAttention",
        mlp_write=f"{ff}.DenseReluDense",
        mid_reader="layer.1",
        z_reader="layer.0.SelfAttention.o",
        causal=False,
        ln1="layer.0.layer_norm",
        ln2="layer.1.layer_norm",
        q_proj="layer.0.SelfAttention.q",
        k_proj="layer.0.SelfAttention.k",
        v_proj="layer.0.SelfAttention.v",
        mlp_pre=f"{ff}.DenseReluDense.wi",
        mlp_post_reader=f"{ff}.DenseReluDense.wo",
        **decoder,
    )


def _bart_stack(layers: str, **decoder: str) -> dict:
    return dict(
        layers=layers,
        embed=layers.split(".")[0] + ".embed_tokens",  # each stack's own embedding module
        final_norm=None,
        attn_write=None,
        mlp_write=None,
        mid_reader=None,
        mid_writer="self_attn_layer_norm",
        z_reader="self_attn.out_proj",
        causal=False,
        attn="self_attn",
        q_proj="self_attn.q_proj",
        k_proj="self_attn.k_proj",
        v_proj="self_attn.v_proj",
        mlp_pre="fc1",
        mlp_post_reader="fc2",
        **decoder,
    )


# Encoder–decoders.  T5 (pre-LN RMSNorm, relative position bias in the scores; non-gated
# DenseReluDense): the decoder's ln2 is the norm before cross-attention, as in TransformerLens's
# HookedEncoderDecoder.  BART is post-LN: attn_out, cross_attn_out and mlp_out are differences.
register_family(
    Family(
        name="t5",
        model_types=("t5",),
        **_t5_stack("encoder.block", 1),
        decoder=Family(
            name="t5.decoder",
            model_types=("t5",),
            **_t5_stack(
                "decoder.block",
                2,
                cross_write="layer.1.EncDecAttention",
                cross_mid_reader="layer.2",
                cross_attn="layer.1.EncDecAttention",
                cross_q_proj="layer.1.EncDecAttention.q",
                cross_k_proj="layer.1.EncDecAttention.k",
                cross_v_proj="layer.1.EncDecAttention.v",
                cross_z_reader="layer.1.EncDecAttention.o",
            ),
        ),
    )
)
register_family(
    Family(
        name="bart",
        model_types=("bart",),
        **_bart_stack("encoder.layers"),
        decoder=Family(
            name="bart.decoder",
            model_types=("bart",),
            **_bart_stack(
                "decoder.layers",
                cross_writer="encoder_attn_layer_norm",
                cross_attn="encoder_attn",
                cross_q_proj="encoder_attn.q_proj",
                cross_k_proj="encoder_attn.k_proj",
                cross_v_proj="encoder_attn.v_proj",
                cross_z_reader="encoder_attn.out_proj",
            ),
        ),
    )
)

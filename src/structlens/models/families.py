"""One adapter per architecture family: where each TransformerLens-style site lives in a HF model.

Module paths are relative to ``model.base_model`` (the inner ``LlamaModel``, ``GPT2Model``, ...)
for model-level modules, and relative to one decoder layer for per-layer modules.

Site semantics per family (what the adapter reads and writes)
-------------------------------------------------------------
``hook_resid_pre``  the layer's input hidden states.
``hook_resid_post`` the layer's output hidden states (= ``hook_resid_pre`` of the next layer).
``hook_attn_out``   the attention sublayer's *residual contribution*. On pre-norm families this
                    is the attention module output; on sandwich-norm families (Gemma-2/3) it is
                    the output of ``post_attention_layernorm``, not the raw attention output.
``hook_mlp_out``    likewise for the MLP (Gemma-2/3: ``post_feedforward_layernorm`` output).
``hook_resid_mid``  the residual stream between the sublayers, read as the input of the norm
                    that feeds the MLP; equal to ``resid_pre + attn_out``.  GPT-NeoX with
                    ``use_parallel_residual`` has no such tensor: the MLP reads ``resid_pre``, and
                    ``resid_mid`` is defined as ``resid_pre + attn_out`` so the identity holds.
``attn.hook_z``     per-head attention outputs before the output projection, shape
                    ``[..., n_heads, d_head]`` (the input of ``o_proj``/``c_proj``/``dense``).

Post-LN encoders (BERT) apply LayerNorm *after* each residual addition, so no sublayer output
is additive.  There ``hook_resid_mid`` is the attention block's (normalised) output and
``hook_attn_out``/``hook_mlp_out`` are *defined* as the differences ``resid_mid - resid_pre`` and
``resid_post - resid_mid``: the effective write of each sublayer, LayerNorm included.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """Module paths of one architecture family.

    ``mid_reader`` is the per-layer module whose input is ``resid_mid`` (None when it has none);
    ``mid_writer`` is set only for post-LN families, whose ``resid_mid`` is a module output.
    ``attn_write``/``mlp_write`` are None when the contribution is a difference (post-LN).
    """

    name: str
    model_types: tuple[str, ...]
    layers: str
    embed: str
    final_norm: str | None
    attn_write: str | None
    mlp_write: str | None
    mid_reader: str | None
    z_reader: str
    mid_writer: str | None = None
    pos_embed: str | None = None
    parallel_attr: str | None = None  # config flag that makes attention and MLP parallel
    causal: bool = True

    @property
    def post_ln(self) -> bool:
        return self.mid_writer is not None


_LLAMA_LIKE = dict(
    layers="layers",
    embed="embed_tokens",
    final_norm="norm",
    attn_write="self_attn",
    mlp_write="mlp",
    mid_reader="post_attention_layernorm",
    z_reader="self_attn.o_proj",
)

FAMILIES: tuple[Family, ...] = (
    Family(
        name="llama",
        model_types=(
            "llama",
            "mistral",
            "qwen2",
            "qwen3",
            "gemma",
            "olmo",
            "phi3",
            "granite",
            "smollm3",
            "mixtral",
            "qwen2_moe",
        ),
        **_LLAMA_LIKE,
    ),
    Family(
        name="gemma2",
        model_types=("gemma2", "gemma3", "gemma3_text"),
        layers="layers",
        embed="embed_tokens",
        final_norm="norm",
        attn_write="post_attention_layernorm",
        mlp_write="post_feedforward_layernorm",
        mid_reader="pre_feedforward_layernorm",
        z_reader="self_attn.o_proj",
    ),
    Family(
        name="gpt2",
        model_types=("gpt2",),
        layers="h",
        embed="wte",
        pos_embed="wpe",
        final_norm="ln_f",
        attn_write="attn",
        mlp_write="mlp",
        mid_reader="ln_2",
        z_reader="attn.c_proj",
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
    ),
)


def family_for(model_type: str) -> Family:
    """The family adapter for a HF ``config.model_type``; ValueError listing supported ones."""
    for fam in FAMILIES:
        if model_type in fam.model_types:
            return fam
    supported = sorted(t for f in FAMILIES for t in f.model_types)
    raise ValueError(
        f"structlens has no site adapter for model_type {model_type!r}. Supported model types: "
        f"{', '.join(supported)}. Add a Family to structlens/models/families.py to support it."
    )

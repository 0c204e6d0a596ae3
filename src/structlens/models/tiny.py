"""Tiny random models of each supported family, built locally for tests and examples.

They have random weights (seeded), a byte-level tokenizer with a 257-token vocabulary (the 256
bytes plus ``<|endoftext|>``), 2–3 layers (8 for ``tiny-llama-deep``) and a width of 64, so
a forward pass takes milliseconds.  Their names are the built-in aliases ``tiny-llama``,
``tiny-qwen2``, ``tiny-mistral``, ``tiny-gpt2``, ``tiny-neox``, ``tiny-neox-seq``, ``tiny-gemma2``,
``tiny-bert``, and one per further family (``tiny-phi``, ``tiny-opt``, ``tiny-falcon``, ...;
:data:`TINY_NAMES` lists them).
"""

from __future__ import annotations

from typing import Any

import torch

VOCAB = 257
EOS = "<|endoftext|>"


def byte_tokenizer():
    """A byte-level BPE tokenizer with no merges: any text, ids 0..255, EOS/PAD = 256."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab[EOS] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    fast.padding_side = "right"
    return fast


def _configs() -> dict[str, tuple[str, dict[str, Any]]]:
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=256,
    )
    return {
        "tiny-llama": ("LlamaConfig", dict(common, num_key_value_heads=2)),
        # enough layers for a test whose independent unit is the layer to reach α = 0.05
        "tiny-llama-deep": (
            "LlamaConfig",
            dict(common, num_key_value_heads=2, num_hidden_layers=8),
        ),
        "tiny-qwen2": ("Qwen2Config", dict(common, num_key_value_heads=2)),
        "tiny-mistral": ("MistralConfig", dict(common, num_key_value_heads=2, sliding_window=None)),
        "tiny-gemma2": (
            "Gemma2Config",
            dict(
                common,
                num_key_value_heads=2,
                head_dim=16,
                query_pre_attn_scalar=16,
                sliding_window=64,
            ),
        ),
        "tiny-gpt2": (
            "GPT2Config",
            dict(
                vocab_size=VOCAB,
                n_embd=64,
                n_layer=3,
                n_head=4,
                n_positions=256,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
            ),
        ),
        "tiny-neox": (
            "GPTNeoXConfig",
            dict(common, use_parallel_residual=True, hidden_dropout=0.0, attention_dropout=0.0),
        ),
        "tiny-neox-seq": (
            "GPTNeoXConfig",
            dict(common, use_parallel_residual=False, hidden_dropout=0.0, attention_dropout=0.0),
        ),
        "tiny-bert": (
            "BertConfig",
            dict(common, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
        ),
        "tiny-granite": (
            "GraniteConfig",
            dict(
                common,
                num_key_value_heads=2,
                residual_multiplier=0.5,
                embedding_multiplier=2.0,
                logits_scaling=4.0,
            ),
        ),
        "tiny-qwen3": ("Qwen3Config", dict(common, num_key_value_heads=2, head_dim=16)),
        "tiny-phi3": ("Phi3Config", dict(common, num_key_value_heads=2, pad_token_id=None)),
        "tiny-olmo2": ("Olmo2Config", dict(common, num_key_value_heads=2)),
        "tiny-qwen3-moe": (
            "Qwen3MoeConfig",
            dict(
                common,
                num_key_value_heads=2,
                head_dim=16,
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
            ),
        ),
        "tiny-starcoder2": (
            "Starcoder2Config",
            dict(common, num_key_value_heads=2, residual_dropout=0.0, embedding_dropout=0.0),
        ),
        "tiny-stablelm": ("StableLmConfig", dict(common, num_key_value_heads=2, qk_layernorm=True)),
        "tiny-cohere": ("CohereConfig", dict(common, num_key_value_heads=2, use_qk_norm=True)),
        "tiny-phi": (
            "PhiConfig",
            dict(common, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0),
        ),
        "tiny-gptj": (
            "GPTJConfig",
            dict(
                vocab_size=VOCAB,
                n_embd=64,
                n_layer=3,
                n_head=4,
                n_positions=256,
                rotary_dim=8,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
            ),
        ),
        "tiny-opt": (
            "OPTConfig",
            dict(
                vocab_size=VOCAB,
                hidden_size=64,
                word_embed_proj_dim=64,
                num_hidden_layers=3,
                num_attention_heads=4,
                ffn_dim=128,
                max_position_embeddings=256,
                dropout=0.0,
                attention_dropout=0.0,
            ),
        ),
        "tiny-bigcode": (
            "GPTBigCodeConfig",
            dict(
                vocab_size=VOCAB,
                n_embd=64,
                n_layer=3,
                n_head=4,
                n_positions=256,
                multi_query=True,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
            ),
        ),
        "tiny-falcon": (
            "FalconConfig",
            dict(
                vocab_size=VOCAB,
                hidden_size=64,
                num_hidden_layers=3,
                num_attention_heads=4,
                hidden_dropout=0.0,
                attention_dropout=0.0,
            ),
        ),
        "tiny-bloom": (
            "BloomConfig",
            dict(
                vocab_size=VOCAB,
                hidden_size=64,
                n_layer=3,
                n_head=4,
                hidden_dropout=0.0,
                attention_dropout=0.0,
            ),
        ),
        "tiny-olmo3": (
            "Olmo3Config",
            dict(
                common,
                num_key_value_heads=2,
                sliding_window=_WINDOW,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            ),
        ),
        "tiny-gemma3-mm": (
            "Gemma3Config",
            dict(
                text_config=dict(
                    common,
                    num_key_value_heads=2,
                    head_dim=16,
                    query_pre_attn_scalar=16,
                    sliding_window=_WINDOW,
                    layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                ),
                vision_config=dict(
                    hidden_size=16,
                    intermediate_size=32,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    image_size=28,
                    patch_size=14,
                ),
                mm_tokens_per_image=4,
            ),
        ),
        # hybrids: Gated DeltaNet layers around a gated full-attention layer
        "tiny-qwen3-next": (
            "Qwen3NextConfig",
            dict(
                common,
                **_LINEAR_ATTENTION,
                num_key_value_heads=2,
                head_dim=16,
                layer_types=["linear_attention", "full_attention", "linear_attention"],
                **_SHARED_EXPERT_MOE,
                mlp_only_layers=[0],  # a dense MLP in layer 0, MoE (with a shared expert) after
            ),
        ),
        "tiny-qwen3.5": (
            "Qwen3_5TextConfig",
            dict(
                common,
                **_LINEAR_ATTENTION,
                num_key_value_heads=2,
                head_dim=16,
                layer_types=["linear_attention", "linear_attention", "full_attention"],
            ),
        ),
        # every layer a mixture of experts with a shared expert, as in the released MoE
        "tiny-qwen3.5-moe": (
            "Qwen3_5MoeTextConfig",
            dict(
                common,
                **_LINEAR_ATTENTION,
                num_key_value_heads=2,
                head_dim=16,
                layer_types=["linear_attention", "linear_attention", "full_attention"],
                **_SHARED_EXPERT_MOE,
            ),
        ),
        "tiny-gpt-oss": (
            "GptOssConfig",
            dict(
                common,
                num_key_value_heads=2,
                head_dim=16,
                num_local_experts=4,
                num_experts_per_tok=2,
                sliding_window=_WINDOW,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0),
            ),
        ),
        "tiny-deepseek-v3": (
            "DeepseekV3Config",
            dict(
                common,
                num_key_value_heads=4,
                q_lora_rank=32,
                kv_lora_rank=16,
                qk_nope_head_dim=8,
                qk_rope_head_dim=4,
                v_head_dim=8,
                first_k_dense_replace=1,  # layer 0 dense, then MoE with a shared expert
                n_routed_experts=4,
                num_experts_per_tok=2,
                n_shared_experts=1,
                moe_intermediate_size=32,
                n_group=2,
                topk_group=1,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0),
            ),
        ),
    }


#: Sliding-window length of the tiny models with sliding layers: it masks keys of the longest
#: test prompts, and no row of the padding the shortest get (a fully masked row, whose output
#: every attention implementation makes up differently).
_WINDOW = 33

#: Gated DeltaNet (linear attention) heads of the tiny hybrids.
_LINEAR_ATTENTION: dict[str, Any] = dict(
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
)

#: Mixtures of experts with a shared expert, of the tiny hybrids.
_SHARED_EXPERT_MOE: dict[str, Any] = dict(
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
)

TINY_NAMES: tuple[str, ...] = tuple(_configs())


def build_tiny(name: str, seed: int = 0) -> tuple[torch.nn.Module, Any]:
    """Build tiny model ``name`` with weights drawn under ``seed``; returns (model, tokenizer)."""
    import transformers

    configs = _configs()
    if name not in configs:
        raise ValueError(f"unknown tiny model {name!r}; choose from {', '.join(configs)}")
    cls_name, kwargs = configs[name]
    special = dict(pad_token_id=VOCAB - 1)
    if cls_name != "BertConfig":
        special.update(bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    if "text_config" in kwargs:  # multimodal: the tokens are the text tower's
        kwargs = {**kwargs, "text_config": {**special, **kwargs["text_config"]}}
    config = getattr(transformers, cls_name)(**{**special, **kwargs})
    auto = transformers.AutoModel if cls_name == "BertConfig" else transformers.AutoModelForCausalLM
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = auto.from_config(config, attn_implementation="eager")
        # Random weights at the default init scale give near-uniform logits and vanishing
        # residual writes; larger weights make site identities and patching tests meaningful.
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.08)
    model.eval()
    return model, byte_tokenizer()

"""Tiny random models of every family, saved with ``save_pretrained`` and loaded back from the
directory (the path a user takes), with random norm gains and biases so that a site "before the
gain" and one "after the gain" differ."""

import re
import tempfile

import torch

from structlens.models import load_model
from structlens.models.tiny import TINY_NAMES

#: One tiny model per family; ``tiny-llama-deep`` is tiny-llama's architecture at 8 layers, so it
#: adds no family.
FAMILY_MODELS = [n for n in TINY_NAMES if n not in ("tiny-neox-seq", "tiny-llama-deep")] + [
    "tiny-neox-seq"
]

#: Layer site kinds each family lacks, and why (docs/sites.md).
EXPECTED_MISSING = {
    "tiny-llama": [],
    "tiny-granite": [],
    "tiny-qwen2": [],
    "tiny-mistral": [],
    "tiny-qwen3": [],
    "tiny-phi3": [],
    "tiny-stablelm": [],
    "tiny-gemma2": [],
    "tiny-gpt2": ["mlp_pre_linear", "rot_k", "rot_q"],
    "tiny-bigcode": ["mlp_pre_linear", "rot_k", "rot_q"],
    "tiny-opt": ["mlp_pre_linear", "rot_k", "rot_q"],
    "tiny-bert": ["mlp_pre_linear", "rot_k", "rot_q"],
    "tiny-neox": ["mlp_pre_linear"],
    "tiny-neox-seq": ["mlp_pre_linear"],
    "tiny-starcoder2": ["mlp_pre_linear"],
    "tiny-olmo2": ["ln1_normalized", "ln1_scale", "ln2_normalized", "ln2_scale"],
    "tiny-qwen3-moe": [],
    "tiny-cohere": ["ln2_normalized", "ln2_scale"],
    "tiny-phi": ["ln2_normalized", "ln2_scale", "mlp_pre_linear"],
    "tiny-gptj": ["ln2_normalized", "ln2_scale", "mlp_pre_linear"],
    "tiny-falcon": ["ln2_normalized", "ln2_scale", "mlp_pre_linear"],
    "tiny-bloom": ["mlp_pre_linear", "rot_k", "rot_q"],
    "tiny-olmo3": ["ln1_normalized", "ln1_scale", "ln2_normalized", "ln2_scale"],
    "tiny-gemma3-mm": [],
    # hybrids: the kinds no layer has (LAYER_LACKS: what some layers lack)
    "tiny-qwen3-next": ["q"],
    "tiny-qwen3.5": ["q"],
    "tiny-qwen3.5-moe": ["mlp_post", "mlp_pre", "mlp_pre_linear", "q"],
    "tiny-gpt-oss": [],
    "tiny-deepseek-v3": ["k", "q", "rot_k", "rot_q", "v"],
}
_LINEAR = ["attn_scores", "k", "pattern", "rot_k", "rot_q", "v", "z"]
_MOE = ["mlp_post", "mlp_pre", "mlp_pre_linear"]
#: Per layer, the kinds a model has on other layers but not on this one (hybrid models: linear
#: attention has no heads; a mixture of experts with a shared expert has no neuron sites).
LAYER_LACKS = {
    "tiny-qwen3-next": [_LINEAR, _MOE, sorted(_LINEAR + _MOE)],
    "tiny-qwen3.5": [_LINEAR, _LINEAR, []],
    "tiny-qwen3.5-moe": [_LINEAR, _LINEAR, []],
    "tiny-deepseek-v3": [[], _MOE, _MOE],
}
#: Families with attention sinks: a softmax row shares its mass with one sink logit per head.
SINKS = {"tiny-gpt-oss"}
#: Families whose hook_z is gated per feature after the attention (z = (pattern · v) ⊙ σ(gate)).
GATED_Z = {"tiny-qwen3-next", "tiny-qwen3.5", "tiny-qwen3.5-moe"}
#: Families whose attention normalises q and k before rotary (so hook_rot_q != rotary(hook_q)
#: at position 0).
QK_NORM = {
    "tiny-qwen3",
    "tiny-olmo2",
    "tiny-qwen3-moe",
    "tiny-cohere",
    "tiny-stablelm",
    "tiny-olmo3",
    "tiny-gemma3-mm",
    "tiny-qwen3-next",
    "tiny-qwen3.5",
    "tiny-qwen3.5-moe",
}

_dirs: dict[str, str] = {}
_models: dict[tuple[str, str], object] = {}


def saved_dir(name: str) -> str:
    """A directory holding tiny model ``name`` (random norm parameters), saved once."""
    if name not in _dirs:
        m = load_model(name)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for pname, p in m.hf.named_parameters():
                if p.dim() == 1:
                    is_gain = pname.endswith("weight") and re.search(r"norm|ln_", pname.lower())
                    base = 1.0 if is_gain else 0.0
                    p.copy_(base + 0.3 * torch.randn(p.shape, generator=gen))
        m.hf.config.architectures = [type(m.hf).__name__]
        if m.hf.config.model_type == "gpt2":
            m.hf.config.n_ctx = m.hf.config.n_positions  # read by TransformerLens
        # no family name in the path: TransformerLens guesses architectures from path names
        d = tempfile.mkdtemp(prefix="structlens-model-")
        m.hf.save_pretrained(d)
        m.tokenizer.save_pretrained(d)
        _dirs[name] = d
    return _dirs[name]


def family_model(name: str, dtype: str = "float32"):
    """Tiny model ``name`` loaded from its saved directory (cached)."""
    if (name, dtype) not in _models:
        _models[(name, dtype)] = load_model(saved_dir(name), dtype=dtype)
    return _models[(name, dtype)]


def transformer_lens_model(directory: str, model):
    """TransformerLens's HookedTransformer for the checkpoint in ``directory``, with TL's default
    ``fold_ln`` (norm gains moved into the next weights) and no centring or bias folding, which
    would change the residual stream and ``hook_v``."""
    from transformer_lens import HookedTransformer
    from transformer_lens import loading_from_pretrained as loading

    cfg = loading.get_pretrained_model_config(
        directory, fold_ln=True, device="cpu", default_prepend_bos=False
    )
    tl = HookedTransformer(cfg, tokenizer=model.tokenizer, move_to_device=False)
    state = loading.get_pretrained_state_dict(directory, cfg, model.hf)
    tl.load_and_process_state_dict(
        state,
        fold_ln=True,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=False,
        refactor_factored_attn_matrices=False,
    )
    return tl


def assert_sites_equal_transformer_lens(model, directory: str) -> list[str]:
    """Assert every site of ``model`` equals TransformerLens's on one prompt; the sites compared."""
    from structlens.interventions import hooked

    tl = transformer_lens_model(directory, model)
    ids, _ = model.tokenize(["The quick brown fox jumps over the lazy dog."])
    _, tl_cache = tl.run_with_cache(ids)
    with hooked(model, model.site_names()) as c:
        model.forward(ids, torch.ones_like(ids))
    compared = []
    for site in model.site_names():
        if site == "logits":
            continue  # TL's name is unembed.hook_out, compared under it
        if site.endswith("hook_resid_mid") and model.parallel:
            continue  # parallel blocks: TL has no resid_mid (ours is resid_pre + attn_out)
        if model.family.moe_experts and ".mlp.hook_" in site:
            continue  # TL hooks MoE neurons per expert on its routed tokens only (test_moe.py)
        ours, theirs = c[site], tl_cache[site]
        assert ours.shape == theirs.shape, site
        fin = torch.isfinite(theirs)
        assert torch.equal(torch.isfinite(ours), fin), site
        err = (ours - theirs).abs()[fin].max() / theirs[fin].abs().max()
        assert err < 1e-4, (site, float(err))
        compared.append(site)
    return compared

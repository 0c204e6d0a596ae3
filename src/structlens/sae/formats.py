"""Published SAE and transcoder layouts: detection, reading, and the provenance check.

:func:`read_dictionary` reads a file or directory in any of the layouts below into a
:class:`PretrainedDictionary`: the module (a :class:`~structlens.sae.models.SparseAutoencoder`
or a :class:`~structlens.sae.models.Transcoder`), its layout's name and its metadata
(``hook_name``, ``hook_name_out``, ``model_name``, ``neuronpedia_id``, …).
:func:`load_dictionary` also checks the provenance against the model and site it will be used
with.  Every tensor's exact shape is checked, NaN/inf values are refused, safetensors and
``np.load(allow_pickle=False)`` read the files (nothing is unpickled), and a file that does
not parse is one :class:`~structlens.errors.DamagedFileError` naming it.

Layouts (weights in our convention after reading: ``W_enc`` ``[d_in, d_sae]``, ``W_dec``
``[d_sae, d_out]``, rows are tokens; "folded" means rewritten into those weights so that the
function of the raw activations is unchanged):

``saelens``
    ``cfg.json`` + ``sae_weights.safetensors`` (+ ``sparsity.safetensors``), SAEs read by
    :mod:`structlens.sae.io`.  ``sparsity.safetensors`` holds ``sparsity`` ``[d_sae]``, the
    log10 feature density, kept as :attr:`PretrainedDictionary.log_sparsity`;
    ``neuronpedia_id`` (in ``cfg.json`` or its ``metadata``) goes to the metadata.  SAELens 6
    transcoders (``architecture`` ``transcoder``, ``skip_transcoder``,
    ``jumprelu_transcoder``, ``jumprelu_skip_transcoder``) have ``W_dec`` ``[d_sae, d_out]``,
    ``b_dec`` ``[d_out]``, no input shift, and ``W_skip`` ``[d_out, d_in]``:
    ``ŷ = f @ W_dec + b_dec + x @ W_skipᵀ``; ``metadata.hook_name_out`` is the output site.
``gemma-scope`` (Gemma Scope 1)
    ``params.npz`` with ``W_enc``/``w_enc`` ``[d_in, d_sae]``, ``b_enc``, ``W_dec``
    ``[d_sae, d_in]``, ``b_dec``, ``threshold`` ``[d_sae]``: JumpReLU,
    ``f = relu(pre)·[pre > θ]``, ``pre = x @ W_enc + b_enc`` (no ``b_dec`` subtracted).
    Under a folder named ``…transcoder…`` (``google/gemma-scope-2b-pt-transcoders``) a
    transcoder writing ``blocks.L.hook_mlp_out`` (``layer_L`` in the path); its input, the
    MLP's normalised input, is given no site.
``gemma-scope-2`` (Gemma Scope 2)
    ``params.safetensors`` with ``w_enc``, ``b_enc``, ``w_dec`` ``[d_sae, d_out]``,
    ``b_dec``, ``threshold`` (key case ignored), the same JumpReLU; skip ("affine")
    transcoders add ``affine_skip_connection`` (or ``w_skip``) ``[d_in, d_out]``, applied
    untransposed: ``ŷ = f @ W_dec + b_dec + x @ W_skip``.  ``config.json`` beside it
    (``hf_hook_point_in``/``hf_hook_point_out``, ``model_name``, ``affine_connection``, …)
    goes to the metadata as ``config``; without one the hooks are inferred from the folder
    (``resid_post…``, ``mlp_out…``, ``attn_out…``, ``transcoder…``), as SAELens does.  The
    Hugging Face hooks are kept as ``hf_hook_name``/``hf_hook_name_out`` and named as sites
    where they are one: ``model.layers.L.output`` → ``blocks.L.hook_resid_post``,
    ``…post_feedforward_layernorm.output`` → ``blocks.L.hook_mlp_out``,
    ``…self_attn.o_proj.input`` → ``blocks.L.attn.hook_z`` (heads concatenated); a
    transcoder's input ``…pre_feedforward_layernorm.output`` includes the norm's gain, which
    ``ln2.hook_normalized`` does not, so it gets no site.  A file with a skip matrix, with
    ``d_out ≠ d_in`` or with different input and output hooks reads as a transcoder.
``sparsify`` (EleutherAI)
    ``<hookpoint>/cfg.json`` (``d_in``, ``num_latents`` or ``expansion_factor``, ``k``,
    ``activation`` (``topk`` only), ``transcode``, ``skip_connection``,
    ``normalize_decoder``; ``signed`` must be false) + ``<hookpoint>/sae.safetensors``
    (``encoder.weight`` ``[d_sae, d_in]``, ``encoder.bias``, ``W_dec`` ``[d_sae, d_out]``,
    ``b_dec``, ``W_skip`` ``[d_out, d_in]`` with a skip connection).  Forward (sparsify's
    ``SparseCoder``): ``pre = relu((x − b_dec·[not transcode]) @ encoder.weightᵀ +
    encoder.bias)``, the top ``k`` kept, ``ŷ = f @ W_dec + b_dec + x @ W_skipᵀ``.  An
    autoencoder without skip reads as a :class:`~structlens.sae.models.TopKSAE`; a transcoder
    or a skip connection as a :class:`~structlens.sae.models.Transcoder` (the ``b_dec`` input
    shift folded into ``b_enc``).  ``layers.N`` is ``blocks.N.hook_resid_post`` (the output
    of layer ``N``, as SAELens maps it); ``layers.N.mlp`` transcoders write
    ``blocks.N.hook_mlp_out`` (the MLP module's output; in the sandwich-norm families the
    site is after the post-MLP norm, so there it is not this tensor) and their input, the
    MLP's input after the norm's gain, has no site name.  ``model`` from a ``config.json``
    one folder up, if any.
``llama-scope`` (OpenMOSS Llama Scope)
    ``hyperparams.json`` + ``checkpoints/final.safetensors`` (the Llama Scope releases), or
    ``config.json`` + ``sae_weights.safetensors`` (later releases): ``encoder.weight``
    ``[d_sae, d]``, ``encoder.bias``, ``decoder.weight`` ``[d_out, d_sae]``,
    ``decoder.bias`` (or ``W_E`` ``[d, d_sae]``, ``b_E``, ``W_D`` ``[d_sae, d_out]``,
    ``b_D``), optionally ``log_jumprelu_threshold`` ``[d_sae]``; ``act_fn`` ``jumprelu``
    (threshold ``exp(log_jumprelu_threshold)`` or the scalar ``jump_relu_threshold``),
    ``topk`` (``top_k``) or ``relu``; ``hook_point_in``/``hook_point_out``.  In training
    units ``p = (s_in·x − c) @ W_Eᵀ + b_E`` and ``ŷ = (f @ W_Dᵀ + b_D)/s_out``, with
    ``s = √d/n`` for ``norm_activation: dataset-wise`` (``n`` the
    ``dataset_average_activation_norm`` of the input and output) and 1 for ``inference``,
    and ``c`` the pre-encoder decoder bias where ``apply_decoder_bias_to_pre_encoder``
    (default true in the first releases).  With ``sparsity_include_decoder_norm`` (default
    true) the gate sees ``p`` times the decoder column's norm.  What the gate compares with
    the threshold is what the publisher's loader computes: for the first releases (whose
    loader folds the dataset norm into the weights before the forward) ``a·p`` with
    ``a = ‖W_D[:, i]‖/s_out``, and ``p/s_in`` without decoder norms; for the later ones
    ``a = ‖W_D[:, i]‖`` (or 1).  Read as ``f = σ(a·p)`` with unit-norm decoder rows:
    ``W_enc = (a·s_in)·W_Eᵀ``, ``b_enc = a·(b_E − c @ W_Eᵀ)``, ``W_dec = W_Dᵀ/(s_out·a)``,
    ``b_dec = b_D/s_out``, the thresholds unchanged.  Per-token and per-batch normalisations
    are refused, as is a gated (GLU) encoder.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from structlens.errors import DamagedFileError, InputError, reading
from structlens.provenance import check_provenance
from structlens.sae.io import (
    CFG_FILENAME,
    WEIGHTS_FILENAME,
    _from_tensors_of,
    _read_cfg,
    load_saelens,
    sae_metadata,
)
from structlens.sae.models import Transcoder
from structlens.sites import site_name

FORMATS = ("saelens", "gemma-scope", "gemma-scope-2", "sparsify", "llama-scope")
SPARSITY_FILENAME = "sparsity.safetensors"


@dataclasses.dataclass(frozen=True)
class PretrainedDictionary:
    """A dictionary read from a published layout: the ``module``, the ``format`` it was read
    from (one of :data:`FORMATS`), the weights file ``path``, its ``metadata`` (``hook_name``
    = the input site, ``hook_name_out`` for transcoders, ``model_name``, …) and, where the
    layout has it, ``log_sparsity`` (log10 feature density per feature)."""

    module: Any
    format: str
    path: Path
    metadata: dict[str, Any]
    log_sparsity: np.ndarray | None = None

    @property
    def is_transcoder(self) -> bool:
        return isinstance(self.module, Transcoder)

    @property
    def input_site(self) -> str | None:
        return self.metadata.get("hook_name")

    @property
    def output_site(self) -> str | None:
        return self.metadata.get("hook_name_out", self.metadata.get("hook_name"))


def detect_format(path: str | Path) -> str:
    """The layout of the file or directory ``path`` (one of :data:`FORMATS`); an
    :class:`InputError` listing the layouts when it is none of them."""
    p = Path(path)
    if p.suffix == ".npz" or (p / "params.npz").is_file():
        return "gemma-scope"
    if p.name == "params.safetensors" or (p / "params.safetensors").is_file():
        return "gemma-scope-2"
    if (p / "sae.safetensors").is_file() and (p / CFG_FILENAME).is_file():
        return "sparsify"
    if (p / "hyperparams.json").is_file() or (
        (p / "config.json").is_file() and (p / WEIGHTS_FILENAME).is_file()
    ):
        return "llama-scope"
    if (p / WEIGHTS_FILENAME).is_file() and (p / CFG_FILENAME).is_file():
        return "saelens"
    raise InputError(
        f"{p} holds no SAE or transcoder in a known layout: expected {WEIGHTS_FILENAME} + "
        f"{CFG_FILENAME} (SAELens), params.npz (Gemma Scope), params.safetensors (Gemma Scope "
        "2), sae.safetensors + cfg.json (sparsify), or hyperparams.json + "
        "checkpoints/final.safetensors or config.json + sae_weights.safetensors (Llama Scope)."
    )


def read_dictionary(
    path: str | Path, *, dtype: torch.dtype | None = None, metadata: dict[str, Any] | None = None
) -> PretrainedDictionary:
    """Read the SAE or transcoder at ``path`` (any of :data:`FORMATS`, detected).

    ``dtype`` casts the weights (default: float32, or the dtype a SAELens ``cfg.json``
    names); ``metadata`` overrides what the files record (a registry entry's model and
    hook, say).
    """
    p = Path(path)
    fmt = detect_format(p)
    reader = {
        "saelens": _read_saelens,
        "gemma-scope": _read_gemma_scope,
        "gemma-scope-2": _read_gemma_scope_2,
        "sparsify": _read_sparsify,
        "llama-scope": _read_llama_scope,
    }[fmt]
    return with_metadata(reader(p, dtype), metadata or {})


def with_metadata(d: PretrainedDictionary, metadata: dict[str, Any]) -> PretrainedDictionary:
    """``d`` with ``metadata`` over its own; a transcoder's sites follow ``hook_name`` and
    ``hook_name_out``."""
    d = dataclasses.replace(d, metadata={**d.metadata, **metadata})
    if isinstance(d.module, Transcoder):
        d.module.input_site = d.metadata.get("hook_name")
        d.module.output_site = d.metadata.get("hook_name_out")
    return d


def load_dictionary(
    path: str | Path,
    *,
    dtype: torch.dtype | None = None,
    model: Any = None,
    site: str | None = None,
    allow_foreign: bool = False,
    metadata: dict[str, Any] | None = None,
) -> Any:
    """The SAE or transcoder at ``path`` (:func:`read_dictionary`), refused as foreign
    (:class:`~structlens.errors.ForeignResultError`, a warning with ``allow_foreign``) when
    its recorded model or input site is not ``model``'s or ``site``
    (:func:`check_dictionary`)."""
    d = read_dictionary(path, dtype=dtype, metadata=metadata)
    check_dictionary(d, model=model, site=site, allow_foreign=allow_foreign)
    return d.module


def check_dictionary(
    d: PretrainedDictionary,
    *,
    model: Any = None,
    site: str | None = None,
    allow_foreign: bool = False,
) -> list[str]:
    """:func:`structlens.provenance.check_provenance` of ``d``'s record against ``model`` and
    ``site`` (its input site).  Two spellings of one thing are not mismatches: a published
    ``model_name`` that names the model without its organisation or in another case
    (``gemma-2-2b`` for ``google/gemma-2-2b``), and ``blocks.L.hook_resid_post`` for
    ``blocks.{L+1}.hook_resid_pre`` (the same tensor)."""
    meta = dict(d.metadata)
    if model is not None and "model_digest" not in meta and meta.get("model_name") is not None:
        if _bare(str(meta["model_name"])) == _bare(str(model.name)):
            meta["model_name"] = model.name
    hook = meta.get("hook_name")
    if site is not None and hook is not None and _same_tensor(str(hook), str(site)):
        meta["hook_name"] = site
    return check_provenance(
        meta, what=f"the {'transcoder' if d.is_transcoder else 'SAE'} in {d.path}", model=model,
        site=site,
        allow_foreign=allow_foreign,
    )  # fmt: skip


def _bare(name: str) -> str:
    return name.rstrip("/").rsplit("/", 1)[-1].lower()


def _same_tensor(a: str, b: str) -> bool:
    def canonical(s: str) -> str:
        m = re.fullmatch(r"blocks\.(\d+)\.hook_resid_post", s)
        return site_name("resid_pre", int(m.group(1)) + 1) if m else s

    return canonical(a) == canonical(b)


# ---------------------------------------------------------------- SAELens
def _read_saelens(path: Path, dtype: torch.dtype | None) -> PretrainedDictionary:
    meta, cfg = sae_metadata(path), _read_cfg(path)
    if cfg.get("architecture") in _SAELENS_TRANSCODERS:
        module: Any = _saelens_transcoder(path, cfg, dtype)
        if "hook_name_out" in cfg and "hook_name_out" not in meta:
            meta["hook_name_out"] = cfg["hook_name_out"]
    else:
        module = load_saelens(path, dtype=dtype)
    if cfg.get("neuronpedia_id") is not None and "neuronpedia_id" not in meta:
        meta["neuronpedia_id"] = cfg["neuronpedia_id"]
    d = PretrainedDictionary(module, "saelens", path / WEIGHTS_FILENAME, meta)
    return dataclasses.replace(d, log_sparsity=_log_sparsity(path, module.d_sae))


def _log_sparsity(path: Path, d_sae: int) -> np.ndarray | None:
    """``sparsity.safetensors``'s ``sparsity`` ``[d_sae]``, if the file is there."""
    from safetensors.torch import load_file

    file = path / SPARSITY_FILENAME
    if not file.is_file():
        return None
    with reading(file, "SAE feature sparsity (safetensors)"):
        tensors = load_file(str(file))
    if "sparsity" not in tensors or tuple(tensors["sparsity"].shape) != (d_sae,):
        found = {k: tuple(v.shape) for k, v in tensors.items()}
        raise InputError(
            f"{file} must hold 'sparsity' of shape ({d_sae},) (log10 feature density of each "
            f"feature); found {found}."
        )
    return tensors["sparsity"].double().numpy()


#: SAELens 6 transcoder architectures → (activation, skip connection).
_SAELENS_TRANSCODERS = {
    "transcoder": ("standard", False),
    "skip_transcoder": ("standard", True),
    "jumprelu_transcoder": ("jumprelu", False),
    "jumprelu_skip_transcoder": ("jumprelu", True),
}


def _saelens_transcoder(path: Path, cfg: dict[str, Any], dtype: torch.dtype | None) -> Transcoder:
    """A SAELens 6 transcoder: ``W_enc`` ``[d_in, d_sae]``, ``W_dec`` ``[d_sae, d_out]``,
    ``b_dec`` ``[d_out]``, ``W_skip`` ``[d_out, d_in]`` (``ŷ = … + x @ W_skipᵀ``), no input
    shift (SAELens refuses ``apply_b_dec_to_input`` for transcoders)."""
    from safetensors.torch import load_file

    activation, skip = _SAELENS_TRANSCODERS[cfg["architecture"]]
    if cfg.get("normalize_activations", "none") not in ("none", None):
        raise InputError(
            f"{path / CFG_FILENAME}: normalize_activations = {cfg['normalize_activations']!r} "
            "is not supported; fold the normalisation into the weights first."
        )
    file = path / WEIGHTS_FILENAME
    with reading(file, "SAELens transcoder weights (safetensors)"):
        raw = load_file(str(file))
    t = {k: v.to(dtype or torch.float32) for k, v in raw.items()}
    if skip and "W_skip" not in t:
        raise InputError(f"{file}: a {cfg['architecture']} needs 'W_skip'; found {sorted(t)}.")
    if "W_skip" in t:
        t["W_skip"] = t["W_skip"].t()
    tc = _transcoder(file, t, activation, None)
    for key, n in (("d_in", tc.d_in), ("d_sae", tc.d_sae), ("d_out", tc.d_out)):
        if key in cfg and cfg[key] != n:
            raise InputError(
                f"{path / CFG_FILENAME} says {key} = {cfg[key]}; the weights have {n}."
            )
    return tc


# ---------------------------------------------------------------- Gemma Scope 1 and 2
def _read_gemma_scope(path: Path, dtype: torch.dtype | None) -> PretrainedDictionary:
    npz = path if path.suffix == ".npz" else path / "params.npz"
    try:
        # TypeError: torch has no dtype for the array (strings, say): the file's fault
        with reading(npz, "Gemma Scope params.npz (numpy zip)", also=(TypeError,)):
            with np.load(npz, allow_pickle=False) as data:
                tensors = {k: torch.from_numpy(np.array(data[k])) for k in data}
    except DamagedFileError as err:
        if "allow_pickle" not in str(err.__cause__):
            raise
        # object arrays, a pickle posing as .npz, or garbage (which np.load takes for a
        # pickle) would need unpickling: refused
        raise DamagedFileError(
            f"{npz} cannot be read without unpickling, which structlens refuses (it can run "
            f"any code): it holds object arrays or a pickle, or is damaged ({err.__cause__})"
        ) from err
    dt = dtype or torch.float32
    tensors = {_gemma_key(k): v.to(dt) for k, v in _lower_keys(npz, tensors).items()}
    # the transcoders (google/gemma-scope-*-transcoders) have an SAE's shapes: only the
    # repository's name tells them apart (a hub cache keeps it six folders up)
    if any("transcoder" in part.lower() for part in npz.parent.parts[-6:]):
        m = re.search(r"layer_(\d+)", str(npz.parent))
        meta = {"hook_name_out": site_name("mlp_out", int(m.group(1)))} if m else {}
        tc = _transcoder(npz, tensors, "jumprelu", None)
        return PretrainedDictionary(tc, "gemma-scope", npz, meta)
    sae = _from_tensors_of(npz, "jumprelu", tensors, {"apply_b_dec_to_input": False}, dt)
    return PretrainedDictionary(sae, "gemma-scope", npz, {})


def _read_gemma_scope_2(path: Path, dtype: torch.dtype | None) -> PretrainedDictionary:
    from safetensors.torch import load_file

    file = path if path.name == "params.safetensors" else path / "params.safetensors"
    with reading(file, "Gemma Scope 2 params.safetensors"):
        raw = load_file(str(file))
    dt = dtype or torch.float32
    t = {_gemma_key(k): v.to(dt) for k, v in _lower_keys(file, raw).items()}
    config = file.parent / "config.json"
    cfg = _json_object(config, "Gemma Scope 2 config.json") if config.is_file() else {}
    meta = _gemma_sites(file.parent, cfg)
    if isinstance(cfg.get("model_name"), str):
        meta["model_name"] = cfg["model_name"]
    if cfg:
        meta["config"] = cfg
    if "W_enc" not in t or "W_dec" not in t or t["W_enc"].ndim != 2 or t["W_dec"].ndim != 2:
        raise InputError(
            f"{file}: needs 2-D w_enc and w_dec (one SAE or transcoder; cross-layer "
            f"transcoders are not read); found {_shapes(t)}."
        )
    if cfg.get("affine_connection") and "W_skip" not in t:
        raise InputError(f"{config} says affine_connection but {file} has no skip matrix.")
    crosses = meta.get("hf_hook_name_out", meta.get("hf_hook_name")) != meta.get("hf_hook_name")
    if "W_skip" in t or t["W_dec"].shape[1] != t["W_enc"].shape[0] or crosses:
        return PretrainedDictionary(
            _transcoder(file, t, "jumprelu", None), "gemma-scope-2", file, meta
        )
    sae = _from_tensors_of(file, "jumprelu", t, {"apply_b_dec_to_input": False}, dt)
    return PretrainedDictionary(sae, "gemma-scope-2", file, meta)


def _lower_keys(file: Path, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for k, v in tensors.items():
        if k.lower() in out:
            raise InputError(f"{file} holds {k!r} twice (names differing in case only).")
        out[k.lower()] = v
    return out


def _gemma_key(key: str) -> str:
    """Our name for a lower-cased Gemma Scope key."""
    names = {"w_enc": "W_enc", "w_dec": "W_dec", "w_skip": "W_skip"}
    return names.get(key, "W_skip" if key == "affine_skip_connection" else key)


#: Gemma 3 module outputs a Gemma Scope 2 ``config.json`` names → site kinds (``None``: the
#: tensor has no site: the pre-feed-forward norm's output includes its ``1 + w`` gain, which
#: ``ln2.hook_normalized`` does not).
_GEMMA3_HOOKS = {
    "output": "resid_post",
    "post_feedforward_layernorm.output": "mlp_out",
    "self_attn.o_proj.input": "z",
    "pre_feedforward_layernorm.output": None,
}
#: The hooks SAELens infers from a folder name when there is no ``config.json``.
_GEMMA3_FOLDERS = {
    "resid_post": ("output", None),
    "mlp_out": ("post_feedforward_layernorm.output", None),
    "attn_out": ("self_attn.o_proj.input", None),
    "transcoder": ("pre_feedforward_layernorm.output", "post_feedforward_layernorm.output"),
}


def _gemma_sites(folder: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """``hf_hook_name`` (``hf_hook_name_out``), the Hugging Face module outputs the dictionary
    reads (writes), from ``config.json``'s ``hf_hook_point_in``/``hf_hook_point_out`` or else
    from the folder name as SAELens infers them, and the sites they are (``hook_name``,
    ``hook_name_out``) where they have one."""
    hf_in, hf_out = cfg.get("hf_hook_point_in"), cfg.get("hf_hook_point_out")
    if not isinstance(hf_in, str):
        m = re.search(r"layer_(\d+)", folder.name)
        kind = next((k for k in _GEMMA3_FOLDERS if folder.parent.name.startswith(k)), None)
        if m is None or kind is None:
            return {}
        a, b = _GEMMA3_FOLDERS[kind]
        hf_in = f"model.layers.{m.group(1)}.{a}"
        hf_out = f"model.layers.{m.group(1)}.{b}" if b else None
    meta: dict[str, Any] = {"hf_hook_name": hf_in}
    if isinstance(hf_out, str) and hf_out != hf_in:
        meta["hf_hook_name_out"] = hf_out
    for key, hf in (("hook_name", hf_in), ("hook_name_out", meta.get("hf_hook_name_out"))):
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", hf or "")
        kind = _GEMMA3_HOOKS.get(m.group(2)) if m else None
        if m and kind:
            meta[key] = site_name(kind, int(m.group(1)))
    return meta


# ---------------------------------------------------------------- sparsify
def _read_sparsify(path: Path, dtype: torch.dtype | None) -> PretrainedDictionary:
    from safetensors.torch import load_file

    cfg = _json_object(path / CFG_FILENAME, "sparsify cfg.json")
    file = path / "sae.safetensors"
    with reading(file, "sparsify sae.safetensors"):
        raw = load_file(str(file))
    dt = dtype or torch.float32
    t = {k: v.to(dt) for k, v in raw.items()}
    if cfg.get("activation", "topk") != "topk" or cfg.get("signed", False):
        raise InputError(
            f"{path / CFG_FILENAME}: activation {cfg.get('activation')!r}"
            f"{' (signed)' if cfg.get('signed') else ''} is not supported; only unsigned TopK."
        )
    d_in, k = _int(cfg, "d_in", path), _int(cfg, "k", path)
    d_sae = int(cfg.get("num_latents") or 0) or d_in * _int(cfg, "expansion_factor", path)
    transcode = bool(cfg.get("transcode", False))
    for name in ("encoder.weight", "encoder.bias", "W_dec", "b_dec"):
        if name not in t:
            raise InputError(f"{file} lacks {name!r}; found {sorted(t)}.")
    d_out = t["b_dec"].shape[0] if t["b_dec"].ndim == 1 else -1
    want = {"encoder.weight": (d_sae, d_in), "encoder.bias": (d_sae,), "W_dec": (d_sae, d_out)}
    if bool(cfg.get("skip_connection", False)) or "W_skip" in t:
        want["W_skip"] = (d_out, d_in)
    _check_shapes(file, t, want)
    meta = _sparsify_sites(path.name, transcode)
    parent_cfg = path.parent / "config.json"
    if parent_cfg.is_file():
        run = _json_object(parent_cfg, "sparsify run config.json")
        if isinstance(run.get("model"), str):
            meta["model_name"] = run["model"]
    W_enc, b_enc = t["encoder.weight"].t(), t["encoder.bias"]
    if not transcode and "W_skip" not in want and d_out == d_in:
        tensors = {"W_enc": W_enc, "b_enc": b_enc, "W_dec": t["W_dec"], "b_dec": t["b_dec"]}
        sae = _from_tensors_of(file, "topk", tensors, {"k": k, "apply_b_dec_to_input": True}, dt)
        return PretrainedDictionary(sae, "sparsify", file, meta)
    if not transcode:  # the encoder reads x − b_dec: folded into b_enc
        b_enc = b_enc - t["b_dec"] @ W_enc
    tc = {"W_enc": W_enc, "b_enc": b_enc, "W_dec": t["W_dec"], "b_dec": t["b_dec"]}
    if "W_skip" in t:
        tc["W_skip"] = t["W_skip"].t()
    return PretrainedDictionary(_transcoder(file, tc, "topk", k), "sparsify", file, meta)


def _sparsify_sites(hookpoint: str, transcode: bool) -> dict[str, str]:
    m = re.fullmatch(r"(?:model\.)?layers\.(\d+)(\.mlp)?", hookpoint)
    if m is None:
        return {}
    layer = int(m.group(1))
    if m.group(2) and transcode:
        return {"hook_name_out": site_name("mlp_out", layer)}
    return {} if m.group(2) else {"hook_name": site_name("resid_post", layer)}


# ---------------------------------------------------------------- Llama Scope
def _read_llama_scope(path: Path, dtype: torch.dtype | None) -> PretrainedDictionary:
    from safetensors.torch import load_file

    # the first layout's loader gates in raw-activation units, the second's in the
    # normalised ones (module docstring)
    first = (path / "hyperparams.json").is_file()
    if first:
        hp_file, file = path / "hyperparams.json", path / "checkpoints" / "final.safetensors"
    else:
        hp_file, file = path / "config.json", path / WEIGHTS_FILENAME
    hp = _json_object(hp_file, "Llama Scope hyperparameters (JSON)")
    with reading(file, "Llama Scope weights (safetensors)"):
        raw = load_file(str(file))
    t = _llama_tensors(file, {k: v.to(torch.float64) for k, v in raw.items()})
    d = _int(hp, "d_model", hp_file)
    d_sae = t["W_E"].shape[0]
    if hp.get("d_sae") is not None and _int(hp, "d_sae", hp_file) != d_sae:
        raise InputError(f"{hp_file} says d_sae = {hp['d_sae']}; {file} has {d_sae} features.")
    if hp.get("use_glu_encoder"):
        raise InputError(f"{hp_file}: use_glu_encoder is not supported (a gated encoder).")
    if "b_D" not in t:
        if hp.get("use_decoder_bias", True):
            raise InputError(f"{file} lacks the decoder bias that {hp_file} says it has.")
        t["b_D"] = torch.zeros(t["W_D"].shape[0], dtype=torch.float64)
    d_out = t["b_D"].shape[0] if t["b_D"].ndim == 1 else -1
    want = {"W_E": (d_sae, d), "b_E": (d_sae,), "W_D": (d_out, d_sae)}
    if "threshold" in t:
        want["threshold"] = (d_sae,)
    _check_shapes(file, t, want)
    s_in, s_out = _llama_norms(hp, hp_file, d, raw)
    c = torch.zeros(d, dtype=torch.float64)
    if hp.get("apply_decoder_bias_to_pre_encoder", first):  # the publisher's defaults
        if d_out != d:
            raise InputError(f"{hp_file}: a pre-encoder decoder bias needs d_out = d_model.")
        # in raw units as the publisher's loader subtracts it (b_D/s_out), times s_in
        c = t["b_D"] * (s_in / s_out if first else 1.0)
    # a: the factor from the training pre-activation p to the gated quantity f = a·p
    a = torch.ones(d_sae, dtype=torch.float64)
    if hp.get("sparsity_include_decoder_norm", True):
        a = t["W_D"].norm(dim=0) * (s_in / s_out if first else 1.0)
    if first:
        a = a / s_in
    act = str(hp.get("act_fn", "relu")).lower()
    tensors = {
        "W_enc": (t["W_E"] * (a * s_in)[:, None]).t(),
        "b_enc": a * (t["b_E"] - t["W_E"] @ c),
        "W_dec": t["W_D"].t() / (s_out * a)[:, None],
        "b_dec": t["b_D"] / s_out,
    }
    if act == "jumprelu":
        if "threshold" in t:
            tensors["threshold"] = t["threshold"]
        else:
            tensors["threshold"] = torch.full((d_sae,), _float(hp, "jump_relu_threshold", hp_file))
    elif act not in ("topk", "relu"):
        raise InputError(f"{hp_file}: act_fn {act!r} is not supported (jumprelu, topk, relu).")
    dt = dtype or torch.float32
    tensors = {k: v.to(dt).contiguous() for k, v in tensors.items()}
    arch = {"jumprelu": "jumprelu", "topk": "topk", "relu": "standard"}[act]
    k = _int(hp, "top_k", hp_file) if act == "topk" else None
    meta: dict[str, Any] = {"llama_scope": hp}
    hook_in, hook_out = hp.get("hook_point_in"), hp.get("hook_point_out", hp.get("hook_point_in"))
    if hook_in is not None:
        meta["hook_name"] = hook_in
    if hook_out != hook_in or d_out != d:
        meta["hook_name_out"] = hook_out
        return PretrainedDictionary(_transcoder(file, tensors, arch, k), "llama-scope", file, meta)
    cfg = {"apply_b_dec_to_input": False, **({"k": k} if k else {})}
    sae = _from_tensors_of(file, arch, tensors, cfg, dt)
    return PretrainedDictionary(sae, "llama-scope", file, meta)


def _llama_tensors(file: Path, raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``W_E`` ``[d_sae, d]``, ``b_E``, ``W_D`` ``[d_out, d_sae]``, ``b_D`` and ``threshold``
    from either generation's names (``encoder.weight``/``decoder.weight``, or ``W_E``
    ``[d, d_sae]``/``W_D`` ``[d_sae, d_out]``)."""
    names = {"encoder.weight": "W_E", "encoder.bias": "b_E", "decoder.weight": "W_D",
             "decoder.bias": "b_D"}  # fmt: skip
    t = {names.get(k, k): v for k, v in raw.items() if not k.startswith("dataset_average")}
    if "encoder.weight" not in raw:
        for key in ("W_E", "W_D"):
            if key in t and t[key].ndim == 2:
                t[key] = t[key].t()
    for key in ("log_jumprelu_threshold", "activation_function.log_jumprelu_threshold"):
        if key in t:
            t["threshold"] = t.pop(key).exp()
    for key in ("W_E", "b_E", "W_D"):
        if key not in t or t[key].ndim != (1 if key == "b_E" else 2):
            raise InputError(
                f"{file} lacks a {'1' if key == 'b_E' else '2'}-D {key!r} (or its "
                f"encoder./decoder. name); found {_shapes(raw)}."
            )
    return t


def _llama_norms(
    hp: dict[str, Any], where: Path, d: int, raw: dict[str, torch.Tensor]
) -> tuple[float, float]:
    """``(s_in, s_out) = (√d/n_in, √d/n_out)`` for ``dataset-wise`` normalisation (``n`` from
    ``dataset_average_activation_norm``, keyed ``in``/``out`` or by hook point, or from the
    weights file's ``dataset_average_activation_norm.<hook>`` scalars), ``(1, 1)`` for
    ``inference``."""
    mode = hp.get("norm_activation")
    if mode == "inference":
        return 1.0, 1.0
    if mode != "dataset-wise":
        raise InputError(
            f"{where}: norm_activation {mode!r} is not supported: 'token-wise' and "
            "'batch-wise' rescale each token or batch by its own norm, which no fixed weights "
            "reproduce; only 'dataset-wise' (folded into the weights) and 'inference' load."
        )
    norms = hp.get("dataset_average_activation_norm")
    norms = dict(norms) if isinstance(norms, dict) else {}
    for k, v in raw.items():
        if k.startswith("dataset_average_activation_norm.") and v.numel() == 1:
            norms.setdefault(k.split(".", 1)[1], float(v))
    out = []
    for side, hook in (("in", "hook_point_in"), ("out", "hook_point_out")):
        key = side if side in norms else str(hp.get(hook, hp.get("hook_point_in")))
        n = _float(norms, key, where) if key in norms else float("nan")
        if not n > 0:
            raise InputError(
                f"{where}: dataset-wise normalisation needs a positive "
                f"dataset_average_activation_norm[{side!r}]; found {norms}."
            )
        out.append(math.sqrt(d) / n)
    return out[0], out[1]


# ---------------------------------------------------------------- shared helpers
def _transcoder(
    file: Path, t: dict[str, torch.Tensor], activation: str, k: int | None
) -> Transcoder:
    """A :class:`Transcoder` from ``W_enc``, ``b_enc``, ``W_dec``, ``b_dec`` (``threshold``,
    ``W_skip``) in our layout, every shape checked."""
    for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
        if name not in t:
            raise InputError(f"{file} lacks {name!r}; found {sorted(t)}.")
    if t["W_enc"].ndim != 2 or t["W_dec"].ndim != 2:
        raise InputError(f"{file}: W_enc and W_dec must be 2-D; found {_shapes(t)}.")
    d_in, d_sae = t["W_enc"].shape
    d_out = t["W_dec"].shape[1]
    want = {"W_dec": (d_sae, d_out), "b_enc": (d_sae,), "b_dec": (d_out,)}
    if activation == "jumprelu":
        if "threshold" not in t:
            raise InputError(f"{file}: a JumpReLU transcoder needs a 'threshold' tensor.")
        want["threshold"] = (d_sae,)
    if "W_skip" in t:
        want["W_skip"] = (d_in, d_out)
    _check_shapes(file, t, want)
    dt = t["W_enc"].dtype
    try:
        tc = Transcoder(
            d_in, d_sae, d_out, activation=activation, k=k, skip="W_skip" in t, dtype=dt
        )
    except ValueError as err:
        raise InputError(f"{file}: {err}") from err
    with torch.no_grad():
        for name, param in tc.named_parameters():
            if name in t:
                param.copy_(t[name])
    return tc


def _check_shapes(file: Path, t: dict[str, torch.Tensor], want: dict[str, tuple[int, ...]]) -> None:
    for name, shape in want.items():
        # exact: a broadcastable [1] bias would load and silently compute something else
        if tuple(t[name].shape) != shape:
            raise InputError(
                f"{file}: {name} has shape {tuple(t[name].shape)}, expected {shape}; the weights "
                "file is damaged or foreign."
            )
    for name, v in t.items():
        if v.is_floating_point() and not torch.isfinite(v).all():
            raise InputError(f"{file}: tensor {name!r} holds NaN or infinite values.")


def _shapes(t: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in t.items()}


def _json_object(file: Path, what: str) -> dict[str, Any]:
    with reading(file, what):
        value = json.loads(file.read_text(encoding="utf-8"))
    if not isinstance(value, dict):
        raise InputError(f"{file} must hold a JSON object, not {type(value).__name__}.")
    return value


def _int(cfg: dict[str, Any], key: str, where: Path) -> int:
    value = cfg.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise InputError(f"{where}: {key} = {value!r} must be a positive integer.")


def _float(cfg: dict[str, Any], key: str, where: Path) -> float:
    value = cfg.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise InputError(f"{where}: {key} = {value!r} must be a finite number.")

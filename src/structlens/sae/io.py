"""Save and load SAEs in SAELens's on-disk format (other published layouts:
:mod:`structlens.sae.formats`).

A directory holds ``sae_weights.safetensors`` with ``W_enc`` [d_in, d_sae], ``b_enc``
[d_sae], ``W_dec`` [d_sae, d_in], ``b_dec`` [d_in] (plus ``threshold`` [d_sae] for JumpReLU)
and ``cfg.json`` with SAELens ≥ 6 field names: ``architecture`` (``"standard"``, ``"topk"``,
``"jumprelu"``), ``d_in``, ``d_sae``, ``dtype``, ``device``, ``apply_b_dec_to_input``,
``normalize_activations``, ``reshape_activations``, ``k`` (TopK),
``rescale_acts_by_decoder_norm`` (TopK) and ``metadata`` (``hook_name``, ``model_name``, …;
structlens adds ``model_digest``, the full-content digest of the model, and
``structlens_version``, and claims no ``sae_lens_version`` it was not written by).
Loading checks every tensor's exact shape and, given the model and site it will be used with,
the recorded provenance (:func:`structlens.provenance.check_provenance`).  Pre-6.0 configs
(``hook_point``, ``activation_fn_str``) are read too.  BatchTopK SAEs are written as JumpReLU
with a constant threshold, as SAELens does, which is the same function.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

import structlens
from structlens.errors import InputError, reading
from structlens.results import atomic_write_bytes, atomic_write_json
from structlens.sae.models import (
    BatchTopKSAE,
    JumpReLUSAE,
    ReLUSAE,
    SparseAutoencoder,
    TopKSAE,
)

WEIGHTS_FILENAME = "sae_weights.safetensors"
CFG_FILENAME = "cfg.json"

_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def save_sae(
    sae: SparseAutoencoder,
    path: str | Path,
    *,
    hook_name: str | None = None,
    model_name: str | None = None,
    model_digest: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write ``sae`` to directory ``path`` in SAELens format; returns ``path``.

    ``hook_name``, ``model_name`` and ``model_digest`` (see
    :func:`structlens.provenance.provenance`) record what the SAE was trained on, so that
    :func:`load_sae` can refuse to use it with another model or site.
    """
    from safetensors.torch import save as save_tensors

    path = Path(path)
    with torch.no_grad():
        tensors = {
            "W_enc": sae.W_enc.detach().contiguous().clone(),
            "b_enc": sae.b_enc.detach().clone(),
            "W_dec": sae.W_dec.detach().contiguous().clone(),
            "b_dec": sae.b_dec.detach().clone(),
        }
        if isinstance(sae, (JumpReLUSAE, BatchTopKSAE)):
            thr = sae.threshold.detach()
            if torch.isnan(thr).any():
                raise InputError("the BatchTopK SAE has no threshold yet; train it before saving.")
            tensors["threshold"] = thr.expand(sae.d_sae).contiguous().clone()
    meta = dict(metadata or {})
    if hook_name is not None:
        meta["hook_name"] = hook_name
    if model_name is not None:
        meta["model_name"] = model_name
    if model_digest is not None:
        meta["model_digest"] = model_digest
    meta["structlens_version"] = structlens.__version__
    meta["structlens_architecture"] = type(sae).__name__
    cfg: dict[str, Any] = {
        "d_in": sae.d_in,
        "d_sae": sae.d_sae,
        "dtype": str(sae.W_dec.dtype).removeprefix("torch."),
        "device": "cpu",
        "apply_b_dec_to_input": sae.apply_b_dec_to_input,
        "normalize_activations": "none",
        "reshape_activations": "none",
        "metadata": meta,
        "architecture": sae.architecture,
    }
    if type(sae) is TopKSAE:
        cfg["k"] = sae.k
        cfg["rescale_acts_by_decoder_norm"] = False
    path.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path / WEIGHTS_FILENAME, save_tensors(tensors))
    atomic_write_json(path / CFG_FILENAME, cfg)
    return path


def _from_tensors(
    arch: str, tensors: dict[str, torch.Tensor], cfg: dict[str, Any], dtype: torch.dtype
) -> SparseAutoencoder:
    for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
        if name not in tensors:
            raise InputError(f"SAE weights lack {name!r}; found {sorted(tensors)}.")
    if tensors["W_enc"].ndim != 2:
        raise InputError(f"W_enc has shape {tuple(tensors['W_enc'].shape)}; it must be 2-D.")
    d_in, d_sae = tensors["W_enc"].shape
    expected = {"W_dec": (d_sae, d_in), "b_enc": (d_sae,), "b_dec": (d_in,)}
    if "threshold" in tensors:
        expected["threshold"] = (d_sae,)
    for name, want in expected.items():
        # exact: a broadcastable [1] bias would load and silently compute something else
        if tuple(tensors[name].shape) != want:
            raise InputError(
                f"{name} has shape {tuple(tensors[name].shape)}, expected {want} for an SAE "
                f"with W_enc of shape {(d_in, d_sae)}; the weights file is damaged or foreign."
            )
    for name, t in tensors.items():
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise InputError(f"SAE tensor {name!r} holds NaN or infinite values.")
    for key, n in (("d_in", d_in), ("d_sae", d_sae)):
        if key in cfg and _cfg_int(cfg, key) != n:
            raise InputError(f"cfg.json says {key} = {cfg[key]} but the weights have {n}.")
    kw: dict[str, Any] = {
        "apply_b_dec_to_input": bool(cfg.get("apply_b_dec_to_input", True)),
        "dtype": dtype,
    }
    sae: SparseAutoencoder
    if arch == "standard":
        sae = ReLUSAE(d_in, d_sae, **kw)
    elif arch == "topk":
        kwargs = cfg.get("activation_fn_kwargs") or {}
        k = cfg.get("k") or (kwargs.get("k") if isinstance(kwargs, dict) else None)
        if k is None:
            raise InputError("a TopK cfg.json needs 'k'.")
        sae = TopKSAE(d_in, d_sae, _cfg_int({"k": k}, "k"), **kw)
    elif arch == "jumprelu":
        if "threshold" not in tensors:
            raise InputError("a JumpReLU SAE needs a 'threshold' tensor.")
        sae = JumpReLUSAE(d_in, d_sae, **kw)
    else:
        raise InputError(
            f"unsupported SAE architecture {arch!r}; supported: standard, topk, jumprelu."
        )
    if cfg.get("rescale_acts_by_decoder_norm"):
        # SAELens folds decoder norms on save; an unfolded one we fold here, same function.
        norms = tensors["W_dec"].norm(dim=1).clamp_min(1e-12)
        tensors = dict(tensors)
        tensors["W_dec"] = tensors["W_dec"] / norms[:, None]
        tensors["W_enc"] = tensors["W_enc"] * norms
        tensors["b_enc"] = tensors["b_enc"] * norms
    with torch.no_grad():
        sae.W_enc_t.copy_(tensors["W_enc"].t())
        sae.b_enc.copy_(tensors["b_enc"])
        sae.W_dec.copy_(tensors["W_dec"])
        sae.b_dec.copy_(tensors["b_dec"])
        if isinstance(sae, JumpReLUSAE):  # arch == "jumprelu"
            thr = tensors["threshold"].to(torch.float64)
            if (thr <= 0).any():
                # log-parametrised thresholds cannot be ≤ 0; the smallest positive float keeps
                # [pre > θ] identical for all pre-activations that can be represented.
                thr = thr.clamp_min(torch.finfo(dtype).tiny)
            sae.log_threshold.copy_(thr.log().to(dtype))
    return sae


def load_sae(
    path: str | Path,
    *,
    dtype: torch.dtype | None = None,
    model: Any = None,
    site: str | None = None,
    allow_foreign: bool = False,
) -> SparseAutoencoder:
    """Load an SAE from a SAELens directory or any published layout of
    :mod:`structlens.sae.formats` (Gemma Scope ``params.npz``, Gemma Scope 2, sparsify,
    Llama Scope).

    Files are read with safetensors or ``np.load(allow_pickle=False)``; nothing is unpickled.
    Given the ``model`` and ``site`` it will be used with, the recorded provenance must match
    (:class:`~structlens.errors.ForeignResultError` otherwise, a warning with
    ``allow_foreign``).  A transcoder is refused: :func:`structlens.sae.load_dictionary`
    loads those.
    """
    from structlens.sae.formats import check_dictionary, read_dictionary

    d = read_dictionary(path, dtype=dtype)
    if not isinstance(d.module, SparseAutoencoder):
        raise InputError(
            f"{d.path} holds a transcoder ({d.module.d_in} -> {d.module.d_out}), not an SAE; "
            "load it with structlens.sae.load_dictionary."
        )
    check_dictionary(d, model=model, site=site, allow_foreign=allow_foreign)
    return d.module


def load_saelens(path: str | Path, *, dtype: torch.dtype | None = None) -> SparseAutoencoder:
    """The SAE in the SAELens directory ``path`` (``cfg.json`` + ``sae_weights.safetensors``),
    every shape checked; provenance is the caller's (:func:`load_sae`)."""
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / WEIGHTS_FILENAME).is_file() or not (path / CFG_FILENAME).is_file():
        raise InputError(
            f"{path} is not an SAE directory: expected {WEIGHTS_FILENAME} and {CFG_FILENAME} "
            "(SAELens format)."
        )
    cfg = _read_cfg(path)
    arch = cfg.get("architecture")
    if arch is None:  # pre-6.0 SAELens
        fn = cfg.get("activation_fn_str", cfg.get("activation_fn", "relu"))
        arch = "topk" if fn == "topk" else "standard"
    if cfg.get("normalize_activations", "none") not in ("none", None):
        raise InputError(
            f"normalize_activations = {cfg['normalize_activations']!r} is not supported; "
            "fold the normalisation into the weights first."
        )
    dt = dtype or _DTYPES.get(str(cfg.get("dtype", "float32")).removeprefix("torch."))
    if dt is None:
        raise InputError(f"unsupported dtype {cfg.get('dtype')!r} in cfg.json.")
    with reading(path / WEIGHTS_FILENAME, "SAE weights file (safetensors)"):
        loaded = load_file(str(path / WEIGHTS_FILENAME))
    tensors = {k: v.to(dt) for k, v in loaded.items()}
    if "log_threshold" in tensors and "threshold" not in tensors:
        tensors["threshold"] = tensors.pop("log_threshold").exp()
    return _from_tensors_of(path / WEIGHTS_FILENAME, arch, tensors, cfg, dt)


def _from_tensors_of(
    file: Path, arch: str, tensors: dict[str, torch.Tensor], cfg: dict[str, Any], dtype: torch.dtype
) -> SparseAutoencoder:
    """:func:`_from_tensors`, its refusals naming ``file`` (the weights they are about)."""
    try:
        return _from_tensors(arch, tensors, cfg, dtype)
    except InputError as err:
        raise InputError(f"{file}: {err}") from err


def _read_cfg(path: Path) -> dict[str, Any]:
    file = path / CFG_FILENAME
    with reading(file, "SAE config (cfg.json, JSON)"):
        cfg = json.loads(file.read_text(encoding="utf-8"))
    if not isinstance(cfg, dict):
        raise InputError(f"{file} must hold a JSON object, not {type(cfg).__name__}.")
    if not isinstance(cfg.get("metadata") or {}, dict):
        raise InputError(f"{file}: 'metadata' must be a JSON object, not {cfg['metadata']!r}.")
    for key in ("d_in", "d_sae", "k"):
        if cfg.get(key) is not None:
            _cfg_int(cfg, key, where=str(file))
    return cfg


def _cfg_int(cfg: dict[str, Any], key: str, where: str = CFG_FILENAME) -> int:
    """``cfg[key]`` as an int; an :class:`InputError` naming ``where`` and ``key`` if it is
    none."""
    value = cfg[key]
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise InputError(f"{where}: {key} = {value!r} is not an integer.")


def sae_metadata(path: str | Path) -> dict[str, Any]:
    """``hook_name``, ``model_name`` and the rest of a SAELens ``cfg.json``'s metadata."""
    cfg = _read_cfg(Path(path))
    meta = dict(cfg.get("metadata") or {})
    for old, new in (
        ("hook_point", "hook_name"),
        ("hook_name", "hook_name"),
        ("model_name", "model_name"),
    ):
        if old in cfg and new not in meta:
            meta[new] = cfg[old]
    return meta

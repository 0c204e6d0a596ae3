"""Glue shared by the ``koopman`` CLI and the replication script: dictionaries by name and
JSON summaries of fits.  Array-level only (no model loading)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from structlens.koopman.dictionaries import (
    Dictionary,
    IdentityDictionary,
    PCADictionary,
    RandomFourierDictionary,
    RandomReLUDictionary,
    SAEDictionary,
    SpectralDictionary,
)
from structlens.koopman.edmdc import EDMDcResult
from structlens.koopman.spectral import modal_principal_dissociation, non_normality
from structlens.registry import Registry

__all__ = [
    "DICTIONARIES",
    "make_dictionary",
    "load_sae_dictionary",
    "summarise_fit",
    "complex_list",
]

DictionaryFactory = Callable[..., Dictionary]

#: Unfitted dictionaries by name: ``factory(size, *, seed, sae_path) -> Dictionary``.
#: Register your own with ``DICTIONARIES.register("name", factory)`` (see docs/architecture.md).
DICTIONARIES: Registry[DictionaryFactory] = Registry("dictionary")
DICTIONARIES.register("identity", lambda size, **_: IdentityDictionary())
DICTIONARIES.register("pca", lambda size, **_: PCADictionary(size))
DICTIONARIES.register("rff", lambda size, *, seed=0, **_: RandomFourierDictionary(size, seed=seed))
# random Fourier features without the state (a pure nonlinear lift of size D)
DICTIONARIES.register(
    "rff-features",
    lambda size, *, seed=0, **_: RandomFourierDictionary(size, seed=seed, include_state=False),
)
DICTIONARIES.register("relu", lambda size, *, seed=0, **_: RandomReLUDictionary(size, seed=seed))
DICTIONARIES.register(
    "spectral", lambda size, **_: SpectralDictionary(n_modes=size, k=max(2 * size, 16), q=8)
)


@DICTIONARIES.register("sae")
def _sae_dictionary(size: int, *, sae_path: str | Path | None = None, **_: Any) -> Dictionary:
    if sae_path is None:
        raise ValueError("the sae dictionary needs --sae PATH (an SAE folder or RELEASE/SAE_ID).")
    return load_sae_dictionary(sae_path)


def load_sae_dictionary(path: str | Path) -> SAEDictionary:
    """An SAE (or transcoder) encoder dictionary from a folder in any published layout
    (SAELens, Gemma Scope 1 and 2, sparsify, Llama Scope) or a registry name
    ``RELEASE/SAE_ID``, read by :func:`structlens.sae.registry.read_pretrained` (exact shapes;
    provenance is checked by the caller that knows the model,
    :func:`structlens.koopman.experiment.run`).  A transcoder's encoder reads its input site."""
    from structlens.sae.models import SparseAutoencoder
    from structlens.sae.registry import read_pretrained

    # Any: ``threshold`` and ``k`` exist only on some architectures
    sae: Any = read_pretrained(str(path)).module
    activation = {"standard": "relu", "topk": "topk", "jumprelu": "jumprelu"}[sae.architecture]
    # a transcoder's b_dec is in its output space; its input-side shift is folded into b_enc
    shift = isinstance(sae, SparseAutoencoder) and sae.apply_b_dec_to_input
    b_dec = sae.b_dec.detach().numpy() if shift else np.zeros(sae.d_in, dtype=np.float32)
    return SAEDictionary(
        sae.W_enc.detach().numpy(),
        sae.b_enc.detach().numpy(),
        b_dec,
        activation=activation,
        k=getattr(sae, "k", None),
        threshold=sae.threshold.detach().numpy() if activation == "jumprelu" else None,
    )


def make_dictionary(
    name: str, size: int, *, seed: int = 0, sae_path: str | Path | None = None
) -> Dictionary:
    """An unfitted dictionary by its name in :data:`DICTIONARIES` (built in: ``identity``,
    ``pca``, ``rff`` (state and D random Fourier features), ``rff-features`` (the features
    only), ``relu``, ``spectral``, ``sae``); ``size`` is k for PCA, D for RFF/ReLU
    and the number of modes for spectral."""
    factory = DICTIONARIES.get(name)
    if size < 1:
        raise ValueError(f"dictionary size must be >= 1, got {size}.")
    return factory(size, seed=seed, sae_path=sae_path)


def complex_list(ev: np.ndarray) -> list[list[float]]:
    """Complex values as JSON-friendly ``[[re, im], ...]``."""
    ev = np.asarray(ev)
    return [[float(z.real), float(z.imag)] for z in ev]


def summarise_fit(res: EDMDcResult, k_dissociation: int = 8) -> dict[str, Any]:
    """JSON summary of a fit: spectrum, conditioning, non-normality, modal/principal
    dissociation (top-``k`` PCA vs dominant modes)."""
    nn = non_normality(res.A)
    out: dict[str, Any] = {
        "eigenvalues": complex_list(res.eigenvalues),
        "spectral_radius": float(np.max(np.abs(res.eigenvalues))),
        "n_samples": int(res.n_samples),
        "n_features": int(res.A.shape[0]),
        "control_rank": int(res.control_rank),
        "control_energy_kept": float(res.control_energy_kept),
        "cond_gram": float(res.cond_gram),
        "readout": res.readout,
        "non_normality": {
            "henrici": float(nn.henrici),
            "henrici_relative": float(nn.henrici_relative),
            "kappa_V": float(nn.kappa_V),
            "eig_condition_max": float(np.max(nn.eig_condition)),
            "eig_condition_median": float(np.median(nn.eig_condition)),
        },
    }
    k = min(k_dissociation, res.A.shape[0] - 1, res.state_mean.shape[0] - 1)
    if k >= 1:
        dis = modal_principal_dissociation(res, k)
        out["dissociation"] = {
            "k": int(dis.dimension),
            "largest_angle_deg": float(np.degrees(dis.largest_angle)),
            "mean_cos2": float(dis.mean_cos2),
        }
    return out

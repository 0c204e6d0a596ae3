"""Baseline rotations that reuse a partition found by NDM (Huang & Hahn's comparison).

Each function returns an orthogonal ``(d, d)`` float64 matrix ``R`` whose column blocks, cut by
the same ``partition``, are the baseline's subspaces (``z = h @ R``, rows = samples).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from structlens.stats.mutual_info import _check_partition


def identity_rotation(d: int) -> np.ndarray:
    """``R = I``: subspaces are blocks of the model's own basis."""
    return np.eye(d)


def random_rotation(d: int, seed: int = 0) -> np.ndarray:
    """A Haar-random orthogonal matrix (QR of a Gaussian matrix with the sign fix)."""
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))
    return q * np.sign(np.diag(r))


def pca_rotation(
    h: np.ndarray, order: Literal["ascending", "descending"] = "ascending"
) -> np.ndarray:
    """Covariance eigenvectors of activations ``h`` ``(n, d)`` as columns.

    ``"ascending"`` (the reference code's choice) puts the smallest-variance directions first,
    so with NDM's descending partition they fill the largest subspace; ``"descending"`` flips it.
    """
    h = np.asarray(h, dtype=np.float64)
    if h.ndim != 2 or h.shape[0] < 2 or not np.isfinite(h).all():
        raise ValueError("h must be a finite (n_samples >= 2, d) array.")
    _, vecs = np.linalg.eigh(np.cov(h, rowvar=False))
    return vecs if order == "ascending" else vecs[:, ::-1].copy()


def decoder_directions(sae: Any) -> np.ndarray:
    """The ``(n_features, d)`` float64 decoder of an SAE: its ``W_dec`` (a
    :class:`structlens.sae.SparseAutoencoder` or anything with one, e.g. a SAELens SAE, or a
    transcoder, whose rows live at its output site), the ``sae`` of an
    :class:`structlens.sae.SAETrainingResult`, a pretrained SAE (a folder in any published
    layout, a registry name ``RELEASE/SAE_ID`` or a
    :class:`structlens.sae.PretrainedDictionary`), or an array taken as is."""
    if isinstance(sae, (str, Path)):
        from structlens.sae.registry import read_pretrained

        sae = read_pretrained(str(sae))
    if hasattr(sae, "module") and not hasattr(sae, "W_dec"):
        sae = sae.module
    if hasattr(sae, "sae") and not hasattr(sae, "W_dec"):
        sae = sae.sae
    if hasattr(sae, "W_dec"):
        w = sae.W_dec
        return np.asarray(w.detach().cpu().double() if hasattr(w, "detach") else w, np.float64)
    return np.asarray(sae, dtype=np.float64)


def sae_cluster_rotation(
    decoder: Any, partition: Sequence[int], n_iter: int = 20, seed: int = 0
) -> np.ndarray:
    """Subspaces from clustering SAE decoder directions (K-subspaces with fixed sizes).

    ``decoder`` is a trained SAE or its ``(n_features, d)`` decoder, one feature direction per
    row (see :func:`decoder_directions`).  The baseline is only meaningful for an SAE trained
    to convergence (e.g. :func:`structlens.ndm.pipeline.train_baseline_sae`): an undertrained
    decoder is close to its random initialisation.

    Directions are normalised; starting from a random rotation cut by ``partition``, each
    direction is assigned to the subspace holding most of its squared norm, then the subspaces
    are refitted one at a time, largest cluster first, as the top singular vectors of the
    cluster's directions projected onto the orthogonal complement of the subspaces already
    fitted — which keeps them orthogonal and of exactly the partition's sizes.  Subspace ``s``
    keeps size ``partition[s]``; the returned matrix's blocks follow ``partition``.
    """
    dec = decoder_directions(decoder)
    if dec.ndim != 2 or not np.isfinite(dec).all():
        raise ValueError("decoder must be a finite (n_features, d) array of feature directions.")
    sizes = _check_partition(partition, dec.shape[1])
    norms = np.linalg.norm(dec, axis=1)
    dirs = dec[norms > 0] / norms[norms > 0, None]
    d = dec.shape[1]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    R = random_rotation(d, seed)
    for _ in range(n_iter):
        energy = np.stack(
            [((dirs @ R[:, bounds[s] : bounds[s + 1]]) ** 2).sum(1) for s in range(len(sizes))]
        )
        assign = energy.argmax(0)
        order = sorted(range(len(sizes)), key=lambda s: (-int((assign == s).sum()), s))
        new = np.zeros_like(R)
        complement = np.eye(d)
        for s in order:
            members = dirs[assign == s]
            proj = members @ complement  # coordinates in the remaining orthonormal basis
            if proj.shape[0] == 0:
                basis = complement[:, : sizes[s]]
            else:
                _, _, vt = np.linalg.svd(proj, full_matrices=True)
                basis = complement @ vt[: sizes[s]].T
            new[:, bounds[s] : bounds[s + 1]] = basis
            # Remaining directions: the complement of the basis within the old complement.
            _, _, vt = np.linalg.svd(basis.T @ complement, full_matrices=True)
            complement = complement @ vt[sizes[s] :].T
        if np.allclose(new, R):
            break
        R = new
    return R

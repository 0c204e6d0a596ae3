"""Preparing residual-stream activations before comparing them.

Residual streams of language models have pitfalls that dominate similarity measures
(Davari et al. 2023; Murphy et al. 2024): the BOS/first position has a huge norm, a few
"massive activation" dimensions are orders of magnitude larger than the rest, and per-token
rows from different positions mix very different scales. :func:`prepare` applies, in this
order: row selection (drop BOS, a keep-mask), outlier clipping, per-dimension standardisation.
Apply the **same** options to both representations so rows stay paired.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._checks import check_finite, to_numpy

__all__ = ["Preprocess", "prepare"]


@dataclasses.dataclass(frozen=True)
class Preprocess:
    """Options of :func:`prepare`.

    Attributes
    ----------
    exclude_bos : bool
        Drop the first position of each sequence (3-D input ``[batch, pos, d]``) or the first
        row (2-D input holding one sequence).
    clip_quantile : float or None
        Clip every entry to ``[-c, c]`` with ``c`` the ``clip_quantile`` quantile of ``|x|``
        over all entries (platonic-rep's rule uses 0.95). ``None`` disables clipping.
    standardize : bool
        Z-score each dimension (constant dimensions become 0). Removes the dominance of
        massive-activation dimensions but makes CKA no longer invariant to orthogonal maps.
    """

    exclude_bos: bool = False
    clip_quantile: float | None = None
    standardize: bool = False

    def __post_init__(self) -> None:
        if self.clip_quantile is not None and not 0.0 < self.clip_quantile <= 1.0:
            raise ValueError(f"clip_quantile must lie in (0, 1], got {self.clip_quantile}.")


def prepare(x: object, options: Preprocess | None = None, mask: object | None = None) -> np.ndarray:
    """Turn activations into a ``[samples, features]`` float64 matrix with the pitfalls handled.

    Parameters
    ----------
    x : array_like
        ``[n, d]`` rows, or ``[batch, pos, d]`` per-token activations (flattened to rows).
    options : Preprocess, optional
        BOS exclusion, clipping, standardisation (all off by default).
    mask : array_like of bool, optional
        Rows to keep: ``[n]`` for 2-D input, ``[batch, pos]`` for 3-D input (e.g. the
        attention mask, so padding is dropped). Combined with ``exclude_bos``.
    """
    opts = options or Preprocess()
    a = to_numpy(x, "activations")
    if a.ndim not in (2, 3):
        raise ValueError(f"activations must be [n, d] or [batch, pos, d], got shape {a.shape}.")
    keep = np.ones(a.shape[:-1], dtype=bool)
    if mask is not None:
        m = np.asarray(to_numpy(mask, "mask") != 0)
        if m.shape != keep.shape:
            raise ValueError(f"mask has shape {m.shape}, expected {keep.shape} (rows to keep).")
        keep &= m
    if opts.exclude_bos:
        if a.ndim == 3:
            keep[:, 0] = False
        else:
            keep[0] = False
    rows = np.asarray(a[keep], dtype=np.float64)
    if rows.shape[0] == 0:
        raise ValueError("no rows left after BOS exclusion and masking.")
    check_finite(rows, "activations")
    if opts.clip_quantile is not None and opts.clip_quantile < 1.0:
        c = float(np.quantile(np.abs(rows), opts.clip_quantile))
        rows = np.clip(rows, -c, c)
    if opts.standardize:
        mu = rows.mean(0)
        sd = rows.std(0)
        rows = np.where(sd > 0, (rows - mu) / np.where(sd > 0, sd, 1.0), 0.0)
    return rows

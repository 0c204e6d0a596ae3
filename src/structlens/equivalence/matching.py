"""Similarity matrices between the components of two models, and matching them.

Layers: one representation ``[n, d]`` per layer (e.g. ``blocks.{l}.hook_resid_post``).
Heads: one ``[n, n_heads, d_head]`` array per layer (``blocks.{l}.attn.hook_z`` with token
rows flattened). All similarities follow the convention *higher = more similar*.

Matching is one-to-one and maximises the summed similarity:

* :func:`match_hungarian` -- optimal bipartite assignment (``scipy.optimize
  .linear_sum_assignment``), rectangular matrices match ``min(m, n)`` pairs;
* :func:`match_monotone` -- the best *order-preserving* assignment (``i < i'`` implies
  ``j < j'``) of ``min(m, n)`` pairs by dynamic programming, for matching depth;
* :func:`match_heads` -- heads globally (all heads of A against all heads of B) or per layer
  (heads of layer ``l_A`` against heads of the layer ``l_B`` it is paired with).

Matching components by CKA and Hungarian assignment is an *extension* of the interpretive
equivalence paper's public code (which has no matching step); see docs/equivalence.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from ..results import Result
from ._checks import check_finite, check_matrix, to_numpy
from .cca import procrustes_similarity as _procrustes
from .cca import pwcca, svcca
from .cka import rbf_cka
from .encoding import encoding_score
from .knn import mutual_knn

__all__ = [
    "METRICS",
    "MatchingResult",
    "layer_similarity_matrix",
    "head_similarity_matrix",
    "match_hungarian",
    "match_monotone",
    "match_heads",
]

METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "rbf_cka": rbf_cka,
    "svcca": svcca,
    "pwcca": pwcca,
    "procrustes": _procrustes,
    "encoding": encoding_score,
    "mutual_knn": mutual_knn,
}
"""Pairwise similarity functions by name; ``"linear_cka"`` and ``"linear_cka_debiased"`` are
handled by a batched path that shares the per-component terms."""


def _checked_layers(acts: Sequence[object], name: str, n: int | None) -> list[np.ndarray]:
    out = []
    for i, a in enumerate(acts):
        m = check_matrix(a, f"{name}[{i}]", min_rows=2)
        if n is not None and m.shape[0] != n:
            raise ValueError(
                f"{name}[{i}] has {m.shape[0]} samples, expected {n}: every component must be "
                "captured on the same probe set."
            )
        n = m.shape[0]
        out.append(m)
    return out


def _centred(a: np.ndarray) -> np.ndarray:
    m = a.astype(np.float64)
    return m - m.mean(0)


def _grouped_linear_cka(
    acts_a: Sequence[object], acts_b: Sequence[object], ga: int, gb: int, debiased: bool
) -> np.ndarray:
    """Linear CKA between every (layer, group) of A and of B: ``[LA, ga, LB, gb]``.

    B's layers are held centred in float64, A's are centred one at a time (inputs may be
    float32 rows), so memory is one model's centred layers beside the inputs."""
    ra = _checked_layers(acts_a, "acts_a", None)
    n = ra[0].shape[0]
    cb = [_centred(m) for m in _checked_layers(acts_b, "acts_b", n)]
    if debiased and n < 4:
        raise ValueError(f"debiased CKA needs at least 4 samples, got {n}.")

    def self_terms(c: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if c.shape[1] % g:
            raise ValueError(f"width {c.shape[1]} is not divisible into {g} heads.")
        s = c.shape[1] // g
        cg = c.reshape(n, g, s)
        rows = np.einsum("ngk,ngk->ng", cg, cg)  # centred squared row norms per group
        gram = c.T @ c
        t = np.array(
            [np.sum(gram[i * s : (i + 1) * s, i * s : (i + 1) * s] ** 2) for i in range(g)]
        )
        tr = rows.sum(0)
        if debiased:
            t = t - n / (n - 2.0) * np.einsum("ng,ng->g", rows, rows) + tr**2 / ((n - 1) * (n - 2))
        return t, rows, tr

    sa = [self_terms(_centred(m), ga) for m in ra]
    sb = [self_terms(c, gb) for c in cb]
    for side, terms in (("acts_a", sa), ("acts_b", sb)):
        for i, (t, _, _) in enumerate(terms):
            if np.any(t <= 0):
                raise ValueError(
                    f"{side}[{i}] has a head/layer with zero (or, debiased, non-positive) "
                    "self-similarity; constant activations cannot be compared."
                )
    out = np.empty((len(ra), ga, len(cb), gb))
    for i, raw in enumerate(ra):
        x = _centred(raw)
        tx, px, trx = sa[i]
        for j, y in enumerate(cb):
            ty, py, try_ = sb[j]
            cross = (x.T @ y).reshape(ga, x.shape[1] // ga, gb, y.shape[1] // gb)
            txy = np.einsum("gkhl,gkhl->gh", cross, cross)
            if debiased:
                txy = txy - n / (n - 2.0) * (px.T @ py) + np.outer(trx, try_) / ((n - 1) * (n - 2))
            out[i, :, j, :] = txy / np.sqrt(np.outer(tx, ty))
    return out


def _resolve_metric(metric: str | Callable) -> tuple[str, Callable | None]:
    if callable(metric):
        return getattr(metric, "__name__", "custom"), metric
    if metric in ("linear_cka", "linear_cka_debiased"):
        return metric, None
    if metric not in METRICS:
        raise ValueError(
            f"unknown metric {metric!r}; choose one of "
            f"{['linear_cka', 'linear_cka_debiased', *METRICS]} or pass a callable."
        )
    return metric, METRICS[metric]


def layer_similarity_matrix(
    acts_a: Sequence[object], acts_b: Sequence[object], metric: str | Callable = "linear_cka"
) -> np.ndarray:
    """Similarity between every layer of model A and every layer of model B.

    Parameters
    ----------
    acts_a, acts_b : sequence of array_like
        One ``[n, d]`` representation per layer, all on the same ``n`` probe inputs (widths
        may differ between the models). Apply :func:`~structlens.equivalence.prepare` first.
    metric : str or callable
        ``"linear_cka"`` (default), ``"linear_cka_debiased"``, a name in :data:`METRICS`, or a
        function ``f(x, y) -> float`` (higher = more similar). Directional metrics
        (``"encoding"``) give entry ``[i, j] = f(A_i -> B_j)``.

    Returns
    -------
    numpy.ndarray
        ``[n_layers_a, n_layers_b]`` similarities.

    Notes
    -----
    Linear CKA centres the layers in float64 and shares the per-layer terms, so it costs one
    ``d_a x d_b`` product per pair; memory is that of B's centred layers (float32 inputs
    stay float32, A's layers are centred one at a time).
    """
    name, fn = _resolve_metric(metric)
    if not len(acts_a) or not len(acts_b):
        raise ValueError("need at least one layer from each model.")
    if fn is None:
        return _grouped_linear_cka(acts_a, acts_b, 1, 1, name.endswith("debiased"))[:, 0, :, 0]
    a = [check_matrix(x, f"acts_a[{i}]") for i, x in enumerate(acts_a)]
    b = [check_matrix(y, f"acts_b[{j}]") for j, y in enumerate(acts_b)]
    n = a[0].shape[0]
    for i, m in enumerate([*a, *b]):
        if m.shape[0] != n:
            raise ValueError(
                f"layer {i} has {m.shape[0]} samples, expected {n}: every layer must be "
                "captured on the same probe set."
            )
    return np.array([[fn(x, y) for y in b] for x in a])


def _check_heads(z: Sequence[object], name: str) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for i, a in enumerate(z):
        m = to_numpy(a, f"{name}[{i}]")
        if m.ndim != 3:
            raise ValueError(
                f"{name}[{i}] must be [n, n_heads, d_head] (hook_z with tokens flattened into "
                f"rows), got shape {m.shape}."
            )
        if out and m.shape[1:] != out[0].shape[1:]:
            raise ValueError(f"{name}[{i}] has shape {m.shape}, other layers {out[0].shape}.")
        check_finite(m, f"{name}[{i}]")
        out.append(m)
    if not out:
        raise ValueError(f"{name} holds no layers.")
    return out


def head_similarity_matrix(
    z_a: Sequence[object], z_b: Sequence[object], metric: str | Callable = "linear_cka"
) -> np.ndarray:
    """Similarity between every attention head of A and every head of B.

    Parameters
    ----------
    z_a, z_b : sequence of array_like
        Per layer, ``[n, n_heads, d_head]`` head outputs (``attn.hook_z``) on the same inputs.
    metric : str or callable
        As in :func:`layer_similarity_matrix`.

    Returns
    -------
    numpy.ndarray
        ``[layers_a, heads_a, layers_b, heads_b]`` similarities.
    """
    name, fn = _resolve_metric(metric)
    a, b = _check_heads(z_a, "z_a"), _check_heads(z_b, "z_b")
    ha, hb = a[0].shape[1], b[0].shape[1]
    if fn is None:
        return _grouped_linear_cka(
            [x.reshape(x.shape[0], -1) for x in a],
            [y.reshape(y.shape[0], -1) for y in b],
            ha,
            hb,
            name.endswith("debiased"),
        )
    out = np.empty((len(a), ha, len(b), hb))
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            if x.shape[0] != y.shape[0]:
                raise ValueError(
                    f"z_a[{i}] has {x.shape[0]} samples and z_b[{j}] {y.shape[0]}; use the same "
                    "probe set."
                )
            for g in range(ha):
                for h in range(hb):
                    out[i, g, j, h] = fn(x[:, g, :], y[:, h, :])
    return out


@dataclasses.dataclass(frozen=True)
class MatchingResult(Result):
    """A one-to-one matching of components of model A to components of model B.

    ``pairs[k] = [a, b]`` with ``a``/``b`` a layer index, or ``[layer, head]`` for heads;
    ``similarities[k]`` the similarity of that pair; ``total`` their sum; ``method`` one of
    ``"hungarian"``, ``"monotone"``, ``"hungarian_global"``, ``"hungarian_per_layer"``.
    """

    pairs: list
    similarities: list
    total: float
    method: str
    similarity: np.ndarray

    def mean_similarity(self) -> float:
        """Average similarity over the matched pairs."""
        return float(np.mean(self.similarities)) if self.similarities else float("nan")


def _check_sim(s: object) -> np.ndarray:
    m = to_numpy(s, "similarity").astype(np.float64)
    if m.ndim != 2 or 0 in m.shape:
        raise ValueError(f"similarity must be a non-empty 2-D matrix, got shape {m.shape}.")
    check_finite(m, "similarity")
    return m


def match_hungarian(similarity: object) -> MatchingResult:
    """Optimal one-to-one assignment maximising total similarity (rows = A, columns = B)."""
    s = _check_sim(similarity)
    rows, cols = linear_sum_assignment(s, maximize=True)
    vals = s[rows, cols]
    return MatchingResult(
        pairs=[[int(r), int(c)] for r, c in zip(rows, cols, strict=True)],
        similarities=[float(v) for v in vals],
        total=float(vals.sum()),
        method="hungarian",
        similarity=s,
    )


def match_monotone(similarity: object) -> MatchingResult:
    """Best order-preserving assignment of ``min(m, n)`` pairs (dynamic programming).

    Matched pairs satisfy ``a_1 < a_2 < ...`` and ``b_1 < b_2 < ...``: depth order is kept,
    skipped layers of the deeper model stay unmatched. ``O(m n)`` time.
    """
    s = _check_sim(similarity)
    transposed = s.shape[0] > s.shape[1]
    t = s.T if transposed else s  # now rows (all matched) <= columns
    m, n = t.shape
    # best[i, j]: best total matching the first i rows into the first j columns
    best = np.full((m + 1, n + 1), -np.inf)
    best[0, :] = 0.0
    take = np.zeros((m + 1, n + 1), dtype=bool)
    for i in range(1, m + 1):
        for j in range(i, n + 1):
            skip = best[i, j - 1]
            use = best[i - 1, j - 1] + t[i - 1, j - 1]
            if use >= skip:
                best[i, j], take[i, j] = use, True
            else:
                best[i, j] = skip
    pairs = []
    i, j = m, n
    while i > 0:
        if take[i, j]:
            pairs.append((i - 1, j - 1))
            i -= 1
        j -= 1
    pairs.reverse()
    if transposed:
        pairs = [(b, a) for a, b in pairs]
    vals = [float(s[a, b]) for a, b in pairs]
    return MatchingResult(
        pairs=[[int(a), int(b)] for a, b in pairs],
        similarities=vals,
        total=float(sum(vals)),
        method="monotone",
        similarity=s,
    )


def match_heads(
    head_similarity: object,
    mode: str = "global",
    layer_pairs: Sequence[Sequence[int]] | None = None,
) -> MatchingResult:
    """Match attention heads of A to heads of B from a ``[LA, HA, LB, HB]`` similarity array.

    Parameters
    ----------
    mode : {"global", "per_layer"}
        ``"global"``: one Hungarian assignment over all ``LA*HA`` by ``LB*HB`` heads.
        ``"per_layer"``: Hungarian within each paired layer.
    layer_pairs : sequence of (layer_a, layer_b), optional
        Layer pairing for ``"per_layer"``. Default: :func:`match_monotone` on the layer
        similarity obtained by averaging the head similarities of each layer pair.

    Returns
    -------
    MatchingResult
        ``pairs[k] = [[layer_a, head_a], [layer_b, head_b]]``; ``similarity`` is the 4-D input.
    """
    s4 = to_numpy(head_similarity, "head_similarity").astype(np.float64)
    if s4.ndim != 4:
        raise ValueError(f"head_similarity must be [LA, HA, LB, HB], got shape {s4.shape}.")
    check_finite(s4, "head_similarity")
    la, ha, lb, hb = s4.shape
    pairs: list = []
    if mode == "global":
        flat = match_hungarian(s4.reshape(la * ha, lb * hb))
        for a, b in flat.pairs:
            pairs.append([[a // ha, a % ha], [b // hb, b % hb]])
    elif mode == "per_layer":
        if layer_pairs is None:
            layer_pairs = match_monotone(s4.mean(axis=(1, 3))).pairs
        for pair in layer_pairs:
            i, j = int(pair[0]), int(pair[1])
            if not (0 <= i < la and 0 <= j < lb):
                raise ValueError(f"layer pair {(i, j)} is out of range for {la} x {lb} layers.")
            for g, h in match_hungarian(s4[i, :, j, :]).pairs:
                pairs.append([[i, g], [j, h]])
    else:
        raise ValueError(f"mode must be 'global' or 'per_layer', got {mode!r}.")
    vals = [float(s4[a[0], a[1], b[0], b[1]]) for a, b in pairs]
    return MatchingResult(
        pairs=pairs,
        similarities=vals,
        total=float(sum(vals)),
        method=f"hungarian_{mode}",
        similarity=s4,
    )

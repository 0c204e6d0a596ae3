"""CONGRUITY statistics as the interpretive-equivalence reference code computes them.

Sun & Toneva (arXiv 2603.30002; code alansun17904/interp-equiv, commit 0bdc4f6) compare
*implementations*: representations of a model before and after interventions. This module
holds the array side; the caller runs the models and the patching.

* Representation (:func:`accumulated_representation`): the accumulated residual stream --
  the input to block 0 followed by the output of every block, ``L + 1`` arrays -- at the last
  token (IOI) or averaged over positions (toy tasks), concatenated layer-major into one
  ``[batch, (L + 1) d]`` row per prompt.
* Similarity: the encoding score of :mod:`~structlens.equivalence.encoding`. Accumulated
  residual streams are far wider than a probe set has prompts, so predictors are reduced to
  the principal components the fit rows support (fitted on the fit half only); the results
  record it in ``reduced_to`` and ``caveat``.
* Interventions: a head's ``attn.hook_z`` patched from another run; heads are ranked by the
  KL divergence they cause (:func:`kl_from_logits`, :func:`rank_heads`).
* Selectivity test (:func:`selectivity_test`): for each target implementation, is the base
  representation a better encoder of it than the intervened one?
* Point test (:func:`point_test`, :func:`bootstrap_point_test`): draw ``n`` random triples
  (two implementations of group 1, one of group 2); ``p`` is the share where the
  within-group encoding beats the cross-group one; the groups are declared *different* when
  ``p - crit * sqrt(p (1 - p) / n) > 0.5``; the bootstrap repeats this ``straps`` times and
  reports the share of "different" decisions (the reference's ``grid`` entry).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Sequence

import numpy as np

from ..results import Result
from ..stats.lanes import lane_budget, run_in_lanes
from ._checks import check_finite, check_matrix, to_numpy
from .encoding import EncodingConfig, _XEncoder

__all__ = [
    "accumulated_representation",
    "LogitReference",
    "kl_from_logits",
    "rank_heads",
    "SelectivityResult",
    "selectivity_test",
    "point_test",
    "PointTestResult",
    "bootstrap_point_test",
]


def accumulated_representation(
    resid: Iterable[object], position: str = "last", mask: object | None = None
) -> np.ndarray:
    """Concatenate the residual stream of all layers into one row per prompt.

    Parameters
    ----------
    resid : sequence of array_like, or array_like
        ``L + 1`` arrays ``[batch, pos, d]`` (``blocks.0.hook_resid_pre`` then
        ``blocks.{l}.hook_resid_post`` for every ``l``), or one ``[L + 1, batch, pos, d]``.
    position : {"last", "mean"}
        Take the last (unmasked) token, or average over (unmasked) positions.
    mask : array_like of bool, optional
        ``[batch, pos]``, true at real tokens (left- or right-padded batches).

    Returns
    -------
    numpy.ndarray
        ``[batch, (L + 1) * d]`` float64, layer-major (layer 0's ``d`` features first).
    """
    layers = [to_numpy(r, "resid") for r in resid]
    if not layers or any(r.ndim != 3 for r in layers):
        raise ValueError("resid must hold [batch, pos, d] arrays, one per layer.")
    shape = layers[0].shape
    if any(r.shape != shape for r in layers):
        raise ValueError(f"all layers must share one shape, got {[r.shape for r in layers]}.")
    batch, pos, _ = shape
    keep = np.ones((batch, pos), dtype=bool)
    if mask is not None:
        keep = np.asarray(to_numpy(mask, "mask") != 0)
        if keep.shape != (batch, pos):
            raise ValueError(f"mask must be [batch, pos] = {(batch, pos)}, got {keep.shape}.")
        if not keep.any(axis=1).all():
            raise ValueError("a prompt has no unmasked position.")
    stacked = np.stack([np.asarray(r, dtype=np.float64) for r in layers], axis=1)  # b,L,p,d
    if position == "last":
        last = pos - 1 - np.argmax(keep[:, ::-1], axis=1)
        out = stacked[np.arange(batch), :, last, :]
    elif position == "mean":
        w = keep.astype(np.float64)
        out = np.einsum("blpd,bp->bld", stacked, w) / w.sum(1)[:, None, None]
    else:
        raise ValueError(f"position must be 'last' or 'mean', got {position!r}.")
    out = out.reshape(batch, -1)
    check_finite(out, "accumulated representation")
    return out


#: Rows of a logit matrix taken at a time (blocks run in parallel lanes, one per thread of
#: torch's budget): over a 262,144-token vocabulary a block's float32 temporaries are 64 MiB
#: each, where the whole matrix of a batch's positions would be gigabytes.
ROW_BLOCK = 64
#: Largest argument of ``exp`` taken in each precision (below its overflow, 88.7 and 709.8).
_EXP_MAX = {np.dtype(np.float32): 80.0, np.dtype(np.float64): 700.0}


class LogitReference:
    """Reference logits ``[rows, classes]`` against which many patched logit matrices are
    compared (:meth:`kl`); their softmax is computed once.

    Per row, with ``a`` the reference's logits, ``b`` the patched ones, ``d = a - b`` and
    ``p = softmax(a)``::

        KL(softmax(a) || softmax(b)) = sum(p * d) + log1p(sum(p * expm1(-d)))

    (``log-sum-exp`` of ``b`` minus that of ``a`` is ``log sum(p * exp(-d))``, and
    ``sum(p) = 1``).  The first-order parts of the two sums cancel exactly, since they share
    ``p``, and what is left is the divergence itself (about ``var_p(d) / 2``), so the
    elementwise arithmetic can be in the logits' precision (float32 for float32, float16 and
    bfloat16 logits; float64 for float64) with every sum accumulated in float64.  In float32
    the error is that of the terms, about ``1e-7 * sqrt(2 KL)`` nats (relative 1e-5 at
    KL = 1e-4, 1e-3 at KL = 1e-9), against log-softmax arithmetic in float64 on the same
    logits, which takes 7.8 times as long for one reference and one patch of 384 rows at
    262,144 classes on one thread (``benchmarks/equivalence/kl.py``); identical logits give
    exactly 0.  A row where the patch raises a logit so far
    that ``exp(-d)`` would overflow takes the shifted sum ``m + log(S)`` instead, with
    ``m = max(-d)`` and ``S = sum(p * exp(-d - m))``.

    >>> ref = LogitReference(np.array([[2.0, 0.0, -1.0]]))
    >>> ref.kl(np.array([[2.0, 0.0, -1.0]]))
    array([0.])
    >>> bool(abs(ref.kl(ref.logits + 5.0)[0]) < 1e-12)  # a shift of every logit: no change
    True
    """

    def __init__(self, logits: object, name: str = "reference_logits") -> None:
        a = check_matrix(logits, name, min_rows=1)
        dtype = np.float64 if a.dtype == np.float64 else np.float32
        self.logits = np.ascontiguousarray(a, dtype=dtype)
        self.probs = np.empty_like(self.logits)
        for i in range(0, len(a), ROW_BLOCK):
            block = self.logits[i : i + ROW_BLOCK]
            e = np.exp(block - block.max(1, keepdims=True))
            e /= e.sum(1, keepdims=True, dtype=np.float64).astype(dtype)
            self.probs[i : i + ROW_BLOCK] = e

    def kl(self, patched_logits: object) -> np.ndarray:
        """Per row, ``KL(softmax(reference) || softmax(patched))`` in nats (float64)."""
        b = check_matrix(patched_logits, "patched_logits", min_rows=1)
        if b.shape != self.logits.shape:
            raise ValueError(f"logit shapes differ: {self.logits.shape} vs {b.shape}.")
        out = np.empty(len(b), dtype=np.float64)
        starts = range(0, len(b), ROW_BLOCK)
        # blocks write disjoint rows of ``out``: their lanes' timing cannot change a value
        lanes = min(lane_budget(), len(starts))
        if lanes > 1:
            run_in_lanes([
                functools.partial(self._blocks, b, out, starts[j::lanes]) for j in range(lanes)
            ])  # fmt: skip
        else:
            self._blocks(b, out, starts)
        return out

    def _blocks(self, b: np.ndarray, out: np.ndarray, starts: Sequence[int]) -> None:
        """:meth:`kl` of the row blocks starting at ``starts``, into ``out``."""
        cap = _EXP_MAX[self.logits.dtype]
        for i in starts:
            a, p = self.logits[i : i + ROW_BLOCK], self.probs[i : i + ROW_BLOCK]
            nd = np.subtract(b[i : i + ROW_BLOCK], a, dtype=a.dtype)  # -d
            first = -np.sum(p * nd, axis=1, dtype=np.float64)
            top = nd.max(1)
            np.minimum(nd, cap, out=nd)
            np.expm1(nd, out=nd)
            nd *= p
            out[i : i + ROW_BLOCK] = first + np.log1p(nd.sum(1, dtype=np.float64))
            for r in np.flatnonzero(top > cap):  # the patch overflows exp(-d) here
                shift = b[i + r].astype(np.float64) - a[r] - top[r]
                lse = top[r] + np.log(np.sum(p[r] * np.exp(shift)))
                out[i + r] = first[r] + lse


def kl_from_logits(reference_logits: object, patched_logits: object) -> float:
    """Mean ``KL(softmax(reference) || softmax(patched))`` over rows, in **nats**
    (:class:`LogitReference`).

    Rows are predicted positions (the reference code uses the last token of each prompt,
    ``F.kl_div(log_softmax(patched), softmax(clean), reduction="batchmean")``).
    """
    return float(np.mean(LogitReference(reference_logits).kl(patched_logits)))


def rank_heads(kl: object, top_k: int | None = None) -> np.ndarray:
    """Heads sorted by decreasing patching KL: ``[k, 2]`` rows of ``(layer, head)``.

    ``kl`` is a ``[layers, heads]`` grid (the reference's ``patch_heads`` output). Ties keep
    row-major order.
    """
    g = to_numpy(kl, "kl").astype(np.float64)
    if g.ndim != 2:
        raise ValueError(f"kl must be a [layers, heads] grid, got shape {g.shape}.")
    check_finite(g, "kl")
    order = np.argsort(-g.ravel(), kind="stable")
    if top_k is not None:
        if not 1 <= top_k <= g.size:
            raise ValueError(f"top_k must lie in [1, {g.size}], got {top_k}.")
        order = order[:top_k]
    return np.stack(np.unravel_index(order, g.shape), axis=1)


class _Encoder:
    """Encoding scores between implementations, cached: the split is fixed by the seed, so
    the score of an ordered pair never changes and repeated triples cost nothing; each
    predictor is factorised once for all the targets it encodes."""

    def __init__(self, config: EncodingConfig | None) -> None:
        self.config = config or EncodingConfig()
        self.cache: dict[tuple[int, int], float] = {}
        self.predictors: dict[int, _XEncoder] = {}

    @property
    def reduced_to(self) -> int | None:
        """Components the reduced predictors kept (one number: it depends on the row count
        only, which all implementations share); ``None`` when no predictor was reduced."""
        widths = {p.reduced_to for p in self.predictors.values() if p.reduced_to is not None}
        return max(widths) if widths else None

    @property
    def caveat(self) -> str | None:
        """What the reduction means, for the predictors it applied to; ``None`` if none."""
        notes = sorted({p.caveat for p in self.predictors.values() if p.caveat})
        return "; ".join(notes) + "." if notes else None

    def __call__(self, x: np.ndarray, y: np.ndarray) -> float:
        key = (id(x), id(y))
        if key not in self.cache:
            if id(x) not in self.predictors:
                self.predictors[id(x)] = _XEncoder(x, self.config)
            r2, _ = self.predictors[id(x)].r2(y)
            self.cache[key] = float(np.sqrt(max(r2, 0.0)))
        return self.cache[key]


def _implementations(group: Sequence[object], name: str) -> list[np.ndarray]:
    if len(group) < 1:
        raise ValueError(f"{name} holds no implementations.")
    out = [check_matrix(g, f"{name}[{i}]").astype(np.float64) for i, g in enumerate(group)]
    n = out[0].shape[0]
    for i, g in enumerate(out):
        if g.shape[0] != n:
            raise ValueError(
                f"{name}[{i}] has {g.shape[0]} prompts, {name}[0] has {n}: all representations "
                "must be taken on the same prompts."
            )
    return out


@dataclasses.dataclass(frozen=True)
class SelectivityResult(Result):
    """Outcome of the selectivity test.

    ``score``: share of targets for which ``encoding(base -> target)`` exceeds
    ``encoding(intervened -> target)``; ``base_scores``/``intervened_scores``: the two
    encoding scores per target; ``pair_index``: which (base, intervened) pair each target used;
    ``reduced_to``/``caveat``: the principal-component reduction of too-wide predictors
    (:mod:`~structlens.equivalence.encoding`), ``None`` when there was none.
    """

    score: float
    n_targets: int
    base_scores: np.ndarray
    intervened_scores: np.ndarray
    pair_index: np.ndarray
    seed: int
    reduced_to: int | None = None
    caveat: str | None = None


def selectivity_test(
    base: Sequence[object],
    intervened: Sequence[object],
    targets: Sequence[object],
    max_targets: int = 100,
    seed: int = 0,
    config: EncodingConfig | None = None,
) -> SelectivityResult:
    """Selectivity of an intervention (``encoding_interp.main`` in the reference code).

    Parameters
    ----------
    base, intervened : sequence of array_like
        Paired representations ``[prompts, features]``: ``intervened[i]`` is ``base[i]``'s
        implementation after the intervention (e.g. top-KL heads patched).
    targets : sequence of array_like
        Representations of the implementations compared against; the first ``max_targets``
        are used (the reference uses at most 100).
    seed : int
        Seeds the random choice of a (base, intervened) pair for each target.
    """
    b = _implementations(base, "base")
    iv = _implementations(intervened, "intervened")
    t = _implementations(targets, "targets")
    if len(b) != len(iv):
        raise ValueError(f"base has {len(b)} implementations and intervened {len(iv)}; pair them.")
    if max_targets < 1:
        raise ValueError(f"max_targets must be positive, got {max_targets}.")
    t = t[:max_targets]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(b), size=len(t))
    enc = _Encoder(config)
    first = np.array([enc(b[i], tg) for i, tg in zip(idx, t, strict=True)])
    second = np.array([enc(iv[i], tg) for i, tg in zip(idx, t, strict=True)])
    return SelectivityResult(
        score=float(np.mean(first > second)),
        n_targets=len(t),
        base_scores=first,
        intervened_scores=second,
        pair_index=idx,
        seed=seed,
        reduced_to=enc.reduced_to,
        caveat=enc.caveat,
    )


def _point_test(
    g1: list[np.ndarray],
    g2: list[np.ndarray],
    n: int,
    crit: float,
    rng: np.random.Generator,
    enc: _Encoder,
    allow_same: bool,
) -> tuple[float, bool]:
    if not allow_same and len(g1) < 2:
        raise ValueError("group1 needs two distinct implementations when allow_same=False.")
    wins = 0
    for _ in range(n):
        i = int(rng.integers(len(g1)))
        j = int(rng.integers(len(g1)))
        while not allow_same and j == i:
            j = int(rng.integers(len(g1)))
        k = int(rng.integers(len(g2)))
        wins += enc(g1[i], g1[j]) > enc(g1[i], g2[k])
    p = wins / n
    return p, bool(p - crit * np.sqrt(p * (1 - p) / n) > 0.5)


def point_test(
    group1: Sequence[object],
    group2: Sequence[object],
    n: int = 20,
    crit: float = 1.96,
    seed: int = 0,
    allow_same: bool = True,
    config: EncodingConfig | None = None,
) -> tuple[float, bool]:
    """One point test: ``(p, different)``.

    ``p`` is the share of ``n`` random triples ``(a, a', b)``, ``a, a'`` from ``group1`` and
    ``b`` from ``group2``, with ``encoding(a -> a') > encoding(a -> b)``; ``different`` is
    ``p - crit * sqrt(p (1 - p) / n) > 0.5``. ``allow_same=True`` reproduces the reference,
    whose two group-1 indices are drawn independently and may coincide (then the
    within-group score is ~1); ``False`` draws two distinct implementations.
    """
    if n < 1:
        raise ValueError(f"n must be positive, got {n}.")
    g1 = _implementations(group1, "group1")
    g2 = _implementations(group2, "group2")
    return _point_test(g1, g2, n, crit, np.random.default_rng(seed), _Encoder(config), allow_same)


@dataclasses.dataclass(frozen=True)
class PointTestResult(Result):
    """Bootstrapped point test: ``decision_rate`` is the share of the ``straps`` repetitions
    declaring the two groups different (the reference's ``grid[alg1, alg2]``); ``p_values``
    holds each repetition's ``p`` (share of within-group wins), ``decisions`` its verdict;
    ``reduced_to``/``caveat`` as in :class:`SelectivityResult`."""

    decision_rate: float
    p_values: np.ndarray
    decisions: np.ndarray
    n: int
    straps: int
    crit: float
    allow_same: bool
    seed: int
    reduced_to: int | None = None
    caveat: str | None = None


def bootstrap_point_test(
    group1: Sequence[object],
    group2: Sequence[object],
    n: int = 20,
    straps: int = 40,
    crit: float = 1.96,
    seed: int = 0,
    allow_same: bool = True,
    config: EncodingConfig | None = None,
) -> PointTestResult:
    """Repeat :func:`point_test` ``straps`` times (reference default 40) with one RNG stream."""
    if n < 1 or straps < 1:
        raise ValueError(f"n and straps must be positive, got n={n}, straps={straps}.")
    g1 = _implementations(group1, "group1")
    g2 = _implementations(group2, "group2")
    rng = np.random.default_rng(seed)
    enc = _Encoder(config)
    results = [_point_test(g1, g2, n, crit, rng, enc, allow_same) for _ in range(straps)]
    p = np.array([r[0] for r in results])
    d = np.array([r[1] for r in results])
    return PointTestResult(
        decision_rate=float(d.mean()),
        p_values=p,
        decisions=d,
        n=n,
        straps=straps,
        crit=crit,
        allow_same=allow_same,
        seed=seed,
        reduced_to=enc.reduced_to,
        caveat=enc.caveat,
    )

"""Neighbor distance minimisation (NDM): learn an orthogonal R and a partition of its columns.

Huang & Hahn, *Decomposing Representation Space into Interpretable Subspaces with Unsupervised
Learning* (ICLR 2026).  Activations ``h`` (rows = samples, width ``d``) are rotated, ``z = h R``,
and the columns of ``z`` are cut into contiguous blocks by a partition ``[d_1, ..., d_S]``.
Training minimises the mean over subspaces of the Euclidean distance from each query to its
nearest key inside that subspace, the keys being a large memory bank that never contains the
query.  Starting from equal small blocks, the KSG mutual information between every pair of
subspaces (divided by ``d_a + d_b``) is estimated periodically; pairs above a threshold are
merged (disjoint pairs, highest first, a few per round), ``R`` is re-based so the merged
rotation spans the same subspaces, and the optimiser restarts.  Training stops when no pair
exceeds the threshold.  Optionally (``NDMConfig.resplit_trials``, not in the reference code)
a planned merge is first checked for an independent split of the pair's span, and a round
with nothing to merge tries to split every subspace (the split/undo pass), so that a merge
of independent groups is avoided or undone.

``R`` is parametrised as ``B exp(A - A^T)`` with ``B`` fixed (PyTorch's trivialisation of the
orthogonal group); each merge sets ``B`` to the current ``R`` with reordered columns and
``A = 0`` — the reference code's restart.  ``NDMConfig.retraction="cayley"`` replaces the
exponential by the Cayley transform (PyTorch's other orthogonal map), whose gradient costs a
linear solve instead of a ``2d x 2d`` matrix exponential.  The exponential's gradient is by
default computed from ``d x d`` products (:mod:`structlens.ndm.expm`, float32) rather than by
autograd's ``2d x 2d`` exponential, which ``NDMConfig.exp_gradient="pytorch"`` selects.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from structlens.ndm.expm import matrix_exp
from structlens.ndm.search import RotatedKeys, neighbor_distance_loss
from structlens.results import Result, atomic_write_bytes, atomic_write_json
from structlens.stats.mutual_info import subspace_mutual_information

ActivationSource = (
    np.ndarray | torch.Tensor | Callable[[], Iterable[torch.Tensor]] | Iterable[torch.Tensor]
)


@dataclasses.dataclass
class NDMConfig:
    """Settings of :class:`NDM` (defaults: the authors' GPT-2 small run, CPU-sized MI sample).

    Attributes
    ----------
    unit_size
        Size of the initial equal subspaces; must divide ``d`` unless ``initial_partition`` is
        given.
    initial_partition
        Explicit starting block sizes (summing to ``d``); overrides ``unit_size``.
    lr, betas
        Adam settings.
    batch_size
        Queries per optimisation step.
    grad_clip
        Gradient-norm clip (``None`` for none).
    max_steps
        Hard limit on optimisation steps.
    bank_size
        Keys in the memory bank searched for neighbours.
    refresh_interval
        Steps served by one memory-bank refresh; each refresh draws ``bank_size`` keys and
        ``refresh_interval * batch_size`` queries, disjoint rows, from the source.
    reproject_interval
        Steps between re-rotating the key bank used to rank candidates (the chosen neighbour is
        always re-scored with the current R).
    rerank
        Candidates per query and subspace whose exact distance picks the neighbour.
    search_chunk
        Keys per matrix product in the search.
    merge_start, merge_interval
        First step at which subspaces may merge, and steps between merge rounds.
    merge_threshold
        Merge when KSG MI / (d_a + d_b) exceeds this (nats per dimension).
    max_merges_per_round
        Cap on merged pairs per round; ``None`` means ``max(1, S // 8)``.
    min_subspaces
        Never merge below this many subspaces.
    mi_k, mi_samples
        KSG neighbours and the number of bank rows the MI is estimated on.
    stop_when_converged
        Stop when a merge round finds no pair above the threshold.
    init
        ``"identity"`` (reference) or ``"random"`` (Haar-random start from ``seed``).
    restarts
        Independent training runs on the same data stream, from ``init`` and then further
        Haar-random rotations; the result is the converged run with the most subspaces, ties
        broken by the lowest loss on a common sample (see ``NDMResult.restarts``).  Guards
        against a rotation stuck with dimensions of one group inside another's subspace,
        which makes merges join independent groups.
    resplit_trials
        Re-splitting, ``0`` (default, as in the reference code) for none.  (1) Before a merge
        round joins a pair of subspaces, look for a split of their joint span into two
        independent parts; if the best split's normalised MI is at most ``merge_threshold``,
        the pair is replaced by it (sizes may change) and not merged.  This escapes the local
        optimum in which two subspaces each hold part of two groups: their MI is high, but
        merging them joins independent groups, irreversibly.  (2) The split/undo pass: a
        round with no pair above the threshold tries to split every subspace larger than a
        unit the same way, and training continues (not converged) if one splits; this undoes
        a merge of independent groups that the check before it missed.  A split is searched
        for each size of the smaller part on the units' grid, by NDM on that span alone from
        ``resplit_trials`` Haar-random rotations of it (run as one batch), keeping the trial
        of lowest loss.  On a planted [4, 4, 8] instance (docs/ndm.md) about a third of the
        trials split the span of the 4- and 8-D groups, hence the benchmark's 8 trials.
        The grid means a group whose size is not a multiple of the unit is never isolated
        (nor is it by merges).
    resplit_steps, resplit_lr
        Adam steps and learning rate of each re-split trial.
    retraction
        The map from the skew-symmetric ``W = A - A^T`` to the rotation's factor: ``"exp"``
        (``exp(W)``, the reference code's) or ``"cayley"`` (``(I - W/2)^{-1} (I + W/2)``).
        Both are orthogonal for every ``A`` and agree to second order in ``W``, so they take
        the same first steps after a restart, but trajectories part over many steps.  At
        ``d = 576`` PyTorch's gradient of the exponential is most of a CPU training step with
        a small bank (benchmarks/ndm), hence ``exp_gradient``.  A training step computes
        the Cayley map and its gradient, with the product by the base, in ``dtype`` (the
        loss's), from one LU factorisation.
    exp_gradient
        How the exponential's gradient is computed in a training step: ``"float32"``
        (default) or ``"float64"``, the Fréchet derivative from ``d x d`` block-triangular
        products (:func:`structlens.ndm.expm.frechet_exp`) in that precision, or
        ``"pytorch"``, autograd's ``2d x 2d`` block matrix exponential (in float64), kept as
        the reference.  The loss is float32, so the gradient that arrives here carries float32
        rounding already: ``"float32"`` agrees with PyTorch's to within 1e-6 at ``d = 64``
        (``tests/ndm/test_ndm_expm.py``) at the least cost, ``"float64"`` to round-off.  A
        difference in the last bits moves a long training trajectory (Adam rescales
        near-zero gradient entries to full steps, and the search's choices are discrete), so
        single runs differ between the options; recovery over seeds is compared in
        ``benchmarks/ndm/planted_recovery*.json``.
    log_interval
        Steps per entry of the loss history.
    seed
        Seeds the initial rotation and every draw from the source.
    device, dtype
        Where and in which precision activations are searched (R itself is kept in float64).
    """

    unit_size: int = 32
    initial_partition: list[int] | None = None
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.999)
    batch_size: int = 128
    grad_clip: float | None = 100.0
    max_steps: int = 100_000
    bank_size: int = 409_600
    refresh_interval: int = 1_000
    reproject_interval: int = 10
    rerank: int = 8
    search_chunk: int = 65_536
    merge_start: int = 20_000
    merge_interval: int = 8_000
    merge_threshold: float = 0.04
    max_merges_per_round: int | None = None
    min_subspaces: int = 1
    mi_k: int = 1
    mi_samples: int = 4_096
    stop_when_converged: bool = True
    init: Literal["identity", "random"] = "identity"
    restarts: int = 1
    resplit_trials: int = 0
    resplit_steps: int = 200
    resplit_lr: float = 1e-2
    retraction: Literal["exp", "cayley"] = "exp"
    exp_gradient: Literal["pytorch", "float64", "float32"] = "float32"
    log_interval: int = 100
    seed: int = 0
    device: str = "cpu"
    dtype: Literal["float32", "float64"] = "float32"

    def validate(self) -> None:
        """Raise ``ValueError`` on an inconsistent setting."""
        positive = {
            "unit_size": self.unit_size,
            "batch_size": self.batch_size,
            "max_steps": self.max_steps,
            "bank_size": self.bank_size,
            "refresh_interval": self.refresh_interval,
            "reproject_interval": self.reproject_interval,
            "rerank": self.rerank,
            "search_chunk": self.search_chunk,
            "merge_interval": self.merge_interval,
            "min_subspaces": self.min_subspaces,
            "mi_k": self.mi_k,
            "log_interval": self.log_interval,
            "restarts": self.restarts,
            "resplit_steps": self.resplit_steps,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"NDMConfig.{name} must be >= 1, got {value}.")
        if self.mi_samples <= self.mi_k:
            raise ValueError(
                f"NDMConfig.mi_samples ({self.mi_samples}) must exceed mi_k ({self.mi_k})."
            )
        if self.init not in ("identity", "random"):
            raise ValueError(f"NDMConfig.init must be 'identity' or 'random', got {self.init!r}.")
        if self.retraction not in ("exp", "cayley"):
            raise ValueError(
                f"NDMConfig.retraction must be 'exp' or 'cayley', got {self.retraction!r}."
            )
        if self.exp_gradient not in _ADJOINT_DTYPES:
            raise ValueError(
                "NDMConfig.exp_gradient must be 'pytorch', 'float64' or 'float32', "
                f"got {self.exp_gradient!r}."
            )
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"NDMConfig.dtype must be 'float32' or 'float64', got {self.dtype!r}.")
        if self.resplit_trials < 0:
            raise ValueError(f"NDMConfig.resplit_trials must be >= 0, got {self.resplit_trials}.")
        if not self.resplit_lr > 0:
            raise ValueError(f"NDMConfig.resplit_lr must be > 0, got {self.resplit_lr}.")
        if self.resplit_trials and self.refresh_interval * self.batch_size < 2:
            raise ValueError(
                "re-splitting holds out half of the query pool, which needs "
                "refresh_interval * batch_size >= 2."
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class NDMResult(Result):
    """A learned decomposition.

    Attributes
    ----------
    rotation
        Orthogonal ``(d, d)`` float64 matrix ``R``; rotated activations are ``z = h @ R`` and
        subspace ``s`` is the column block ``partition[s]`` of ``R`` (sizes in descending order).
    partition
        Subspace sizes summing to ``d``.
    merge_history
        One entry per merge round: ``step``, merged ``pairs`` (indices into the partition
        before the round), their normalised ``mi``, ``partition_before``, ``partition_after``.
    steps
        Optimisation steps taken.
    converged
        Whether training stopped because no subspace pair exceeded the merge threshold.
    loss_history
        Mean loss over each ``log_interval`` steps.
    config
        The :class:`NDMConfig` as a dict.
    provenance
        ``data_digest`` and ``model_digest`` of the training inputs (see :meth:`NDM.fit`), the
        ``config``, the ``restart`` this result comes from, and ``resumed_from_step``
        (``None`` for an uninterrupted run).
    restarts
        With ``NDMConfig.restarts > 1``, one entry per run: ``restart``, ``partition``,
        ``converged``, ``steps``, ``selection_loss`` (NDM loss on a common sample of
        ``bank_size`` keys and ``batch_size`` queries, each run at its own partition),
        ``lowest_loss`` (whether no run has a lower one) and ``chosen``; empty otherwise.
    resplit_history
        One entry per merge round that re-split instead of merging (see
        ``NDMConfig.resplit_trials``): ``step``, ``kind`` (``"merge"``: planned merge pairs
        were re-split; ``"final"``: the split/undo pass of a round with nothing to merge split
        single subspaces), the re-split ``subspaces`` (index lists into ``partition_before``:
        pairs, or single subspaces), their normalised MI as planned for the merge
        (``mi_merge``, ``None`` for ``"final"``) and between the two parts of the learnt split
        (``mi_split``, held-out rows), ``partition_before`` and ``partition_after``.
    chosen_loss_is_lowest
        With restarts: whether the chosen run also has the lowest ``selection_loss``
        (``None`` without restarts).  It can be ``False`` because the rule prefers converged
        runs and finer partitions, and losses at different partitions are not on one scale.
    selection_note
        With restarts, when ``chosen_loss_is_lowest`` is ``False``: which run has the lowest
        loss and why it was not chosen; ``None`` otherwise.
    """

    rotation: np.ndarray
    partition: list[int]
    merge_history: list[dict[str, Any]]
    steps: int
    converged: bool
    loss_history: list[float]
    config: dict[str, Any]
    provenance: dict[str, Any] = dataclasses.field(default_factory=dict)
    restarts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    resplit_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    chosen_loss_is_lowest: bool | None = None
    selection_note: str | None = None

    def bases(self) -> list[np.ndarray]:
        """Orthonormal basis ``(d, d_s)`` of every subspace (column blocks of ``rotation``)."""
        bounds = np.concatenate([[0], np.cumsum(self.partition)])
        return [self.rotation[:, bounds[s] : bounds[s + 1]] for s in range(len(self.partition))]

    def project(self, h: np.ndarray) -> list[np.ndarray]:
        """Coordinates of activations ``h`` (``(n, d)``) in every subspace."""
        return [np.asarray(h) @ basis for basis in self.bases()]

    def training_record(self, n_activations: int, seconds: float) -> dict[str, Any]:
        """The JSON record of one layer's run in ``ndm_train.json`` (without the rotation)."""
        return {
            "partition": self.partition,
            "steps": self.steps,
            "converged": self.converged,
            "merge_history": self.merge_history,
            "loss_history": self.loss_history,
            "config": self.config,
            "n_activations": int(n_activations),
            "seconds": seconds,
            "queries_per_second": self.steps * self.config["batch_size"] / max(seconds, 1e-9),
        }


def orthogonal_map(
    W: torch.Tensor, retraction: str = "exp", adjoint_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """The orthogonal factor of the skew-symmetric ``W`` (``(..., d, d)``): ``exp(W)`` or the
    Cayley transform ``(I - W/2)^{-1} (I + W/2)`` (see ``NDMConfig.retraction``).  With an
    ``adjoint_dtype`` the exponential's gradient is :func:`structlens.ndm.expm.matrix_exp`'s,
    computed in that dtype; without, PyTorch's."""
    if retraction == "exp":
        if adjoint_dtype is None:
            return torch.linalg.matrix_exp(W)
        return matrix_exp(W, adjoint_dtype)
    eye = torch.eye(W.shape[-1], dtype=W.dtype, device=W.device)
    # I - W/2 has eigenvalues 1 - i lambda/2, all of modulus >= 1: the solve is well conditioned.
    return torch.linalg.solve(eye - 0.5 * W, eye + 0.5 * W)


class _CayleyRotation(torch.autograd.Function):
    """``R = B (I - W/2)^{-1} (I + W/2) = 2 B M^{-1} - B`` with ``M = I - W/2``, for a fixed
    orthogonal ``B`` and skew-symmetric ``W``, in ``dtype``.

    ``Y = B M^{-1}`` is one solve with ``M^T = I + W/2`` (its LU kept), and the gradient
    ``dL/dW = Y^T G M^{-T} = (M^{-1} G^T Y)^T`` one product and one solve with the same LU:
    about ``6.7 d^3`` operations against ``11.3 d^3`` for the solve, the product by ``B``
    and their gradients taken apart."""

    @staticmethod
    def forward(ctx: Any, base: torch.Tensor, W: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        b, w = base.to(dtype), W.to(dtype)
        eye = torch.eye(w.shape[-1], dtype=dtype, device=w.device)
        lu, pivots = torch.linalg.lu_factor(eye + 0.5 * w)
        Y = torch.linalg.lu_solve(lu, pivots, b.mT).mT
        ctx.save_for_backward(lu, pivots, Y)
        return (2 * Y - b).to(base.dtype)

    @staticmethod
    def backward(ctx: Any, G: torch.Tensor) -> tuple[None, torch.Tensor, None]:
        lu, pivots, Y = ctx.saved_tensors
        Z = torch.linalg.lu_solve(lu, pivots, G.to(Y.dtype).mT @ Y, adjoint=True)
        return None, Z.mT.to(G.dtype), None


class _Rotation(torch.nn.Module):
    """``R = B Q(A - A^T)`` in float64, ``Q`` the ``retraction``'s orthogonal map: orthogonal
    for any ``A``; ``B`` is fixed."""

    base: torch.Tensor

    def __init__(self, base: torch.Tensor, retraction: str = "exp") -> None:
        super().__init__()
        self.register_buffer("base", base.to(torch.float64).clone())
        self.A = torch.nn.Parameter(torch.zeros_like(self.base))
        self.retraction = retraction

    def forward(
        self, adjoint_dtype: torch.dtype | None = None, dtype: torch.dtype = torch.float64
    ) -> torch.Tensor:
        """``R``, in float64; ``adjoint_dtype`` as in :func:`orthogonal_map`, ``dtype`` the
        arithmetic of the Cayley map (training passes the loss's dtype, which ``R`` is cast
        to there)."""
        W = self.A - self.A.T
        if self.retraction == "cayley":
            return _CayleyRotation.apply(self.base, W, dtype)
        return self.base @ orthogonal_map(W, "exp", adjoint_dtype)


class _Feed:
    """Draws disjoint key banks and query pools from an in-memory array or a tensor stream.

    Its only randomness is a ``torch.Generator``; its state before the latest draw and the
    stream position then are what a checkpoint needs to rebuild the same bank.
    """

    def __init__(self, source: ActivationSource, seed: int) -> None:
        self.pool: torch.Tensor | None = None
        self.factory: Callable[[], Iterable[torch.Tensor]] | None = None
        if isinstance(source, (np.ndarray, torch.Tensor)):
            pool = torch.as_tensor(source)
            if pool.ndim != 2:
                raise ValueError(
                    f"activations must have shape (n_samples, d), got {tuple(pool.shape)}."
                )
            self.pool = pool
        elif callable(source):
            self.factory = source
        elif isinstance(source, Iterable):
            if iter(source) is source:
                raise ValueError(
                    "source is a one-shot iterator; pass a re-iterable (list, store) or a "
                    "callable returning a fresh iterator, so the bank can be refreshed and resumed."
                )
            self.factory = lambda: source
        else:
            raise ValueError(
                "source must be an (n, d) array/tensor, an iterable of (rows, d) tensors, or a "
                f"callable returning such an iterable; got {type(source).__name__}."
            )
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch = 0
        self.position = 0
        self._iterator: Iterator[torch.Tensor] | None = None

    def state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def digest(self) -> str:
        """SHA-256 of the data: dtype, shape and bytes of the array, or of every tensor of one
        full pass over the stream, in order."""
        h = hashlib.sha256()
        tensors = [self.pool] if self.pool is not None else self.factory()  # type: ignore[misc]
        for t in tensors:
            t = torch.as_tensor(t).detach().cpu().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    def restore(self, state: dict[str, Any], generator_state: torch.Tensor) -> None:
        self.generator.set_state(generator_state)
        self.epoch = int(state["epoch"])
        self.position = 0
        self._iterator = None
        if self.factory is not None:
            self._iterator = iter(self.factory())
            for _ in range(int(state["position"])):
                next(self._iterator)
            self.position = int(state["position"])

    def _next_tensor(self) -> torch.Tensor:
        assert self.factory is not None
        if self._iterator is None:
            self._iterator = iter(self.factory())
        try:
            t = next(self._iterator)
        except StopIteration:
            self.epoch += 1
            self.position = 0
            self._iterator = iter(self.factory())
            try:
                t = next(self._iterator)
            except StopIteration:
                raise ValueError("the activation source yielded no tensors.") from None
        self.position += 1
        return torch.as_tensor(t)

    def draw(self, n_rows: int) -> torch.Tensor:
        """``n_rows`` activation rows in random order (no row repeated)."""
        if self.pool is not None:
            if self.pool.shape[0] < n_rows:
                raise ValueError(
                    f"a refresh needs {n_rows} rows (bank_size + refresh_interval * batch_size) "
                    f"but the activations hold {self.pool.shape[0]}; lower bank_size or "
                    "refresh_interval, or supply more activations."
                )
            idx = torch.randperm(self.pool.shape[0], generator=self.generator)[:n_rows]
            return self.pool[idx]
        parts, have = [], 0
        while have < n_rows:
            t = self._next_tensor()
            if t.ndim != 2:
                raise ValueError(f"source tensors must be (rows, d), got {tuple(t.shape)}.")
            parts.append(t)
            have += t.shape[0]
        rows = torch.cat(parts)[:n_rows] if len(parts) > 1 else parts[0][:n_rows]
        return rows[torch.randperm(n_rows, generator=self.generator)]


@dataclasses.dataclass(frozen=True)
class MergePlan:
    """The subspace pairs one merge round joins, and the column order that re-bases ``R``.

    Attributes
    ----------
    pairs
        Merged pairs ``(a, b)``, indices into the partition before the round, highest MI first.
    mi
        Their normalised mutual information.
    max_mi
        The largest normalised MI over all pairs (merged or not).
    partition_after
        Subspace sizes after the round, descending; among equal sizes merged pairs come first.
    permutation
        Column order of the old rotation whose contiguous blocks are ``partition_after``.
    """

    pairs: list[tuple[int, int]]
    mi: list[float]
    max_mi: float
    partition_after: list[int]
    permutation: list[int]


def plan_merges(
    mi: np.ndarray,
    partition: Sequence[int],
    threshold: float,
    *,
    max_pairs: int | None = None,
    min_subspaces: int = 1,
) -> MergePlan | None:
    """Choose the merges of one round from a matrix of normalised mutual information.

    Disjoint pairs with ``mi[a, b] > threshold`` are taken greedily in descending order of MI,
    at most ``max_pairs`` (default ``max(1, S // 8)`` for ``S`` subspaces) and never leaving
    fewer than ``min_subspaces``.  Returns ``None`` when nothing merges.  Pure: ``mi`` is the
    symmetric ``(S, S)`` matrix of :func:`structlens.stats.mutual_info.subspace_mutual_information`
    (normalised by ``d_a + d_b``), ``partition`` the current block sizes.
    """
    sizes = [int(s) for s in partition]
    n_sub = len(sizes)
    mi = np.asarray(mi, dtype=np.float64)
    if mi.shape != (n_sub, n_sub):
        raise ValueError(f"mi must be ({n_sub}, {n_sub}) for partition {sizes}, got {mi.shape}.")
    if n_sub <= max(min_subspaces, 1):
        return None
    cap = min(max_pairs or max(1, n_sub // 8), n_sub - min_subspaces)
    candidates = sorted(
        ((mi[a, b], a, b) for a in range(n_sub) for b in range(a + 1, n_sub)), reverse=True
    )
    used: set[int] = set()
    pairs: list[tuple[int, int, float]] = []
    for value, a, b in candidates:
        if value <= threshold or len(pairs) == cap:
            break
        if a in used or b in used:
            continue
        used.update((a, b))
        pairs.append((a, b, float(value)))
    if not pairs:
        return None
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    groups = [
        list(range(bounds[a], bounds[a + 1])) + list(range(bounds[b], bounds[b + 1]))
        for a, b, _ in pairs
    ]
    groups += [list(range(bounds[s], bounds[s + 1])) for s in range(n_sub) if s not in used]
    groups.sort(key=len, reverse=True)  # stable: merged pairs first among equal sizes
    return MergePlan(
        pairs=[(a, b) for a, b, _ in pairs],
        mi=[v for _, _, v in pairs],
        max_mi=float(candidates[0][0]),
        partition_after=[len(g) for g in groups],
        permutation=[int(c) for g in groups for c in g],
    )


@dataclasses.dataclass
class TrainState:
    """Everything the trainer carries from one step to the next.

    :meth:`save` and :meth:`load` make an interrupted run continue bit-identically.  The key
    bank is not stored: it is drawn again from the source after restoring the feed to
    ``feed_generator`` / ``feed_position`` (its state before the latest refresh) and projected
    with ``key_rotation`` (the rotation the bank was last projected with).
    """

    rotation: _Rotation
    optimizer: torch.optim.Adam
    partition: list[int]
    key_rotation: torch.Tensor
    feed_generator: torch.Tensor
    feed_position: dict[str, Any]
    step: int = 0
    steps_since_refresh: int = 0
    merge_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    resplit_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    loss_history: list[float] = dataclasses.field(default_factory=list)
    running: list[float] = dataclasses.field(default_factory=list)
    converged: bool = False

    _SCALARS: ClassVar[tuple[str, ...]] = (
        "partition",
        "step",
        "steps_since_refresh",
        "feed_position",
        "merge_history",
        "resplit_history",
        "loss_history",
        "running",
        "converged",
    )

    def save(self, directory: Path, provenance: dict[str, Any]) -> None:
        """Write ``checkpoint.safetensors`` and ``checkpoint.json`` (with ``provenance``)."""
        from safetensors.torch import save

        tensors = {
            "base": self.rotation.base.detach().cpu().contiguous(),
            "A": self.rotation.A.detach().cpu().contiguous(),
            "key_rotation": self.key_rotation.detach().cpu().contiguous(),
            "generator": self.feed_generator.clone(),
        }
        adam = self.optimizer.state.get(self.rotation.A)
        if adam:
            tensors["exp_avg"] = adam["exp_avg"].detach().cpu().contiguous()
            tensors["exp_avg_sq"] = adam["exp_avg_sq"].detach().cpu().contiguous()
            tensors["adam_step"] = torch.as_tensor(adam["step"], dtype=torch.float32).reshape(1)
        atomic_write_bytes(directory / "checkpoint.safetensors", save(tensors))
        meta = {name: getattr(self, name) for name in self._SCALARS}
        atomic_write_json(directory / "checkpoint.json", {"provenance": provenance, **meta})

    @classmethod
    def load(
        cls,
        directory: Path,
        make_optimizer: Callable[[_Rotation], torch.optim.Adam],
        device: torch.device,
        retraction: str = "exp",
    ) -> tuple[TrainState, dict[str, Any]] | None:
        """The state saved in ``directory`` and its provenance, or ``None`` if there is none."""
        from safetensors.torch import load_file

        meta_path = directory / "checkpoint.json"
        if not meta_path.exists():
            return None
        meta = json.loads(meta_path.read_text())
        arrays = load_file(str(directory / "checkpoint.safetensors"))
        rotation = _Rotation(arrays["base"], retraction).to(device)
        with torch.no_grad():
            rotation.A.copy_(arrays["A"])
        optimizer = make_optimizer(rotation)
        if "exp_avg" in arrays:
            optimizer.load_state_dict(
                {
                    "state": {
                        0: {
                            "step": arrays["adam_step"].reshape(()),
                            "exp_avg": arrays["exp_avg"].to(device),
                            "exp_avg_sq": arrays["exp_avg_sq"].to(device),
                        }
                    },
                    "param_groups": optimizer.state_dict()["param_groups"],
                }
            )
        state = cls(
            rotation=rotation,
            optimizer=optimizer,
            key_rotation=arrays["key_rotation"].to(device),
            feed_generator=arrays["generator"],
            **{name: meta[name] for name in cls._SCALARS},
        )
        return state, meta["provenance"]


class _Bank:
    """The current key bank and query pool drawn from the feed, projected for the search."""

    def __init__(
        self, feed: _Feed, config: NDMConfig, device: torch.device, dtype: torch.dtype
    ) -> None:
        self.feed, self.config, self.device, self.dtype = feed, config, device, dtype
        self.keys = self.queries = torch.empty(0)
        self.index: RotatedKeys | None = None

    def refresh(self, state: TrainState) -> None:
        """Record the feed's position in ``state``, then draw new keys and queries."""
        cfg = self.config
        state.feed_generator = self.feed.generator.get_state()
        state.feed_position = self.feed.state()
        rows = self.feed.draw(cfg.bank_size + cfg.refresh_interval * cfg.batch_size)
        rows = rows.to(device=self.device, dtype=self.dtype)
        if not bool(torch.isfinite(rows).all()):
            raise ValueError("activations contain NaN or infinite values; clean the source.")
        self.keys = rows[: cfg.bank_size].contiguous()
        self.queries = rows[cfg.bank_size :].contiguous()

    def project(self, state: TrainState, rotation: torch.Tensor | None = None) -> None:
        """Project the keys with ``rotation`` (default: the current one) for ranking."""
        R = state.rotation().detach() if rotation is None else rotation
        self.index = RotatedKeys(self.keys, R, state.partition, self.config.search_chunk)
        state.key_rotation = self.index.rotation

    def batch(self, state: TrainState) -> torch.Tensor:
        b = self.config.batch_size
        return self.queries[state.steps_since_refresh * b : (state.steps_since_refresh + 1) * b]


class NDM:
    """Neighbor distance minimisation trainer.

    Examples
    --------
    >>> h = np.random.default_rng(0).standard_normal((6000, 8)).astype(np.float32)
    >>> cfg = NDMConfig(unit_size=2, batch_size=32, max_steps=20, bank_size=2000,
    ...                 refresh_interval=10, merge_start=10, merge_interval=10, mi_samples=500)
    >>> result = NDM(cfg).fit(h)
    >>> sum(result.partition)
    8
    """

    def __init__(self, config: NDMConfig | None = None) -> None:
        self.config = config or NDMConfig()
        self.config.validate()

    def fit(
        self,
        source: ActivationSource,
        *,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int = 1_000,
        resume: bool = True,
        stop_at_step: int | None = None,
        progress: Callable[[int, float, list[int]], None] | None = None,
        model_digest: str | None = None,
        data_digest: str | None = None,
    ) -> NDMResult:
        """Train on activations and return the rotation and partition.

        Parameters
        ----------
        source
            Activations, rows = samples, width ``d``: an ``(n, d)`` array or tensor (rows drawn
            at random under the seed), an iterable of ``(rows, d)`` tensors that can be iterated
            again (e.g. an activation store), or a callable returning a fresh iterable; streams
            are read in order, restarted when exhausted, and each refresh's rows are shuffled.
        checkpoint_dir
            Where to checkpoint every ``checkpoint_every`` steps, at merges and at the end.
            Each run writes into its own subdirectory ``run-<key>/restart-<r>``, the key being
            a digest of the training data, the config and ``model_digest``; with ``resume``,
            training continues from the checkpoint under the same key only and gives the same
            result as an uninterrupted run.  A checkpoint written for other data, another config or
            another model is never resumed: the run starts fresh under its own key (the other
            checkpoint is kept) and a warning names the inputs that differ.
        stop_at_step
            Stop (and checkpoint) once this many steps are done, as for a time-limited job.
        progress
            Called every ``log_interval`` steps with ``(step, mean loss, partition)``.
        model_digest
            Identity of the model the activations came from (e.g. a weights digest); recorded
            in the checkpoint key and the result's provenance.
        data_digest
            Identity of the training data.  By default the SHA-256 of the activations' bytes,
            dtype and shape (for a stream: of every tensor of one full pass, which reads the
            source once more); pass the source's own content digest to skip that pass.
        """
        cfg = self.config
        provenance = {
            "data_digest": data_digest or _Feed(source, cfg.seed).digest(),
            "config": _jsonable_config(cfg),
            "model_digest": model_digest,
        }
        run_dir = _run_directory(Path(checkpoint_dir), provenance) if checkpoint_dir else None
        runs = [
            self._train(
                source,
                restart,
                provenance,
                None if run_dir is None else run_dir / f"restart-{restart}",
                resume=resume,
                checkpoint_every=checkpoint_every,
                stop_at_step=stop_at_step,
                progress=progress,
            )
            for restart in range(cfg.restarts)
        ]
        if len(runs) == 1:
            return runs[0]
        return self._select(source, runs)

    def _train(
        self,
        source: ActivationSource,
        restart: int,
        provenance: dict[str, Any],
        run_dir: Path | None,
        *,
        resume: bool,
        checkpoint_every: int,
        stop_at_step: int | None,
        progress: Callable[[int, float, list[int]], None] | None,
    ) -> NDMResult:
        """One training run from initial rotation number ``restart`` (see ``restarts``)."""
        cfg = self.config
        device = torch.device(cfg.device)
        feed = _Feed(source, cfg.seed)
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
        loaded = (
            TrainState.load(run_dir, self._optimizer, device, cfg.retraction)
            if run_dir is not None and resume
            else None
        )
        if loaded is None:
            state = self._initial_state(self._peek_width(feed), device, restart)
            resumed_from = None
        else:
            state, _ = loaded
            feed.restore(state.feed_position, state.feed_generator)
            resumed_from = state.step
        bank = _Bank(feed, cfg, device, _DTYPES[cfg.dtype])
        bank.refresh(state)
        bank.project(state, state.key_rotation)

        def checkpoint() -> None:
            if run_dir is not None:
                state.save(run_dir, provenance)

        limit = cfg.max_steps if stop_at_step is None else min(cfg.max_steps, stop_at_step)
        while state.step < limit and not state.converged:
            if state.steps_since_refresh == cfg.refresh_interval:
                bank.refresh(state)
                bank.project(state)
                state.steps_since_refresh = 0
            elif state.step % cfg.reproject_interval == 0 and state.step > 0:
                bank.project(state)
            if self._step(state, bank) and progress is not None:
                progress(state.step, state.loss_history[-1], list(state.partition))
            if self._merge_due(state.step):
                if self._merge(state, bank):
                    bank.project(state)
                checkpoint()
            elif state.step % checkpoint_every == 0:
                checkpoint()
        checkpoint()
        return self._result(
            state, {**provenance, "restart": restart, "resumed_from_step": resumed_from}
        )

    def _select(self, source: ActivationSource, runs: list[NDMResult]) -> NDMResult:
        """The best of several restarts: converged runs first, then the finest partition (a
        merge needs MI above the threshold and cannot be undone, so a spurious merge only
        ever coarsens the partition), then the lowest loss on one common sample.  Losses at
        different partitions are not on one scale, so the chosen run may not have the lowest;
        ``chosen_loss_is_lowest`` and ``selection_note`` of the result say so."""
        cfg = self.config
        device = torch.device(cfg.device)
        sample = _Feed(source, cfg.seed + 1).draw(cfg.bank_size + cfg.batch_size)
        sample = sample.to(device=device, dtype=_DTYPES[cfg.dtype])
        keys, queries = sample[: cfg.bank_size], sample[cfg.bank_size :]
        losses = []
        for run in runs:
            R = torch.as_tensor(run.rotation, device=device)
            nearest = RotatedKeys(keys, R, run.partition, cfg.search_chunk).nearest(
                queries, R, cfg.rerank
            )
            losses.append(float(neighbor_distance_loss(queries, keys, nearest, R, run.partition)))
        best = min(
            range(len(runs)),
            key=lambda r: (not runs[r].converged, -len(runs[r].partition), losses[r]),
        )
        lowest = min(losses)
        table = [
            {
                "restart": r,
                "partition": run.partition,
                "converged": run.converged,
                "steps": run.steps,
                "selection_loss": losses[r],
                "lowest_loss": losses[r] == lowest,
                "chosen": r == best,
            }
            for r, run in enumerate(runs)
        ]
        note = None
        if losses[best] > lowest:
            other = losses.index(lowest)
            # The ordering only puts a lower loss behind by convergence or by a coarser partition.
            why = (
                "did not converge"
                if runs[best].converged and not runs[other].converged
                else f"has the coarser partition {runs[other].partition}"
            )
            note = (
                f"restart {other} has a lower selection loss ({lowest:.6g} < "
                f"{losses[best]:.6g}) but {why}; restart {best} "
                f"(partition {runs[best].partition}) was kept."
            )
        return dataclasses.replace(
            runs[best],
            restarts=table,
            chosen_loss_is_lowest=losses[best] == lowest,
            selection_note=note,
        )

    def _step(self, state: TrainState, bank: _Bank) -> bool:
        """One optimisation step on the next query batch; returns whether it closed a window of
        ``log_interval`` steps (whose mean loss it appended to the loss history)."""
        cfg = self.config
        assert bank.index is not None
        q = bank.batch(state)
        R = state.rotation(_ADJOINT_DTYPES[cfg.exp_gradient], _DTYPES[cfg.dtype])
        neighbors = bank.index.nearest(q, R.detach(), cfg.rerank)
        loss = neighbor_distance_loss(q, bank.keys, neighbors, R, state.partition)
        state.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_([state.rotation.A], cfg.grad_clip)
        state.optimizer.step()
        state.step += 1
        state.steps_since_refresh += 1
        state.running.append(float(loss.detach()))
        if len(state.running) == cfg.log_interval:
            state.loss_history.append(float(np.mean(state.running)))
            state.running = []
            return True
        return False

    def _merge_due(self, step: int) -> bool:
        cfg = self.config
        return step >= cfg.merge_start and (step - cfg.merge_start) % cfg.merge_interval == 0

    def _merge(self, state: TrainState, bank: _Bank) -> bool:
        """Run a merge round; re-base the rotation and restart the optimiser if pairs merge
        or (with ``resplit_trials``) are re-split instead, or if a round with nothing to merge
        splits a subspace (the split/undo pass); otherwise training has converged."""
        cfg = self.config
        with torch.no_grad():
            R_now = state.rotation().detach()
        entry = self._merge_round(bank.keys, R_now, state.partition, state.step)
        resplit = None
        if cfg.resplit_trials:
            unit = min(self._initial_partition(R_now.shape[0]))
            if entry is None:
                spans = [[s] for s, size in enumerate(state.partition) if size > unit]
                mi_merge = None
            else:
                spans, mi_merge = entry["pairs"], entry["mi"]
            resplit = self._resplit(bank, R_now, state.partition, spans, mi_merge, state.step, unit)
        if resplit is not None:
            R_new, state.partition, record = resplit
            state.resplit_history.append(record)
            state.rotation = _Rotation(R_new, cfg.retraction).to(R_now.device)
            state.optimizer = self._optimizer(state.rotation)
            return True
        if entry is None:
            state.converged = cfg.stop_when_converged
            return False
        perm = entry.pop("_perm")
        state.merge_history.append(entry)
        state.partition = entry["partition_after"]
        state.rotation = _Rotation(R_now[:, perm], cfg.retraction).to(R_now.device)
        state.optimizer = self._optimizer(state.rotation)
        return True

    def _resplit(
        self,
        bank: _Bank,
        R: torch.Tensor,
        partition: list[int],
        spans: list[list[int]],
        mi_merge: list[float] | None,
        step: int,
        unit: int,
    ) -> tuple[torch.Tensor, list[int], dict[str, Any]] | None:
        """Look for a split of the joint span of each group of subspaces in ``spans`` (indices
        into ``partition``) into two independent parts (see ``NDMConfig.resplit_trials``):
        the pairs a merge round plans (their MI ``mi_merge``), or single subspaces in the
        split/undo pass of a round with nothing to merge (``mi_merge`` ``None``).

        For every size ``k`` of the smaller part up to half the span that is a multiple of
        ``gcd(unit, span size)`` (``unit`` = the initial block size: merges and re-splits keep
        the partition on the units' grid, and trying only sizes on it halves the cost), the
        split of lowest NDM loss among the trials is learnt on the first ``mi_samples`` keys
        and half the query pool; its normalised MI is estimated on the other half.  The split
        of lowest MI replaces the group if that MI does not exceed ``merge_threshold``.
        Returns the new rotation, partition and history entry, or ``None`` if no group
        splits.
        """
        cfg = self.config
        keys = bank.keys[: cfg.mi_samples].to(torch.float64)
        pool = bank.queries[: 2 * cfg.mi_samples].to(torch.float64)
        half = pool.shape[0] // 2
        bounds = np.concatenate([[0], np.cumsum(partition)]).tolist()
        # Seeded by the step, so a resumed run draws the same trials.
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        R_new = R.clone()
        blocks = [list(range(bounds[s], bounds[s + 1])) for s in range(len(partition))]
        in_spans = {s for group in spans for s in group}
        parts = [blocks[s] for s in range(len(partition)) if s not in in_spans]
        record: dict[str, Any] = {
            "step": step, "kind": "merge" if mi_merge is not None else "final",
            "subspaces": [], "mi_merge": [], "mi_split": [], "partition_before": list(partition),
        }  # fmt: skip
        for i, group in enumerate(spans):
            cols = [c for s in group for c in blocks[s]]
            span = R[:, cols].to(torch.float64)
            grid = math.gcd(unit, len(cols))
            best = _best_split(span, keys, pool[:half], pool[half:], cfg, gen, grid)
            if best is not None and best[0] <= cfg.merge_threshold:
                mi, Q, large = best
                R_new[:, cols] = span @ Q.to(span.device)
                parts += [cols[:large], cols[large:]]
                record["subspaces"].append(list(group))
                record["mi_merge"].append(None if mi_merge is None else mi_merge[i])
                record["mi_split"].append(mi)
            else:
                parts += [blocks[s] for s in group]
        if not record["subspaces"]:
            return None
        # Largest first, as the partition is kept; blocks keep their column order among equals.
        order = sorted(parts, key=lambda g: (-len(g), g[0]))
        record["partition_after"] = [len(g) for g in order]
        perm = [c for g in order for c in g]
        return R_new[:, perm], record["partition_after"], record

    def _result(self, state: TrainState, provenance: dict[str, Any]) -> NDMResult:
        with torch.no_grad():
            R_final = state.rotation().detach().cpu().numpy()
        return NDMResult(
            rotation=R_final,
            partition=list(state.partition),
            merge_history=state.merge_history,
            resplit_history=state.resplit_history,
            steps=state.step,
            converged=state.converged,
            loss_history=state.loss_history,
            config=_jsonable_config(self.config),
            provenance=provenance,
        )

    def _optimizer(self, rotation: _Rotation) -> torch.optim.Adam:
        return torch.optim.Adam([rotation.A], lr=self.config.lr, betas=self.config.betas)

    def _initial_state(self, d: int, device: torch.device, restart: int = 0) -> TrainState:
        rotation = _Rotation(self._initial_rotation(d, restart), self.config.retraction)
        rotation = rotation.to(device)
        return TrainState(
            rotation=rotation,
            optimizer=self._optimizer(rotation),
            partition=self._initial_partition(d),
            key_rotation=rotation().detach(),
            feed_generator=torch.empty(0, dtype=torch.uint8),
            feed_position={},
        )

    def _peek_width(self, feed: _Feed) -> int:
        if feed.pool is not None:
            return int(feed.pool.shape[1])
        assert feed.factory is not None
        for t in feed.factory():
            return int(torch.as_tensor(t).shape[-1])
        raise ValueError("the activation source yielded no tensors.")

    def _initial_partition(self, d: int) -> list[int]:
        cfg = self.config
        if cfg.initial_partition is not None:
            sizes = [int(s) for s in cfg.initial_partition]
            if sum(sizes) != d or any(s < 1 for s in sizes):
                raise ValueError(
                    f"initial_partition {sizes} must hold positive sizes summing to d={d} "
                    f"(it sums to {sum(sizes)})."
                )
            return sorted(sizes, reverse=True)
        if d % cfg.unit_size:
            raise ValueError(
                f"unit_size={cfg.unit_size} does not divide d={d}; choose a divisor of d or "
                "give initial_partition explicitly."
            )
        return [cfg.unit_size] * (d // cfg.unit_size)

    def _initial_rotation(self, d: int, restart: int = 0) -> torch.Tensor:
        """``init`` for restart 0; restart ``r`` takes the next Haar-random draw from ``seed``
        (with ``init="random"`` restart 0 is the first draw)."""
        draws = restart + (self.config.init == "random")
        if draws == 0:
            return torch.eye(d, dtype=torch.float64)
        g = torch.Generator().manual_seed(self.config.seed)
        for _ in range(draws):
            rotation = _haar(d, g)
        return rotation

    def _merge_round(
        self, keys: torch.Tensor, R: torch.Tensor, partition: list[int], step: int
    ) -> dict[str, Any] | None:
        """Estimate the subspaces' MI on the first ``mi_samples`` keys and plan a round; the
        merge-history entry carries the column permutation under ``"_perm"``."""
        cfg = self.config
        if len(partition) <= cfg.min_subspaces:
            return None
        z = keys[: cfg.mi_samples].to(torch.float64) @ R.to(keys.device)
        mi = subspace_mutual_information(z, partition, k=cfg.mi_k, standardize=True, normalize=True)
        plan = plan_merges(
            mi,
            partition,
            cfg.merge_threshold,
            max_pairs=cfg.max_merges_per_round,
            min_subspaces=cfg.min_subspaces,
        )
        if plan is None:
            return None
        return {
            "step": step,
            "pairs": [[a, b] for a, b in plan.pairs],
            "mi": plan.mi,
            "max_mi": plan.max_mi,
            "partition_before": list(partition),
            "partition_after": plan.partition_after,
            "_perm": plan.permutation,
        }


_DTYPES = {"float32": torch.float32, "float64": torch.float64}
_ADJOINT_DTYPES: dict[str, torch.dtype | None] = {"pytorch": None, **_DTYPES}


def _haar(d: int, gen: torch.Generator) -> torch.Tensor:
    """A Haar-random ``(d, d)`` orthogonal matrix (sign-corrected QR of a Gaussian)."""
    q, r = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def _best_split(
    span: torch.Tensor,
    keys: torch.Tensor,
    fit: torch.Tensor,
    test: torch.Tensor,
    cfg: NDMConfig,
    gen: torch.Generator,
    grid: int = 1,
) -> tuple[float, torch.Tensor, int] | None:
    """The split of ``span`` (``(d, b)`` orthonormal columns) into two parts of lowest
    held-out MI: ``(normalised MI, rotation Q of the span, size of the larger part)``, or
    ``None`` if ``b < 2 * grid``.  The smaller part's size runs over the multiples of ``grid``
    up to ``b / 2``; for each, the trial of lowest NDM loss on ``test`` among
    ``resplit_trials`` fits on ``fit`` is kept (see ``_fit_splits``)."""
    k, fit, test = (x.to(span.device) @ span for x in (keys, fit, test))
    b = span.shape[1]
    larges = [b - small for small in range(grid, b // 2 + 1, grid)]
    if not larges:
        return None
    trials = cfg.resplit_trials
    Qs = _fit_splits(k, fit, [large for large in larges for _ in range(trials)], cfg, gen)
    best: tuple[float, torch.Tensor, int] | None = None
    for i, large in enumerate(larges):
        sizes = [large, b - large]
        Q = min(Qs[i * trials : (i + 1) * trials], key=lambda Q: _split_loss(k, test, Q, sizes))
        mi = subspace_mutual_information(
            test @ Q, sizes, k=cfg.mi_k, standardize=True, normalize=True
        )[0, 1]
        if best is None or mi < best[0]:
            best = (float(mi), Q, large)
    return best


def _split_nearest(
    keys: torch.Tensor, queries: torch.Tensor, Q: torch.Tensor, sizes: list[int]
) -> torch.Tensor:
    """Exact nearest key of every query inside both parts of a split ``Q`` of a pair's span
    (``(2, b)``, as :meth:`RotatedKeys.nearest`); the span is small, so plain distances."""
    out, start = [], 0
    for size in sizes:
        cols = Q[:, start : start + size]
        dist = torch.cdist(queries @ cols, keys @ cols, compute_mode="donot_use_mm_for_euclid_dist")
        out.append(dist.argmin(1))
        start += size
    return torch.stack(out)


def _split_loss(
    keys: torch.Tensor, queries: torch.Tensor, Q: torch.Tensor, sizes: list[int]
) -> float:
    """NDM loss of the split ``Q`` of a pair's span (keys and queries already in the span)."""
    with torch.no_grad():
        nearest = _split_nearest(keys, queries, Q, sizes)
        return float(neighbor_distance_loss(queries, keys, nearest, Q, sizes))


def _fit_splits(
    keys: torch.Tensor,
    queries: torch.Tensor,
    larges: list[int],
    cfg: NDMConfig,
    gen: torch.Generator,
) -> list[torch.Tensor]:
    """NDM restricted to a span, one independent fit per entry of ``larges`` (the size of
    the first part): from Haar-random rotations ``Q`` of the span, ``resplit_steps`` Adam
    steps on batches of ``queries`` against all ``keys`` (``mi_samples`` rows, exact search).

    The fits run as one batch (a part is a column mask of its ``Q``), so many trials cost
    about as much as one; they share each step's query batch.  Adam is elementwise and the
    gradient is clipped per fit, so each fit is the single-split NDM on its own."""
    b = keys.shape[1]
    base = torch.stack([_haar(b, gen) for _ in larges]).to(keys.device)
    A = torch.zeros_like(base, requires_grad=True)
    first = (
        torch.arange(b, device=keys.device)[None, :]
        < torch.tensor(larges, device=keys.device)[:, None]
    ).to(keys.dtype)
    masks = torch.stack([first, 1.0 - first])[:, :, None, :]  # (part, fit, 1, b)
    opt = torch.optim.Adam([A], lr=cfg.resplit_lr, betas=cfg.betas)
    for _ in range(cfg.resplit_steps):
        q = queries[torch.randint(queries.shape[0], (cfg.batch_size,), generator=gen)]
        Q = base @ orthogonal_map(A - A.transpose(1, 2), cfg.retraction)
        with torch.no_grad():
            qz, kz = q @ Q, keys @ Q  # (fit, n, b)
            nearest = [
                torch.cdist(qz * m, kz * m, compute_mode="donot_use_mm_for_euclid_dist").argmin(2)
                for m in masks
            ]
        loss = sum(
            torch.linalg.vector_norm(((q - keys[idx]) @ Q) * m, dim=2).mean(1)
            for idx, m in zip(nearest, masks, strict=True)
        )
        opt.zero_grad(set_to_none=True)
        (loss.sum() / 2).backward()
        if cfg.grad_clip is not None:
            assert A.grad is not None
            norm = torch.linalg.vector_norm(A.grad.flatten(1), dim=1)
            A.grad.mul_((cfg.grad_clip / (norm + 1e-6)).clamp(max=1.0)[:, None, None])
        opt.step()
    with torch.no_grad():
        return list(base @ orthogonal_map(A - A.transpose(1, 2), cfg.retraction))


def _jsonable_config(cfg: NDMConfig) -> dict[str, Any]:
    return json.loads(json.dumps(cfg.to_dict()))


def _run_directory(root: Path, provenance: dict[str, Any]) -> Path:
    """``root / run-<key>`` for this run's provenance (restart ``r`` checkpoints in its
    ``restart-<r>``); warns when ``root`` holds checkpoints of other inputs (they are kept,
    never resumed), naming the inputs that differ."""
    key = hashlib.sha256(json.dumps(provenance, sort_keys=True).encode()).hexdigest()[:16]
    run_dir = root / f"run-{key}"
    if not run_dir.is_dir():
        if (root / "checkpoint.json").exists():
            warnings.warn(
                f"{root} holds a checkpoint without provenance (older structlens); it is not "
                "resumed.",
                stacklevel=3,
            )
        changed = {}
        for path in sorted(root.glob("run-*/restart-*/checkpoint.json")):
            theirs = json.loads(path.read_text()).get("provenance", {})
            changed[path.parent.parent] = [
                name for name in provenance if theirs.get(name) != provenance[name]
            ]
        if changed:
            closest = min(changed, key=lambda p: len(changed[p]))
            warnings.warn(
                f"not resuming the {len(changed)} checkpoint(s) in {root}, written for other "
                f"inputs (the closest, {closest.name}: its {', '.join(changed[closest])} "
                f"differ); starting fresh in {run_dir.name}.",
                stacklevel=3,
            )
    return run_dir


def subspace_variances(
    h: np.ndarray | torch.Tensor, rotation: np.ndarray, partition: Sequence[int]
) -> list[float]:
    """Total variance of the activations inside each subspace (for variance-normalised Gini).

    ``h`` is ``(n, d)`` (rows = samples); returns ``sum_c var(z[:, c])`` over each block's
    columns of ``z = h @ rotation``.
    """
    z = np.asarray(h, dtype=np.float64) @ np.asarray(rotation, dtype=np.float64)
    var = z.var(0)
    bounds = np.concatenate([[0], np.cumsum(partition)])
    return [float(var[bounds[s] : bounds[s + 1]].sum()) for s in range(len(partition))]

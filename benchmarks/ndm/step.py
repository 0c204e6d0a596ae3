"""NDM training step against its FLOP bound and against the reference implementation.

One run measures the machine's float32 GEMM rate on the step's shapes, times our full
training step (rotation, neighbour search, exact loss, backward) and the reference code's
(``Sappique/SubspacePartition``, ``NewUnevenRTrainer.step`` + backward) on the same keys,
queries and rotation, and divides the step's FLOP count by the measured rate.

FLOP count of one step (``B`` queries, ``K`` keys, width ``d``, ``r`` re-ranked candidates,
re-projection every ``P`` steps), the bound's numerator:

* search scores ``2 B K d`` (every key's inner product with every query, summed over the
  subspaces' widths, which add up to ``d``);
* re-ranking ``2 B r d^2`` (each candidate's raw difference projected on its subspace's
  ``d x d_s`` block, all subspaces together) and the exact loss ``2 B d^2`` forward plus
  ``4 B d^2`` backward (gradients to the difference's projection and to ``R``);
* the bank's projection ``2 K d^2``, once every ``P`` steps, so ``2 K d^2 / P`` per step;
* ``R = B Q``: ``2 d^3`` forward and ``2 d^3`` backward (the gradient to ``Q``);
* the retraction ``Q(W)``, ``W = A - A^T``: the exponential as PyTorch computes it, a
  degree-18 Taylor approximant in 5 products after ``s = ceil(log2(|W|_1 / 1.09))``
  squarings, ``2 (5 + s) d^3`` forward, and its adjoint Fréchet derivative on the
  block-triangular ``[[W^T, G], [0, W^T]]`` in float32 (``structlens.ndm.expm``): a
  degree-15 Taylor approximant after ``s'`` squarings, ``s'`` from the skew bound
  ``|W^4|_1^{1/4} >= |W|_2`` against float32's threshold 2.12, in
  ``expm.adjoint_products(s')`` products (17 at ``s' = 0``), ``2 adjoint_products(s') d^3``
  backward; the Cayley map with the product by ``B`` folded in (``R = 2 B (I - W/2)^{-1} -
  B``, as training computes it): LU ``2/3 d^3`` and a solve with ``d`` right-hand sides
  ``2 d^3`` forward, one more such solve and one product ``4 d^3`` backward, and no separate
  ``R = B Q``.

``fraction_of_flop_bound`` is that count over the best of the GEMM rates (measured just
before each timed variant, since load on a shared machine moves them), divided by the measured
step (with the re-projection amortised over ``P`` steps); 1 would be every FLOP at the GEMM
rate.  The exponential's backward is counted as the block-triangular float32 adjoint, the
least arithmetic known here for the float32 loss's gradient, whichever gradient a variant
uses.  ``speedup_vs_reference`` is the reference step's time over ours (per variant, and for
the bank as a whole that of ``exp``).  Neither side's optimiser step is
timed.  The reference projects every key with the current ``R`` in every step (its
``search_steps`` blocks of ``block_len`` keys), recomputes PyTorch's orthogonal
parametrisation at each use, and keeps ``R`` in float32.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from structlens.ndm.expm import adjoint_products, norm_bound, squarings
from structlens.ndm.ndm import _Rotation
from structlens.ndm.search import PROJECT_ROWS, TILE, RotatedKeys, neighbor_distance_loss

VARIANTS: dict[str, tuple[str, torch.dtype | None]] = {
    "exp": ("exp", torch.float32),
    "exp_pytorch_gradient": ("exp", None),
    "exp_float64_gradient": ("exp", torch.float64),
    "cayley": ("cayley", None),
}
"""Our steps timed: retraction and the exponential's gradient (``NDMConfig.exp_gradient``).
``exp`` is the default (``exp_gradient="float32"``: the ``d x d`` Fréchet derivative in
float32), whose numbers are the bank's headline ones; ``exp_float64_gradient`` the same
derivative in float64; ``exp_pytorch_gradient`` is autograd's
``2d x 2d`` block exponential (the default before, and the reference the others are tested
against)."""

THETA_EXP = 1.090863719290036
"""PyTorch's float64 threshold for its degree-18 Taylor approximant (``|W|_1`` after scaling)."""


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def gemm_rates(d: int, batch: int, size: int, n_sub: int) -> dict[str, float]:
    """Float32 GEMM rate (FLOP/s) on the step's shapes: the retraction's ``d x d`` product,
    the bank projection's ``(PROJECT_ROWS, d) x (d, d)`` and the search's batched
    ``(n_sub, batch, size) x (n_sub, size, TILE)`` score product."""
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(d, d, generator=gen), torch.randn(d, d, generator=gen)
    rows = torch.randn(PROJECT_ROWS, d, generator=gen)
    q = torch.randn(n_sub, batch, size, generator=gen)
    k = torch.randn(n_sub, size, TILE, generator=gen)
    shapes = {
        "square_d": (lambda: a @ b, 2 * d**3),
        "projection": (lambda: rows @ a, 2 * PROJECT_ROWS * d * d),
        "search_tile": (lambda: torch.bmm(q, k), 2 * n_sub * batch * size * TILE),
    }
    return {name: flops / median_time(fn, 7) for name, (fn, flops) in shapes.items()}


def step_flops(
    batch: int, bank: int, d: int, rerank: int, interval: int, W: torch.Tensor, retraction: str
) -> dict[str, float]:
    """The step's FLOP count by part (see the module docstring)."""
    if retraction == "exp":
        w_norm = float(torch.linalg.matrix_norm(W, 1))
        s_fwd = max(0, math.ceil(math.log2(max(w_norm, 1e-300) / THETA_EXP)))
        Wt = W.mT.float()
        s_bwd = squarings(norm_bound(Wt, torch.linalg.matrix_power(Wt, 4)), torch.float32)
        retract = 2 * (5 + s_fwd) * d**3 + 2 * adjoint_products(s_bwd) * d**3
    else:
        retract = (2 / 3 + 2 + 4) * d**3  # with the product by B
    return {
        "search": 2 * batch * bank * d,
        "rerank_and_loss": 2 * batch * rerank * d**2 + 6 * batch * d**2,
        "projection_amortised": 2 * bank * d**2 / interval,
        "rotation_product": 4 * d**3 if retraction == "exp" else 0,
        "retraction": retract,
    }


def time_ours(
    keys: torch.Tensor,
    queries: list[torch.Tensor],
    rotation: _Rotation,
    partition: list[int],
    rerank: int,
    adjoint_dtype: torch.dtype | None,
) -> dict[str, float]:
    """Median of our training step (as ``NDM._step``: rotation, search, loss, backward; the
    exponential's gradient in ``adjoint_dtype``, ``None`` for PyTorch's) and of the bank
    projection, on the given queries in turn."""
    index = RotatedKeys(keys, rotation().detach(), partition)
    batches = itertools.cycle(queries)

    def step() -> None:
        q = next(batches)
        rotation.A.grad = None
        R = rotation(adjoint_dtype, keys.dtype)  # as NDM._step: Cayley in the loss's dtype
        nn = index.nearest(q, R.detach(), rerank)
        neighbor_distance_loss(q, keys, nn, R, partition).backward()

    R0 = rotation().detach()
    return {
        "step_s": median_time(step, len(queries) - 1),
        "projection_s": median_time(lambda: RotatedKeys(keys, R0, partition), 1, warmup=0),
    }


def load_reference(root: Path) -> type:
    """``NewUnevenRTrainer`` from a checkout of Sappique/SubspacePartition at ``root``; its
    data module's model and dataset imports (unused by the step) are stubbed."""
    for name, attrs in {
        "transformer_lens": ["HookedTransformer"],
        "datasets": ["load_dataset", "concatenate_datasets", "load_from_disk"],
    }.items():
        if name not in sys.modules:
            module = types.ModuleType(name)
            for attr in attrs:
                setattr(module, attr, object)
            sys.modules[name] = module
    sys.path.insert(0, str(root))
    from subspace_partition.training.model import NewUnevenRTrainer

    return NewUnevenRTrainer


class _ReferenceBuffer:
    """The reference's ``BufferReuse`` interface over fixed tensors: ``pop_one`` hands out the
    query batches in turn, ``next`` the key bank's blocks cyclically."""

    buffer_dtype = torch.float32

    def __init__(self, keys: torch.Tensor, block_len: int, queries: list[torch.Tensor]) -> None:
        self.blocks = list(keys.split(block_len))
        self.block_len = block_len
        self.queries = queries
        self.cursor = self.popped = 0

    def pop_one(self, bz: int) -> torch.Tensor:
        self.cursor = 0
        self.popped += 1
        return self.queries[(self.popped - 1) % len(self.queries)]

    def __next__(self) -> torch.Tensor:
        block = self.blocks[self.cursor % len(self.blocks)]
        self.cursor += 1
        return block


def time_reference(
    trainer_cls: type,
    keys: torch.Tensor,
    queries: list[torch.Tensor],
    base: torch.Tensor,
    lower: torch.Tensor,
    partition: list[int],
    block_len: int,
) -> float:
    """Median of the reference's ``step()`` + backward with ``R = base exp(W)``, ``W = lower -
    lower^T`` (``lower`` strictly lower triangular; euclidean metric, all of ``keys`` searched
    in blocks of ``block_len``)."""
    d, batch = keys.shape[1], queries[0].shape[0]
    cfg = types.SimpleNamespace(
        metric="euclidean", search_steps=keys.shape[0] // block_len, batch_size=batch
    )
    buffer = _ReferenceBuffer(keys, block_len, queries)
    trainer = trainer_cls(d, partition, cfg, buffer, previous_R=base.float())
    with torch.no_grad():  # the parametrisation keeps tril(original) - tril(original)^T
        trainer.R.parametrizations.weight.original.copy_(lower)

    def step() -> None:
        trainer.zero_grad(set_to_none=True)
        trainer.step().backward()

    return median_time(step, len(queries) - 1)


def bench_step(
    reference: Path | None,
    banks: list[int],
    d: int = 576,
    batch: int = 128,
    unit: int = 32,
    repeats: int = 5,
    rerank: int = 8,
    interval: int = 10,
    block_len: int = 16_384,
) -> dict:
    """Our step (exponential and Cayley) and the reference's at each bank size in ``banks``
    (multiples of ``block_len``, or smaller than it: one block), on standard-normal keys and
    queries and one rotation ``base exp(W)`` whose ``A`` has N(0, 0.01^2) entries below the
    diagonal (a rotation some way from its restart point)."""
    gen = torch.Generator().manual_seed(0)
    partition = [unit] * (d // unit)
    base = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))[0]
    lower = (0.01 * torch.randn(d, d, generator=gen, dtype=torch.float64)).tril(-1)
    w_norm = float(torch.linalg.matrix_norm(lower - lower.T, 1))
    trainer_cls = None if reference is None else load_reference(reference)
    rows = []
    for bank in banks:
        keys = torch.randn(bank, d, generator=gen)
        queries = [torch.randn(batch, d, generator=gen) for _ in range(repeats + 1)]
        row: dict = {"bank": bank}
        for name, (retraction, adjoint) in VARIANTS.items():
            rotation = _Rotation(base, retraction)
            with torch.no_grad():
                rotation.A.copy_(lower)
            # The rate is measured next to each timing: on a shared machine it moves with load.
            rates = gemm_rates(d, batch, unit, len(partition))
            rate = max(rates.values())
            t = time_ours(keys, queries, rotation, partition, rerank, adjoint)
            flops = step_flops(batch, bank, d, rerank, interval, lower - lower.T, retraction)
            measured = t["step_s"] + t["projection_s"] / interval
            bound = sum(flops.values()) / rate
            row[name] = {
                **t,
                "amortised_step_s": measured,
                "flops": flops,
                "gemm_flops_per_s": rates,
                "flop_bound_s": bound,
                "fraction_of_flop_bound": bound / measured,
            }
        row["fraction_of_flop_bound"] = row["exp"]["fraction_of_flop_bound"]
        if trainer_cls is not None:
            ref = time_reference(
                trainer_cls, keys, queries, base, lower.float(), partition, min(block_len, bank)
            )
            row["reference_step_s"] = ref
            for name in VARIANTS:
                row[name]["speedup_vs_reference"] = ref / row[name]["amortised_step_s"]
            row["speedup_vs_reference"] = row["exp"]["speedup_vs_reference"]
        rows.append(row)
        print(row, flush=True)
    return {
        "d": d,
        "batch": batch,
        "partition": partition,
        "rerank": rerank,
        "reproject_interval": interval,
        "w_norm_1": w_norm,
        "torch_threads": torch.get_num_threads(),
        "banks": rows,
    }

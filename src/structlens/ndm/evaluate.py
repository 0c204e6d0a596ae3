"""Subspace activation patching: how concentrated a circuit's information is across subspaces.

Huang & Hahn evaluate a decomposition ``(R, partition)`` by patching one subspace at a time
from a corrupted run into the clean run at a few token positions of one layer and measuring
the drop of the task metric.  If the decomposition is good, one subspace carries (almost) the
whole effect of patching the entire space, and the Gini coefficient of the per-subspace
effects is high.

Conventions
-----------
* Activations are rows; subspace ``s`` of a rotation ``R`` is its column block
  ``partition[s]``; patching it at the selected positions sets
  ``x <- x + (x_corrupt - x) Q Q^T`` with ``Q`` that block (as
  :func:`structlens.interventions.patch` with ``basis=subspace_basis(R, cols)``).
* The effect of a patch on prompt ``i`` is ``metric_clean(i) - metric_patched(i)`` (positive
  when patching destroys the behaviour), always scored against the clean prompt's answers.
  The *normalised* effect divides the mean effect by the mean effect of patching the whole
  space at the same positions.
* Gini coefficients use the mean (over prompts) effect per subspace, see
  :mod:`structlens.stats.gini`; confidence intervals are percentile bootstraps over prompts.

GPT-2 small (12 layers) to a model with ``L`` layers: ``resid_post`` of layer ``l`` sits after
``l + 1`` of 12 blocks; the matching layer is ``round((l + 1) L / 12) - 1`` with halves rounded
up, so 4, 6, 8, 9 map to 12, 17, 22, 24 for SmolLM2's 30 layers (relative depths 0.417, 0.583,
0.75, 0.833 vs 0.433, 0.6, 0.767, 0.833).  Under the protocol's share sweep a test's layer is
the candidate of :func:`sweep_candidates` chosen by :func:`choose_layer` instead.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from structlens.data.tasks import TaskDataset, make_task, pad_batch
from structlens.data.tasks.induction import make_induction
from structlens.interventions import run_with_cache
from structlens.interventions.fastrun import metric_logits, resumed, truncated
from structlens.models.loading import Model
from structlens.results import Result
from structlens.sites import site_name
from structlens.stats.gini import (
    gini,
    gini_dimension_normalized,
    gini_rows,
    gini_variance_normalized,
)
from structlens.stats.intervals import percentile_interval

GINI_VARIANTS = ("unnormalized", "dimension", "variance")


@dataclasses.dataclass(frozen=True)
class PatchTest:
    """One subspace patching test of the paper.

    ``layer`` is the GPT-2-small ``resid_post`` layer of the paper (see :func:`map_layer`),
    ``positions`` names the task positions patched (``task.positions[name]``), ``corruption``
    a key of ``task.corrupted`` or ``"name_swap"`` (:func:`name_swap_corruption`).
    """

    name: str
    task: str
    corruption: str
    gpt2_layer: int
    positions: tuple[str, ...]


PAPER_TESTS: tuple[PatchTest, ...] = (
    PatchTest("previous_token", "ioi", "position_swap", 4, ("IO+1", "S+1")),
    PatchTest("duplicate_token", "ioi", "position_swap", 6, ("S2",)),
    PatchTest("s_inhibition_position", "ioi", "position_swap", 8, ("END",)),
    PatchTest("s_inhibition_name", "ioi", "name_swap", 8, ("END",)),
    PatchTest("greater_than", "greater_than", "01", 9, ("METRIC",)),
)

# Tests on the repeated-sequence task (:mod:`structlens.data.tasks.induction`), whose
# mechanism is relative: they replace the position-swap tests on rotary-embedding models.
ROPE_TESTS: tuple[PatchTest, ...] = (
    PatchTest("previous_token_relative", "induction", "prev_swap", 4, ("A+1",)),
    PatchTest("induction", "induction", "resample_first", 6, ("END",)),
)


def uses_rope(model: Model) -> bool:
    """Whether the model encodes positions by rotary embeddings (no absolute-position
    subspace in the residual stream), read from its Hugging Face config."""
    cfg = model.hf.config
    if getattr(cfg, "position_embedding_type", None) in ("absolute", "relative_key"):
        return False
    attrs = ("rope_parameters", "rope_theta", "rotary_pct", "rotary_dim")  # per release
    return any(getattr(cfg, attr, None) is not None for attr in attrs)


def patch_tests_for(model: Model) -> tuple[PatchTest, ...]:
    """The paper's tests, with the ``position_swap`` tests (which need an absolute-position
    subspace) replaced by :data:`ROPE_TESTS` on a rotary-embedding model."""
    if not uses_rope(model):
        return PAPER_TESTS
    kept = tuple(t for t in PAPER_TESTS if t.corruption != "position_swap")
    return ROPE_TESTS + kept


def make_test_task(test: PatchTest, tokenizer: Any, *, n: int, seed: int = 0) -> TaskDataset:
    """The task dataset a test runs on: the registry's task, or the repeated-sequence task of
    :data:`ROPE_TESTS` (built here, so the circuit-task registry and everything that iterates
    it are unchanged)."""
    if test.task == "induction":
        return make_induction(tokenizer, n=n, seed=seed)
    return make_task(test.task, tokenizer, n=n, seed=seed)


def map_layer(gpt2_layer: int, n_layers: int, source_layers: int = 12) -> int:
    """The layer of an ``n_layers`` model at the relative depth of ``gpt2_layer`` of 12."""
    if not 0 <= gpt2_layer < source_layers:
        raise ValueError(f"gpt2_layer must be in [0, {source_layers}), got {gpt2_layer}.")
    return int(math.floor((gpt2_layer + 1) * n_layers / source_layers + 0.5)) - 1


def sweep_candidates(mapped: int, n_layers: int, window: int) -> tuple[int, ...]:
    """The layers of an ``n_layers`` model within ``window`` layers of ``mapped``: the
    candidates of a test's share sweep."""
    if not 0 <= mapped < n_layers or window < 0:
        raise ValueError(
            f"need 0 <= mapped < n_layers and window >= 0; got mapped={mapped}, "
            f"n_layers={n_layers}, window={window}."
        )
    return tuple(range(max(0, mapped - window), min(n_layers, mapped + window + 1)))


#: Level of the paired test a layer must pass to take a test off its mapped layer (Holm's
#: adjustment over the window's other candidates).
SWEEP_ALPHA = 0.05


def share_gain_p(runs: Sequence[PatchRun], mapped: int) -> tuple[float, ...]:
    """One-sided p-values that each run's whole-space share exceeds that of ``runs[mapped]``.

    The runs patch the same prompts at different layers, so the comparison is paired: a t
    test (n − 1 degrees of freedom) of the per-prompt differences of the whole-space effects
    (every run's share has the same clean-metric denominator).  NaN at ``mapped`` itself,
    where a share is NaN (no behaviour to remove) and with fewer than two prompts; a
    difference without spread gives 0 when positive, else 1.
    """
    from scipy.stats import t as student_t

    ref = runs[mapped]
    if not math.isfinite(whole_space_share(ref)) or len(ref.full_effect) < 2:
        return (float("nan"),) * len(runs)
    out = []
    for i, run in enumerate(runs):
        if i == mapped or not math.isfinite(whole_space_share(run)):
            out.append(float("nan"))
            continue
        diff = np.asarray(run.full_effect, float) - np.asarray(ref.full_effect, float)
        mean, sd = float(diff.mean()), float(diff.std(ddof=1))
        if sd == 0.0:
            out.append(0.0 if mean > 0 else 1.0)
            continue
        out.append(float(student_t.sf(mean / (sd / math.sqrt(diff.size)), diff.size - 1)))
    return tuple(out)


def choose_layer(
    mapped: int,
    candidates: Sequence[int],
    shares: Sequence[float],
    errors: Sequence[float],
    p_values: Sequence[float],
    alpha: float = SWEEP_ALPHA,
) -> int:
    """The share sweep's rule, fixed before any share is seen: the candidate nearest
    ``mapped`` (the shallower at equal distance) among those whose whole-space share is
    within one standard error (``errors``) of the largest share, where a candidate other
    than ``mapped`` counts only if its paired gain over ``mapped`` (``p_values``,
    :func:`share_gain_p`) survives Holm's adjustment over the other candidates at
    ``alpha``; ``mapped`` when none counts.

    This is the one-standard-error rule of model selection with the paper's depth as the
    default and a test to leave it: a test moves only to a layer that carries the task by
    more than the noise of the selection prompts, measured on the same prompts (the
    layers' per-prompt effects are correlated) and over every candidate it could have
    moved to.  Equal or indistinguishable shares keep it where the paper put it.
    Non-finite shares (a model that does not do the task) never count; with none finite the
    layer stays ``mapped``; a best share without a finite error counts alone.

    >>> layers, shares = (10, 11, 12, 13, 14), (0.2, 0.5, 0.56, 0.9, 0.3)
    >>> choose_layer(12, layers, shares, (0.05,) * 5, (0.2, 0.3, float("nan"), 0.001, 0.4))
    13
    >>> choose_layer(12, layers, shares, (0.05,) * 5, (0.2, 0.3, float("nan"), 0.04, 0.4))
    12
    """
    if not len(candidates) == len(shares) == len(errors) == len(p_values):
        raise ValueError(
            f"{len(candidates)} candidate layers for {len(shares)} shares, {len(errors)} "
            f"standard errors and {len(p_values)} p-values."
        )
    finite = [(float(s), float(e), int(c))
              for c, s, e in zip(candidates, shares, errors) if math.isfinite(s)]  # fmt: skip
    if not finite:
        return int(mapped)
    best, error, _ = max(finite)
    floor = best - (error if math.isfinite(error) else 0.0)
    tested = [(int(c), float(p)) for c, p in zip(candidates, p_values)
              if c != mapped and math.isfinite(p)]  # fmt: skip
    beats = set()
    if tested:
        from structlens.stats.multiplicity import holm

        rejected = holm([p for _, p in tested], alpha).rejected
        beats = {c for (c, _), r in zip(tested, rejected, strict=True) if r}
    counted = [c for s, _, c in finite if s >= floor and (c == mapped or c in beats)]
    if not counted:
        return int(mapped)
    return min(counted, key=lambda c: (abs(c - mapped), c))


def name_swap_corruption(task: TaskDataset) -> list[list[int]]:
    """The paper's ``S_name`` corruption of IOI: the S name (both mentions) becomes the IO name
    and the IO name becomes the S name, so the lengths and positions stay the same."""
    if task.name != "ioi":
        raise ValueError(f"name_swap is defined for the ioi task, got {task.name!r}.")
    out = []
    for i, toks in enumerate(task.clean):
        t = list(toks)
        io, s, s2 = (task.positions[k][i] for k in ("IO", "S", "S2"))
        t[io], t[s], t[s2] = toks[s], toks[io], toks[io]
        out.append(t)
    return out


def corrupted_prompts(task: TaskDataset, corruption: str) -> list[list[int]]:
    if corruption == "name_swap":
        return name_swap_corruption(task)
    if corruption not in task.corrupted:
        raise ValueError(
            f"task {task.name!r} has no corruption {corruption!r}; "
            f"choose from {sorted(task.corrupted)} (or 'name_swap' for ioi)."
        )
    return [list(t) for t in task.corrupted[corruption]]


def metric_positions(task: TaskDataset) -> list[list[int]]:
    """Per prompt, the positions whose logits the task metric reads."""
    return [
        [task.positions[name][i] for name in task.metric_positions] for i in range(len(task.clean))
    ]


def patch_positions(task: TaskDataset, names: Sequence[str]) -> list[list[int]] | None:
    """Per-prompt positions for the given names; ``"METRIC"`` means the metric positions and
    ``"ALL"`` every position (returned as ``None``)."""
    if list(names) == ["ALL"]:
        return None
    out: list[list[int]] = [[] for _ in task.clean]
    for name in names:
        rows = (
            metric_positions(task)
            if name == "METRIC"
            else [[p] for p in task.positions[name]]
            if name in task.positions
            else None
        )
        if rows is None:
            raise ValueError(
                f"task {task.name!r} has no position {name!r}; choose from "
                f"{sorted(task.positions)}, 'METRIC' or 'ALL'."
            )
        for i, r in enumerate(rows):
            out[i] += r
    return out


@dataclasses.dataclass(frozen=True)
class PatchRun(Result):
    """Per-prompt outputs of patching each subspace (``bases[s]``) and the whole space.

    ``effects[i, s] = clean_metric[i] - patched_metric[i, s]``; ``full_effect`` is the same for
    the whole space; ``top1[i, s]`` the top-1 token at the last metric position of each patched
    run (``top1_clean`` / ``top1_full`` likewise), for routing analyses.
    """

    clean_metric: np.ndarray
    corrupt_metric: np.ndarray
    effects: np.ndarray
    full_effect: np.ndarray
    top1: np.ndarray
    top1_clean: np.ndarray
    top1_full: np.ndarray

    def mean_effects(self) -> np.ndarray:
        return self.effects.mean(0)

    def normalized_effects(self) -> np.ndarray:
        """Mean effect per subspace divided by the mean whole-space effect."""
        return self.effects.mean(0) / self.full_effect.mean()


def _check_bases(bases: Sequence[np.ndarray | torch.Tensor], d: int) -> list[torch.Tensor]:
    out = []
    for s, b in enumerate(bases):
        q = torch.as_tensor(np.asarray(b), dtype=torch.float64)
        if q.ndim != 2 or q.shape[0] != d:
            raise ValueError(f"basis {s} must be (d={d}, k), got {tuple(q.shape)}.")
        if not torch.allclose(q.T @ q, torch.eye(q.shape[1], dtype=q.dtype), atol=1e-4):
            raise ValueError(f"basis {s} does not have orthonormal columns.")
        out.append(q)
    return out


def patch_subspaces(
    model: Model,
    task: TaskDataset,
    corrupted: Sequence[Sequence[int]],
    layer: int,
    positions: Sequence[Sequence[int]] | None,
    bases: Mapping[str, Sequence[np.ndarray | torch.Tensor]],
    *,
    batch_size: int = 16,
    stack_rows: int = 256,
) -> dict[str, PatchRun]:
    """Patch every subspace of every method from the corrupted run at ``resid_post`` of
    ``layer`` and the given positions (``None``: all), and score the task metric.

    ``bases`` maps a method name to its list of ``(d, d_s)`` orthonormal bases.  Prompts are
    batched (``batch_size``); the clean and corrupted ``resid_post`` are computed once per
    batch (the model truncated after ``layer``) and each patched run only computes the layers
    after ``layer`` (:func:`structlens.interventions.fastrun.resumed`), unembedding only the
    metric positions.  Patched copies of a batch, one per subspace, are stacked along the
    batch dimension into forward passes of at most ``stack_rows`` rows (at least one copy per
    pass; ``stack_rows=1`` runs one pass per subspace): the numbers are those of separate
    passes up to floating-point round-off, and a large vocabulary's unembedding matrix is read
    once per pass instead of once per subspace.  Returns one :class:`PatchRun` per method.
    """
    n = len(task.clean)
    if len(corrupted) != n:
        raise ValueError(f"{len(corrupted)} corrupted prompts for {n} clean prompts.")
    if any(len(c) != len(t) for c, t in zip(corrupted, task.clean, strict=True)):
        raise ValueError("every corrupted prompt must have its clean prompt's length.")
    if positions is not None and len(positions) != n:
        raise ValueError(f"{len(positions)} position lists for {n} prompts.")
    if stack_rows < 1:
        raise ValueError(f"stack_rows must be at least 1, got {stack_rows}.")
    checked = {m: _check_bases(b, model.d_model) for m, b in bases.items()}
    batches = [
        _patch_batch(
            model, task, corrupted, layer, positions, checked,
            list(range(start, min(n, start + batch_size))), stack_rows,
        )
        for start in range(0, n, batch_size)
    ]  # fmt: skip
    return {
        method: PatchRun(
            clean_metric=np.concatenate([b.clean_metric for b in batches]),
            corrupt_metric=np.concatenate([b.corrupt_metric for b in batches]),
            effects=np.concatenate([b.effects[method] for b in batches]),
            full_effect=np.concatenate([b.full_effect for b in batches]),
            top1=np.concatenate([b.top1[method] for b in batches]),
            top1_clean=np.concatenate([b.top1_clean for b in batches]),
            top1_full=np.concatenate([b.top1_full for b in batches]),
        )
        for method in checked
    }


@dataclasses.dataclass(frozen=True)
class _BatchRun:
    """One prompt batch's share of every method's :class:`PatchRun` (``effects`` and
    ``top1`` per method)."""

    clean_metric: np.ndarray
    corrupt_metric: np.ndarray
    full_effect: np.ndarray
    top1_clean: np.ndarray
    top1_full: np.ndarray
    effects: dict[str, np.ndarray]
    top1: dict[str, np.ndarray]


def _patch_batch(
    model: Model,
    task: TaskDataset,
    corrupted: Sequence[Sequence[int]],
    layer: int,
    positions: Sequence[Sequence[int]] | None,
    bases: Mapping[str, Sequence[torch.Tensor]],
    idx: list[int],
    stack_rows: int,
) -> _BatchRun:
    """Clean, corrupted, whole-space and every subspace patch of prompts ``idx``, scored in
    stacks of ``max(1, stack_rows // len(idx))`` (:func:`_score_stacked`)."""
    pad = model.tokenizer.pad_token_id or 0
    ids, mask = pad_batch([task.clean[i] for i in idx], pad)
    cids, _ = pad_batch([list(corrupted[i]) for i in idx], pad)
    ids, mask, cids = ids.to(model.device), mask.to(model.device), cids.to(model.device)
    site = site_name("resid_post", layer)
    with truncated(model, layer):
        _, cache = run_with_cache(model, ids, mask, [site])
        _, ccache = run_with_cache(model, cids, mask, [site])
    clean, corrupt = cache[site].double(), ccache[site].double()
    delta = corrupt - clean
    if positions is not None:
        pmask = torch.zeros(delta.shape[:2], dtype=torch.float64, device=delta.device)
        for r, i in enumerate(idx):
            pmask[r, list(positions[i])] = 1.0
        delta = delta * pmask[..., None]
    whole = clean + delta
    # with positions, the corrupted run is the corrupted prompt itself, not a patch
    residuals: list[Callable[[], torch.Tensor]] = [
        lambda: clean, lambda: whole if positions is None else corrupt, lambda: whole
    ]  # fmt: skip
    residuals += [partial(_project, clean, delta, q) for qs in bases.values() for q in qs]
    metrics, tops = _score_stacked(
        model, task, layer, (ids, mask, idx), residuals, max(1, stack_rows // len(idx))
    )
    m_clean = metrics[0]
    effects, top1, offset = {}, {}, 3
    for method, qs in bases.items():
        own = slice(offset, offset + len(qs))
        offset += len(qs)
        if qs:
            effects[method] = np.stack([m_clean - m for m in metrics[own]], 1)
            top1[method] = np.stack(tops[own], 1)
        else:
            effects[method] = np.empty((len(idx), 0))
            top1[method] = np.empty((len(idx), 0), np.int64)
    return _BatchRun(
        clean_metric=m_clean,
        corrupt_metric=metrics[1],
        full_effect=m_clean - metrics[2],
        top1_clean=tops[0],
        top1_full=tops[2],
        effects=effects,
        top1=top1,
    )


def _project(clean: torch.Tensor, delta: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The clean residual with the part of ``delta`` in subspace ``q`` added: ``q``'s patch."""
    q = q.to(delta.device)
    return clean + (delta @ q) @ q.T


def _score_stacked(
    model: Model,
    task: TaskDataset,
    layer: int,
    batch: tuple[torch.Tensor, torch.Tensor, list[int]],
    residuals: Sequence[Callable[[], torch.Tensor]],
    stack: int,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Task metric and top-1 token of one prompt batch resumed from each of ``residuals``.

    ``stack`` residuals at a time are concatenated along the batch dimension and run in one
    resumed forward pass.  Rows do not interact, so each gets its own pass's numbers, while
    the per-pass costs (probing and swapping the layers; reading the unembedding matrix,
    which dominates small batches with a large vocabulary) are paid once per stack.  A
    residual is built only when its stack runs, so memory holds ``stack`` of them.

    Parameters
    ----------
    batch
        The batch's input ids and attention mask ``[b, seq]`` and its prompt indices.
    residuals
        Each returns a ``resid_post`` of ``layer``, ``[b, seq, d]``.

    Returns
    -------
    metrics, tops : list of ndarray
        Per residual, the float64 metric and the top-1 token at the last metric position of
        each prompt of the batch.
    """
    ids, mask, idx = batch
    every = metric_positions(task)
    mpos = [every[i] for i in idx]
    metrics: list[np.ndarray] = []
    tops: list[np.ndarray] = []
    for start in range(0, len(residuals), stack):
        chunk = residuals[start : start + stack]
        k = len(chunk)
        resid = torch.cat([make() for make in chunk])
        with torch.no_grad(), resumed(model, layer, resid):
            logits = metric_logits(model, ids.repeat(k, 1), mask.repeat(k, 1), mpos * k)
        metric = task.metric(logits[:, 0] if logits.shape[1] == 1 else logits, idx * k)
        metrics += list(metric.double().cpu().numpy().reshape(k, len(idx)))
        tops += list(logits[:, -1].argmax(-1).cpu().numpy().reshape(k, len(idx)))
    return metrics, tops


def whole_space_run(
    model: Model,
    task: TaskDataset,
    corrupted: Sequence[Sequence[int]],
    layer: int,
    positions: Sequence[Sequence[int]] | None,
    *,
    batch_size: int = 16,
) -> PatchRun:
    """Clean, corrupted and whole-space-patched metrics only (no subspace): what the screen
    needs, at the cost of three forward passes per batch."""
    return patch_subspaces(
        model, task, corrupted, layer, positions, {"whole": []}, batch_size=batch_size
    )["whole"]


def whole_space_share(run: PatchRun) -> float:
    """Mean whole-space patching effect as a fraction of the mean clean metric.

    NaN when the clean metric's mean is not positive: the model does not do the task, so
    there is no behaviour for a patch to remove.
    """
    clean = float(np.mean(run.clean_metric))
    return float(np.mean(run.full_effect)) / clean if clean > 0 else float("nan")


def whole_space_share_error(run: PatchRun) -> float:
    """The standard error over prompts of :func:`whole_space_share`, the mean clean metric
    held fixed (the same prompts' clean run is every candidate layer's denominator, so only
    the whole-space effect varies between layers).  NaN where the share is, or with fewer
    than two prompts."""
    clean, full = float(np.mean(run.clean_metric)), np.asarray(run.full_effect, dtype=float)
    if clean <= 0 or full.size < 2:
        return float("nan")
    return float(full.std(ddof=1) / math.sqrt(full.size)) / clean


def gini_variants(
    mean_effects: np.ndarray, dims: Sequence[int], variances: Sequence[float]
) -> dict[str, float]:
    """The three Gini variants of one vector of mean effects per subspace."""
    return {
        "unnormalized": gini(mean_effects),
        "dimension": gini_dimension_normalized(mean_effects, dims),
        "variance": gini_variance_normalized(mean_effects, variances),
    }


def bootstrap_gini(
    effects: np.ndarray,
    dims: Sequence[int],
    variances: Sequence[float],
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Gini variants of the mean effects over ``n_boot`` resamplings of the prompts (rows of
    ``effects``), as arrays of length ``n_boot``.  The same ``seed`` gives the same resamples
    for every method, so differences between methods are paired."""
    eff = np.asarray(effects, dtype=np.float64)
    if eff.ndim != 2 or eff.shape[0] < 2:
        raise ValueError(f"effects must be (n_prompts >= 2, n_subspaces), got {eff.shape}.")
    n = eff.shape[0]
    # every resample's prompts in one draw: the same stream as n_boot draws of n in turn
    draws = np.random.default_rng(seed).integers(0, n, (n_boot, n))
    means = eff[draws].mean(1)
    return {
        "unnormalized": gini_rows(means),
        "dimension": gini_rows(means, dims),
        "variance": gini_rows(means, variances),
    }


def summarize_gini(
    runs: Mapping[str, Mapping[str, PatchRun]],
    dims: Mapping[str, Sequence[int]],
    variances: Mapping[str, Mapping[str, Sequence[float]]],
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Gini per test and method, their means over tests, with bootstrap CIs over prompts.

    ``runs[test][method]`` are :class:`PatchRun` s, ``dims[test]`` the partition used by that
    test, ``variances[test][method]`` the activation variance in each of the method's
    subspaces.  Returns ``gini[test][method][variant] = {"value", "ci"}``,
    ``gini_mean[method][variant] = {"value", "ci"}`` and ``gini_mean_diff`` (NDM minus each
    other method, paired bootstrap, with the one-sided bootstrap p-value ``p_above``) when a
    method is called ``"ndm"``.
    """
    table: dict[str, dict[str, dict[str, Any]]] = {}
    boots: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    for t_i, (test, by_method) in enumerate(runs.items()):
        table[test], boots[test] = {}, {}
        for method, run in by_method.items():
            point = gini_variants(run.mean_effects(), dims[test], variances[test][method])
            bs = bootstrap_gini(
                run.effects, dims[test], variances[test][method], n_boot=n_boot, seed=seed + t_i
            )
            boots[test][method] = bs
            table[test][method] = {
                k: {"value": point[k], "ci": list(percentile_interval(bs[k]))}
                for k in GINI_VARIANTS
            }
    methods = list(next(iter(runs.values())))
    mean: dict[str, dict[str, Any]] = {}
    mean_boot: dict[str, dict[str, np.ndarray]] = {}
    for method in methods:
        mean[method], mean_boot[method] = {}, {}
        for k in GINI_VARIANTS:
            mean_boot[method][k] = np.mean([boots[t][method][k] for t in runs], axis=0)
            mean[method][k] = {
                "value": float(np.mean([table[t][method][k]["value"] for t in runs])),
                "ci": list(percentile_interval(mean_boot[method][k])),
            }
    out: dict[str, Any] = {"gini": table, "gini_mean": mean}
    if "ndm" in methods:
        out["gini_mean_diff"] = {
            other: {k: _difference(mean, mean_boot, other, k) for k in GINI_VARIANTS}
            for other in methods
            if other != "ndm"
        }
    return out


def _difference(
    mean: Mapping[str, Any], boot: Mapping[str, Mapping[str, np.ndarray]], other: str, k: str
) -> dict[str, Any]:
    """NDM's mean Gini minus ``other``'s: the value, the paired percentile interval and
    ``p_above``, the share of the paired bootstrap draws in which NDM is not above it (the
    one-sided bootstrap p-value of "NDM above ``other``"; NaN draws left out)."""
    diff = boot["ndm"][k] - boot[other][k]
    finite = diff[np.isfinite(diff)]
    return {
        "value": mean["ndm"][k]["value"] - mean[other][k]["value"],
        "ci": list(percentile_interval(diff)),
        "p_above": float(np.mean(finite <= 0)) if finite.size else float("nan"),
    }


def routing_rates(run: PatchRun, task: TaskDataset) -> dict[str, Any]:
    """Knowledge-conflict routing per patched subspace: the fraction of prompts whose top-1
    token is the context answer (``context_rate``) or the parametric answer
    (``param_rate``), for the clean run, each subspace patch and the whole-space patch."""
    ctx = np.asarray(task.answers["context"])
    par = np.asarray(task.answers["parametric"])

    def rates(top: np.ndarray) -> dict[str, float]:
        return {
            "context_rate": float(np.mean(top == ctx)),
            "param_rate": float(np.mean(top == par)),
        }

    return {
        "clean": rates(run.top1_clean),
        "full": rates(run.top1_full),
        "subspaces": [rates(run.top1[:, s]) for s in range(run.top1.shape[1])],
    }

"""Training the SAEs of a width sweep to convergence, on rows cleaned of massive activations.

:func:`drop_massive` leaves out the rows whose norm is far above the median (SmolLM2 has a
few such tokens besides position 0, whose squared error dominates the batches they fall in);
:func:`train_to_convergence` trains one SAE epoch by epoch until the FVU on a held-out tenth
of the rows levels off; :func:`search_k` picks a TopK k whose held-out FVU matches a target
in a few trainings (ε by depth compares layers only at matched reconstruction quality).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["MASSIVE_NORM_FACTOR", "drop_massive", "train_to_convergence", "KSearch", "search_k"]

# The default of CausalProtocol.massive_norm_factor: rows above 10× the median norm.
MASSIVE_NORM_FACTOR = 10.0


def drop_massive(x: torch.Tensor, factor: float = MASSIVE_NORM_FACTOR) -> tuple[torch.Tensor, int]:
    """``x`` without the rows whose norm exceeds ``factor`` × the median row norm, and how
    many were dropped.

    Examples
    --------
    >>> x = torch.ones(5, 2)
    >>> x[1] *= 100
    >>> kept, n = drop_massive(x)
    >>> kept.shape, n
    (torch.Size([4, 2]), 1)
    """
    norms = x.norm(dim=1)
    keep = norms <= factor * norms.median()
    return x[keep], int((~keep).sum())


def train_to_convergence(
    config: Any,
    x: torch.Tensor,
    *,
    batch_size: int,
    max_epochs: int,
    tol: float,
    seed: int,
    device: str = "cpu",
) -> tuple[Any, list[float]]:
    """Train one SAE on the first nine tenths of ``x`` epoch by epoch (fresh shuffles) until
    the FVU on the last tenth (other prompts: rows are prompt-contiguous) improves by less
    than ``tol`` (relative) or ``max_epochs`` is reached.

    Returns
    -------
    result : SAETrainingResult
        The trainer's result after the last epoch.
    curve : list of float
        The held-out FVU after each epoch.

    Raises
    ------
    InputError
        When ``x`` leaves less than one batch after the held-out tenth.
    """
    from structlens.errors import InputError
    from structlens.sae import evaluate_sae
    from structlens.sae.sweep import shuffled_batches
    from structlens.sae.train import SAETrainer

    n_val = max(batch_size, x.shape[0] // 10)
    if x.shape[0] - n_val < batch_size:
        raise InputError(
            f"{x.shape[0]} training tokens leave fewer than one batch of {batch_size} after "
            f"holding out {n_val}; use more training prompts or a smaller batch size."
        )
    x_fit, x_val = x[:-n_val], x[-n_val:]
    trainer = SAETrainer(config, x.shape[1], tail_tokens=20_000, device=device)
    curve: list[float] = []
    for epoch in range(max_epochs):
        for batch in shuffled_batches(x_fit, batch_size, 1, seed + epoch):
            trainer.step(batch)
        curve.append(float(evaluate_sae(trainer.sae, x_val).fvu))
        if len(curve) >= 2 and curve[-2] - curve[-1] < tol * curve[-2]:
            break
    return trainer.result(), curve


@dataclasses.dataclass(frozen=True)
class KSearch:
    """A k search (:func:`search_k`): the ``ks`` tried in order with their ``fvus``, the
    chosen ``k`` (FVU closest to the target) and its ``fvu``, whether it lies within the
    tolerance (``matched``) and why the search stopped (``stop``: ``"matched"``,
    ``"budget"``, ``"bracketed"`` — no untried rung between a k above and one below the
    target — or ``"ladder end"``)."""

    ks: list[int]
    fvus: list[float]
    k: int
    fvu: float
    matched: bool
    stop: str


def search_k(
    fvu_of: Callable[[int], float],
    ladder: Sequence[int],
    *,
    start: int,
    target: float,
    tol: float,
    max_trials: int,
) -> KSearch:
    """The rung of ``ladder`` (with ``start``) whose FVU ``fvu_of(k)`` comes closest to
    ``target``, from at most ``max_trials`` calls, stopping once one lies within ``tol``.

    FVU falls as k grows, so every trial bounds where the target can lie: the next k is an
    untried rung inside that bracket.  From one trial it is the next rung towards the target;
    from two or more, the rung nearest the k a power law through the two trials closest to
    the target predicts (``log FVU`` linear in ``log k``), which reaches a target several
    rungs away in one step.

    Examples
    --------
    >>> s = search_k(lambda k: k ** -0.5, [1, 4, 16, 64, 256], start=4, target=1 / 16,
    ...              tol=1e-9, max_trials=3)
    >>> s.ks, s.k, s.stop
    ([4, 16, 256], 256, 'matched')
    """
    if max_trials < 1 or not target > 0 or tol < 0:
        raise ValueError(
            f"max_trials must be >= 1, target > 0 and tol >= 0; got {max_trials}, {target}, {tol}."
        )
    rungs = sorted({int(k) for k in ladder} | {int(start)})
    tried: dict[int, float] = {}
    k: int | None = int(start)
    stop = "budget"
    while k is not None:
        tried[k] = float(fvu_of(k))
        if abs(tried[k] - target) <= tol:
            stop = "matched"
            break
        if len(tried) >= max_trials:
            break
        k, stop = _next_k(tried, rungs, target, k)
    best = min(tried, key=lambda r: abs(tried[r] - target))
    return KSearch(
        ks=list(tried), fvus=list(tried.values()), k=best, fvu=tried[best],
        matched=abs(tried[best] - target) <= tol, stop=stop,
    )  # fmt: skip


def _next_k(
    tried: dict[int, float], rungs: list[int], target: float, last: int
) -> tuple[int | None, str]:
    """The next rung to try inside the bracket the trials leave (or ``None`` and why)."""
    lo = max((k for k, f in tried.items() if f > target), default=None)  # needs a larger k
    hi = min((k for k, f in tried.items() if f < target), default=None)  # needs a smaller k
    left = [
        r for r in rungs
        if r not in tried and (lo is None or r > lo) and (hi is None or r < hi)
    ]  # fmt: skip
    if not left:
        return None, "bracketed" if lo is not None and hi is not None else "ladder end"
    aim = _power_law_k(tried, target) or last
    return min(left, key=lambda r: abs(math.log(r / aim))), "budget"


def _power_law_k(tried: dict[int, float], target: float) -> float | None:
    """The k at which ``log FVU``, linear in ``log k`` through the two trials closest to the
    target, reaches it; ``None`` from fewer than two trials or a slope that is not negative."""
    if len(tried) < 2 or min(tried.values()) <= 0:
        return None
    (k1, f1), (k2, f2) = sorted(tried.items(), key=lambda kf: abs(math.log(kf[1] / target)))[:2]
    slope = math.log(f2 / f1) / math.log(k2 / k1)
    if not slope < 0:
        return None
    return k1 * math.exp(math.log(target / f1) / slope)

"""Training the SAEs of a width sweep to convergence, on rows cleaned of massive activations.

:func:`drop_massive` leaves out the rows whose norm is far above the median (SmolLM2 has a
few such tokens besides position 0, whose squared error dominates the batches they fall in);
:func:`train_to_convergence` trains one SAE epoch by epoch until the FVU on a held-out tenth
of the rows levels off.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["MASSIVE_NORM_FACTOR", "drop_massive", "train_to_convergence"]

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

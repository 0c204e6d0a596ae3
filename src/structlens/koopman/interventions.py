"""Koopman modes as interventions on a model: k modes vs k PCA vs k random directions.

At ``resid_pre(l)`` three ablations of equal real dimension k are compared on a task (IOI):

* **modes**: the dominant Koopman modes (decreasing ``|λ|``, a conjugate pair counts 2) are
  mean-ablated with the exact affine map of :func:`~structlens.koopman.mode_ablation`
  (an affine dictionary, identity or PCA, is required so the map is exact);
* **pca**: the top-k principal directions of the state, mean-ablated
  (``x + (μ − x) Q Qᵀ``);
* **random**: k random orthonormal directions, mean-ablated, averaged over seeds.

The mean is the state mean of the fit (the calibration corpus), for all three.  The score is
the normalised change of the task metric (IOI: logit(IO) − logit(S)) per prompt,
``(LD_abl − LD_clean) / mean(LD_clean)``: 0 = no effect, −1 = the mean logit difference is
gone.  CIs are percentile bootstraps over prompts.

Ablations act at the task positions (default: ``"END"``, the read-out position).  With
``positions="all"`` every position but 0 is ablated (``exclude_position0=True``, the
default): position 0 is the attention sink, whose offset no task reads and whose removal
breaks the model at every layer whatever the subspace.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from structlens.koopman.dictionaries import Dictionary
from structlens.koopman.edmdc import EDMDcResult
from structlens.koopman.spectral import eigendecomposition, mode_ablation, real_modes
from structlens.results import Result
from structlens.sites import site_name
from structlens.stats.intervals import bootstrap_interval

__all__ = ["AblationComparison", "select_modes", "compare_ablations"]


@dataclass(frozen=True)
class AblationComparison(Result):
    """Normalised metric change under three ablations of equal dimension at one layer.

    ``change`` is ``(3, n_prompts)`` for ``methods = ["modes", "pca", "random"]`` (random:
    mean over ``n_random`` draws per prompt); ``mean``/``ci`` are per method.
    ``mode_eigenvalues`` is ``(n_modes, 2)``: Re, Im (Im ≥ 0 for a pair).
    ``dimension`` is the real dimension actually ablated (``k``, or ``k − 1`` when only a
    conjugate pair could fill the last slot).
    """

    layer: int
    site: str
    dimension: int
    positions: str
    exclude_position0: bool
    methods: list[str]
    change: np.ndarray
    mean: np.ndarray
    ci: np.ndarray
    clean_metric_mean: float
    mode_indices: list[int]
    mode_eigenvalues: np.ndarray
    n_random: int
    seed: int


def select_modes(result: EDMDcResult, k: int) -> tuple[list[int], int]:
    """Dominant real modes (decreasing ``|λ|``) filling exactly ``k`` real dimensions when
    possible; a pair that would overshoot is skipped for the next real eigenvalue.  Returns
    (mode indices into ``real_modes``, dimension reached)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}.")
    modes = real_modes(eigendecomposition(result.A))
    order = sorted(range(len(modes)), key=lambda i: -abs(modes[i].eigenvalue))
    chosen: list[int] = []
    dim = 0
    for i in order:
        if dim + modes[i].size <= k:
            chosen.append(i)
            dim += modes[i].size
        if dim == k:
            break
    if dim == 0:
        raise ValueError(f"no set of modes has dimension <= {k}.")
    return chosen, dim


def _position_lists(
    task: Any, index: Sequence[int], positions: str, exclude_position0: bool
) -> list[list[int]] | None:
    if positions == "all":
        if not exclude_position0:
            return None
        return [list(range(1, int(task.positions["END"][i]) + 1)) for i in index]
    if positions not in task.positions:
        raise ValueError(
            f"positions must be 'all' or one of {sorted(task.positions)}; got {positions!r}."
        )
    pos = [int(task.positions[positions][i]) for i in index]
    return [[p] if p > 0 or not exclude_position0 else [] for p in pos]


def _masked(new: torch.Tensor, act: torch.Tensor, pos: list[list[int]] | None) -> torch.Tensor:
    if pos is None:
        return new
    mask = torch.zeros(act.shape[:2], dtype=act.dtype, device=act.device)
    for b, ps in enumerate(pos):
        mask[b, ps] = 1
    return act + (new - act) * mask[..., None]


def _apply(
    fn: Callable[[torch.Tensor], torch.Tensor], pos: list[list[int]] | None, act: torch.Tensor
) -> torch.Tensor:
    return _masked(fn(act), act, pos)


def compare_ablations(
    model: Any,
    task: Any,
    layer: int,
    result: EDMDcResult,
    dictionary: Dictionary,
    k: int,
    *,
    positions: str = "END",
    exclude_position0: bool = True,
    n_random: int = 5,
    batch_size: int = 16,
    n_bootstrap: int = 1000,
    seed: int = 0,
) -> AblationComparison:
    """Compare k Koopman modes vs k PCA vs k random directions ablated at ``resid_pre(layer)``.

    ``result`` must be a fit of that layer's states with the affine ``dictionary`` (identity
    or PCA) so that the mode ablation is exact.  ``positions`` is a named task position
    (IOI: ``"END"``, ``"S2"``, ...) or ``"all"``; position 0 is never ablated when
    ``exclude_position0`` (see module docstring).  Fit ``result`` without position 0 too
    (:func:`structlens.koopman.data.load_layer` drops it by default).
    """
    from structlens.data.tasks import pad_batch
    from structlens.interventions import run_with_writes

    if dictionary.affine_map() is None:
        raise ValueError(
            "mode ablation inside the model needs an affine dictionary (IdentityDictionary or "
            "PCADictionary); a nonlinear lift removes modes only to first order."
        )
    d = model.d_model
    if result.state_mean.shape != (d,):
        raise ValueError(
            f"the fit's state has dimension {result.state_mean.shape}, the model {d}; fit "
            f"resid_pre({layer}) of this model."
        )
    if n_random < 1:
        raise ValueError(f"n_random must be >= 1, got {n_random}.")
    site = site_name("resid_pre", layer)
    idx, dim = select_modes(result, k)
    abl = mode_ablation(result, dictionary, idx, mean=True)
    W = torch.as_tensor(abl.weight, dtype=torch.float32)
    bias = torch.as_tensor(abl.bias, dtype=torch.float32)
    evals, evecs = np.linalg.eigh(result.state_cov)
    Q_pca = torch.as_tensor(evecs[:, ::-1][:, :dim].copy(), dtype=torch.float32)
    rng = np.random.default_rng(seed)
    Q_rand = [
        torch.as_tensor(np.linalg.qr(rng.standard_normal((d, dim)))[0], dtype=torch.float32)
        for _ in range(n_random)
    ]
    mu = torch.as_tensor(result.state_mean, dtype=torch.float32)
    pad_id = model.tokenizer.pad_token_id or 0

    def subspace_mean(Q: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        def f(act: torch.Tensor) -> torch.Tensor:
            q = Q.to(act)
            return act + ((mu.to(act) - act) @ q) @ q.T

        return f

    def koopman(act: torch.Tensor) -> torch.Tensor:
        return act @ W.to(act) + bias.to(act)

    fns = [koopman, subspace_mean(Q_pca)] + [subspace_mean(Q) for Q in Q_rand]
    n = len(task.clean)
    clean = np.empty(n)
    ablated = np.empty((len(fns), n))
    for s in range(0, n, batch_size):
        index = list(range(s, min(n, s + batch_size)))
        ids, mask = pad_batch([task.clean[i] for i in index], pad_id)
        pos = _position_lists(task, index, positions, exclude_position0)

        def metric(logits: torch.Tensor, index: list[int] = index) -> np.ndarray:
            return task.metric(task.gather_logits(logits, index), index).double().numpy()

        with torch.no_grad():
            clean[index] = metric(model.forward(ids, mask))
        for j, fn in enumerate(fns):
            writer = functools.partial(_apply, fn, pos)
            ablated[j, index] = metric(run_with_writes(model, ids, mask, {site: writer}))
    scale = float(np.mean(clean))
    if abs(scale) < 1e-12:
        raise ValueError("the clean metric averages to 0; the normalised change is undefined.")
    per = (ablated - clean) / scale
    change = np.stack([per[0], per[1], per[2:].mean(axis=0)])
    modes = real_modes(eigendecomposition(result.A))
    return AblationComparison(
        layer=int(layer),
        site=site,
        dimension=dim,
        positions=positions,
        exclude_position0=exclude_position0,
        methods=["modes", "pca", "random"],
        change=change,
        mean=change.mean(axis=1),
        ci=np.array([bootstrap_interval(c, 0.95, n_bootstrap, rng) for c in change]),
        clean_metric_mean=scale,
        mode_indices=[int(i) for i in idx],
        mode_eigenvalues=np.array(
            [[modes[i].eigenvalue.real, modes[i].eigenvalue.imag] for i in idx]
        ),
        n_random=n_random,
        seed=seed,
    )

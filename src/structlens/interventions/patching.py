"""Activation, head and subspace patching; direction/subspace ablation; gradients and AtP.

Conventions
-----------
Activations at a site have shape ``[batch, seq, *site_shape]``, or ``[batch, head, query_pos,
key_pos]`` at ``attn.hook_attn_scores``/``attn.hook_pattern``.  ``positions`` selects tokens
(query positions at those two sites): ``None`` for all, or one list of positions per prompt (a
``[batch, k]`` tensor also works).  ``heads`` (only at sites with a head axis: ``attn.hook_q``,
``hook_k``, ``hook_v`` (KV heads), ``hook_rot_q/k``, ``hook_z``, scores and pattern) selects
heads.  Patching the pattern replaces whole rows, so patched rows stay normalised.  ``basis``
is a ``[d, k]`` matrix with orthonormal columns spanning the subspace acted on (see
:func:`subspace_basis`); patching a subspace replaces only the component of the activation in it:
``x + (src - x) Q Qᵀ``.  With ``basis=None`` the whole activation is replaced.

Attribution patching (Nanda 2023; Syed et al. 2023) estimates the effect of patching the
corrupted activation into the clean run to first order:
``effect ≈ (a_corrupt - a_clean) · ∂metric/∂a`` evaluated on the clean run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from structlens.interventions.hooks import Writer, hooked, site_grads
from structlens.models.loading import Model

Positions = Sequence[Sequence[int]] | torch.Tensor | None
Metric = Callable[[torch.Tensor], torch.Tensor]


def subspace_basis(rotation: torch.Tensor, columns: Sequence[int]) -> torch.Tensor:
    """The ``[d, k]`` basis formed by the given columns of an orthogonal ``rotation``."""
    r = torch.as_tensor(rotation)
    if r.ndim != 2 or r.shape[0] != r.shape[1]:
        raise ValueError(f"rotation must be a square [d, d] matrix, got shape {tuple(r.shape)}")
    eye = torch.eye(r.shape[0], dtype=torch.float64)
    if not torch.allclose(r.double().T @ r.double(), eye, atol=1e-4):
        raise ValueError("rotation is not orthogonal (RᵀR != I); orthonormalise it first")
    return r[:, list(columns)]


def _position_mask(act: torch.Tensor, positions: Positions) -> torch.Tensor | None:
    if positions is None:
        return None
    b, s = act.shape[:2]
    mask = torch.zeros(b, s, dtype=torch.bool, device=act.device)
    if isinstance(positions, torch.Tensor):
        positions = positions.tolist()
    if len(positions) != b:
        raise ValueError(f"{len(positions)} position lists for a batch of {b}")
    for i, row in enumerate(positions):
        mask[i, list(row)] = True
    return mask


def _check_basis(basis: torch.Tensor, d: int) -> torch.Tensor:
    if basis.ndim != 2 or basis.shape[0] != d:
        raise ValueError(f"basis must have shape [d={d}, k], got {tuple(basis.shape)}")
    gram = basis.double().T @ basis.double()
    if not torch.allclose(gram, torch.eye(gram.shape[0], dtype=gram.dtype), atol=1e-4):
        raise ValueError(
            "basis columns must be orthonormal (QᵀQ = I); orthonormalise with torch.linalg.qr first"
        )
    return basis


def replace_writer(
    source: torch.Tensor,
    *,
    positions: Positions = None,
    heads: Sequence[int] | None = None,
    basis: torch.Tensor | None = None,
    head_first: bool = False,
) -> Writer:
    """A writer that moves the activation towards ``source`` on the selected part.

    ``source`` broadcasts against the activation (a ``[d]`` mean vector works, as does a full
    ``[batch, seq, ...]`` cache entry).  Positions, heads and subspace restrict the change.
    ``head_first`` says the activation is ``[batch, head, query_pos, key_pos]`` (scores and
    pattern; :attr:`structlens.sites.Site.head_first`).
    """
    if head_first and basis is not None:
        raise ValueError(
            "a basis cannot restrict a patch of attention scores or patterns (it would mix "
            "key positions and denormalise the pattern); select heads and positions instead"
        )

    def write(act: torch.Tensor) -> torch.Tensor:
        src = source.to(device=act.device, dtype=act.dtype)
        delta = src - act
        if head_first:  # masked (-inf) scores stay masked
            delta = torch.where(torch.isinf(act), 0.0, delta)
        if basis is not None:
            q = _check_basis(basis.to(device=act.device, dtype=act.dtype), act.shape[-1])
            delta = (delta @ q) @ q.T
        if heads is not None:
            if act.ndim != 4:
                raise ValueError(
                    "heads can only be selected at sites with a head axis (attn.hook_q/k/v, "
                    "hook_rot_q/k, hook_z, hook_attn_scores, hook_pattern)"
                )
            axis = 1 if head_first else 2
            hmask = torch.zeros(act.shape[axis], dtype=torch.bool, device=act.device)
            hmask[list(heads)] = True
            delta = delta * hmask.reshape(-1, *([1] * (act.ndim - 1 - axis)))
        if head_first:
            pmask = _position_mask(act.transpose(1, 2), positions)
            if pmask is not None:
                delta = delta * pmask[:, None, :, None]
        else:
            pmask = _position_mask(act, positions)
            if pmask is not None:
                delta = delta * pmask.reshape(*pmask.shape, *([1] * (act.ndim - 2)))
        return act + delta

    return write


def run_with_cache(
    model: Model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, sites: Sequence[str]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Output (logits, or last hidden state for encoders) and activations at ``sites``."""
    with torch.no_grad(), hooked(model, sites) as cache:
        out = model.forward(input_ids, attention_mask)
    return out, dict(cache)


def run_with_writes(
    model: Model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    writes: Mapping[str, Writer],
) -> torch.Tensor:
    """Output of a forward pass with the given site writes applied."""
    with torch.no_grad(), hooked(model, writes=writes):
        return model.forward(input_ids, attention_mask)


def patch(
    model: Model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    site: str,
    source: torch.Tensor,
    *,
    positions: Positions = None,
    heads: Sequence[int] | None = None,
    basis: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run ``input_ids`` with ``site`` patched from ``source`` (e.g. a corrupted run's cache).

    Returns the model output.  ``source`` must have the target activation's shape, or
    broadcast to it; positions, heads and basis restrict the patch (module docstring).
    """
    head_first = model.site(site).head_first
    writer = replace_writer(
        source, positions=positions, heads=heads, basis=basis, head_first=head_first
    )
    return run_with_writes(model, input_ids, attention_mask, {site: writer})


def ablation_source(
    act: torch.Tensor,
    mode: str,
    *,
    mean: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The activation to patch in for an ablation of ``act`` (``[batch, seq, ...]``).

    ``"zero"``: zeros.  ``"mean"``: ``mean`` (e.g. the mean over a reference dataset; default
    the mean over this batch's tokens).  ``"resample"``: the activation of another prompt in
    the batch at the same position (a random derangement under ``generator``).
    """
    if mode == "zero":
        return torch.zeros_like(act)
    if mode == "mean":
        if mean is None:
            mean = act.reshape(-1, *act.shape[2:]).mean(0)
        return mean.to(act).expand_as(act)
    if mode == "resample":
        b = act.shape[0]
        if b < 2:
            raise ValueError("resample ablation needs a batch of at least 2 prompts")
        shift = int(torch.randint(1, b, (1,), generator=generator))
        return act.roll(shift, dims=0)
    raise ValueError(f"unknown ablation mode {mode!r}; use 'zero', 'mean' or 'resample'")


def ablate(
    model: Model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    site: str,
    *,
    mode: str = "zero",
    basis: torch.Tensor | None = None,
    positions: Positions = None,
    heads: Sequence[int] | None = None,
    mean: torch.Tensor | None = None,
    seed: int = 0,
) -> torch.Tensor:
    """Run with ``site`` (or its ``basis`` subspace, heads, positions) ablated; see
    :func:`ablation_source` for the modes."""
    gen = torch.Generator().manual_seed(seed)
    head_first = model.site(site).head_first

    def write(act: torch.Tensor) -> torch.Tensor:
        src = ablation_source(act, mode, mean=mean, generator=gen)
        return replace_writer(
            src, positions=positions, heads=heads, basis=basis, head_first=head_first
        )(act)

    return run_with_writes(model, input_ids, attention_mask, {site: write})


def run_with_grads(
    model: Model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sites: Sequence[str],
    metric: Metric,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Per-prompt metric, activations and d(sum of metric)/d(activation) at ``sites``.

    ``metric`` maps the model output to one value per prompt.  One backward pass serves all
    sites.
    """
    with hooked(model, sites, grad=True) as cache:
        out = model.forward(input_ids, attention_mask)
        value = metric(out)
        grads = site_grads(value, cache)
    acts = {k: v.detach() for k, v in cache.items()}
    return value.detach(), acts, grads


def attribution_patch(
    model: Model,
    clean_ids: torch.Tensor,
    corrupt_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sites: Sequence[str],
    metric: Metric,
    *,
    directions: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Attribution patching: first-order effects of patching corrupt activations into clean.

    Returns a dict with ``metric_clean`` (``[batch]``) and, per site, the estimated change of
    the metric: ``[batch, seq]`` for residual-type sites (patching the whole vector at one
    position), ``[batch, seq, n_heads]`` for sites with a head axis (one head at one position;
    ``[batch, n_heads, query_pos]`` for scores and pattern: one row), or, with ``directions``
    (``[k, d]``, rows normalised here), ``[batch, seq, k]`` for patching the component along
    each direction.
    """
    if clean_ids.shape != corrupt_ids.shape:
        raise ValueError(
            "clean and corrupt inputs must have the same shape (same-length "
            "corruptions), got "
            f"{tuple(clean_ids.shape)} and {tuple(corrupt_ids.shape)}"
        )
    head_first = {s: model.site(s).head_first for s in sites}
    if directions is not None and any(head_first.values()):
        raise ValueError("directions apply to vector sites, not to attention scores or patterns")
    _, corrupt = run_with_cache(model, corrupt_ids, attention_mask, sites)
    value, clean, grads = run_with_grads(model, clean_ids, attention_mask, sites, metric)
    out: dict[str, Any] = {"metric_clean": value}
    for s in sites:
        delta = corrupt[s] - clean[s]
        if head_first[s]:  # masked scores are -inf in both runs
            delta = torch.where(torch.isinf(clean[s]), 0.0, delta)
        g = grads[s]
        if directions is not None:
            u = directions.to(delta) / directions.to(delta).norm(dim=-1, keepdim=True)
            out[s] = (delta @ u.T) * (g @ u.T)
        else:  # per position; at head sites the last axis is d_head (or key_pos): per head
            out[s] = (delta * g).sum(-1)
    return out

"""Residual-stream readers shared by every method: the activations at
``blocks.{l}.hook_resid_pre`` over prompts, streamed from forward passes that stop at the
deepest layer read, and the next-token loss of a run with that site replaced.

Pads are always dropped; position 0 (the attention sink, whose residual norm is far above
the rest) is dropped with ``skip_first``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from structlens.interventions import hooked
from structlens.sites import site_name

__all__ = [
    "select_rows",
    "next_token_nll",
    "residual_batches",
    "residual_batches_multi",
    "collect_residuals",
    "ce_runner",
]

Model = Any  # a structlens.models.loading.Model (kept untyped: capture sits below models' users)


def select_rows(mask: torch.Tensor, skip_first: bool) -> torch.Tensor:
    """The rows of a padded batch a residual reader keeps: real tokens, and not position 0
    with ``skip_first``."""
    sel = mask.bool().clone()
    if skip_first:
        # Position 0 is an attention sink with a residual norm far above the rest.
        sel[:, 0] = False
    return sel


def next_token_nll(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-prompt summed next-token negative log-likelihood (nats), pads excluded: ``[b]``."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    nll = -logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    valid = (mask[:, 1:] * mask[:, :-1]).to(nll.dtype)
    return (nll * valid).sum(1)


class _Stop(Exception):
    """Raised from a hook to end a forward pass once the needed site has been read."""


def residual_batches(
    model: Model,
    layer: int,
    prompts: Sequence[Sequence[int]],
    *,
    batch_size: int = 8,
    skip_first: bool = True,
) -> Iterator[torch.Tensor]:
    """Yield ``[n_tokens, d]`` float32 residuals at ``blocks.{layer}.hook_resid_pre``.

    The forward pass stops at ``layer`` (layers above it and the unembedding never run), so
    streaming SAE training data costs ``layer/n_layers`` of a full forward.  Pads (and
    position 0 with ``skip_first``) are dropped.
    """
    for out in residual_batches_multi(
        model, [layer], prompts, batch_size=batch_size, skip_first=skip_first
    ):
        yield out[layer]


@torch.no_grad()
def residual_batches_multi(
    model: Model,
    layers: Sequence[int],
    prompts: Sequence[Sequence[int]],
    *,
    batch_size: int = 8,
    skip_first: bool = True,
) -> Iterator[dict[int, torch.Tensor]]:
    """:func:`residual_batches` at several layers from one forward pass per batch (which
    stops at the deepest of them): yields ``{layer: [n_tokens, d]}``."""
    from structlens.data.tasks import pad_batch

    if not layers:
        raise ValueError("layers is empty; pass at least one layer.")
    sites = {layer: site_name("resid_pre", layer, n_layers=model.n_layers) for layer in layers}
    last = sites[max(sites)]
    pad = int(model.tokenizer.pad_token_id)

    def stop(a: torch.Tensor) -> torch.Tensor:
        raise _Stop(a)

    for s in range(0, len(prompts), batch_size):
        ids, mask = (t.to(model.device) for t in pad_batch(list(prompts[s : s + batch_size]), pad))
        sel = select_rows(mask, skip_first)
        reads: dict[str, Callable[..., torch.Tensor]] = {
            site: (lambda a, sel=sel: a[sel].float().cpu()) for site in sites.values()
        }
        reads[last] = stop
        try:
            with hooked(model, reads=reads) as cache:
                model.forward(ids, mask)
        except _Stop as done:
            cache[last] = done.args[0][sel].float().cpu()
        else:  # pragma: no cover - the read hook always fires
            raise AssertionError(last)
        yield {layer: cache[site] for layer, site in sites.items()}


def collect_residuals(
    model: Model, layer: int, prompts: Sequence[Sequence[int]], batch_size: int = 8
) -> torch.Tensor:
    """All residuals (position 0 dropped) at ``layer`` over ``prompts``: ``[n_tokens, d]``."""
    return torch.cat(list(residual_batches(model, layer, prompts, batch_size=batch_size)))


def ce_runner(
    model: Model,
    layer: int,
    prompts: Sequence[Sequence[int]],
    *,
    batch_size: int = 8,
    skip_first: bool = True,
) -> Callable[[Callable[[torch.Tensor], torch.Tensor] | None], float]:
    """``run_with_replacement(fn)`` for :func:`structlens.sae.ce_loss_recovered`.

    Runs the prompts with ``blocks.{layer}.hook_resid_pre`` replaced by ``fn`` applied to the
    ``[b, seq, d]`` activation (position 0 kept clean with ``skip_first``) and returns the
    mean next-token cross-entropy in nats over all predicted tokens.
    """
    from structlens.data.tasks import pad_batch

    site = site_name("resid_pre", layer, n_layers=model.n_layers)
    pad = int(model.tokenizer.pad_token_id)

    def run(fn: Callable[[torch.Tensor], torch.Tensor] | None) -> float:
        total, count = 0.0, 0
        for s in range(0, len(prompts), batch_size):
            ids, mask = (
                t.to(model.device) for t in pad_batch(list(prompts[s : s + batch_size]), pad)
            )
            writes = {}
            if fn is not None:

                def write(a: torch.Tensor) -> torch.Tensor:
                    out = fn(a)
                    return torch.cat([a[:, :1], out[:, 1:]], dim=1) if skip_first else out

                writes = {site: write}
            with torch.no_grad(), hooked(model, writes=writes):
                logits = model.forward(ids, mask)
            total += float(next_token_nll(logits, ids, mask).sum())
            count += int((mask[:, 1:] * mask[:, :-1]).sum())
        if count == 0:
            raise ValueError("the prompts contain no predicted tokens (need ≥ 2 tokens each).")
        return total / count

    return run

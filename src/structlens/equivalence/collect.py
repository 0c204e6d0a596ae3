"""Model to arrays for the equivalence comparison: per-layer residual and head rows of a
model on probe prompts (fit set), padded batches on the model's device.

Every forward of the comparison goes through :func:`forward`: a probe prompt is the model's
input, except for an encoder–decoder language model given an encoder context, whose decoder
reads the prompt while its encoder reads the context (the text before it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from structlens.interventions import hooked
from structlens.models.loading import Model

from .preprocess import Preprocess, prepare

__all__ = ["collect_rows", "forward", "prepare_layers"]


def _batches(n: int, size: int) -> list[list[int]]:
    return [list(range(i, min(n, i + size))) for i in range(0, n, size)]


def _pad(tokens: Sequence[Sequence[int]], model: Model) -> tuple[torch.Tensor, torch.Tensor]:
    from structlens.data.tasks import pad_batch

    ids, mask = pad_batch(tokens, int(model.tokenizer.pad_token_id))
    return ids.to(model.device), mask.to(model.device)


def forward(
    model: Model,
    tokens: Sequence[Sequence[int]],
    context: Sequence[Sequence[int]] | None = None,
    positions: Sequence[Sequence[int]] | None = None,
    *,
    rows_from: int | None = None,
    max_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's output on the right-padded ``tokens`` and their mask.

    ``context`` (one token list per prompt) goes to the encoder of an encoder–decoder, whose
    decoder then reads ``tokens`` causally, so the output and the decoder's sites have the
    prompts' positions, as a decoder-only model's do; ``None`` runs ``model.forward`` on the
    prompts alone (an encoder–decoder language model's encoder then reads its start token).
    ``positions`` (the same number ``k`` for every prompt): only the outputs there,
    ``[batch, k, ...]``, the values of the full output at those positions; a decoder-only
    language model then unembeds only them
    (:func:`~structlens.interventions.fastrun.metric_logits`), which over a 262k vocabulary
    is most of a forward's arithmetic.
    ``rows_from`` (instead of ``positions``): only the outputs at real tokens from that
    position on, ``[rows, ...]`` in the order of ``out[keep]``; a decoder-only language model
    then unembeds only those rows (:func:`~structlens.interventions.fastrun.row_logits`), not
    the padding nor the positions before ``rows_from``; ``max_rows``: where there are more
    such tokens, only ``max_rows`` of them, evenly spaced in that order
    (:func:`thin_rows`).
    """
    from structlens.interventions.fastrun import metric_logits, row_logits

    if positions is not None and rows_from is not None:
        raise ValueError("pass positions or rows_from, not both.")
    ids, mask = _pad(tokens, model)
    decoder_only = context is None and model.causal and not model.is_encoder_decoder
    keep = None
    if rows_from is not None:
        keep = mask.bool().clone()
        keep[:, :rows_from] = False
        keep = thin_rows(keep, max_rows)
    if positions is not None and decoder_only:
        return metric_logits(model, ids, mask, positions), mask
    if keep is not None and decoder_only:
        return row_logits(model, ids, mask, keep), mask
    if context is None:
        out = model.forward(ids, mask)
    else:
        if len(context) != len(tokens):
            raise ValueError(f"{len(context)} encoder contexts for {len(tokens)} prompts.")
        source, source_mask = _pad(context, model)
        out = model.forward(source, source_mask, decoder_input_ids=ids)
    if keep is not None:
        return out[keep.to(out.device)], mask
    if positions is None:
        return out, mask
    idx = torch.as_tensor([list(p) for p in positions], device=out.device)
    return out.gather(1, idx[..., None].expand(-1, -1, out.shape[-1])), mask


def thin_rows(keep: torch.Tensor, max_rows: int | None) -> torch.Tensor:
    """``keep`` (boolean ``[b, seq]``) with only ``max_rows`` of its true entries, evenly
    spaced in row-major order (the first and the last kept), where it has more; unchanged
    otherwise.

    >>> thin_rows(torch.ones(2, 5, dtype=torch.bool), 4).int().tolist()
    [[1, 0, 0, 1, 0], [0, 1, 0, 0, 1]]
    """
    n = int(keep.sum())
    if max_rows is None or n <= max_rows:
        return keep
    flat = keep.flatten().nonzero().flatten()
    pick = flat[torch.as_tensor(np.linspace(0, n - 1, max_rows).round().astype(np.int64))]
    out = torch.zeros(keep.numel(), dtype=torch.bool, device=keep.device)
    out[pick] = True
    return out.reshape(keep.shape)


def _sites(model: Model) -> tuple[list[str], list[str]]:
    stack, n = model.output_stack, model.n_output_layers
    return (
        [f"{stack}.{l}.hook_resid_post" for l in range(n)],
        [f"{stack}.{l}.attn.hook_z" for l in range(n)],
    )


def _row_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def collect_rows(
    model: Model,
    tokens: Sequence[Sequence[int]],
    start: int,
    sentence: bool,
    batch_size: int,
    context: Sequence[Sequence[int]] | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per layer, resid_post rows ``[n, d]`` and hook_z rows ``[n, H, dh]``: real tokens
    from position ``start`` on, in the model's precision (float32 for float32, float16 and
    bfloat16 models, which float32 holds exactly; the similarities and maps convert to
    float64 one layer at a time), or one float64 mean row per prompt.  ``context``: the
    encoder's input per prompt (:func:`forward`)."""
    resid_sites, z_sites = _sites(model)
    res: list[list[np.ndarray]] = [[] for _ in resid_sites]
    zs: list[list[np.ndarray]] = [[] for _ in z_sites]
    for idx in _batches(len(tokens), batch_size):
        part = None if context is None else [context[i] for i in idx]
        # the rows are hooked activations: the outputs are not read, so a decoder-only
        # language model unembeds one position per prompt, not every one
        with torch.no_grad(), hooked(model, [*resid_sites, *z_sites]) as cache:
            _, mask = forward(model, [tokens[i] for i in idx], part, [[0]] * len(idx))
        keep = mask.bool().clone()
        keep[:, :start] = False
        if not bool(keep.any(1).all()):
            raise ValueError("a probe prompt has no token left after excluding position 0.")
        w = keep.double()
        for out, sites in ((res, resid_sites), (zs, z_sites)):
            for l, s in enumerate(sites):
                if sentence:
                    a = cache[s].double()
                    flat = a.reshape(*a.shape[:2], -1)
                    m = (flat * w[..., None]).sum(1) / w.sum(1)[:, None]
                    out[l].append(m.reshape(len(idx), *a.shape[2:]).cpu().numpy())
                else:
                    out[l].append(cache[s][keep].to(_row_dtype(cache[s].dtype)).cpu().numpy())
        del cache
    return [np.concatenate(r) for r in res], [np.concatenate(z) for z in zs]


def prepare_layers(acts: list[np.ndarray], options: Preprocess) -> list[np.ndarray]:
    """``options`` applied to every layer; with neither clipping nor standardisation the
    rows are returned as they are (the similarities centre them in float64 themselves, so a
    float64 copy of every layer here would only double the memory)."""
    opts = dataclasses.replace(options, exclude_bos=False)
    if opts.clip_quantile is None and not opts.standardize:
        return list(acts)
    out = []
    for a in acts:
        flat = a.reshape(a.shape[0], -1)
        out.append(prepare(flat, opts).reshape(a.shape))
    return out

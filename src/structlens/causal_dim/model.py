"""Model-side callables for causal dimensionality and SAE evaluation on real transformers.

Everything here loads nothing: it takes a :class:`structlens.models.Model` and token ids and
returns the callables and tensors that the array-level code in :mod:`structlens.causal_dim` and
:mod:`structlens.sae` consumes.

Residual → output function ``f_l``
---------------------------------
:func:`residual_function` builds, for ONE prompt and one position ``t``, the batched callable
``f(H) -> Y`` of :mod:`structlens.causal_dim.jacobian`: each row of ``H`` [b, d] replaces the
residual stream ``blocks.{l}.hook_resid_pre`` at position ``t`` and the model runs to the logits.

* ``outputs="same"``: ``Y`` = logits at position ``t`` only, ``[b, V]``.
* ``outputs="downstream"``: ``Y`` = logits at positions ``t … T−1``, ``[b, T−t, V]`` (the
  Jacobian then sums ``J_pᵀJ_p`` over those positions).

The prefix ``0 … t−1`` does not depend on ``h`` in a causal model, so it runs once and its
key/value cache is reused; layers below ``l`` run once with batch 1 and the batch is expanded
to ``b`` rows only at layer ``l`` (the write), so a call costs ``b`` rows through layers
``l … L−1`` only.  Forward-mode AD needs eager attention; :func:`eager_attention` switches
the model to it for the duration (and restores the previous implementation).

Gradients and splices
---------------------
:func:`residual_grads` runs a metric backward once per batch and yields ``(acts, grads)`` at
a residual site over chosen positions: the input of :class:`structlens.causal_dim.FeatureStats`
and :func:`structlens.causal_dim.four_cell_ablation` for every SAE of a sweep.
:func:`token_prompt_ids` gives, batch by batch, the prompt each of those rows came from (the
resampling unit of the sweep's intervals).
:func:`sae_splice_writer` writes ``x̂(h) + (h − x̂(h))`` (error term), which leaves the model
unchanged; :func:`ce_runner` gives the ``run_with_replacement`` of
:func:`structlens.sae.ce_loss_recovered`.

Generated text
--------------
:func:`sample_continuations` samples text from the model itself (temperature 1, special
tokens never drawn), seeded per batch, so more SAE training tokens can be had than a small
corpus holds.
"""

from __future__ import annotations

import copy
import dataclasses
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import numpy as np
import torch

from structlens.capture.residuals import next_token_nll, select_rows
from structlens.causal_dim.jacobian import (
    CausalDimension,
    CausalDimensionResult,
    JacobianConfig,
)
from structlens.interventions import hooked
from structlens.models.loading import Model
from structlens.sae.models import SparseAutoencoder
from structlens.sites import site_name

Outputs = Literal["same", "downstream"]


@contextmanager
def eager_attention(model: Model) -> Iterator[None]:
    """Run ``model`` with ``attn_implementation="eager"`` inside the block (forward-mode AD)."""
    cfg = model.hf.config
    before = getattr(cfg, "_attn_implementation", None)
    if before in (None, "eager"):
        yield
        return
    model.hf.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.hf.set_attn_implementation(before)


#: Texts sampled per forward batch by :func:`sample_continuations` (fixed: part of what the
#: seed determines).
SAMPLE_BATCH = 32


@torch.no_grad()
def sample_continuations(
    model: Model, prefixes: Sequence[Sequence[int]], n_tokens: int, seed: int
) -> list[list[int]]:
    """Each prefix followed by ``n_tokens`` tokens sampled from ``model`` at temperature 1.

    All prefixes must have one length (no padding, so every text is a plain causal run).
    Special tokens (end of text, chat markers) are never drawn, so every text has its full
    length.  Batch ``j`` of :data:`SAMPLE_BATCH` prefixes draws from a generator seeded with
    ``(seed, j)``: the same prefixes and seed give the same texts on the same device.
    """
    _check_causal(model)
    if len({len(p) for p in prefixes}) > 1 or n_tokens < 0:
        raise ValueError("prefixes must share one length and n_tokens must be >= 0.")
    special = sorted(set(getattr(model.tokenizer, "all_special_ids", [])))
    out: list[list[int]] = []
    for j, start in enumerate(range(0, len(prefixes), SAMPLE_BATCH)):
        ids = torch.tensor(
            [list(p) for p in prefixes[start : start + SAMPLE_BATCH]], device=model.device
        )
        state = int(np.random.SeedSequence([seed, j]).generate_state(1)[0])
        gen = torch.Generator(device=model.device).manual_seed(state)
        res = model.hf(input_ids=ids, use_cache=True)
        for i in range(n_tokens):
            logits = res.logits[:, -1].float()
            logits[:, special] = -torch.inf
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)
            ids = torch.cat([ids, nxt], dim=1)
            if i + 1 < n_tokens:  # the last token needs no forward pass of its own
                res = model.hf(input_ids=nxt, cache=res.cache, use_cache=True)
        out += ids.tolist()
    return out


def _check_causal(model: Model) -> None:
    if not model.causal:
        raise ValueError(f"{model.name} is an encoder; f_l needs a causal LM with logits.")


def residual_function(
    model: Model,
    layer: int,
    token_ids: Sequence[int],
    position: int = -1,
    outputs: Outputs = "same",
    *,
    compress_head: Literal["raw", "log_probs"] | None = None,
) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor]:
    """``(f, h0)``: the residual → logits map of one prompt at ``(layer, position)``.

    ``f`` maps ``H`` [b, d] to ``[b, V]`` (``outputs="same"``) or ``[b, T−t, V]``
    (``"downstream"``) with each row patched into ``blocks.{layer}.hook_resid_pre`` at
    ``position``; ``h0`` [1, d] is the clean residual there, so ``f(h0)`` equals the clean
    logits.  Call ``f`` inside :func:`eager_attention` for forward-mode AD.

    ``compress_head`` (``"raw"`` or ``"log_probs"``) replaces the ``V``-wide output by the
    ``d``-wide ``y_p = n_p C_p`` (``n_p`` = final-norm output at output position ``p``) with
    ``C_p C_pᵀ = Aᵀ A``, ``A = W_U`` (raw logits) or ``(I − 1 p̄ᵀ) W_U`` (log-probs, ``p̄`` the
    clean next-token distribution): the Jacobians then have the same Gram ``JᵀJ`` at the clean
    point as the logits/log-probs, at ``d/V`` of the cost.  Use it with
    ``JacobianConfig(output="raw")`` and only at the clean point ``h0`` (for ``"log_probs"``
    the factor is frozen at ``p̄``).  Needs a linear unembedding (no logit soft-capping).
    """
    _check_causal(model)
    site = site_name("resid_pre", layer, n_layers=model.n_layers)
    if outputs not in ("same", "downstream"):
        raise ValueError(f"outputs must be 'same' or 'downstream', got {outputs!r}.")
    ids = torch.as_tensor(list(token_ids), dtype=torch.long, device=model.device)[None]
    n = ids.shape[1]
    if n == 0:
        raise ValueError("token_ids is empty.")
    t = position + n if position < 0 else position
    if not 0 <= t < n:
        raise ValueError(f"position {position} outside a prompt of {n} tokens.")
    chunk = ids[:, t : t + 1] if outputs == "same" else ids[:, t:]
    prefix = None
    with torch.no_grad(), hooked(model, reads=[site]) as cache:
        if t > 0:
            prefix = model.hf(input_ids=ids[:, :t], use_cache=True).cache
        model.hf(
            input_ids=chunk,
            cache=copy.deepcopy(prefix) if prefix is not None else None,
            use_cache=prefix is not None,
        )
    h0 = cache[site][:, 0].detach().clone()
    factors = None
    if compress_head is not None:
        factors = _head_factors(model, ids, t, outputs, compress_head)

    def f(h: torch.Tensor) -> torch.Tensor:
        if h.ndim != 2 or h.shape[1] != model.d_model:
            raise ValueError(f"f expects [b, {model.d_model}] residuals, got {tuple(h.shape)}.")
        b = h.shape[0]
        past = None
        if prefix is not None:
            past = copy.deepcopy(prefix)
            # Layers from `layer` on see b rows; below it, the batch-1 prefix is shared.
            for i, lay in enumerate(past.layers):
                if i >= layer:
                    lay.keys = lay.keys.expand(b, *lay.keys.shape[1:])
                    lay.values = lay.values.expand(b, *lay.values.shape[1:])

        def write(a: torch.Tensor) -> torch.Tensor:
            rest = a[:, 1:].expand(b, -1, -1)
            return torch.cat([h[:, None, :].to(a.dtype), rest], dim=1)

        # hooked() disables grad unless grad=True, and grad=True would make the embedding a
        # leaf (not allowed inside torch.func.jvp); keep the caller's mode instead.
        grad_mode = torch.is_grad_enabled()
        with hooked(model, writes={site: write}), torch.set_grad_enabled(grad_mode):
            if factors is None:
                y = model.hf(input_ids=chunk, cache=past, use_cache=past is not None).logits
            else:
                hid = model.hf.base_model(input_ids=chunk, cache=past, use_cache=past is not None)
                y = torch.einsum("bpd,pde->bpe", hid.last_hidden_state, factors.to(h.dtype))
        return y[:, 0] if outputs == "same" else y

    return f, h0


#: ``id(weight) -> (weakref, version, W_Uᵀ W_U, W_Uᵀ 1)`` in float64: the Gram costs ``V d²``
#: multiply-adds (33 GFLOP for SmolLM2, 107 for Gemma 3), once per model, not once per window.
#: Keyed by identity (tensors compare elementwise); an entry leaves with its tensor.
_UNEMBEDDING: dict[int, tuple[weakref.ref, int, torch.Tensor, torch.Tensor]] = {}
#: Rows of the unembedding converted to float64 at a time (bounds the transient copy).
_ROWS = 16_384


@torch.no_grad()
def _unembedding_moments(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W_Uᵀ W_U, W_Uᵀ 1)`` of the unembedding ``weight`` [V, d] in float64, cached per
    weight tensor and recomputed when the tensor is modified in place (its version moves)."""
    hit = _UNEMBEDDING.get(id(weight))
    if hit is not None and hit[0]() is weight and hit[1] == weight._version:
        return hit[2], hit[3]
    d = weight.shape[1]
    gram = torch.zeros(d, d, dtype=torch.float64, device=weight.device)
    ones = torch.zeros(d, dtype=torch.float64, device=weight.device)
    for s in range(0, weight.shape[0], _ROWS):
        w = weight[s : s + _ROWS].double()
        gram += w.T @ w
        ones += w.sum(0)
    key = id(weight)
    if hit is None or hit[0]() is not weight:
        weakref.finalize(weight, _UNEMBEDDING.pop, key, None)
    _UNEMBEDDING[key] = (weakref.ref(weight), weight._version, gram, ones)
    return gram, ones


def _weighted_rows(p: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``p @ W_U`` [P, d] in float64, ``W_U`` converted a block of rows at a time."""
    out = torch.zeros(p.shape[0], weight.shape[1], dtype=torch.float64, device=weight.device)
    for s in range(0, weight.shape[0], _ROWS):
        out += p[:, s : s + _ROWS] @ weight[s : s + _ROWS].double()
    return out


@torch.no_grad()
def _head_factors(
    model: Model, ids: torch.Tensor, t: int, outputs: Outputs, output: str
) -> torch.Tensor:
    """``[P, d, d]`` factors ``C_p`` with ``C_p C_pᵀ = A_pᵀ A_p`` (see residual_function)."""
    if output not in ("raw", "log_probs"):
        raise ValueError(f"compress_head must be 'raw' or 'log_probs', got {output!r}.")
    if getattr(model.hf.config, "final_logit_softcapping", None):
        raise ValueError(f"{model.name} soft-caps its logits; use compress_head=None.")
    weight = model.hf.get_output_embeddings().weight  # [V, d]
    gram, u = _unembedding_moments(weight)
    stop = t + 1 if outputs == "same" else ids.shape[1]
    if output == "raw":
        mats = gram[None].expand(stop - t, -1, -1)
    else:
        p = torch.softmax(model.forward(ids)[0, t:stop].double(), dim=-1)  # [P, V]
        wp = _weighted_rows(p, weight)  # W_Uᵀ p, [P, d]
        # (I − 1pᵀ)ᵀ(I − 1pᵀ) = I − p1ᵀ − 1pᵀ + V ppᵀ, sandwiched by W_U.
        mats = (
            gram[None]
            - wp[:, :, None] * u[None, None, :]
            - u[None, :, None] * wp[:, None, :]
            + weight.shape[0] * wp[:, :, None] * wp[:, None, :]
        )
    lam, q = torch.linalg.eigh((mats + mats.transpose(1, 2)) / 2)
    return (q * lam.clamp_min(0).sqrt()[:, None, :]).float()


def model_causal_dimension(
    model: Model,
    layer: int,
    prompts: Sequence[Sequence[int]],
    config: JacobianConfig | None = None,
    *,
    position: int = -1,
    outputs: Outputs = "same",
    compress_head: bool = True,
) -> CausalDimensionResult:
    """Σ = E[JᵀJ] at ``blocks.{layer}.hook_resid_pre`` over one residual vector per prompt.

    The residual vector is the prompt's token at ``position`` (default the last); each prompt
    gets its own ``f`` (its own context), and all feed one mergeable accumulator.  With
    ``compress_head`` (exact method only) the unembedding enters through ``d × d`` factors
    (see :func:`residual_function`): the same Σ at ``d/V`` of the cost.  The result's
    ``output`` field then reads ``"raw"``; ``config.output`` says what Σ is of.
    """
    if compress_head and (config or JacobianConfig()).method != "exact":
        raise ValueError("compress_head needs method='exact' (the factor is the clean point's).")
    if not prompts:
        raise ValueError("need at least one prompt.")
    cfg = config or JacobianConfig()
    compress = cfg.output if compress_head else None
    # The compressed head already includes the log-softmax; the estimator must not redo it.
    est = CausalDimension(dataclasses.replace(cfg, output="raw") if compress_head else cfg)
    with eager_attention(model):
        for toks in prompts:
            f, h0 = residual_function(model, layer, toks, position, outputs, compress_head=compress)
            est.partial_fit((f, h0))
    assert est.statistics is not None  # prompts is not empty
    return est.fit_from_statistics(est.statistics)


def vector_grams(
    model: Model,
    layer: int,
    prompts: Sequence[Sequence[int]],
    config: JacobianConfig | None = None,
    *,
    position: int = -1,
    outputs: Outputs = "same",
) -> Iterator[torch.Tensor]:
    """Yield one exact ``J(x)ᵀJ(x)`` [d, d] (float64) per prompt, in prompt order.

    Same ``f`` and conventions as :func:`model_causal_dimension` with ``compress_head``; the
    stack feeds :func:`structlens.causal_dim.kappa.kappa_from_grams` (per-vector jackknife and
    bootstrap) and can be saved vector by vector, so a long run resumes where it stopped.
    """
    cfg = dataclasses.replace(config or JacobianConfig(), n_groups=1)
    if cfg.method != "exact":
        raise ValueError("vector_grams needs method='exact'.")
    raw = dataclasses.replace(cfg, output="raw")
    with eager_attention(model):
        for toks in prompts:
            f, h0 = residual_function(
                model, layer, toks, position, outputs, compress_head=cfg.output
            )
            stats = CausalDimension(raw).partial_fit((f, h0)).statistics
            assert stats is not None  # h0 holds one vector
            yield stats.sums[0].clone()


def token_prompt_ids(
    prompts: Sequence[Sequence[int]],
    *,
    batch_size: int = 8,
    skip_first: bool = True,
    offset: int = 0,
) -> list[torch.Tensor]:
    """The prompt index of every row that :func:`residual_grads` (and
    :func:`residual_batches`) yield for ``prompts``: one ``[n_tokens]`` int64 tensor per batch.

    Built from the same padding mask and row selection as those functions, so row ``r`` of
    batch ``j`` came from prompt ``ids[j][r] − offset`` of ``prompts``.  ``offset`` shifts the
    ids, e.g. to keep them distinct across several prompt lists fed to one accumulator.
    """
    from structlens.data.tasks import pad_batch

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    out = []
    for s in range(0, len(prompts), batch_size):
        batch = list(prompts[s : s + batch_size])
        _, mask = pad_batch(batch, 0)
        sel = select_rows(mask, skip_first)
        rows = torch.arange(s, s + len(batch), dtype=torch.long)[:, None].expand_as(sel)
        out.append(rows[sel] + offset)
    return out


def residual_grads(
    model: Model,
    layer: int,
    prompts: Sequence[Sequence[int]],
    *,
    metric: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    batch_size: int = 8,
    skip_first: bool = True,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(acts, grads)`` [n_tokens, d] at ``blocks.{layer}.hook_resid_pre``, one batch
    of prompts at a time (one forward and one backward pass per batch).

    ``metric(logits, ids, mask) -> [b]`` defaults to :func:`next_token_nll` (the LM loss,
    summed over positions, so ``grads`` at token ``t`` include its effect on every later
    prediction).  Pad positions (and position 0 with ``skip_first``) are dropped.
    """
    for out in residual_grads_multi(
        model, [layer], prompts, metric=metric, batch_size=batch_size, skip_first=skip_first
    ):
        yield out[layer]


def residual_grads_multi(
    model: Model,
    layers: Sequence[int],
    prompts: Sequence[Sequence[int]],
    *,
    metric: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    batch_size: int = 8,
    skip_first: bool = True,
) -> Iterator[dict[int, tuple[torch.Tensor, torch.Tensor]]]:
    """:func:`residual_grads` at several layers from the same forward and backward pass:
    yields ``{layer: (acts, grads)}`` per batch of prompts."""
    from structlens.data.tasks import pad_batch
    from structlens.interventions import run_with_grads

    sites = {layer: site_name("resid_pre", layer, n_layers=model.n_layers) for layer in layers}
    metric = metric or next_token_nll
    pad = int(model.tokenizer.pad_token_id)
    for s in range(0, len(prompts), batch_size):
        ids, mask = (t.to(model.device) for t in pad_batch(list(prompts[s : s + batch_size]), pad))
        _, acts, grads = run_with_grads(
            # mypy cannot infer a lambda whose defaults bind loop variables
            model,
            ids,
            mask,
            list(sites.values()),
            lambda out, i=ids, m=mask: metric(out, i, m),  # type: ignore[misc]
        )
        sel = select_rows(mask, skip_first)
        yield {
            layer: (acts[site][sel].float().cpu(), grads[site][sel].float().cpu())
            for layer, site in sites.items()
        }


def sae_splice_writer(
    sae: SparseAutoencoder, *, error_term: bool = True, skip_first: bool = True
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Writer replacing the site's activation ``a`` [b, seq, d] by the SAE reconstruction.

    ``error_term=True`` adds ``a − x̂(a)`` so the model output is unchanged (the AtP splice);
    ``False`` gives the plain SAE replacement used for CE loss recovered.  With
    ``skip_first`` position 0 (the attention sink the SAE is not trained on) is kept clean.
    """

    def write(a: torch.Tensor) -> torch.Tensor:
        x = a.to(sae.W_dec.dtype)
        recon = sae(x)
        out = recon + (x - recon).detach() if error_term else recon
        out = out.to(a.dtype)
        if skip_first:
            out = torch.cat([a[:, :1], out[:, 1:]], dim=1)
        return out

    return write


@torch.no_grad()
def exact_feature_effects(
    model: Model,
    layer: int,
    token_ids: Sequence[int],
    sae: SparseAutoencoder,
    features: Sequence[int],
    metric: Callable[[torch.Tensor], torch.Tensor],
    *,
    chunk: int = 64,
    skip_first: bool = True,
) -> torch.Tensor:
    """Exact effect on ``metric`` of zero-ablating each feature at every position of ONE
    prompt, with the SAE spliced in with its error term: ``[len(features)]``.

    Ablating ``i`` writes ``h − f_i(h)·W_dec[i]`` at each position; ``metric(logits [b, seq,
    V]) -> [b]``.  Layers below ``layer`` run once; rows are expanded at the write.  With
    ``skip_first`` position 0 is never ablated (as in :func:`sae_splice_writer`).
    """
    site = site_name("resid_pre", layer, n_layers=model.n_layers)
    ids = torch.as_tensor(list(token_ids), dtype=torch.long, device=model.device)[None]
    feats = torch.as_tensor(list(features), dtype=torch.long)
    if feats.numel() == 0 or feats.min() < 0 or feats.max() >= sae.d_sae:
        raise ValueError(f"features must be a non-empty list of indices in [0, {sae.d_sae}).")
    base = metric(model.forward(ids))
    out = []
    for s in range(0, feats.numel(), chunk):
        fs = feats[s : s + chunk]

        def write(a: torch.Tensor, fs: torch.Tensor = fs) -> torch.Tensor:
            f = sae.encode(a[0].to(sae.W_dec.dtype))  # [seq, d_sae]
            if skip_first:
                f[0] = 0
            delta = f[:, fs].T[:, :, None] * sae.W_dec[fs][:, None, :]  # [F, seq, d]
            return a - delta.to(a.dtype)

        with hooked(model, writes={site: write}):
            logits = model.hf(input_ids=ids, use_cache=False).logits
        out.append(metric(logits) - base)
    return torch.cat(out)

"""The causal-dimensionality sections that run on trained SAEs beside the protocol's stages
(:mod:`structlens.causal_dim.stages`): the four-cell encoder/decoder ablation and IOI
task-specific recovery.

Both take a loaded :class:`~structlens.models.Model` (or the evaluation pairs) and an SAE and
return plain dicts of JSON-ready values.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from structlens.causal_dim.controls import four_cell_ablation
from structlens.causal_dim.model import eager_attention, residual_function, residual_grads
from structlens.models.loading import Model
from structlens.sae import SparseAutoencoder

__all__ = ["four_cell", "ioi_recovery"]


def four_cell(
    sae: SparseAutoencoder, acts_grads: Sequence[tuple[torch.Tensor, torch.Tensor]], seed: int = 0
) -> dict[str, Any]:
    """The four-cell ablation of ``sae`` on ``(acts, grads)`` batches (learned vs random
    orthonormal encoder × decoder): N_causal, N_repr, inflation, L0 and ε per cell."""
    res = four_cell_ablation(sae, acts_grads, seed=seed)
    return {
        "width": sae.d_sae,
        "n_causal": res.n_causal,
        "n_repr": res.n_repr,
        "inflation": res.inflation,
        "l0": res.l0,
        "epsilon": res.epsilon,
        "n_tokens": res.n_tokens,
    }


def ioi_recovery(
    model: Model,
    layer: int,
    sae: SparseAutoencoder,
    *,
    n_prompts: int = 32,
    n_ground_truth: int = 10,
    top_fraction: float = 0.05,
    seed: int = 0,
) -> dict[str, Any]:
    """Task-specific recovery on IOI at the END position of ``blocks.{layer}.hook_resid_pre``.

    Ground truth: the ``n_ground_truth`` features with the largest mean ``|Δ metric|`` under
    exact zero-ablation (SAE spliced with its error term, feature removed at END only, metric
    logit(IO) − logit(S)); AtP: ``mean_p |−f_i ⟨W_dec[i], ∇_h metric⟩|`` at END.  Reports the
    share of the ground truth inside AtP's top ``top_fraction`` of ALL ``d_sae`` features and
    of the features that fire at END on some prompt, and the Spearman correlation over those.
    """
    from scipy.stats import spearmanr

    from structlens.data.tasks import make_task

    task = make_task("ioi", model.tokenizer, n=n_prompts, seed=seed)
    end = task.positions["END"]
    acts_l, grads_l = [], []
    for i, toks in enumerate(task.clean):

        def metric(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, i: int = i):
            return task.metric(task.gather_logits(logits, [i]), [i])

        for acts, grads in residual_grads(model, layer, [toks], metric=metric, skip_first=False):
            acts_l.append(acts[end[i]])
            grads_l.append(grads[end[i]])
    acts, grads = torch.stack(acts_l), torch.stack(grads_l)
    sae = copy.deepcopy(sae).cpu()  # codes and scores on the CPU, like acts and grads
    with torch.no_grad():
        f = sae.encode(acts.to(sae.W_dec.dtype))  # [n, m]
        atp = (-f * (grads.to(sae.W_dec.dtype) @ sae.W_dec.T)).abs().double()
    exact = torch.zeros_like(atp)
    with eager_attention(model), torch.no_grad():
        for i, toks in enumerate(task.clean):
            feats = torch.nonzero(f[i] > 0).squeeze(1)
            if feats.numel() == 0:
                continue
            fn, h0 = residual_function(model, layer, toks, end[i], "same")
            base = task.metric(fn(h0), [i])
            rows = h0 - (f[i, feats, None] * sae.W_dec[feats]).to(h0.device)
            vals = task.metric(fn(rows.to(h0.dtype)), [i] * feats.numel())
            exact[i, feats] = (vals - base).abs().double().cpu()
    atp_s, exact_s = atp.mean(0).numpy(), exact.mean(0).numpy()
    fired = np.flatnonzero((f > 0).any(0).numpy())
    gt = np.argsort(-exact_s, kind="stable")[:n_ground_truth]
    k_all = math.ceil(top_fraction * sae.d_sae)
    k_fired = max(1, math.ceil(top_fraction * fired.size))
    top_all = set(np.argsort(-atp_s, kind="stable")[:k_all].tolist())
    top_fired = set(fired[np.argsort(-atp_s[fired], kind="stable")[:k_fired]].tolist())
    return {
        "width": sae.d_sae,
        "n_prompts": n_prompts,
        "n_fired_at_end": int(fired.size),
        "n_ground_truth": n_ground_truth,
        "top_fraction": top_fraction,
        "recall_top_of_all": float(np.mean([g in top_all for g in gt])),
        "k_all": k_all,
        "recall_top_of_fired": float(np.mean([g in top_fired for g in gt])),
        "k_fired": k_fired,
        "spearman_fired": float(spearmanr(atp_s[fired], exact_s[fired]).statistic),
        "ground_truth": gt.tolist(),
    }

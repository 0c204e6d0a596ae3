"""The causal-dimensionality sections that run on trained SAEs beside the protocol's stages
(:mod:`structlens.causal_dim.stages`).

:func:`four_cell` and :func:`ioi_recovery` take one SAE and return plain dicts (the
``causal-dim ablate`` command writes those); the typed stages below return frozen Results
(what the replication caches and :mod:`structlens.causal_dim.verdicts` reads):

* :func:`ce_recovered` — CE loss recovered per SAE (:class:`CERecovered`).
* :func:`four_cells` — the four-cell ablation per architecture (:class:`FourCell`).
* :func:`architecture_counts` — N_repr and N_causal per architecture at one width
  (:class:`ArchitectureCounts`).
* :func:`architecture_growth` — N_causal growth over widths per architecture
  (:class:`ArchitectureGrowth`).
* :func:`epsilon_by_depth` — ε and AtP by layer (:class:`DepthEpsilon`).
* :func:`ioi` — IOI task-specific recovery (:class:`IOIRecovery`).
* :func:`synthetic_recall` — AtP recall of known causal directions on a synthetic model,
  with its positive control (:class:`SyntheticRecall`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from structlens.causal_dim.controls import four_cell_ablation
from structlens.causal_dim.model import eager_attention, residual_function, residual_grads
from structlens.models.loading import Model
from structlens.results import Result
from structlens.sae import SparseAutoencoder, TopKSAE

__all__ = [
    "four_cell",
    "ioi_recovery",
    "CERecovered",
    "ce_recovered",
    "FourCell",
    "four_cells",
    "ArchitectureCounts",
    "architecture_counts",
    "ArchitectureGrowth",
    "architecture_growth",
    "DepthEpsilon",
    "epsilon_by_depth",
    "IOIRecovery",
    "ioi",
    "SyntheticRecall",
    "synthetic_recall",
]

Pairs = Sequence[tuple[torch.Tensor, torch.Tensor]]
# N_causal's calibration: ε is the 98th percentile of AtP (the top 2% count as causal).
TOP_SHARE = 0.02


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


def _scores(sae: SparseAutoencoder, pairs: Pairs) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean |AtP| and firing counts of ``sae`` over ``pairs``."""
    from structlens.causal_dim.sweep import FeatureStats

    st = FeatureStats(sae.d_sae, n_blocks=1)
    for acts, grads in pairs:
        st.update(sae, acts, grads)
    return st.scores()


@dataclasses.dataclass(frozen=True)
class CERecovered(Result):
    """CE loss recovered per SAE name (clean, zero-ablated and spliced CE, and the score)."""

    layer: int
    by_sae: dict


def ce_recovered(
    model: Model,
    layer: int,
    saes: Mapping[str, SparseAutoencoder],
    prompts: Sequence[Sequence[int]],
) -> CERecovered:
    """CE loss recovered of each SAE of ``saes`` (name → SAE) spliced at ``layer`` on
    ``prompts`` (zero ablation; the clean and ablated runs shared)."""
    from structlens.sae.sweep import ce_recovered_by_width

    todo: dict[Any, Any] = dict(saes)  # the function accepts any keys, e.g. widths
    got = ce_recovered_by_width(model, layer, todo, prompts)
    return CERecovered(layer=int(layer), by_sae={str(k): v for k, v in got.items()})


@dataclasses.dataclass(frozen=True)
class FourCell(Result):
    """The four-cell ablation (:func:`four_cell`) of each architecture at one width."""

    width: int
    layer: int
    architectures: dict


def four_cells(
    saes: Mapping[str, SparseAutoencoder], pairs: Pairs, *, width: int, layer: int, seed: int
) -> FourCell:
    """:func:`four_cell` of each SAE of ``saes`` (architecture → SAE at ``width``)."""
    cells = {a: four_cell(sae, pairs, seed=seed) for a, sae in saes.items()}
    return FourCell(width=int(width), layer=int(layer), architectures=cells)


@dataclasses.dataclass(frozen=True)
class ArchitectureCounts(Result):
    """Per architecture at one width: N_repr, N_causal against common thresholds (the
    sweep's ε, TopK's own 98th percentile) and against its own, the AtP share of its own
    top 2%, and its quality on the evaluation tokens."""

    width: int
    layer: int
    rows: dict


def architecture_counts(
    saes: Mapping[str, SparseAutoencoder],
    pairs: Pairs,
    eval_acts: torch.Tensor,
    *,
    width: int,
    layer: int,
    sweep_epsilon: float | None,
) -> ArchitectureCounts:
    """N_repr and N_causal of each SAE of ``saes`` (architecture → SAE at ``width``, TopK as
    ``"topk"``) over the evaluation ``pairs``; ``sweep_epsilon`` is the width sweep's ε."""
    from structlens.causal_dim.sweep import calibrate_epsilon
    from structlens.sae.sweep import sae_quality

    scores = {a: _scores(sae, pairs) for a, sae in saes.items()}
    eps_topk = calibrate_epsilon(scores["topk"][0], TOP_SHARE) if "topk" in scores else None
    rows = {}
    for a, (atp, fires) in scores.items():
        eps_own = calibrate_epsilon(atp, TOP_SHARE)
        rows[a] = {
            "n_repr": int((fires >= 1).sum()),
            "epsilon_own": eps_own,
            "n_causal_at_sweep_epsilon": (
                int((atp > sweep_epsilon).sum()) if sweep_epsilon is not None else None
            ),
            "n_causal_at_topk_epsilon": int((atp > eps_topk).sum()) if eps_topk else None,
            "top2pct_atp_share": float(atp[atp > eps_own].sum() / max(atp.sum(), 1e-300)),
            "quality": sae_quality(saes[a], eval_acts),
        }
    return ArchitectureCounts(width=int(width), layer=int(layer), rows=rows)


@dataclasses.dataclass(frozen=True)
class ArchitectureGrowth(Result):
    """Per architecture over ``widths`` at L0 ≈ ``k``: N_repr, N_causal (ε from its own base
    width), their growth at the widest SAE, and FVU and L0 per width."""

    widths: list
    layer: int
    k: int
    rows: dict


def architecture_growth(
    protocol: Any,
    saes: Mapping[str, Mapping[int, SparseAutoencoder]],
    pairs: Pairs,
    eval_acts: torch.Tensor,
    *,
    prompt_ids: Sequence[Any],
    layer: int,
    d_model: int,
) -> ArchitectureGrowth:
    """One width sweep (no bootstrap) per architecture of ``saes`` (architecture → width →
    SAE) over the evaluation ``pairs``, under ``protocol``'s sweep settings."""
    from structlens.causal_dim.sweep import sweep_analysis
    from structlens.sae.sweep import sae_quality

    cfg = protocol.width_sweep(d_model, n_bootstrap=0)
    rows, widths = {}, []
    for a, by_width in saes.items():
        widths = sorted(by_width)
        quality = {w: sae_quality(by_width[w], eval_acts) for w in widths}
        res, _ = sweep_analysis(
            {w: by_width[w] for w in widths}, pairs, cfg, prompt_ids=prompt_ids,
            n_blocks=protocol.sweep_blocks, heldout_fvu={w: q["fvu"] for w, q in quality.items()},
        )  # fmt: skip
        rows[a] = {
            "n_repr": res.n_repr.tolist(),
            "n_causal": res.n_causal.tolist(),
            "epsilon": res.epsilon,
            "n_repr_growth": float(res.n_repr_growth[-1]),
            "n_causal_growth": float(res.n_causal_growth[-1]),
            "fvu": [quality[w]["fvu"] for w in widths],
            "l0": [quality[w]["l0"] for w in widths],
        }
    return ArchitectureGrowth(widths=widths, layer=int(layer), k=int(protocol.sae_k), rows=rows)


@dataclasses.dataclass(frozen=True)
class DepthEpsilon(Result):
    """ε (98th percentile of AtP), mean AtP, median gradient norm, N_repr, the SAE's k (TopK;
    ``None`` otherwise) and quality of one SAE of ``width`` per layer (``rows``, by depth);
    ``k_search`` holds, by layer (string keys), how each layer's k was chosen to match the
    sweep layer's held-out FVU (:class:`~structlens.causal_dim.stages.KMatch` as JSON; empty
    for a fixed k)."""

    width: int
    rows: list
    k_search: dict = dataclasses.field(default_factory=dict)


def epsilon_by_depth(
    saes: Mapping[int, SparseAutoencoder],
    pairs: Mapping[int, Pairs],
    eval_acts: Mapping[int, torch.Tensor],
    *,
    width: int,
    k_search: Mapping[int, Mapping[str, Any]] | None = None,
) -> DepthEpsilon:
    """ε and AtP of each SAE of ``saes`` (layer → SAE) over that layer's evaluation pairs;
    ``k_search`` (layer → how its k was chosen) is recorded beside them."""
    from structlens.causal_dim.sweep import calibrate_epsilon
    from structlens.sae.sweep import sae_quality

    rows = []
    for layer in sorted(saes):
        atp, fires = _scores(saes[layer], pairs[layer])
        gnorm = torch.cat([grads.norm(dim=1) for _, grads in pairs[layer]])
        rows.append(
            {
                "layer": int(layer),
                "epsilon": calibrate_epsilon(atp, TOP_SHARE),
                "mean_atp": float(atp.mean()),
                "median_grad_norm": float(gnorm.median()),
                "n_repr": int((fires >= 1).sum()),
                "k": saes[layer].k if isinstance(saes[layer], TopKSAE) else None,
                "quality": sae_quality(saes[layer], eval_acts[layer]),
            }
        )
    search = {str(y): dict(v) for y, v in (k_search or {}).items()}
    return DepthEpsilon(width=int(width), rows=rows, k_search=search)


@dataclasses.dataclass(frozen=True)
class IOIRecovery(Result):
    """:func:`ioi_recovery`'s numbers: the share of the exact-ablation ground truth inside
    AtP's top ``top_fraction`` of all features and of those firing at END, and the Spearman
    correlation of AtP with the exact effects over the firing features."""

    width: int
    n_prompts: int
    n_fired_at_end: int
    n_ground_truth: int
    top_fraction: float
    recall_top_of_all: float
    k_all: int
    recall_top_of_fired: float
    k_fired: int
    spearman_fired: float
    ground_truth: list


def ioi(
    model: Model, layer: int, sae: SparseAutoencoder, *, n_prompts: int, seed: int
) -> IOIRecovery:
    """:func:`ioi_recovery` as a typed stage."""
    return IOIRecovery(**ioi_recovery(model, layer, sae, n_prompts=n_prompts, seed=seed))


# The synthetic ground truth: causal read-out directions are rotated mixtures of the atoms,
# not atoms an SAE could learn one by one; the TopK SAE and the ranks recall is read at.
SYNTHETIC_MODEL: dict[str, Any] = {
    "d": 32,
    "n_atoms": 256,
    "n_causal": 8,
    "vocab": 64,
    "active": 4,
    "seed": 0,
}
SYNTHETIC_SAE: dict[str, Any] = {"d_sae": 512, "k": 4, "lr": 2e-3}
SYNTHETIC_TOP_K = (8, 11, 26)


@dataclasses.dataclass(frozen=True)
class SyntheticRecall(Result):
    """AtP recall (top k → :class:`~structlens.causal_dim.controls.RecallResult` as JSON) of
    the synthetic model's causal directions: ``rotated`` (the paper's ground truth) and
    ``atoms`` (the positive control, directions an SAE can learn), after ``steps`` batches."""

    rotated: dict
    atoms: dict
    steps: int
    model: dict
    sae: dict


def synthetic_recall(steps: int) -> SyntheticRecall:
    """Train one TopK SAE per read-out (``rotated``, ``atoms``) on ``steps`` batches of 512
    samples of :class:`~structlens.causal_dim.controls.SyntheticCausalModel` and rank its
    features by AtP on 4000 fresh samples."""
    from structlens.causal_dim.controls import SyntheticCausalModel, atp_recall
    from structlens.sae import SAETrainConfig, train_sae

    def recall(readout: str) -> dict[str, Any]:
        model = SyntheticCausalModel(**SYNTHETIC_MODEL, readout=readout)
        sae = train_sae(
            SAETrainConfig(architecture="topk", **SYNTHETIC_SAE),
            (model.sample(512) for _ in range(steps)),
        ).sae
        acts = model.sample(4000)
        grads = model.metric_grads(acts)
        return {
            str(k): atp_recall(sae, model.causal, acts, grads, top_k=k).to_json()
            for k in SYNTHETIC_TOP_K
        }

    return SyntheticRecall(
        rotated=recall("rotated"), atoms=recall("atoms"), steps=int(steps),
        model=dict(SYNTHETIC_MODEL), sae=dict(SYNTHETIC_SAE),
    )  # fmt: skip

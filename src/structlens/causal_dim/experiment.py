"""End-to-end causal-dimensionality experiments on a model (used by the CLI and the
replication script): κ by layer, a width sweep of SAEs at one layer with AtP on the LM loss,
CE loss recovered, the four-cell ablation and IOI task-specific recovery.

Every function takes a loaded :class:`~structlens.models.Model` and token-id lists and returns
plain dicts of JSON-ready values (plus trained SAEs where relevant).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch

from structlens.causal_dim.controls import four_cell_ablation
from structlens.causal_dim.jacobian import JacobianConfig
from structlens.causal_dim.kappa import kappa_from_grams
from structlens.causal_dim.model import (
    eager_attention,
    residual_function,
    residual_grads,
    sae_splice_writer,
    token_prompt_ids,
    vector_grams,
)
from structlens.causal_dim.sweep import FeatureStats, WidthSweepConfig, analyze_width_sweep
from structlens.config import ExperimentReport, check_choices
from structlens.execution import Executor
from structlens.models.loading import Model
from structlens.sae import (
    SparseAutoencoder,
)
from structlens.sae.experiment import SAEExperimentConfig
from structlens.stats.ranks import CONVENTION, effective_ranks


def kappa_by_layer(
    model: Model,
    layers: Sequence[int],
    prompts: Sequence[Sequence[int]],
    config: JacobianConfig | None = None,
    *,
    position: int = -1,
    outputs: str = "same",
    n_bootstrap: int = 200,
    seed: int = 0,
) -> dict[str, Any]:
    """Exact κ (erank), κ_PR, stable and numerical rank of Σ at each layer, with spectra.

    One exact Gram per prompt (:func:`~structlens.causal_dim.model.vector_grams`); with ≥ 2
    prompts ``erank``/``participation_ratio`` are the bias-corrected jackknife estimates with
    their SEs and t intervals over prompts (each prompt its own group:
    :func:`~structlens.causal_dim.kappa.kappa_from_grams`), and ``erank_plugin`` /
    ``participation_ratio_plugin`` the plug-in values; with one prompt the point is the
    plug-in and the errors are ``None``.
    """
    cfg = config or JacobianConfig(output="log_probs")
    if not prompts:
        raise ValueError("need at least one prompt.")
    out: dict[str, Any] = {"layers": [], "d": model.d_model}
    for layer in layers:
        grams = torch.stack(
            list(vector_grams(model, layer, prompts, cfg, position=position, outputs=outputs))  # type: ignore[arg-type]
        )
        if grams.shape[0] >= 2:
            res = kappa_from_grams(grams)
            err = {
                "erank_se": res.erank_se,
                "participation_ratio_se": res.participation_ratio_se,
                "erank_ci": res.erank_ci,
                "participation_ratio_ci": res.participation_ratio_ci,
            }
            lam = res.eigenvalues
            erank, pr = res.erank, res.participation_ratio
            plugin = {
                "erank_plugin": res.erank_plugin,
                "participation_ratio_plugin": res.participation_ratio_plugin,
                "ci_method": res.ci_method,
            }
            stable, numerical = res.stable_rank, res.numerical_rank
        else:
            lam = np.linalg.eigvalsh(grams[0].numpy())[::-1]
            r = effective_ranks(lam)
            err = dict.fromkeys(
                ("erank_se", "participation_ratio_se", "erank_ci", "participation_ratio_ci")
            )
            erank, pr = r.entropy_effective_rank, r.participation_ratio
            plugin = {"erank_plugin": erank, "participation_ratio_plugin": pr, "ci_method": None}
            stable, numerical = r.stable_rank, r.numerical_rank
        out["layers"].append(
            {
                "layer": int(layer),
                "erank": erank,
                "participation_ratio": pr,
                **plugin,
                "stable_rank": stable,
                "numerical_rank": numerical,
                "kappa_over_d": erank / model.d_model,
                **err,
                "n_vectors": int(grams.shape[0]),
                "eigenvalues": np.asarray(lam).tolist(),
            }
        )
    out["settings"] = {
        "output": cfg.output,
        "outputs": outputs,
        "position": position,
        "n_prompts": len(prompts),
        "prompt_tokens": [len(p) for p in prompts],
        "convention": CONVENTION,
    }
    return out


def sweep_analysis(
    saes: dict[int, SparseAutoencoder],
    acts_grads: Sequence[tuple[torch.Tensor, torch.Tensor]],
    config: WidthSweepConfig | None = None,
    *,
    prompt_ids: Sequence[torch.Tensor] | None = None,
    n_blocks: int = 64,
    exact_erank: float | None = None,
    heldout_fvu: dict[int, float] | None = None,
) -> tuple[Any, dict[int, FeatureStats]]:
    """FeatureStats for every width from the SAME cached ``(acts, grads)``, then the analysis
    (``heldout_fvu``: width → held-out FVU, for the sweep's FVU gate).

    ``prompt_ids`` holds, per batch of ``acts_grads``, the prompt of every row
    (:func:`~structlens.causal_dim.model.token_prompt_ids`): the bootstrap and jackknife
    resample whole prompts.  Required unless ``n_blocks == 1``.
    """
    batches = list(acts_grads)
    if prompt_ids is None:
        if n_blocks != 1:
            raise ValueError(
                "sweep_analysis needs prompt_ids (one tensor per batch, the prompt of each "
                "token; see structlens.causal_dim.model.token_prompt_ids): the intervals "
                "resample whole prompts."
            )
        ids: list[torch.Tensor | None] = [None] * len(batches)
    else:
        ids = list(prompt_ids)
        if len(ids) != len(batches):
            raise ValueError(
                f"prompt_ids has {len(ids)} batches but acts_grads {len(batches)}; give one "
                "tensor of prompt ids per (acts, grads) batch."
            )
    stats = {m: FeatureStats(m, n_blocks) for m in saes}
    for (acts, grads), pid in zip(batches, ids, strict=True):
        for m, sae in saes.items():
            stats[m].update(sae, acts, grads, pid)
    res = analyze_width_sweep(stats, config, exact_erank=exact_erank, heldout_fvu=heldout_fvu)
    return res, stats


def four_cell(
    sae: SparseAutoencoder, acts_grads: Sequence[tuple[torch.Tensor, torch.Tensor]], seed: int = 0
) -> dict[str, Any]:
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


@dataclasses.dataclass(frozen=True)
class CausalDimExperimentConfig:
    """Settings of one causal-dimensionality experiment.

    ``jacobian``: exact Σ = E[JᵀJ] at ``blocks.{l}.hook_resid_pre`` for ``layers``, from
    ``jacobian_prompts`` corpus windows of ``jacobian_tokens`` tokens, of the ``output``
    (``log_probs`` or ``raw`` logits) at the ``same`` (last) or ``downstream`` positions.
    ``sweep``: SAEs of ``sae_config.widths`` (≥ 2) at ``sae_config.layer``, AtP on the LM
    loss over the held-out windows in ``n_blocks`` prompt blocks, N_repr/N_causal at
    ε = ``percentile``, κ̂ with ``n_bootstrap`` resamples, and the exact κ at that layer.
    ``ablate``: the four-cell encoder/decoder ablation of a given SAE at ``sae_config.layer``
    on its held-out windows.
    """

    analysis: Literal["jacobian", "sweep", "ablate"] = "jacobian"
    layers: tuple[int, ...] = (0,)
    jacobian_prompts: int = 4
    jacobian_tokens: int = 24
    output: Literal["log_probs", "raw"] = "log_probs"
    positions: Literal["same", "downstream"] = "same"
    sae_config: SAEExperimentConfig = dataclasses.field(default_factory=SAEExperimentConfig)
    percentile: float = 98.0
    min_count: int = 1
    n_bootstrap: int = 200
    n_blocks: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        check_choices(self)
        if not self.layers or min(self.layers) < 0:
            raise ValueError(f"layers must name layers >= 0; got {list(self.layers)}.")
        if self.jacobian_prompts < 1:
            raise ValueError("jacobian_prompts must be ≥ 1.")
        if self.analysis == "sweep" and len(self.sae_config.widths) < 2:
            raise ValueError("a width sweep needs at least two widths.")
        self.width_sweep  # noqa: B018  (WidthSweepConfig validates percentile, min_count, ...)

    @property
    def width_sweep(self) -> WidthSweepConfig:
        """The settings of the width-sweep analysis."""
        return WidthSweepConfig(
            percentile=self.percentile, min_count=self.min_count,
            n_bootstrap=self.n_bootstrap, seed=self.seed,
        )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class CausalDimReport(ExperimentReport):
    """Results of a causal-dimensionality experiment; ``payload()`` is its JSON document
    (``results`` holds κ by layer, the width sweep or the four-cell table)."""

    def payload(self) -> dict[str, Any]:
        return {"model": self.model, **self.meta, **self.results}


def _check_layers(layers: Sequence[int], n_layers: int) -> None:
    if any(not 0 <= x < n_layers for x in layers):
        raise ValueError(f"layers must lie in [0, {n_layers}); got {list(layers)}.")


def _kappa(cfg: CausalDimExperimentConfig, model: Model, layers: Sequence[int]) -> dict[str, Any]:
    from structlens.sae.collect import corpus_windows

    _, held = corpus_windows(model.tokenizer, cfg.jacobian_tokens, 1, cfg.jacobian_prompts)
    n = cfg.jacobian_prompts
    jac = JacobianConfig(output=cfg.output, n_groups=max(2, n), max_rows=max(2048, model.d_model))
    return kappa_by_layer(model, layers, held, jac, outputs=cfg.positions)


def run(
    cfg: CausalDimExperimentConfig,
    model: Model,
    *,
    sae: SparseAutoencoder | None = None,
    executor: str | Executor | None = None,
) -> tuple[CausalDimReport, dict[int, SparseAutoencoder]]:
    """Run ``cfg.analysis`` on ``model``; returns the report and the SAEs trained (by width;
    empty unless ``sweep``).  ``ablate`` needs the ``sae`` to ablate; ``executor`` trains the
    sweep's widths in parallel (same SAEs as in-process)."""
    from structlens.sae.collect import check_sae_fits, corpus_windows
    from structlens.sae.experiment import train_saes

    if cfg.analysis == "jacobian":
        _check_layers(cfg.layers, model.n_layers)
        res = _kappa(cfg, model, cfg.layers)
        first = res["layers"][0]
        kappa = {k: first[k] for k in ("erank", "participation_ratio", "layer")}
        results = {"kappa": kappa, "by_layer": res}
        return CausalDimReport(analysis="causal_jacobian", model=model.name, results=results), {}
    layer = cfg.sae_config.layer
    _check_layers([layer], model.n_layers)
    if cfg.analysis == "ablate":
        if sae is None:
            raise ValueError("the four-cell ablation needs an SAE (--sae).")
        check_sae_fits(sae, model)
        _, ev = corpus_windows(
            model.tokenizer, cfg.sae_config.prompt_tokens, 1, cfg.sae_config.eval_prompts
        )
        table = four_cell(sae, list(residual_grads(model, layer, ev)), seed=cfg.seed)
        report = CausalDimReport(
            analysis="causal_ablate", model=model.name, results={"four_cell": table},
            meta={"layer": layer},
        )  # fmt: skip
        return report, {}
    if not model.causal:
        raise ValueError(f"{model.name} is an encoder; the sweep's AtP metric is the LM loss.")
    trained, _, ev = train_saes(cfg.sae_config, model, executor=executor)
    saes = {w: r.sae for w, r in trained.items()}
    kappa = _kappa(dataclasses.replace(cfg, output="log_probs", positions="same"), model, [layer])
    erank = kappa["layers"][0]["erank"]
    pairs = list(residual_grads(model, layer, ev))
    res, _ = sweep_analysis(
        saes, pairs, cfg.width_sweep, prompt_ids=token_prompt_ids(ev), n_blocks=cfg.n_blocks,
        exact_erank=erank,
    )  # fmt: skip
    # Every array as a list (to_json keeps only shapes), so the document holds the whole
    # result and WidthSweepResult.from_dict rebuilds it.
    fields = {f.name: getattr(res, f.name) for f in dataclasses.fields(res)}
    sweep_json = res.to_json() | {
        name: value.tolist() for name, value in fields.items() if isinstance(value, np.ndarray)
    }
    pr = kappa["layers"][0]["participation_ratio"]
    results = {
        "kappa": {"erank": erank, "participation_ratio": pr, "by_layer": kappa},
        "sweep": sweep_json,
    }
    report = CausalDimReport(
        analysis="causal_sweep", model=model.name, results=results, meta={"layer": layer}
    )
    return report, saes


__all__ = [
    "CausalDimExperimentConfig",
    "CausalDimReport",
    "run",
    "four_cell",
    "ioi_recovery",
    "kappa_by_layer",
    "sae_splice_writer",
    "sweep_analysis",
]

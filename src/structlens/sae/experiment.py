"""SAE experiments on a model: train one or several widths on one activation stream
(:func:`run`) and evaluate a saved SAE (:func:`evaluate`), at ``blocks.{layer}.hook_resid_pre``.

Example
-------
>>> from structlens.sae.experiment import SAEExperimentConfig
>>> SAEExperimentConfig(widths=(128, 64), k=4).widths
(64, 128)
>>> SAEExperimentConfig(arch="gated")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: unknown architecture 'gated'; choose from: relu, topk, ...
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from structlens.config import ExperimentReport
from structlens.sae.collect import check_sae_fits, corpus_windows, residuals
from structlens.sae.train import SAETrainConfig

__all__ = [
    "SAEExperimentConfig",
    "SAEEvaluationConfig",
    "SAEReport",
    "run",
    "evaluate",
    "train_saes",
]


@dataclass(frozen=True)
class SAEExperimentConfig:
    """SAEs of ``widths`` (sorted, distinct) trained on the residual stream at ``layer`` over
    ``prompts`` corpus windows of ``prompt_tokens`` tokens, ``epochs`` passes in batches of
    ``batch_size`` tokens; evaluated on ``eval_prompts`` held-out windows.  ``k`` is the
    TopK/BatchTopK k, ``target_l0`` the matched L0 of relu/jumprelu, ``lr_base`` the learning
    rate at width 2^14; ``arch`` names a registered architecture (all checked by
    :class:`~structlens.sae.SAETrainConfig`)."""

    layer: int = 0
    widths: tuple[int, ...] = (4096,)
    arch: str = "topk"
    k: int = 32
    target_l0: float | None = None
    prompts: int = 200
    eval_prompts: int = 8
    prompt_tokens: int = 128
    epochs: int = 1
    batch_size: int = 512
    lr_base: float = 2e-4
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.widths or min(self.widths) < 1:
            raise ValueError(f"widths must be positive integers; got {list(self.widths)}.")
        object.__setattr__(self, "widths", tuple(sorted(set(self.widths))))
        if self.prompt_tokens < 2 or self.prompts < 1 or self.eval_prompts < 1:
            raise ValueError("--prompt-tokens must be ≥ 2 and --prompts/--eval-prompts ≥ 1.")
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError(
                f"epochs and batch_size must be ≥ 1; got {self.epochs}, {self.batch_size}."
            )
        self.train_config  # noqa: B018  (SAETrainConfig validates arch, k, target_l0, lr_base)

    @property
    def train_config(self) -> SAETrainConfig:
        """The training settings of the smallest width (the sweep scales them per width)."""
        return SAETrainConfig(
            architecture=self.arch, d_sae=self.widths[0], k=self.k, target_l0=self.target_l0,
            lr_base=self.lr_base, seed=self.seed,
        )  # fmt: skip


@dataclass(frozen=True)
class SAEEvaluationConfig:
    """Evaluation of a saved SAE at ``layer`` on ``eval_prompts`` held-out corpus windows."""

    layer: int = 0
    eval_prompts: int = 8
    prompt_tokens: int = 128

    def __post_init__(self) -> None:
        if self.prompt_tokens < 2 or self.eval_prompts < 1:
            raise ValueError("--prompt-tokens must be ≥ 2 and --eval-prompts ≥ 1.")


@dataclass(frozen=True)
class SAEReport(ExperimentReport):
    """Results of an SAE experiment: ``results`` per width (training, held-out quality, CE
    loss recovered) or, for an evaluation, ``eval`` and ``ce``."""

    def payload(self) -> dict[str, Any]:
        if self.analysis == "sae_eval":
            return {"model": self.model, **self.meta, **self.results}
        return {"model": self.model, **self.meta, "per_width": self.results}


def train_saes(
    cfg: SAEExperimentConfig, model: Any, *, executor: Any = None
) -> tuple[dict[int, Any], Any, list[list[int]]]:
    """Train one SAE per width on the training windows' residuals; returns the training
    results by width, the training activations and the held-out windows."""
    from structlens.sae.sweep import train_width_sweep

    tr, ev = corpus_windows(model.tokenizer, cfg.prompt_tokens, cfg.prompts, cfg.eval_prompts)
    acts = residuals(model, cfg.layer, tr)
    if acts.shape[0] < cfg.batch_size:
        raise ValueError(f"only {acts.shape[0]} training tokens for --batch-size {cfg.batch_size}.")
    trained = train_width_sweep(
        acts, cfg.widths, cfg.train_config, batch_size=cfg.batch_size, epochs=cfg.epochs,
        seed=cfg.seed, executor=executor,
    )  # fmt: skip
    return trained, acts, ev


def run(cfg: SAEExperimentConfig, model: Any, *, out: Path, executor: Any = None) -> SAEReport:
    """Train one SAE per width on ONE activation stream (same tokens, same order), save each
    to ``out/saes/<width>`` (SAELens format) and evaluate it on the held-out windows.

    ``executor`` trains the widths in parallel (same SAEs as in-process).
    """
    from structlens.provenance import provenance
    from structlens.sae import save_sae
    from structlens.sae.sweep import ce_recovered_by_width, sae_quality
    from structlens.sites import site_name

    site = site_name("resid_pre", cfg.layer, n_layers=model.n_layers)
    trained, acts, ev = train_saes(cfg, model, executor=executor)
    eval_acts = residuals(model, cfg.layer, ev)
    saes = {w: r.sae for w, r in trained.items()}
    ce = ce_recovered_by_width(model, cfg.layer, saes, ev) if model.causal else {}
    per_width = {}
    for w, r in trained.items():
        # cast: the str fields go to save_sae's str keywords, never to ``metadata``
        save_sae(r.sae, out / "saes" / str(w), **cast(dict[str, Any], provenance(model, site)))
        per_width[str(w)] = {
            "train": {
                "tokens": r.tokens,
                "steps": r.steps,
                "final_fvu": r.final_fvu,
                "final_l0": r.final_l0,
                "dead_fraction": r.dead_fraction,
                "learning_rate": r.learning_rate,
            },
            "eval": sae_quality(r.sae, eval_acts),
            "ce": ce.get(w),
            "path": str(out / "saes" / str(w)),
        }
    meta = {
        "site": site,
        "n_train_tokens": int(acts.shape[0]),
        "epochs": cfg.epochs,
        "widths": list(cfg.widths),
    }
    analysis = "sae_train" if len(cfg.widths) == 1 else "sae_sweep"
    return SAEReport(analysis=analysis, model=model.name, results=per_width, meta=meta)


def evaluate(cfg: SAEEvaluationConfig, model: Any, sae: Any, *, path: Path) -> SAEReport:
    """FVU, L0, dead fraction and CE loss recovered of ``sae`` (saved at ``path``)."""
    from structlens.sae.sweep import ce_recovered_by_width, sae_quality

    check_sae_fits(sae, model)
    _, ev = corpus_windows(model.tokenizer, cfg.prompt_tokens, 1, cfg.eval_prompts)
    acts = residuals(model, cfg.layer, ev)
    ce = ce_recovered_by_width(model, cfg.layer, {sae.d_sae: sae}, ev) if model.causal else {}
    results = {"eval": sae_quality(sae, acts), "ce": ce.get(sae.d_sae)}
    meta = {"sae": str(path), "layer": cfg.layer}
    return SAEReport(analysis="sae_eval", model=model.name, results=results, meta=meta)

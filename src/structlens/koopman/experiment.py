"""Koopman experiments on a model: EDMDc over depth (fit, convergence, invariance, modes,
reduce) from one frozen :class:`KoopmanExperimentConfig`.

``run(cfg, model, root=...)`` captures (or reuses, content-hashed) the depth sites under
``root``, fits per-layer operators (or one pooled operator) and returns a
:class:`KoopmanReport` whose ``results`` are nested ``results[<layers>][<dictionary>]``
(``results[<layer>]`` for ``modes``, ``results[<order>]`` for ``reduce``).

Example
-------
>>> from structlens.koopman.experiment import KoopmanExperimentConfig
>>> KoopmanExperimentConfig(analysis="fit", layers=(1, 2), dictionaries=("pca",), size=8).size
8
>>> KoopmanExperimentConfig(dictionaries=("pca", "bogus"))
Traceback (most recent call last):
...
ValueError: unknown dictionary 'bogus'; choose from identity, pca, rff, relu, spectral, sae.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from structlens.config import ExperimentReport, check_choices
from structlens.koopman.collect import DepthData, collect_depth
from structlens.koopman.edmdc import EDMDc, EDMDcConfig, solve
from structlens.koopman.pipeline import (
    DICTIONARIES,
    complex_list,
    make_dictionary,
    summarise_fit,
)
from structlens.provenance import check_provenance, provenance

__all__ = ["KoopmanExperimentConfig", "KoopmanReport", "run"]

Analysis = Literal["fit", "convergence", "invariance", "modes", "reduce"]


@dataclass(frozen=True)
class KoopmanExperimentConfig:
    """Settings of one Koopman experiment (one ``structlens koopman <analysis>`` call).

    Data: ``n_corpus`` corpus chunks of ``prompt_tokens`` tokens plus ``n_task`` IOI prompts;
    every position is a sample of the depth map ``resid_pre(l) -> resid_pre(l+1)`` driven by
    ``attn_out(l)``.  ``dictionaries`` are names in the dictionary registry
    (:data:`structlens.koopman.pipeline.DICTIONARIES`); ``size`` is PCA k, RFF/ReLU D or
    the number of spectral modes.
    ``control_rank`` (if set) overrides ``control_energy``.  ``mom_blocks`` (fit) adds a
    median-of-means fit; ``n_blocks``/``n_repeats`` set the split-half convergence; ``k``,
    ``positions``, ``n_ioi``, ``n_random`` the IOI mode ablation; ``orders`` the balanced
    truncation orders of ``reduce`` (which pools ``layers`` and takes one dictionary).
    ``allow_foreign`` lets the ``sae`` dictionary come from another model or site (warns).
    """

    analysis: Analysis = "fit"
    layers: tuple[int, ...] = (8,)
    pooled: bool = False
    dictionaries: tuple[str, ...] = ("identity", "pca")
    size: int = 64
    sae: Path | None = None
    n_corpus: int = 200
    prompt_tokens: int = 64
    n_task: int = 50
    alpha: float = 1e-6
    control_energy: float = 0.99
    control_rank: int | None = None
    mom_blocks: int = 0
    n_blocks: int = 32
    n_repeats: int = 10
    k: int = 4
    positions: str = "all"
    n_ioi: int = 50
    n_random: int = 5
    orders: tuple[int, ...] = (4, 8, 16)
    seed: int = 0
    allow_foreign: bool = False

    def __post_init__(self) -> None:
        unknown = [d for d in self.dictionaries if d not in DICTIONARIES]
        if unknown:
            raise ValueError(
                f"unknown dictionary {unknown[0]!r}; choose from {', '.join(DICTIONARIES)}."
            )
        check_choices(self)
        if not self.layers or min(self.layers) < 0:
            raise ValueError(f"layers must name at least one layer >= 0; got {self.layers}.")
        if not self.dictionaries:
            raise ValueError("dictionaries names no dictionary.")
        if "sae" in self.dictionaries and self.sae is None and self.analysis != "modes":
            raise ValueError("the sae dictionary needs --sae PATH (an SAELens-format directory).")
        if self.size < 1:
            raise ValueError(f"dictionary size must be >= 1, got {self.size}.")
        if self.n_corpus < 0 or self.n_task < 0 or self.n_corpus + self.n_task == 0:
            raise ValueError("n_corpus and n_task must be >= 0 and not both 0.")
        if self.mom_blocks < 0:
            raise ValueError(f"mom_blocks must be >= 0, got {self.mom_blocks}.")
        if self.n_blocks < 4 or self.n_repeats < 2:
            raise ValueError(
                f"need n_blocks >= 4 and n_repeats >= 2; got {self.n_blocks}, {self.n_repeats}."
            )
        if self.analysis == "modes" and not 1 <= self.k <= self.size:
            raise ValueError(f"k must be in [1, size={self.size}]; got {self.k}.")
        if self.analysis == "reduce" and len(self.dictionaries) != 1:
            raise ValueError("reduce takes one dictionary.")
        if not self.orders or min(self.orders) < 1:
            raise ValueError(f"orders must be integers >= 1; got {self.orders}.")
        self.edmdc  # noqa: B018  (EDMDcConfig validates alpha and the control truncation)

    @property
    def edmdc(self) -> EDMDcConfig:
        """The EDMDc solver settings."""
        if self.control_rank is not None:
            return EDMDcConfig(alpha=self.alpha, control_rank=self.control_rank)
        return EDMDcConfig(alpha=self.alpha, control_energy=self.control_energy)


@dataclass(frozen=True)
class KoopmanReport(ExperimentReport):
    """Results of one Koopman experiment; ``payload()`` is the ``<analysis>.json`` document."""


def _fitted(cfg: KoopmanExperimentConfig, name: str, X: Any, U: Any, Y: Any) -> Any:
    """Dictionary ``name`` of ``cfg.size`` fitted on the stream (``ValueError`` on bad data)."""
    dic = make_dictionary(name, cfg.size, seed=cfg.seed, sae_path=cfg.sae)
    try:
        return dic.fit(X, U, Y)
    except ValueError as err:
        raise ValueError(f"{name} dictionary: {err}") from err


@dataclass
class _SplitHalfPoint:
    """One (layer label, dictionary) point of the convergence grid; picklable for executors.

    Returns the split-half result, or the error message of bad input.
    """

    streams: Mapping[str, tuple[np.ndarray, ...]]
    cfg: KoopmanExperimentConfig

    def __call__(self, point: tuple[str, str]) -> Any:
        from structlens.koopman import split_half_convergence

        label, name = point
        X, U, Y, pid = self.streams[label]
        try:
            dic = _fitted(self.cfg, name, X, U, Y)
        except ValueError as err:
            return str(err)
        try:
            blocks = EDMDc(dic, self.cfg.edmdc).statistics(
                X, U, Y, pid, n_blocks=self.cfg.n_blocks, seed=self.cfg.seed
            )
            return split_half_convergence(
                blocks, self.cfg.edmdc, n_repeats=self.cfg.n_repeats, seed=self.cfg.seed
            )
        except ValueError as err:
            return f"layer {label}, {name}: {err}"


def _fit(cfg: KoopmanExperimentConfig, data: DepthData, executor: Any) -> dict[str, Any]:
    from structlens.koopman.data import store_statistics
    from structlens.stats.robust import tail_diagnostic

    results: dict[str, dict[str, Any]] = {}
    for label, (X, U, Y, pid) in data.streams.items():
        results[label] = {}
        raw_tail = tail_diagnostic(X)
        for name in cfg.dictionaries:
            dic = _fitted(cfg, name, X, U, Y)
            try:
                layers = data.layers if data.pooled else [int(label)]
                stats = store_statistics(data.store, dic, layers, executor=executor)
                res = solve(stats, cfg.edmdc, dic)
            except ValueError as err:
                raise ValueError(f"layer {label}, {name}: {err}") from err
            entry = summarise_fit(res)
            lifted = tail_diagnostic(stats.tails)
            entry["tails"] = {
                "raw_state_p95_kurtosis": raw_tail.p95_kurtosis,
                "raw_state_heavy": raw_tail.heavy,
                "lifted_p95_kurtosis": lifted.p95_kurtosis,
                "lifted_heavy": lifted.heavy,
            }
            if cfg.mom_blocks:
                try:
                    mom = EDMDc(dic, cfg.edmdc).fit_median_of_means(
                        X, U, Y, pid, n_blocks=cfg.mom_blocks, seed=cfg.seed
                    )
                except ValueError as err:
                    raise ValueError(f"layer {label}, {name}, median of means: {err}") from err
                entry["median_of_means"] = {"eigenvalues": complex_list(mom.eigenvalues)}
            results[label][name] = entry
    return results


def _convergence(
    cfg: KoopmanExperimentConfig, data: DepthData, executor: Any, progress: bool
) -> dict[str, Any]:
    from structlens.execution import get_executor

    results: dict[str, dict[str, Any]] = {label: {} for label in data.streams}
    grid = [(label, name) for label in data.streams for name in cfg.dictionaries]
    job = _SplitHalfPoint(data.streams, cfg)
    runner = get_executor(executor)
    outcomes = list(runner.map(job, grid, desc="split-half grid", progress=progress))
    for (label, name), sh in zip(grid, outcomes, strict=True):
        if isinstance(sh, str):
            raise ValueError(sh)
        results[label][name] = {
            "split_half": {
                "slope": sh.slope,
                "slope_ci": sh.slope_ci,
                "slope_last4": sh.slope_last4,
                "slope_w2": sh.slope_w2,
                "n_samples": sh.n_samples.tolist(),
                "w_inf_mean": sh.w_inf_mean.tolist(),
                "w2_mean": sh.w2_mean.tolist(),
                "eig_condition_max": sh.eig_condition_max,
                "eig_condition_median": float(np.median(sh.eig_condition)),
                "n_blocks": cfg.n_blocks,
                "n_repeats": cfg.n_repeats,
            }
        }
    return results


def _invariance(cfg: KoopmanExperimentConfig, data: DepthData) -> dict[str, Any]:
    from structlens.koopman import invariance_residual_split

    results: dict[str, dict[str, Any]] = {}
    for label, (X, U, Y, pid) in data.streams.items():
        results[label] = {}
        for name in cfg.dictionaries:
            dic = _fitted(cfg, name, X, U, Y)
            try:
                inv = invariance_residual_split(dic, X, U, Y, pid, cfg.edmdc, seed=cfg.seed)
            except ValueError as err:
                raise ValueError(f"layer {label}, {name}: {err}") from err
            results[label][name] = {
                "invariance_residual": {
                    "pooled": inv.pooled,
                    "mean": inv.mean,
                    "median": inv.median,
                    "n_dead": inv.n_dead,
                    "n_features": int(len(inv.per_feature)),
                }
            }
    return results


def _modes(cfg: KoopmanExperimentConfig, model: Any, data: DepthData) -> dict[str, Any]:
    from structlens.data.tasks import make_task
    from structlens.koopman.interventions import compare_ablations

    try:
        task = make_task("ioi", model.tokenizer, n=cfg.n_ioi, seed=cfg.seed + 1)
    except ValueError as err:
        raise ValueError(f"IOI prompts cannot be built for {model.name}: {err}") from err
    results: dict[str, Any] = {}
    for label, (X, U, Y, _) in data.streams.items():
        dic = _fitted(cfg, "pca", X, U, Y)
        try:
            res = EDMDc(dic, cfg.edmdc).fit(X, U, Y)
            cmp = compare_ablations(
                model, task, int(label), res, dic, cfg.k,
                positions=cfg.positions, n_random=cfg.n_random, seed=cfg.seed,
            )  # fmt: skip
        except ValueError as err:
            raise ValueError(f"layer {label}: {err}") from err
        results[label] = {
            "dimension": cmp.dimension,
            "positions": cfg.positions,
            "clean_logit_diff": cmp.clean_metric_mean,
            "mode_eigenvalues": cmp.mode_eigenvalues.tolist(),
            **{
                meth: {"mean": float(cmp.mean[j]), "ci": cmp.ci[j].tolist()}
                for j, meth in enumerate(cmp.methods)
            },
        }
    return results


def _reduce(cfg: KoopmanExperimentConfig, data: DepthData) -> tuple[dict[str, Any], str]:
    from structlens.koopman import balanced_truncation

    ((label, (X, U, Y, _)),) = data.streams.items()
    dic = _fitted(cfg, cfg.dictionaries[0], X, U, Y)
    res = EDMDc(dic, cfg.edmdc).fit(X, U, Y)
    n = res.A.shape[0]
    if any(not 1 <= r < n for r in cfg.orders):
        raise ValueError(f"orders must be in [1, {n - 1}]; got {list(cfg.orders)}.")
    rows: dict[str, Any] = {}
    for r in cfg.orders:
        red = balanced_truncation(
            res.A, res.B, res.C, r, len(data.layers), input_cov=res.control_cov
        )
        rows[str(r)] = {
            "error": red.error,
            "enns_glover": red.enns_glover,
            "certified": red.certified,
            "markov_bound": red.markov_bound,
            "instance_error": red.instance_error,
            "instance_bound": red.instance_bound,
            "effective_rank": red.effective_rank,
            "rho0": red.rho0,
        }
    return rows, label


def _check_sae(cfg: KoopmanExperimentConfig, model: Any, pooled: bool) -> list[str]:
    """Refuse an SAE dictionary made from another model, or from another site than the state
    ``resid_pre(l)`` of each fitted layer (pooled fits: the model only); with
    ``cfg.allow_foreign`` warn instead.  Returns the mismatches."""
    from structlens.sae import sae_metadata
    from structlens.sites import site_name

    if cfg.sae is None or "sae" not in cfg.dictionaries or cfg.analysis == "modes":
        return []
    if not (Path(cfg.sae) / "cfg.json").is_file():
        return []  # a Gemma Scope params.npz records no provenance; the loader checks the rest
    meta = sae_metadata(cfg.sae)
    sites = [None] if pooled else [site_name("resid_pre", layer) for layer in cfg.layers]
    mismatches: list[str] = []
    for site in sites:
        for m in check_provenance(
            meta, what=f"the SAE in {cfg.sae}", model=model, site=site,
            allow_foreign=cfg.allow_foreign,
        ):  # fmt: skip
            if m not in mismatches:
                mismatches.append(m)
    return mismatches


def run(
    cfg: KoopmanExperimentConfig,
    model: Any,
    *,
    root: str | Path,
    executor: Any = None,
    progress: bool = False,
) -> KoopmanReport:
    """Run ``cfg.analysis`` on ``model``; the activation store is cached under ``root``.

    ``executor`` (name or :class:`~structlens.execution.Executor`) runs the capture shards,
    the per-shard statistics of ``fit`` and the grid points of ``convergence``.
    """
    pooled = {"modes": False, "reduce": True}.get(cfg.analysis, cfg.pooled)
    foreign = _check_sae(cfg, model, pooled)
    data = collect_depth(
        model, cfg.layers, pooled=pooled, n_corpus=cfg.n_corpus,
        prompt_tokens=cfg.prompt_tokens, n_task=cfg.n_task, seed=cfg.seed, root=root,
        executor=executor if cfg.analysis in ("fit", "convergence") else None, progress=progress,
    )  # fmt: skip
    meta: dict[str, Any] = {}
    if cfg.analysis == "fit":
        results = _fit(cfg, data, executor)
    elif cfg.analysis == "convergence":
        results = _convergence(cfg, data, executor, progress)
    elif cfg.analysis == "invariance":
        results = _invariance(cfg, data)
    elif cfg.analysis == "modes":
        results, meta = _modes(cfg, model, data), {"k": cfg.k}
    else:
        results, label = _reduce(cfg, data)
        meta = {"layers": label, "horizon": len(data.layers), "dictionary": cfg.dictionaries[0]}
    meta["provenance"] = provenance(model)
    if cfg.sae is not None and "sae" in cfg.dictionaries:
        meta["sae"] = {"path": str(cfg.sae), "foreign": foreign}
    return KoopmanReport(analysis=cfg.analysis, model=model.name, results=results, meta=meta)

"""The driver: run or load every stage, write ``analysis.json``."""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from structlens import __version__
from structlens.analyze.config import CACHE_VERSION, AnalysisReport, AnalyzeConfig
from structlens.analyze.memory import PeakMemory
from structlens.causal_dim import stages as causal_stages
from structlens.causal_dim import verdicts as causal
from structlens.data.tasks import sanity as tasks
from structlens.equivalence import stages as equivalence_stages
from structlens.equivalence import verdicts as equivalence
from structlens.errors import InputError
from structlens.koopman import stages as koopman_stages
from structlens.koopman import verdicts as koopman
from structlens.ndm import stages as ndm_stages
from structlens.ndm import verdicts as ndm
from structlens.pipeline.cache import Stage, StageCache
from structlens.pipeline.progress import ExecutorView, ProgressBars, StageProgress
from structlens.results import read_json_object
from structlens.verdicts import Section


def default_layers(n_layers: int, count: int) -> tuple[int, ...]:
    """``count`` evenly spaced layers, skipping the first block where there is room."""
    start = 1 if n_layers > count else 0
    return tuple(
        sorted(
            set(np.linspace(start, n_layers - 1, min(count, n_layers)).round().astype(int).tolist())
        )
    )


def _stage_settings(cfg: AnalyzeConfig, stage: str, layers: Sequence[int]) -> dict[str, Any]:
    p = dataclasses.asdict(cfg.settings)
    prefix = {
        "tasks": ("task_",),
        "koopman": ("koopman",),
        "ndm": ("ndm",),
        "causal_dim": ("kappa_", "causal_dim"),
        "equivalence": ("equivalence",),
    }[stage]
    out = {k: v for k, v in p.items() if k.startswith(prefix)}
    out["seed"] = cfg.seed
    if stage in ("koopman", "causal_dim"):
        out["layers"] = list(layers)
    if stage == "equivalence":
        out["compare"] = cfg.compare
    return out


def _section(
    stage: str,
    cfg: AnalyzeConfig,
    model: Any,
    layers: tuple[int, ...],
    executor: ExecutorView,
    step: StageProgress,
) -> Section:
    """Run one stage of the main job: the method's analysis stage, then its verdicts."""
    p, seed = cfg.settings, cfg.seed
    if stage == "tasks":
        return tasks.section(tasks.task_sanity(model, p.task_prompts, seed=seed, step=step))
    if stage == "koopman":
        return koopman.section(
            koopman_stages.analysis(
                p.koopman.replace(seed=seed), model, layers, n_corpus=p.koopman_corpus,
                max_tokens=p.koopman_tokens, root=cfg.out / "activations", executor=executor,
                progress=executor.progress, step=step,
            )
        )  # fmt: skip
    if stage == "ndm":
        return ndm.section(
            ndm_stages.analysis(
                p.ndm.replace(seed=seed), model, root=cfg.out, executor=executor, step=step
            )
        )
    if stage == "causal_dim":
        return causal.section(
            causal_stages.analysis(
                p.causal_dim.replace(seed=seed), model, layers, n_kappa_layers=p.kappa_layers,
                executor=executor, step=step,
            )
        )  # fmt: skip
    return equivalence.section(
        equivalence_stages.analysis(
            p.equivalence.replace(seed=seed), model, compare=cfg.compare, device=cfg.device,
            step=step,
        )
    )  # fmt: skip


def _steps(stage: str, cfg: AnalyzeConfig, layers: tuple[int, ...]) -> int:
    """Progress-bar steps of ``stage``: the ``step`` calls its analysis makes."""
    return {
        "tasks": 4,
        "koopman": len(layers) + 2,
        "ndm": 8,
        "causal_dim": len(causal_stages.kappa_layers(layers, cfg.settings.kappa_layers)) + 2,
        "equivalence": 1 + bool(cfg.compare),
    }[stage]


def run_analysis(cfg: AnalyzeConfig, model: Any) -> AnalysisReport:
    """Run (or load from the cache) every stage of ``cfg.stages`` on ``model``, write
    ``cfg.out/analysis.json`` and return the report."""
    layers = cfg.layers or default_layers(model.n_layers, cfg.settings.n_layers)
    bad = [layer for layer in layers if layer >= model.n_layers]
    if bad:
        raise ValueError(
            f"layers {bad} out of range; the model has layers 0..{model.n_layers - 1}."
        )
    from structlens.execution import get_executor

    cfg.out.mkdir(parents=True, exist_ok=True)
    executor = ExecutorView(get_executor(cfg.executor), cfg.progress)
    fingerprint = model_fingerprint(model)
    cache = StageCache(cfg.out / "cache")
    sections: dict[str, dict[str, Any]] = {}
    status: dict[str, dict[str, Any]] = {}
    progress = ProgressBars(cfg.progress)

    memory = PeakMemory()
    peaks: dict[str, float | None] = {}

    def compute(stage: str, _folder: Path) -> Section:  # a section writes no other files
        t0 = time.perf_counter()
        memory.start()
        with progress.stage(stage, _steps(stage, cfg, layers)) as step:
            torch.manual_seed(cfg.seed)
            section = _section(stage, cfg, model, layers, executor, step)
        peaks[stage] = memory.stop()
        return dataclasses.replace(section, seconds=round(time.perf_counter() - t0, 1))

    with progress.session():
        for stage in cfg.stages:
            key = Stage(
                stage,
                {"version": CACHE_VERSION, **_stage_settings(cfg, stage, layers)},
                model=fingerprint,
            )
            section = cache.run(key, Section, functools.partial(compute, stage))
            sections[stage] = section.to_json()
            hit = cache.events[-1].hit
            status[stage] = {
                "status": "cached" if hit else "computed",
                "seconds": section.seconds,
                "peak_rss_gib": peaks.get(stage),  # None when loaded from the cache
                "load_average": round(os.getloadavg()[0], 2),
            }
    run = {
        "model": model.name,
        "fingerprint": fingerprint,
        "d_model": int(model.d_model),
        "n_layers": int(model.n_layers),
        "profile": cfg.profile,
        "layers": list(layers),
        "seed": cfg.seed,
        "executor": cfg.executor,
        "compare": cfg.compare,
        "stages": status,
        "peak_rss_gib": memory.overall,  # the process's, model loading and every stage
        "structlens_version": __version__,
    }
    report = AnalysisReport(run=run, sections=sections)
    report.save(cfg.out)
    return report


def model_fingerprint(model: Any) -> str:
    fp = model.fingerprint
    return str(fp() if callable(fp) else fp)


def load_report(directory: str | Path) -> AnalysisReport:
    """The report saved in ``directory/analysis.json`` (raises ``FileNotFoundError`` with a
    hint when there is none)."""
    path = Path(directory) / "analysis.json"
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist; run `structlens analyze MODEL --out {directory}` first."
        )
    doc = read_json_object(path, "structlens analysis (JSON)")
    if not isinstance(doc.get("run"), dict):
        raise InputError(f"{path} has no 'run' record, so `structlens analyze` did not write it.")
    run = doc.pop("run")
    doc.pop("schema_version", None)
    return AnalysisReport(run=run, sections=doc)

"""The driver: run or load every stage, write ``analysis.json``."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from structlens import __version__
from structlens.analyze import causal, equivalence, koopman, ndm
from structlens.analyze.config import AnalysisReport, AnalyzeConfig
from structlens.analyze.runtime import ExecutorView, ProgressBars, StageCache, model_fingerprint
from structlens.data.tasks import sanity as tasks
from structlens.errors import InputError
from structlens.results import read_json_object, to_jsonable
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
    cache = StageCache(cfg.out / "cache", model_fingerprint(model))
    steps = {
        "tasks": 4,
        "koopman": len(layers) + 2,
        "ndm": 8,
        "causal_dim": len(causal.kappa_layers(layers, cfg.settings.kappa_layers)) + 2,
        "equivalence": 1 + bool(cfg.compare),
    }
    runners = {
        "tasks": lambda step: tasks.section(
            tasks.task_sanity(model, cfg.settings.task_prompts, seed=cfg.seed, step=step)
        ),
        "koopman": lambda step: koopman.run(model, cfg, layers, step, executor),
        "ndm": lambda step: ndm.run(model, cfg, step, executor),
        "causal_dim": lambda step: causal.run(model, cfg, layers, step, executor),
        "equivalence": lambda step: equivalence.run(model, cfg, step),
    }
    sections: dict[str, dict[str, Any]] = {}
    status: dict[str, dict[str, Any]] = {}
    progress = ProgressBars(cfg.progress)
    with progress.session():
        for stage in cfg.stages:
            settings = _stage_settings(cfg, stage, layers)
            hit = cache.get(stage, settings)
            if hit is not None:
                sections[stage] = hit
                status[stage] = {"status": "cached", "seconds": hit.get("seconds", 0.0)}
                continue
            t0 = time.perf_counter()
            with progress.stage(stage, steps[stage]) as step:
                torch.manual_seed(cfg.seed)
                section = runners[stage](step)
            result = section.to_json() if isinstance(section, Section) else section
            result["seconds"] = round(time.perf_counter() - t0, 1)
            cache.put(stage, settings, result)
            sections[stage] = json.loads(json.dumps(to_jsonable(result)))
            status[stage] = {"status": "computed", "seconds": result["seconds"]}
    run = {
        "model": model.name,
        "fingerprint": cache.fingerprint,
        "d_model": int(model.d_model),
        "n_layers": int(model.n_layers),
        "profile": cfg.profile,
        "layers": list(layers),
        "seed": cfg.seed,
        "executor": cfg.executor,
        "compare": cfg.compare,
        "stages": status,
        "structlens_version": __version__,
    }
    report = AnalysisReport(run=run, sections=sections)
    report.save(cfg.out)
    return report


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

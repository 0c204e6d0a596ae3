"""Koopman experiments on a model: EDMDc over depth (fit, convergence, invariance, modes,
reduce) from one frozen :class:`KoopmanExperimentConfig`.

``run(cfg, model, root=...)`` captures (or reuses, content-hashed) the depth sites under
``root`` and runs the stages of :mod:`structlens.koopman.stages` under ``cfg.protocol``; it
returns a :class:`KoopmanReport` whose ``results`` are nested
``results[<layers>][<dictionary>]`` (``results[<layer>]`` for ``modes``, ``results[<order>]``
for ``reduce``), each entry the JSON form of a stage result.

Example
-------
>>> from structlens.koopman.experiment import KoopmanExperimentConfig
>>> KoopmanExperimentConfig(analysis="fit", layers=(1, 2), dictionaries=("pca",), size=8).specs
('pca:8',)
>>> KoopmanExperimentConfig(dictionaries=("pca", "bogus"))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: unknown dictionary 'bogus'; choose from identity, pca, rff, rff-features, ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from structlens.config import ExperimentReport, check_choices
from structlens.koopman.collect import DepthData, collect_depth
from structlens.koopman.protocol import KoopmanProtocol
from structlens.provenance import provenance
from structlens.results import to_jsonable

__all__ = ["KoopmanExperimentConfig", "KoopmanReport", "run"]

Analysis = Literal["fit", "convergence", "invariance", "modes", "reduce"]


@dataclass(frozen=True)
class KoopmanExperimentConfig:
    """What one Koopman experiment runs (one ``structlens koopman <analysis>`` call); every
    scientific choice is in ``protocol`` (:class:`~structlens.koopman.protocol.KoopmanProtocol`).

    Data: ``n_corpus`` corpus chunks of ``prompt_tokens`` tokens plus ``n_task`` IOI prompts;
    every position is a sample of the depth map ``resid_pre(l) -> resid_pre(l+1)`` driven by
    ``attn_out(l)``.  ``dictionaries`` are names in the dictionary registry
    (:data:`structlens.koopman.pipeline.DICTIONARIES`) of size ``size`` (PCA k, RFF/ReLU D,
    spectral modes); they replace the protocol's dictionaries of ``analysis`` (:attr:`specs`).
    ``k``, ``positions``, ``n_ioi``, ``n_random`` set the IOI mode ablation; ``orders`` the
    balanced truncation orders of ``reduce`` (which pools ``layers`` and takes one
    dictionary).  ``allow_foreign`` lets the ``sae`` dictionary come from another model or
    site (warns).
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
    k: int = 4
    positions: str = "all"
    n_ioi: int = 50
    n_random: int = 5
    orders: tuple[int, ...] = (4, 8, 16)
    allow_foreign: bool = False
    protocol: KoopmanProtocol = dataclasses.field(default_factory=KoopmanProtocol)

    def __post_init__(self) -> None:
        from structlens.koopman.pipeline import DICTIONARIES

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
        if self.size < 1:
            raise ValueError(f"dictionary size must be >= 1, got {self.size}.")
        # the protocol checks the names (and builds the stages' dictionary list)
        object.__setattr__(self, "protocol", self._protocol_with_specs())
        if "sae" in self.dictionaries and self.sae is None and self.analysis != "modes":
            raise ValueError(
                "the sae dictionary needs --sae PATH (an SAE folder in a published layout, "
                "or RELEASE/SAE_ID)."
            )
        if self.n_corpus < 0 or self.n_task < 0 or self.n_corpus + self.n_task == 0:
            raise ValueError("n_corpus and n_task must be >= 0 and not both 0.")
        if self.analysis == "modes" and not 1 <= self.k <= self.size:
            raise ValueError(f"k must be in [1, size={self.size}]; got {self.k}.")
        if self.analysis == "reduce" and len(self.dictionaries) != 1:
            raise ValueError("reduce takes one dictionary.")
        if not self.orders or min(self.orders) < 1:
            raise ValueError(f"orders must be integers >= 1; got {self.orders}.")

    @property
    def specs(self) -> tuple[str, ...]:
        """The dictionaries as protocol specs (``"pca:64"``; identity takes no size)."""
        return tuple(d if d == "identity" else f"{d}:{self.size}" for d in self.dictionaries)

    def _protocol_with_specs(self) -> KoopmanProtocol:
        field = {
            "fit": "fit_dictionaries",
            "convergence": "split_half_dictionaries",
            "invariance": "invariance_dictionaries",
        }.get(self.analysis)
        if field is None:
            return self.protocol.replace(headline_dictionary=self.specs[0])
        heads = {"headline_dictionary": self.specs[0]}
        if field == "split_half_dictionaries":
            heads["split_half_headline"] = self.specs[0]
        return self.protocol.replace(**{field: self.specs, **heads})


@dataclass(frozen=True)
class KoopmanReport(ExperimentReport):
    """Results of one Koopman experiment; ``payload()`` is the ``<analysis>.json`` document."""


def _entry(result: Any) -> dict[str, Any]:
    """A stage result as a JSON document entry (without the fields its keys already say)."""
    doc = to_jsonable(result)
    for key in ("layers", "dictionary"):
        doc.pop(key, None)
    return doc


@dataclass
class _Point:
    """One (layer label, dictionary spec) point of a stage grid; picklable for executors.

    Returns the stage result, or the error message of bad input.
    """

    rows: Mapping[str, Any]
    protocol: KoopmanProtocol
    stage: str
    sae: Path | None

    def __call__(self, point: tuple[str, str]) -> Any:
        from structlens.koopman import stages

        label, spec = point
        try:
            if self.stage == "split_half":
                return stages.split_half(self.protocol, self.rows[label], spec)
            fn = stages.spectrum if self.stage == "spectrum" else stages.invariance
            return fn(self.protocol, self.rows[label], spec, sae_path=self.sae)
        except ValueError as err:
            return str(err)


def _grid(
    cfg: KoopmanExperimentConfig, data: DepthData, stage: str, executor: Any, progress: bool
) -> dict[str, Any]:
    from structlens.execution import get_executor

    specs = {
        "spectrum": cfg.protocol.fit_dictionaries,
        "split_half": cfg.protocol.split_half_dictionaries,
        "invariance": cfg.protocol.invariance_dictionaries,
    }[stage]
    grid = [(label, spec) for label in data.rows for spec in specs]
    job = _Point(data.rows, cfg.protocol, stage, cfg.sae)
    outcomes = get_executor(executor).map(job, grid, desc=f"{stage} grid", progress=progress)
    results: dict[str, dict[str, Any]] = {label: {} for label in data.rows}
    for (label, _), got in zip(grid, list(outcomes), strict=True):
        if isinstance(got, str):
            raise ValueError(got)
        results[label][got.dictionary] = _entry(got)
    return results


def _modes(cfg: KoopmanExperimentConfig, model: Any, data: DepthData) -> dict[str, Any]:
    from structlens.data.tasks import make_task
    from structlens.koopman.stages import mode_ablation

    try:
        task = make_task("ioi", model.tokenizer, n=cfg.n_ioi, seed=cfg.protocol.seed + 1)
    except ValueError as err:
        raise ValueError(f"IOI prompts cannot be built for {model.name}: {err}") from err
    return {
        label: _entry(
            mode_ablation(
                cfg.protocol,
                model,
                task,
                rows,
                f"pca:{cfg.size}",
                cfg.k,
                positions=cfg.positions,
                n_random=cfg.n_random,
            )  # fmt: skip
        )
        for label, rows in data.rows.items()
    }


def _reduce(cfg: KoopmanExperimentConfig, data: DepthData) -> tuple[dict[str, Any], str]:
    from structlens.koopman.stages import reduction

    ((label, rows),) = data.rows.items()
    got = reduction(cfg.protocol, rows, cfg.specs[0], cfg.orders, sae_path=cfg.sae)
    return {str(r.order): _entry(r) for r in got}, label


def _check_sae(cfg: KoopmanExperimentConfig, model: Any, pooled: bool) -> list[str]:
    """Refuse an SAE dictionary made from another model, or from another site than the state
    ``resid_pre(l)`` of each fitted layer (pooled fits: the model only); with
    ``cfg.allow_foreign`` warn instead.  Returns the mismatches."""
    from structlens.sae.formats import check_dictionary
    from structlens.sae.registry import read_pretrained
    from structlens.sites import site_name

    if cfg.sae is None or "sae" not in cfg.dictionaries or cfg.analysis == "modes":
        return []
    # any published layout or registry name; what it records (model, site) is checked
    pretrained = read_pretrained(str(cfg.sae))
    sites = [None] if pooled else [site_name("resid_pre", layer) for layer in cfg.layers]
    mismatches: list[str] = []
    for site in sites:
        for m in check_dictionary(
            pretrained, model=model, site=site, allow_foreign=cfg.allow_foreign
        ):
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

    ``executor`` (name or :class:`~structlens.execution.Executor`) runs the capture shards and
    the (layer, dictionary) points of ``fit``, ``convergence`` and ``invariance``.
    """
    pooled = {"modes": False, "reduce": True}.get(cfg.analysis, cfg.pooled)
    foreign = _check_sae(cfg, model, pooled)
    data = collect_depth(
        cfg.protocol, model, cfg.layers, pooled=pooled, n_corpus=cfg.n_corpus,
        prompt_tokens=cfg.prompt_tokens, n_task=cfg.n_task, seed=cfg.protocol.seed, root=root,
        executor=executor, progress=progress,
    )  # fmt: skip
    meta: dict[str, Any] = {"protocol": cfg.protocol.to_json()}
    stage = {"fit": "spectrum", "convergence": "split_half", "invariance": "invariance"}
    if cfg.analysis in stage:
        results = _grid(cfg, data, stage[cfg.analysis], executor, progress)
    elif cfg.analysis == "modes":
        results = _modes(cfg, model, data)
        meta["k"] = cfg.k
    else:
        results, label = _reduce(cfg, data)
        meta |= {"layers": label, "horizon": len(data.layers), "dictionary": cfg.specs[0]}
    meta["provenance"] = provenance(model)
    if cfg.sae is not None and "sae" in cfg.dictionaries:
        meta["sae"] = {"path": str(cfg.sae), "foreign": foreign}
    return KoopmanReport(analysis=cfg.analysis, model=model.name, results=results, meta=meta)

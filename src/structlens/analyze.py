"""The main job: every method of structlens on one model, cached stage by stage.

:func:`run_analysis` runs five stages on a loaded model — circuit-task sanity, Koopman
spectral analysis, NDM subspaces, causal dimensionality and interpretive equivalence — and
returns an :class:`AnalysisReport` whose JSON form (``DIR/analysis.json``) has one top-level
key per method.  Each method's entry holds ``headline`` numbers (``{"value", "ci", "unit",
"label"}``; ``ci`` is a 95% interval or ``None`` where the estimator has none), a
``caveats`` list (``{"kind", "message"}``: results that must not be read as plain numbers)
and ``details`` (the tables and figure data the HTML report draws).

Every stage is cached in ``DIR/cache/<stage>-<key>.json`` under a content key: the model's
fingerprint, the stage's settings (from the profile), the analysis layers and the seed.  A
second run with the same key loads the stage instead of recomputing it; an interrupted run
resumes at the first stage without a cache entry (activation captures resume shard by shard
in ``DIR/activations``).

Profiles fix the sizes: ``smoke`` (a tiny model in well under three minutes on two CPU
cores; what the tests run), ``cpu`` (SmolLM2-135M on a laptop CPU) and ``full`` (the
replication settings, for a GPU or a Ray cluster).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from structlens import __version__
from structlens.results import atomic_write_json, to_jsonable

__all__ = [
    "PROFILES",
    "STAGES",
    "AnalysisReport",
    "AnalyzeConfig",
    "Profile",
    "parse_layers",
    "run_analysis",
]

STAGES = ("tasks", "koopman", "ndm", "causal_dim", "equivalence")
CACHE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Profile:
    """Sizes of every stage (one profile per compute budget)."""

    n_layers: int  # analysis layers when none are given (evenly spaced)
    task_prompts: int
    koopman_corpus: int
    koopman_tokens: int
    koopman_blocks: int
    koopman_pca: int
    koopman_dictionaries: tuple[str, ...]
    koopman_repeats: int
    koopman_bootstrap: int
    ndm_corpus: int
    ndm_tokens: int
    ndm_steps: int
    ndm_unit: int  # initial subspace size (the gcd with d when it does not divide d)
    ndm_batch: int
    ndm_bank: int
    ndm_refresh: int
    ndm_merge_start: int
    ndm_merge_interval: int
    ndm_mi_samples: int
    patch_prompts: int
    baselines: tuple[str, ...]
    gini_bootstrap: int
    browser_top: int
    browser_pool: int
    browser_neighbours: int
    kappa_vectors: int
    kappa_tokens: int
    sweep_widths: tuple[int, ...]
    sweep_k: int
    sweep_train_prompts: int
    sweep_eval_prompts: int
    sweep_bootstrap: int
    equiv_probe: int
    equiv_heads: int
    equiv_congruity: bool


PROFILES: dict[str, Profile] = {
    "smoke": Profile(
        n_layers=3, task_prompts=24,
        koopman_corpus=48, koopman_tokens=48, koopman_blocks=16, koopman_pca=8,
        koopman_dictionaries=("identity", "pca", "relu"), koopman_repeats=8,
        koopman_bootstrap=200,
        ndm_corpus=64, ndm_tokens=64, ndm_steps=150, ndm_unit=8, ndm_batch=64, ndm_bank=2048,
        ndm_refresh=20, ndm_merge_start=50, ndm_merge_interval=50, ndm_mi_samples=1000,
        patch_prompts=16, baselines=("identity", "random", "pca"), gini_bootstrap=200,
        browser_top=6, browser_pool=96, browser_neighbours=5,
        kappa_vectors=24, kappa_tokens=24,
        sweep_widths=(64, 128, 256, 512), sweep_k=8, sweep_train_prompts=48,
        sweep_eval_prompts=16, sweep_bootstrap=50,
        equiv_probe=24, equiv_heads=8, equiv_congruity=False,
    ),
    "cpu": Profile(
        n_layers=4, task_prompts=64,
        koopman_corpus=120, koopman_tokens=64, koopman_blocks=32, koopman_pca=32,
        koopman_dictionaries=("identity", "pca", "rff", "relu"), koopman_repeats=12,
        koopman_bootstrap=200,
        ndm_corpus=160, ndm_tokens=96, ndm_steps=400, ndm_unit=32, ndm_batch=128,
        ndm_bank=8192, ndm_refresh=25, ndm_merge_start=150, ndm_merge_interval=100,
        ndm_mi_samples=2000,
        patch_prompts=24, baselines=("identity", "random", "pca"), gini_bootstrap=500,
        browser_top=8, browser_pool=240, browser_neighbours=8,
        kappa_vectors=48, kappa_tokens=32,
        sweep_widths=(1024, 2048, 4096, 8192), sweep_k=32, sweep_train_prompts=160,
        sweep_eval_prompts=24, sweep_bootstrap=100,
        equiv_probe=32, equiv_heads=12, equiv_congruity=False,
    ),
    "full": Profile(
        n_layers=8, task_prompts=100,
        koopman_corpus=400, koopman_tokens=64, koopman_blocks=64, koopman_pca=32,
        koopman_dictionaries=("identity", "pca", "rff", "relu", "spectral"),
        koopman_repeats=20, koopman_bootstrap=1000,
        ndm_corpus=1000, ndm_tokens=128, ndm_steps=10_500, ndm_unit=32, ndm_batch=128,
        ndm_bank=8192, ndm_refresh=50, ndm_merge_start=1000, ndm_merge_interval=500,
        ndm_mi_samples=4096,
        patch_prompts=48, baselines=("identity", "random", "pca", "sae"), gini_bootstrap=1000,
        browser_top=10, browser_pool=400, browser_neighbours=10,
        kappa_vectors=128, kappa_tokens=64,
        sweep_widths=(512, 1024, 2048, 4096, 8192, 16384, 32768), sweep_k=32,
        sweep_train_prompts=800, sweep_eval_prompts=96, sweep_bootstrap=200,
        equiv_probe=64, equiv_heads=32, equiv_congruity=True,
    ),
}  # fmt: skip


def parse_layers(spec: str | Sequence[str | int] | None, n_layers: int) -> tuple[int, ...]:
    """Layers from ``"3,5"``, ``"blocks.3.hook_resid_pre,blocks.5.*"`` or ``"all"``.

    Raises ``ValueError`` with a fix-it message on a layer outside ``[0, n_layers)``.
    """
    if spec is None:
        return ()
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[int] = []
    for item in (str(i).strip() for i in items):
        if not item:
            continue
        if item == "all":
            out += range(n_layers)
            continue
        m = re.fullmatch(r"(?:blocks\.)?(\d+)(?:\..*)?", item)
        if m is None:
            raise ValueError(
                f"cannot read a layer from {item!r}; pass layer numbers ('3,5') or residual "
                "site names ('blocks.3.hook_resid_pre')."
            )
        layer = int(m.group(1))
        if not 0 <= layer < n_layers:
            raise ValueError(f"layer {layer} out of range; the model has layers 0..{n_layers - 1}.")
        out.append(layer)
    return tuple(sorted(set(out)))


@dataclasses.dataclass(frozen=True)
class AnalyzeConfig:
    """Settings of :func:`run_analysis`.

    Attributes
    ----------
    profile : {"smoke", "cpu", "full"}
        Sizes of every stage (:data:`PROFILES`).
    layers : tuple of int
        Analysis layers (Koopman, κ); empty: ``profile.n_layers`` evenly spaced layers.
    out : Path
        Output directory (``analysis.json``, ``report.html``, ``cache/``, ``activations/``).
    executor : {"local", "ray"}
        Where captures, baselines and SAE widths run.
    compare : str or None
        A second model for the equivalence section (besides the rotated copy).
    seed : int
    device : str
    stages : tuple of str
        Stages to run (default: all of :data:`STAGES`).
    progress : bool
        Progress bars with an ETA on the terminal.
    """

    profile: str = "cpu"
    layers: tuple[int, ...] = ()
    out: Path = Path("results/analysis")
    executor: str = "local"
    compare: str | None = None
    seed: int = 0
    device: str = "cpu"
    stages: tuple[str, ...] = STAGES
    progress: bool = True

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"profile must be one of {', '.join(PROFILES)}; got {self.profile!r}.")
        if self.executor not in ("local", "ray"):
            raise ValueError(f"executor must be 'local' or 'ray'; got {self.executor!r}.")
        bad = [s for s in self.stages if s not in STAGES]
        if bad or not self.stages:
            raise ValueError(f"stages must name some of {', '.join(STAGES)}; got {bad}.")
        if any(int(layer) < 0 for layer in self.layers):
            raise ValueError(f"layers must be >= 0; got {list(self.layers)}.")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0; got {self.seed}.")
        object.__setattr__(self, "out", Path(self.out))
        object.__setattr__(self, "layers", tuple(sorted({int(x) for x in self.layers})))

    @property
    def settings(self) -> Profile:
        return PROFILES[self.profile]


@dataclasses.dataclass
class AnalysisReport:
    """The analysis of one model: ``sections[method]`` as described in the module docstring,
    plus ``run`` (model, profile, layers, per-stage status and seconds)."""

    run: dict[str, Any]
    sections: dict[str, dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": CACHE_VERSION, "run": self.run, **self.sections}

    def caveats(self) -> list[tuple[str, dict[str, str]]]:
        """Every caveat as ``(method, caveat)``."""
        return [(m, c) for m, s in self.sections.items() for c in s.get("caveats", [])]

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / "analysis.json"
        atomic_write_json(path, to_jsonable(self.to_json()))
        return path


# ---------------------------------------------------------------------------- small helpers


def _num(value: Any, ci: Sequence[float] | None = None, unit: str = "", label: str = "") -> dict:
    """A headline number: value, 95% CI (or None), unit and a human label."""
    finite = value is not None and math.isfinite(float(value))
    ci_ok = ci is not None and all(math.isfinite(float(c)) for c in ci)
    return {
        "value": (value if isinstance(value, int) else float(value)) if finite else None,
        "ci": [float(ci[0]), float(ci[1])] if ci_ok else None,
        "unit": unit,
        "label": label,
    }


def _caveat(kind: str, message: str) -> dict[str, str]:
    return {"kind": kind, "message": message}


def _t_interval(x: Sequence[float], confidence: float = 0.95) -> list[float]:
    """Student-t interval of the mean of ``x`` (NaN with fewer than two values)."""
    from scipy import stats

    a = np.asarray(x, dtype=np.float64)
    if a.size < 2:
        return [float("nan"), float("nan")]
    half = float(stats.t.ppf(0.5 + confidence / 2, a.size - 1) * a.std(ddof=1) / math.sqrt(a.size))
    return [float(a.mean() - half), float(a.mean() + half)]


def _contains(ci: Sequence[float] | None, value: float) -> bool:
    return ci is not None and all(map(math.isfinite, ci)) and ci[0] <= value <= ci[1]


def _default_layers(n_layers: int, count: int) -> tuple[int, ...]:
    """``count`` evenly spaced layers, skipping the first block where there is room."""
    start = 1 if n_layers > count else 0
    return tuple(
        sorted(
            set(np.linspace(start, n_layers - 1, min(count, n_layers)).round().astype(int).tolist())
        )
    )  # noqa: E501


def _model_fingerprint(model: Any) -> str:
    fp = model.fingerprint
    return str(fp() if callable(fp) else fp)


class _Cache:
    """JSON results of stages under content keys in ``root``."""

    def __init__(self, root: Path, fingerprint: str) -> None:
        self.root = root
        self.fingerprint = fingerprint

    def path(self, stage: str, settings: dict[str, Any]) -> Path:
        doc = {"v": CACHE_VERSION, "model": self.fingerprint, "stage": stage, **settings}
        key = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
        return self.root / f"{stage}-{key[:16]}.json"

    def get(self, stage: str, settings: dict[str, Any]) -> dict[str, Any] | None:
        path = self.path(stage, settings)
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:  # a torn write cannot happen (atomic), a hand edit can
            return None

    def put(self, stage: str, settings: dict[str, Any], value: dict[str, Any]) -> None:
        atomic_write_json(self.path(stage, settings), to_jsonable(value))


class _Progress:
    """One bar per stage with an ETA (rich); silent when disabled."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: Any = None

    @contextmanager
    def session(self) -> Iterator[_Progress]:
        if not self.enabled:
            yield self
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        with Progress(
            TextColumn("{task.description:<34}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        ) as bar:
            self._bar = bar
            try:
                yield self
            finally:
                self._bar = None

    @contextmanager
    def stage(self, name: str, total: int) -> Iterator[_Step]:
        """A bar of ``total`` steps, advanced by calling the yielded :class:`_Step`."""
        task = None if self._bar is None else self._bar.add_task(name, total=total)
        yield _Step(self._bar, task, name)
        if task is not None:
            self._bar.update(task, completed=total, description=name)


class _Step:
    """Advances one stage's bar (``step(what)``) and opens bars for long loops inside it
    (``with step.loop(name, total) as done: done(n)``); does nothing without a bar."""

    def __init__(self, bar: Any, task: Any, name: str) -> None:
        self._bar, self._task, self._name = bar, task, name

    def __call__(self, what: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=f"{self._name}: {what}"[:34])

    @contextmanager
    def loop(self, name: str, total: int) -> Iterator[Callable[[int], None]]:
        if self._bar is None:
            yield lambda done: None
            return
        task = self._bar.add_task(f"  {name}"[:34], total=total)
        yield lambda done: self._bar.update(task, completed=done)
        self._bar.remove_task(task)


@dataclasses.dataclass
class _Executor:
    """The configured executor with the library's own progress bars on or off."""

    inner: Any
    progress: bool

    @property
    def name(self) -> str:
        return self.inner.name

    def map(self, fn: Any, items: Any, *, desc: str = "", progress: bool = True, resident=False):
        return self.inner.map(
            fn, items, desc=desc, progress=progress and self.progress, resident=resident
        )


# ---------------------------------------------------------------------------------- stages


def _logits_fn(model: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def fn(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = model.forward(ids.to(model.device), mask.to(model.device))
        return getattr(out, "logits", out)

    return fn


def _stage_tasks(model: Any, cfg: AnalyzeConfig, step: _Step) -> dict[str, Any]:
    """Accuracy (Wilson CI) and mean metric (t CI) on every task the tokenizer supports."""
    from structlens.data.tasks import available_tasks, evaluate_task, make_task

    p = cfg.settings
    rows, caveats = [], []
    headline: dict[str, Any] = {}
    for name in available_tasks():
        step(name)
        try:
            task = make_task(name, model.tokenizer, n=p.task_prompts, seed=cfg.seed)
        except ValueError as err:
            caveats.append(_caveat("not_run", f"{name}: not available for this tokenizer ({err})"))
            continue
        r = evaluate_task(
            task, _logits_fn(model), batch_size=16, pad_id=model.tokenizer.pad_token_id or 0
        )
        rows.append(
            {
                "task": name,
                "n": r["n"],
                "accuracy": r["accuracy"],
                "accuracy_ci": list(r["accuracy_ci"]),
                "metric_mean": r["metric_mean"],
                "metric_ci": list(r["metric_ci"]),
                "metric": r["metric_description"],
            }
        )
        headline[f"{name}_accuracy"] = _num(r["accuracy"], r["accuracy_ci"], "", f"{name} accuracy")
        headline[f"{name}_metric"] = _num(r["metric_mean"], r["metric_ci"], "", f"{name} metric")
        if r["metric_ci"][0] <= 0:
            caveats.append(
                _caveat(
                    "null_effect",
                    f"{name}: the mean metric's CI reaches 0 or below "
                    f"([{r['metric_ci'][0]:+.3f}, {r['metric_ci'][1]:+.3f}]); the model does not "
                    "reliably perform the task, so circuit analyses of it are not meaningful.",
                )
            )
    if not rows:
        caveats.append(_caveat("not_run", "no circuit task is available for this tokenizer."))
    return {"headline": headline, "caveats": caveats, "details": {"rows": rows}}


def _usable_tasks(model: Any, names: Sequence[str], seed: int) -> list[str]:
    from structlens.data.tasks import make_task

    ok = []
    for name in names:
        try:
            make_task(name, model.tokenizer, n=2, seed=seed)
        except ValueError:
            continue
        ok.append(name)
    return ok


def _first_position_mask(store: Any) -> np.ndarray:
    return store.load_index()["position"].numpy() > 0


def _spectrum_bootstrap(
    blocks: Sequence[Any], config: Any, dictionary: Any, n_boot: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Spectral radius over bootstrap resamples of prompt blocks, and the pooled resampled
    eigenvalues (for the figure)."""
    from structlens.koopman import merge_statistics, solve

    rng = np.random.default_rng(seed)
    radii, clouds = np.empty(n_boot), []
    for b in range(n_boot):
        pick = rng.integers(0, len(blocks), len(blocks))
        ev = solve(merge_statistics([blocks[i] for i in pick]), config, dictionary).eigenvalues
        radii[b] = float(np.max(np.abs(ev)))
        if b < 20:
            clouds.append(ev)
    return radii, np.concatenate(clouds)


def _stage_koopman(
    model: Any,
    cfg: AnalyzeConfig,
    layers: Sequence[int],
    step: _Step,
    executor: _Executor,
) -> dict[str, Any]:
    """Per layer (PCA-k dictionary fitted on half the prompts, position 0 excluded):
    split-half convergence, spectrum with a block bootstrap, non-normality; at the middle
    analysis layer, held-out invariance residuals of every dictionary."""
    from structlens.koopman import EDMDc, EDMDcConfig, merge_statistics, solve
    from structlens.koopman import split_half_convergence as shc
    from structlens.koopman.data import capture_depth, depth_prompts, load_layer
    from structlens.koopman.invariance import invariance_residual
    from structlens.koopman.pipeline import complex_list, make_dictionary, summarise_fit

    p = cfg.settings
    step("capture")
    prompts = depth_prompts(
        model.tokenizer, n_corpus=p.koopman_corpus, max_tokens=p.koopman_tokens, task=None
    )
    store = capture_depth(
        model,
        prompts,
        layers,
        root=cfg.out / "activations",
        executor=executor,
        progress=executor.progress,
    )
    keep = _first_position_mask(store)
    # The control (attention output) is compressed to as many components as the dictionary
    # has features, so every half of the smallest split still over-determines the fit.
    econf = EDMDcConfig(alpha=1e-6, control_rank=min(p.koopman_pca, model.d_model))
    n_blocks = min(p.koopman_blocks, len(prompts) // 3)
    halves = [2**i for i in range(1, int(np.log2(n_blocks // 2)) + 1)]
    per_layer, caveats = [], []
    for layer in layers:
        step(f"layer {layer}")
        X, U, Y, pid = (a[keep] for a in load_layer(store, layer))
        train = pid % 2 == 0  # the dictionary only sees even-numbered prompts
        k = min(p.koopman_pca, X.shape[1] - 1)
        dic = make_dictionary("pca", k, seed=cfg.seed).fit(X[train])
        blocks = EDMDc(dic, econf).statistics(X, U, Y, pid, n_blocks=n_blocks, seed=cfg.seed)
        conv = shc(
            blocks, econf, half_sizes=halves, n_repeats=p.koopman_repeats, n_bootstrap=500,
            seed=cfg.seed,
        )  # fmt: skip
        fit = summarise_fit(solve(merge_statistics(blocks), econf, dic))
        radii, cloud = _spectrum_bootstrap(blocks, econf, dic, p.koopman_bootstrap, cfg.seed)
        row = {
            "layer": int(layer),
            "dictionary": f"pca-{k}",
            "n_samples": int(X.shape[0]),
            "slope": conv.slope,
            "slope_ci": list(conv.slope_ci),
            "eig_condition_max": conv.eig_condition_max,
            "half_samples": conv.n_samples.tolist(),
            "w_inf_mean": conv.w_inf_mean.tolist(),
            "spectral_radius": fit["spectral_radius"],
            "spectral_radius_ci": np.percentile(radii, [2.5, 97.5]).tolist(),
            "eigenvalues": fit["eigenvalues"],
            "bootstrap_eigenvalues": complex_list(cloud),
            "henrici_relative": fit["non_normality"]["henrici_relative"],
            "kappa_V": fit["non_normality"]["kappa_V"],
            "dissociation_mean_cos2": fit.get("dissociation", {}).get("mean_cos2"),
        }
        per_layer.append(row)
        if not _contains(conv.slope_ci, -0.5):
            caveats.append(
                _caveat(
                    "not_converged",
                    f"layer {layer}: the split-half slope {conv.slope:+.2f} "
                    f"[{conv.slope_ci[0]:+.2f}, {conv.slope_ci[1]:+.2f}] excludes the M^-1/2 "
                    "rate; the spectrum is not yet in its sampling-limited regime, so its "
                    "eigenvalues are not identified at this sample size.",
                )
            )
        if conv.eig_condition_max**2 > X.shape[0] / 2:
            caveats.append(
                _caveat(
                    "ill_conditioned",
                    f"layer {layer}: eigenvalue condition number {conv.eig_condition_max:.0f} is "
                    "not small against sqrt(M); individual eigenvalues are unreliable.",
                )
            )
    mid = layers[len(layers) // 2]
    step(f"invariance (layer {mid})")
    X, U, Y, pid = (a[keep] for a in load_layer(store, mid))
    train = pid % 2 == 0
    invariance = []
    for name in p.koopman_dictionaries:
        size = {"pca": min(p.koopman_pca, X.shape[1] - 1), "spectral": max(2, p.koopman_pca // 4)}
        dic = make_dictionary(name, size.get(name, 4 * X.shape[1]), seed=cfg.seed).fit(X[train])
        est = EDMDc(dic, econf)
        res = invariance_residual(
            est.statistics(X[train], U[train], Y[train])[0],
            est.statistics(X[~train], U[~train], Y[~train])[0],
            econf,
        )
        invariance.append(
            {
                "dictionary": name,
                "n_features": int(dic.n_features),
                "pooled": res.pooled,
                "median": res.median,
                "n_dead": res.n_dead,
            }
        )
    # The headline is the middle analysis layer, fixed in advance (not the best-looking one).
    row = next(r for r in per_layer if r["layer"] == mid)
    at = f"layer {mid}"
    headline = {
        "slope": _num(row["slope"], row["slope_ci"], "", f"split-half slope ({at})"),
        "spectral_radius": _num(
            row["spectral_radius"], row["spectral_radius_ci"], "", f"spectral radius ({at})"
        ),
        "henrici_relative": _num(
            row["henrici_relative"], None, "", f"relative Henrici departure ({at})"
        ),
    }
    return {
        "headline": headline,
        "caveats": caveats,
        "details": {
            "layers": per_layer,
            "invariance_layer": int(mid),
            "invariance": invariance,
            "n_prompts": len(prompts),
        },
    }


def _context(tokenizer: Any, ids: Sequence[int], pos: int, left: int = 12, right: int = 4):
    """``[before, token, after]`` decoded around ``ids[pos]`` (kept apart for escaping)."""
    dec = tokenizer.decode
    return [
        dec(list(ids[max(0, pos - left) : pos])),
        dec([ids[pos]]),
        dec(list(ids[pos + 1 : pos + 1 + right])),
    ]


def preimage_browser(
    tokenizer: Any,
    h: np.ndarray,
    prompts: Sequence[tuple[str, Sequence[int]]],
    prompt_index: np.ndarray,
    position: np.ndarray,
    rotation: np.ndarray,
    partition: Sequence[int],
    *,
    top: int,
    pool: int,
    neighbours: int,
    seed: int = 0,
) -> dict[str, Any]:
    """A bounded preimage index for the report.

    For each subspace ``s`` the ``top`` stored activations with the largest norm of their
    projection ``|h R_s|`` (at most one per prompt) are its top activating contexts.  The
    union of those, topped up with random rows to ``pool`` entries, is the embedded index;
    for every entry and subspace the ``neighbours`` nearest other entries by cosine similarity
    of the projections are precomputed with :class:`structlens.ndm.SubspaceIndex`, so the
    page answers "nearest stored activations to this context" without any computation.
    """
    from structlens.ndm.preimage import SubspaceIndex

    bounds = np.concatenate([[0], np.cumsum(partition)])
    chosen: list[int] = []
    tops: list[list[int]] = []
    for s in range(len(partition)):
        norm = np.linalg.norm(h @ rotation[:, bounds[s] : bounds[s + 1]], axis=1)
        rows, seen = [], set()
        for r in np.argsort(-norm, kind="stable"):
            if int(prompt_index[r]) in seen:
                continue
            seen.add(int(prompt_index[r]))
            rows.append(int(r))
            if len(rows) == top:
                break
        tops.append(rows)
        chosen += rows
    chosen = list(dict.fromkeys(chosen))
    rng = np.random.default_rng(seed)
    rest = np.setdiff1d(np.arange(h.shape[0]), chosen)
    chosen += rng.choice(rest, min(len(rest), max(0, pool - len(chosen))), replace=False).tolist()
    slot = {r: i for i, r in enumerate(chosen)}
    index = SubspaceIndex(rotation, partition)
    index.add(h[chosen])
    k = min(neighbours, len(chosen) - 1)
    near = []
    for s in range(len(partition)):
        idx, sims = index.query(h[chosen], s, k=k, exclude=range(len(chosen)))
        near.append(
            [[[int(i), round(float(v), 4)] for i, v in zip(a, b)] for a, b in zip(idx, sims)]
        )
    entries = []
    for r in chosen:
        pid, toks = prompts[int(prompt_index[r])]
        entries.append(
            {
                "prompt": pid,
                "position": int(position[r]),
                "context": _context(tokenizer, toks, int(position[r])),
            }
        )
    return {
        "entries": entries,
        "top": [[slot[r] for r in rows] for rows in tops],
        "neighbours": near,
        "partition": list(map(int, partition)),
    }


def _full_effect_ci(effect: np.ndarray) -> list[float]:
    return _t_interval(effect)


def _stage_ndm(model: Any, cfg: AnalyzeConfig, step: _Step, executor: _Executor) -> dict[str, Any]:
    """NDM at the layers of the paper's patching tests that this tokenizer supports; the
    patching-test Gini of NDM against baseline rotations (bootstrap CIs over prompts); the
    preimage browser at the first trained layer."""
    from structlens.data.tasks import make_task
    from structlens.ndm import NDM, NDMConfig, subspace_variances
    from structlens.ndm.data import capture_residuals, training_prompts
    from structlens.ndm.evaluate import (
        PAPER_TESTS,
        corrupted_prompts,
        map_layer,
        patch_positions,
        patch_subspaces,
        summarize_gini,
    )
    from structlens.ndm.pipeline import baseline_rotations
    from structlens.sites import site_name

    p = cfg.settings
    caveats: list[dict[str, str]] = []
    usable = set(_usable_tasks(model, sorted({t.task for t in PAPER_TESTS}), cfg.seed))
    tests = [t for t in PAPER_TESTS if t.task in usable]
    skipped = [t.name for t in PAPER_TESTS if t.task not in usable]
    if skipped:
        caveats.append(
            _caveat("not_run", f"patching tests {skipped} need tasks this tokenizer cannot build.")
        )
    layer_of = {t.name: map_layer(t.gpt2_layer, model.n_layers) for t in tests}
    layers = sorted(set(layer_of.values())) or [model.n_layers // 2]
    step("capture")
    prompts = training_prompts(
        model, corpus_prompts=p.ndm_corpus, task_prompts=0, max_tokens=p.ndm_tokens, seed=cfg.seed
    )
    store = capture_residuals(
        model, prompts, layers, cfg.out / "activations", progress=executor.progress
    )
    index = store.load_index()
    d = model.d_model
    unit = p.ndm_unit if d % p.ndm_unit == 0 else math.gcd(d, p.ndm_unit)
    trained: dict[int, dict[str, Any]] = {}
    rotations: dict[int, dict[str, np.ndarray]] = {}
    variances: dict[int, dict[str, list[float]]] = {}
    hs: dict[int, np.ndarray] = {}
    for layer in layers:
        step(f"train layer {layer}")
        h = store.load(site_name("resid_post", layer)).double().numpy()
        hs[layer] = h
        refresh = max(1, min(p.ndm_refresh, (h.shape[0] - p.ndm_bank) // p.ndm_batch))
        ncfg = NDMConfig(
            unit_size=unit, batch_size=p.ndm_batch, max_steps=p.ndm_steps,
            bank_size=min(p.ndm_bank, h.shape[0] // 2), refresh_interval=refresh,
            merge_start=p.ndm_merge_start, merge_interval=p.ndm_merge_interval,
            mi_samples=min(p.ndm_mi_samples, h.shape[0] // 2), log_interval=10, seed=cfg.seed,
        )  # fmt: skip
        with step.loop(f"NDM steps, layer {layer}", p.ndm_steps) as done:
            res = NDM(ncfg).fit(
                h,
                checkpoint_dir=cfg.out / "cache" / f"ndm-ckpt-L{layer}",
                progress=lambda n, loss, partition, done=done: done(n),
            )
        trained[layer] = {
            "layer": int(layer),
            "partition": list(res.partition),
            "steps": int(res.steps),
            "converged": bool(res.converged),
            "stop_reason": (
                "no subspace pair above the MI threshold"
                if res.converged
                else f"step limit {p.ndm_steps} reached with pairs above the MI threshold"
            ),
            "merge_history": [
                {"step": m["step"], "max_mi": m["max_mi"], "n_subspaces": len(m["partition_after"])}
                for m in res.merge_history
            ],
            "threshold": ncfg.merge_threshold,
            "n_activations": int(h.shape[0]),
        }
        if not res.converged:
            caveats.append(
                _caveat(
                    "not_converged",
                    f"layer {layer}: NDM stopped at the step limit ({res.steps} steps) with "
                    "subspace pairs still above the MI threshold; the partition is not the "
                    "method's fixed point.",
                )
            )
        base, _ = baseline_rotations(
            h, res.partition, p.baselines, seed=cfg.seed, executor=executor
        )
        rotations[layer] = {"ndm": np.asarray(res.rotation), **base}
        variances[layer] = {
            m: subspace_variances(h, r, res.partition) for m, r in rotations[layer].items()
        }
    runs, tests_out = {}, []
    for test in tests:
        step(f"patch {test.name}")
        task = make_task(test.task, model.tokenizer, n=p.patch_prompts, seed=cfg.seed)
        layer = layer_of[test.name]
        bounds = np.concatenate([[0], np.cumsum(trained[layer]["partition"])])
        bases = {
            m: [r[:, bounds[s] : bounds[s + 1]] for s in range(len(bounds) - 1)]
            for m, r in rotations[layer].items()
        }
        run = patch_subspaces(
            model, task, corrupted_prompts(task, test.corruption), layer,
            patch_positions(task, test.positions), bases,
        )  # fmt: skip
        runs[test.name] = run
        full = run["ndm"].full_effect
        full_ci = _full_effect_ci(full)
        tests_out.append(
            {
                "test": test.name,
                "layer": int(layer),
                "full_effect": float(full.mean()),
                "full_effect_ci": full_ci,
                "normalized": {m: r.normalized_effects().tolist() for m, r in run.items()},
            }
        )
        if _contains(full_ci, 0.0):
            caveats.append(
                _caveat(
                    "null_effect",
                    f"{test.name}: patching the whole space has no detectable effect "
                    f"({full.mean():+.3f}, CI [{full_ci[0]:+.3f}, {full_ci[1]:+.3f}]); the "
                    "Gini of its subspace effects measures noise, not concentration.",
                )
            )
    gini: dict[str, Any] = {}
    headline: dict[str, Any] = {}
    if runs:
        summary = summarize_gini(
            runs,
            {t: trained[layer_of[t]]["partition"] for t in runs},
            {t: variances[layer_of[t]] for t in runs},
            n_boot=p.gini_bootstrap,
            seed=cfg.seed,
        )
        gini = {
            "mean": {m: v["dimension"] for m, v in summary["gini_mean"].items()},
            "per_test": {
                t: {m: v["dimension"] for m, v in by.items()} for t, by in summary["gini"].items()
            },
            "ndm_minus": {m: v["dimension"] for m, v in summary.get("gini_mean_diff", {}).items()},
            "variant": "dimension-normalised Gini of the mean subspace patching effects",
        }
        for m, v in gini["mean"].items():
            headline[f"gini_{m}"] = _num(v["value"], v["ci"], "", f"Gini ({m})")
        for m, v in gini["ndm_minus"].items():
            if v["ci"][0] <= 0:
                caveats.append(
                    _caveat(
                        "not_significant",
                        f"NDM's Gini is not above the {m} baseline "
                        f"({v['value']:+.3f}, CI [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]).",
                    )
                )
    step("preimage index")
    first = layers[0]
    keep = index["position"].numpy() >= 0
    browser = preimage_browser(
        model.tokenizer, hs[first][keep], prompts, index["prompt_index"].numpy()[keep],
        index["position"].numpy()[keep], rotations[first]["ndm"], trained[first]["partition"],
        top=p.browser_top, pool=p.browser_pool, neighbours=p.browser_neighbours, seed=cfg.seed,
    )  # fmt: skip
    browser["layer"] = int(first)
    headline["n_subspaces"] = _num(
        len(trained[first]["partition"]), None, "", f"subspaces (layer {first})"
    )
    return {
        "headline": headline,
        "caveats": caveats,
        "details": {
            "trained": list(trained.values()),
            "tests": tests_out,
            "gini": gini,
            "browser": browser,
        },
    }


def _stage_causal(
    model: Any,
    cfg: AnalyzeConfig,
    layers: Sequence[int],
    step: _Step,
    executor: _Executor,
) -> dict[str, Any]:
    """Exact κ = erank(E[JᵀJ]) of the same-position log-probs at each layer (one vector per
    prompt, bootstrap CI) with the κ(n)/κ(n/2) convergence check; the SAE width-sweep wedge
    at the middle layer."""
    from structlens.causal_dim import WidthSweepConfig
    from structlens.causal_dim.experiment import (
        collect_residuals,
        sweep_analysis,
        train_width_sweep,
    )
    from structlens.causal_dim.jacobian import JacobianConfig
    from structlens.causal_dim.kappa import kappa_curve, kappa_from_grams
    from structlens.causal_dim.model import residual_grads, vector_grams
    from structlens.ndm.data import training_prompts
    from structlens.sae import SAETrainConfig

    p = cfg.settings
    d = model.d_model
    offset = p.ndm_corpus  # prompts disjoint from the NDM training windows
    prompts = [
        t
        for _, t in training_prompts(
            model, corpus_prompts=p.kappa_vectors, corpus_offset=offset, task_prompts=0,
            max_tokens=p.kappa_tokens, seed=cfg.seed,
        )
    ]  # fmt: skip
    jcfg = JacobianConfig(output="log_probs")
    rows, caveats = [], []
    for layer in layers:
        step(f"κ layer {layer}")
        grams = torch.stack(list(vector_grams(model, layer, prompts, jcfg)))
        n = grams.shape[0]
        k = kappa_from_grams(grams, n_bootstrap=200, seed=cfg.seed)
        curve = kappa_curve(grams, [max(1, n // 2), n], seed=cfg.seed)
        ratio = curve["erank"][1] / curve["erank"][0]
        rows.append(
            {
                "layer": int(layer),
                "kappa": k.erank,
                "kappa_ci": list(k.erank_ci),
                "kappa_pr": k.participation_ratio,
                "kappa_pr_ci": list(k.participation_ratio_ci),
                "n_vectors": int(n),
                "kappa_half": curve["erank"][0],
                "convergence_ratio": ratio,
                "eigenvalues": np.asarray(k.eigenvalues).tolist(),
            }
        )
        if n < d:
            caveats.append(
                _caveat(
                    "too_few_vectors",
                    f"layer {layer}: κ from {n} vectors < d = {d}; Σ̂ has rank ≤ {n}, so κ is "
                    "biased low and bounded by the sample, not by the model.",
                )
            )
        if ratio > 1.05:
            caveats.append(
                _caveat(
                    "not_converged",
                    f"layer {layer}: κ(n)/κ(n/2) = {ratio:.2f} > 1.05; κ is still rising with n "
                    "and is a lower bound.",
                )
            )
    sweep: dict[str, Any] = {}
    if p.sweep_widths:
        mid = layers[len(layers) // 2]
        step(f"SAE widths (layer {mid})")
        train_p = [
            t
            for _, t in training_prompts(
                model, corpus_prompts=p.sweep_train_prompts, corpus_offset=offset + p.kappa_vectors,
                task_prompts=0, max_tokens=p.kappa_tokens * 2, seed=cfg.seed,
            )
        ]  # fmt: skip
        eval_p = train_p[: p.sweep_eval_prompts]
        train_p = train_p[p.sweep_eval_prompts :]
        acts = collect_residuals(model, mid, train_p)
        base = SAETrainConfig(
            architecture="topk", d_sae=p.sweep_widths[0], k=p.sweep_k, seed=cfg.seed
        )
        saes = train_width_sweep(
            acts, p.sweep_widths, base, batch_size=min(1024, acts.shape[0] // 4),
            epochs=2, seed=cfg.seed, executor=executor,
        )  # fmt: skip
        step("AtP over widths")
        exact = next(r["kappa"] for r in rows if r["layer"] == mid)
        res, _ = sweep_analysis(
            {m: r.sae for m, r in saes.items()},
            list(residual_grads(model, mid, eval_p)),
            WidthSweepConfig(n_bootstrap=p.sweep_bootstrap, seed=cfg.seed),
            n_blocks=16,
            exact_erank=exact,
        )
        fit = res.fits.get(res.fit_model)
        pinned = (
            "no fit: N_causal is 0 at some width"
            if fit is None
            else _fit_at_bound(fit, res.widths, res.n_causal)
        )
        sweep = {
            "layer": int(mid),
            "widths": res.widths.tolist(),
            "n_repr": res.n_repr.tolist(),
            "n_causal": res.n_causal.tolist(),
            "n_repr_ci": res.n_repr_ci.tolist(),
            "n_causal_ci": res.n_causal_ci.tolist(),
            "wedge": res.wedge,
            "wedge_ci": list(res.wedge_ci),
            "fit_model": res.fit_model,
            "kappa_hat": res.kappa_hat,
            "kappa_hat_ci": list(res.kappa_hat_ci),
            "identified": not pinned,
            "fit": {k: v for k, v in (fit or {}).items() if isinstance(v, (int, float))},
        }
        if pinned:
            caveats.append(
                _caveat(
                    "unidentified",
                    f"width sweep (layer {mid}): κ̂ is unidentified — {pinned} of the "
                    f"{res.fit_model} fit of N_causal(m); the widths do not pin down a "
                    "saturation level, so no κ̂ is reported.",
                )
            )
    else:
        caveats.append(_caveat("not_run", "the SAE width sweep is not part of this profile."))
    headline = {
        f"kappa_L{r['layer']}": _num(r["kappa"], r["kappa_ci"], "dims", f"κ (layer {r['layer']})")
        for r in rows
    }
    if sweep:
        headline["wedge"] = _num(sweep["wedge"], sweep["wedge_ci"], "", "width-sweep wedge")
        headline["kappa_hat"] = _num(
            sweep["kappa_hat"] if sweep["identified"] else None,
            sweep["kappa_hat_ci"] if sweep["identified"] else None,
            "features",
            "κ̂ (saturating fit)" + ("" if sweep["identified"] else ": unidentified"),
        )
    return {
        "headline": headline,
        "caveats": caveats,
        "details": {"layers": rows, "d_model": int(d), "sweep": sweep},
    }


def _fit_at_bound(fit: dict[str, float], widths: np.ndarray, counts: np.ndarray) -> str:
    """Which parameter of a saturating fit sits at a bound of
    :func:`structlens.causal_dim.fit_saturating`'s box ('' if none)."""
    ymax, mmax = float(np.max(counts)), float(np.max(widths))
    tol = 1e-3
    if math.log(fit["K"]) >= math.log(ymax) + 25 - tol:
        return "K at its upper bound"
    if fit["m_half"] > 0 and math.log(fit["m_half"]) >= math.log(mmax) + 25 - tol:
        return "m½ at its upper bound"
    if "n" in fit and (
        abs(math.log(fit["n"]) - math.log(0.1)) < tol
        or abs(math.log(fit["n"]) - math.log(10)) < tol
    ):  # noqa: E501
        return "Hill exponent at a bound"
    return ""


def _equivalence_row(result: Any, name: str) -> tuple[dict[str, Any], list[dict[str, str]]]:
    row = {
        "pair": name,
        "model_b": result.model_b,
        "probe": result.probe,
        "score": result.score,
        "score_ci": list(result.score_ci),
        "null_score": result.null_score,
        "null_score_ci": list(result.null_score_ci),
        "layer_score": result.layer_score,
        "layer_score_ci": list(result.layer_score_ci),
        "informative": result.informative,
        "verdicts": result.verdicts,
        "layer_similarity": np.asarray(result.layer_similarity).tolist(),
    }
    caveats = []
    if math.isfinite(result.null_score) and result.null_score_ci[1] >= result.score_ci[0]:
        caveats.append(
            _caveat(
                "null_passes",
                f"{name}: mean-ablating B's heads passes the criterion about as often as the "
                f"matched partners (null {result.null_score:.2f} "
                f"[{result.null_score_ci[0]:.2f}, {result.null_score_ci[1]:.2f}] vs "
                f"{result.score:.2f} [{result.score_ci[0]:.2f}, {result.score_ci[1]:.2f}]); "
                "the score does not show that the partners carry the mechanism.",
            )
        )
    return row, caveats


def _stage_equivalence(model: Any, cfg: AnalyzeConfig, step: _Step) -> dict[str, Any]:
    """The model against a rotated, head-permuted copy of itself (the answer is known:
    equivalent) and against ``cfg.compare`` when given."""
    from structlens.equivalence.compare import CompareConfig, compare, corpus_probe
    from structlens.equivalence.scenarios import rotate_and_permute
    from structlens.models import load_model

    p = cfg.settings
    ccfg = CompareConfig(
        congruity=p.equiv_congruity,
        max_validate_heads=p.equiv_heads,
        max_validate_layers=min(model.n_layers, 6),
        seed=cfg.seed,
    )
    rows, caveats = [], []
    step("rotated copy")
    try:
        twin, _, _ = rotate_and_permute(model, seed=cfg.seed + 1)
    except ValueError as err:
        caveats.append(_caveat("not_run", f"sanity row: {err}"))
    else:
        res = compare(model, twin, corpus_probe(model, twin, n=p.equiv_probe), ccfg)
        row, cav = _equivalence_row(res, "rotated + head-permuted copy (known: equivalent)")
        rows.append(row)
        caveats += cav
        if res.score_ci[0] < ccfg.equivalent_at:
            caveats.append(
                _caveat(
                    "failed_sanity",
                    "the rotated copy is functionally identical, yet its score's CI falls below "
                    f"{ccfg.equivalent_at}; do not trust the comparisons below.",
                )
            )
        del twin
    if cfg.compare:
        step(f"vs {cfg.compare}")
        other = load_model(cfg.compare, device=cfg.device, seed=cfg.seed)
        res = compare(model, other, corpus_probe(model, other, n=p.equiv_probe), ccfg)
        row, cav = _equivalence_row(res, f"vs {other.name}")
        rows.append(row)
        caveats += cav
    headline = {}
    for i, r in enumerate(rows):
        key = "sanity" if i == 0 and "copy" in r["pair"] else "compare"
        headline[f"{key}_score"] = _num(r["score"], r["score_ci"], "", f"score: {r['pair']}")
        headline[f"{key}_null"] = _num(
            r["null_score"], r["null_score_ci"], "", f"null score: {r['pair']}"
        )
    return {"headline": headline, "caveats": caveats, "details": {"rows": rows}}


# ------------------------------------------------------------------------------------ driver


def _stage_settings(cfg: AnalyzeConfig, stage: str, layers: Sequence[int]) -> dict[str, Any]:
    p = dataclasses.asdict(cfg.settings)
    prefix = {
        "tasks": ("task_",),
        "koopman": ("koopman_",),
        "ndm": ("ndm_", "patch_", "baselines", "gini_", "browser_"),
        "causal_dim": ("kappa_", "sweep_", "ndm_corpus"),
        "equivalence": ("equiv_",),
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
    layers = cfg.layers or _default_layers(model.n_layers, cfg.settings.n_layers)
    bad = [layer for layer in layers if layer >= model.n_layers]
    if bad:
        raise ValueError(
            f"layers {bad} out of range; the model has layers 0..{model.n_layers - 1}."
        )
    from structlens.execution import get_executor

    cfg.out.mkdir(parents=True, exist_ok=True)
    executor = _Executor(get_executor(cfg.executor), cfg.progress)
    cache = _Cache(cfg.out / "cache", _model_fingerprint(model))
    steps = {
        "tasks": 4,
        "koopman": len(layers) + 2,
        "ndm": 8,
        "causal_dim": len(layers) + 2,
        "equivalence": 1 + bool(cfg.compare),
    }
    runners = {
        "tasks": lambda step: _stage_tasks(model, cfg, step),
        "koopman": lambda step: _stage_koopman(model, cfg, layers, step, executor),
        "ndm": lambda step: _stage_ndm(model, cfg, step, executor),
        "causal_dim": lambda step: _stage_causal(model, cfg, layers, step, executor),
        "equivalence": lambda step: _stage_equivalence(model, cfg, step),
    }
    sections: dict[str, dict[str, Any]] = {}
    status: dict[str, dict[str, Any]] = {}
    progress = _Progress(cfg.progress)
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
                result = runners[stage](step)
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
    doc = json.loads(path.read_text())
    run = doc.pop("run")
    doc.pop("schema_version", None)
    return AnalysisReport(run=run, sections=doc)

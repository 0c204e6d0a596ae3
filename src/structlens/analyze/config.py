"""Settings of the main job: profiles, :class:`AnalyzeConfig`, the report object."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from structlens.causal_dim.protocol import PROFILES as CAUSAL
from structlens.causal_dim.protocol import CausalProtocol
from structlens.equivalence.protocol import PROFILES as EQUIVALENCE
from structlens.equivalence.protocol import EquivalenceProtocol
from structlens.koopman.protocol import PROFILES as KOOPMAN
from structlens.koopman.protocol import KoopmanProtocol
from structlens.ndm.protocol import PROFILES as NDM
from structlens.ndm.protocol import NDMProtocol
from structlens.results import atomic_write_json, to_jsonable

STAGES = ("tasks", "koopman", "ndm", "causal_dim", "equivalence")
# Part of every cache key and of analysis.json; bump it when a stage's output changes.
CACHE_VERSION = 7


@dataclasses.dataclass(frozen=True)
class Profile:
    """Sizes of every stage (one profile per compute budget)."""

    n_layers: int  # analysis layers when none are given (evenly spaced)
    task_prompts: int
    koopman_corpus: int
    koopman_tokens: int
    koopman: KoopmanProtocol  # every scientific choice of the Koopman stage
    ndm: NDMProtocol  # every scientific choice of the NDM stage
    kappa_layers: int  # κ at this many of the analysis layers (the middle one always)
    causal_dim: CausalProtocol  # every scientific choice of the causal-dimensionality stage
    equivalence: EquivalenceProtocol  # every scientific choice of the equivalence stage


PROFILES: dict[str, Profile] = {
    "smoke": Profile(
        n_layers=3, task_prompts=24,
        koopman_corpus=48, koopman_tokens=48, koopman=KOOPMAN["smoke"],
        ndm=NDM["smoke"],
        kappa_layers=3, causal_dim=CAUSAL["smoke"],
        equivalence=EQUIVALENCE["smoke"],
    ),
    "cpu": Profile(
        n_layers=4, task_prompts=64,
        koopman_corpus=120, koopman_tokens=64, koopman=KOOPMAN["paper"],
        ndm=NDM["cpu"],
        # the paper's rules at CPU sizes: fewer Jacobian vectors, SAE training data (no
        # further corpus chunks, no generated text) and widths (4·d, 8·d, 16·d: 2304 to
        # 9216 for SmolLM2, 2560 to 10240 for Gemma 3 270M)
        kappa_layers=2,
        causal_dim=CAUSAL["paper"].replace(
            kappa_start=8, kappa_max_vectors=32, sae_train_prompts=160, sae_train_extra=0,
            sae_generated_prompts=0, sae_max_epochs=3, sweep_width_ratios=(4.0, 8.0, 16.0),
            sweep_bootstrap=100,
        ),
        # the layer map needs more fit tokens (half the probe) than d = 576 dimensions; a
        # random 12 heads, no CONGRUITY and no head groups keep the stage in the CPU budget
        equivalence=EQUIVALENCE["paper"].replace(
            probe_prompts=96, max_validate_heads=12, head_subset="random",
            max_validate_layers=6, validate_head_groups=False, congruity=False,
        ),
    ),
    "full": Profile(
        n_layers=8, task_prompts=100,
        koopman_corpus=400, koopman_tokens=64,
        koopman=KOOPMAN["paper"].replace(spectrum_bootstrap=1000),
        ndm=NDM["cpu"].replace(
            corpus_prompts=1000, corpus_tokens=128, steps=10_500, refresh_interval=50,
            merge_start=1000, merge_interval=500, mi_samples=4096, patch_prompts=48,
            baselines=("identity", "random", "pca", "sae"), gini_bootstrap=1000,
            browser_top=10, browser_pool=400, browser_neighbours=10,
        ),
        kappa_layers=8,
        causal_dim=CAUSAL["paper"].replace(sweep_widths=(2304, 4608, 9216, 18432, 36864)),
        equivalence=EQUIVALENCE["paper-subset"].replace(
            probe="corpus", probe_prompts=128, max_validate_heads=32, max_validate_layers=6
        ),
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

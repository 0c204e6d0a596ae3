"""Replicate the causal-dimensionality claims on SmolLM2-135M-Instruct.

    python -m structlens.replication causal-dimension                  # CPU profile
    python -m structlens.replication causal-dimension --profile gpu --device cuda

Every section is a typed stage of :mod:`structlens.causal_dim` (exact κ, SAE training and the
width sweep from :mod:`~structlens.causal_dim.stages` under the profile's protocol, the one
the CLI and ``analyze`` run; CE recovered, architectures, growth, depth, four-cell, IOI and
the synthetic model from :mod:`~structlens.causal_dim.experiment`).  This module only caches
them through :class:`~structlens.pipeline.cache.StageCache` under ``--out``: exact Grams in
blocks of 16 vectors, then κ; the training residuals once (``train-acts``) and every SAE on
that stream (``sae``); the evaluation residuals and their gradients once (``eval-grads``),
reused by every section.  A failing section is logged and left out; the others still run.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from structlens.causal_dim import experiment as ex
from structlens.causal_dim.protocol import PROFILES as PROTOCOLS
from structlens.causal_dim.stages import KappaFit, LayerRows, SweepFit, TrainedSAE, sae_jobs
from structlens.pipeline.cache import Stage, StageCache, data_digest
from structlens.results import Result, to_jsonable

R = TypeVar("R", bound=Result)

METHOD = "causal-dimension"
GRAM_BLOCK = 16  # vectors per cached Gram block

# Every scientific choice of exact κ and the width sweep is the profile's protocol (the one
# the CLI and `analyze` run too); the rest are this replication's own sections.
CPU: dict[str, Any] = {
    "profile": "cpu",
    "model": "smollm2-135m",
    "protocol": PROTOCOLS["paper"],
    # Three layers on the CPU (each vector costs ~4 s here); five on the gpu profile.
    "jacobian_layers": [15, 5, 25],
    "sweep_layer": 15,
    "ablation_width": 2304,  # four-cell and architecture controls: the base width
    "arch_controls": ["jumprelu", "relu"],
    # Widths of the per-architecture growth sweeps (the arch_controls at matched L0 over these
    # widths, against TopK's sweep): none on the CPU, the full span on the gpu profile.
    "arch_sweep_widths": [],
    "depth_layers": [1, 5, 10, 20, 27],
    "depth_width": 2304,
    "ioi_prompts": 32,
    "seed": 0,
    "synthetic_steps": 600,
}
GPU = CPU | {
    "profile": "gpu",
    "protocol": PROTOCOLS["gpu"],
    "jacobian_layers": [15, 5, 10, 20, 25],
    "arch_sweep_widths": [2304, 4608, 9216, 18432, 36864, 73728, 147456],
    "depth_layers": [1, 4, 7, 10, 13, 16, 19, 22, 25, 27],
    "synthetic_steps": 3000,
}
SMOKE = CPU | {
    "profile": "smoke",
    "model": "tiny-llama",
    "protocol": PROTOCOLS["smoke"],
    "jacobian_layers": [1, 2],
    "sweep_layer": 1,
    "ablation_width": 256,  # d = 64: base 4·d
    "arch_sweep_widths": [256, 512],
    "depth_layers": [0, 2],
    "depth_width": 256,
    "ioi_prompts": 0,  # the byte-level test tokenizer has no single-token names
    "synthetic_steps": 600,  # fewer leave the atoms control untrained (recall 0)
}
# Test-only override of a profile's sizes (``run(..., test_sizes=TINY_TEST_SIZES)``): the
# tiny model at the smoke sizes, so the gpu profile runs end to end on the CPU in the tests.
TINY_TEST_SIZES = {k: v for k, v in SMOKE.items() if k != "profile"}
PROFILES = {"cpu": CPU, "gpu": GPU, "smoke": SMOKE}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# the profile's settings that say which SAEs the sections train (stages.sae_jobs)
LAYOUT = ("sweep_layer", "ablation_width", "arch_controls", "arch_sweep_widths", "depth_layers",
          "depth_width")  # fmt: skip


def _given(result: R) -> R:
    """A computed Result, handed to the cache as its compute."""
    return result


@dataclasses.dataclass
class Run:
    """What the render step reads: every section's typed Result (``None`` when it did not
    run), each SAE's training and the sections that failed."""

    settings: dict[str, Any]
    out: Path
    d_model: int = 0
    kappa: list[KappaFit] = dataclasses.field(default_factory=list)
    sweep: SweepFit | None = None
    ce: ex.CERecovered | None = None
    fourcell: ex.FourCell | None = None
    arch: ex.ArchitectureCounts | None = None
    growth: ex.ArchitectureGrowth | None = None
    depth: ex.DepthEpsilon | None = None
    ioi: ex.IOIRecovery | None = None
    synthetic: ex.SyntheticRecall | None = None
    trained: dict[str, TrainedSAE] = dataclasses.field(default_factory=dict)
    failures: dict[str, str] = dataclasses.field(default_factory=dict)


class CausalReplication:
    """The stages of one profile, sharing one model, one cache and one :class:`Run`."""

    def __init__(self, s: dict[str, Any], out: Path, device: str = "cpu") -> None:
        from structlens.causal_dim.stages import prompt_sets
        from structlens.models import load_model

        self.s, self.device = s, device
        self.protocol = s["protocol"].replace(seed=s["seed"])
        self.cache = StageCache(out / "stages")
        self.model = load_model(s["model"], device=device)
        self.fp = self.model.fingerprint()
        self.prompts = prompt_sets(self.protocol, self.model.tokenizer)
        settings = {k: v for k, v in s.items() if k != "protocol"}
        self.run_ = Run(settings | {"protocol": self.protocol.to_json()}, out, self.model.d_model)
        self.keys: dict[str, str] = {}  # stage keys of κ, the sweep and every SAE by name

    def stage(self, name: str, config: dict[str, Any], **keys: Any) -> Stage:
        """A stage whose config carries the protocol (so every protocol change reaches it)."""
        return Stage(name, config | {"protocol": self.protocol.key()}, **keys)

    def cached(self, stage: Stage, kind: type[R], compute: Callable[[], R], key: str = "") -> R:
        """``stage``'s Result, computed or read back, and the same either way (through its
        JSON form: string keys, non-finite floats as floats); its key is kept as ``key``
        (default: the stage's name) for the stages that read it."""
        self.keys[key or stage.name] = stage.key
        return kind.from_dict(to_jsonable(self.cache.run(stage, kind, lambda _: compute())))

    def part(self, name: str, fn: Callable[[], None]) -> None:
        """Run one section; a failure is logged and recorded, and the others still run."""
        t = time.time()
        try:
            fn()
            log(f"{name} done ({time.time() - t:.0f} s)")
        except Exception:  # noqa: BLE001 - one broken part must not lose the rest of a long run
            log(f"{name} FAILED\n{traceback.format_exc()}")
            self.run_.failures[name] = traceback.format_exc()

    # -- exact κ ------------------------------------------------------------------------
    def gram_source(self, layer: int, used: list[Stage]) -> Callable[[int, int], np.ndarray]:
        """``grams(start, stop)`` for :func:`structlens.causal_dim.stages.kappa`: the exact
        Grams of windows ``start:stop`` of ``layer``, computed (or read back) in cached blocks
        of :data:`GRAM_BLOCK` vectors; every block stage used is appended to ``used``."""
        from structlens.causal_dim.stages import GramBlock, blocked_grams, exact_grams

        windows, p = self.prompts.kappa_windows, self.protocol
        jacobian = {"output": p.jacobian_output, "positions": p.jacobian_positions}

        def block(a: int, b: int) -> np.ndarray:
            config = {"layer": layer, "start": a, "stop": b, **jacobian}
            stage = Stage("grams", config, model=self.fp, data=data_digest(windows[a:b]))

            def compute(_: Path) -> GramBlock:
                t = time.time()
                g = exact_grams(p, self.model, layer, windows[a:b])
                log(f"layer {layer}: vectors {a}-{b} ({(time.time() - t) / (b - a):.1f} s/vec)")
                return GramBlock(grams=g)

            used.append(stage)
            return self.cache.run(stage, GramBlock, compute).grams

        return blocked_grams(block, GRAM_BLOCK)

    def jacobian(self) -> None:
        """Exact κ of every Jacobian layer (the protocol's stage) from cached Gram blocks, one
        cached :class:`KappaFit` per layer over the blocks it drew."""
        from structlens.causal_dim.stages import kappa

        fits = []
        for layer in self.s["jacobian_layers"]:
            used: list[Stage] = []
            fit = kappa(self.protocol, self.model, layer, self.prompts,
                        grams=self.gram_source(layer, used))  # fmt: skip
            stage = self.stage("kappa", {"layer": layer}, inputs=tuple(st.key for st in used))
            fits.append(self.cached(stage, KappaFit, partial(_given, fit), f"kappa-L{layer}"))
        self.run_.kappa = sorted(fits, key=lambda f: f.layer)

    # -- SAE training ---------------------------------------------------------------------
    def train(self) -> dict[str, Path]:
        """Capture the training residuals once, then train every SAE on that one stream;
        returns each SAE's folder by name."""
        from structlens.causal_dim.stages import train_sae, training_rows
        from structlens.sae import save_sae

        s, device = self.s, self.device
        layers = sorted({s["sweep_layer"], *s["depth_layers"]})
        train = self.prompts.sae_train
        acts_stage = Stage("train-acts", {"layers": layers}, model=self.fp, data=data_digest(train))
        acts = self.cache.run(
            acts_stage, LayerRows, lambda _: training_rows(self.model, layers, train)
        )
        folders = {}
        for name, config, layer in sae_jobs(self.protocol, **{k: s[k] for k in LAYOUT}):
            # "record": 2 marks the typed Result (a JSON record before), so old caches recompute
            cfg = {"name": name, "sae": dataclasses.asdict(config), "layer": layer, "record": 2}
            stage = self.stage("sae", cfg | {"device": device}, inputs=(acts_stage.key,))

            def fit(folder: Path, config: Any = config, layer: int = layer) -> TrainedSAE:
                t = time.time()
                sae, info = train_sae(self.protocol, acts.of(layer), config, device=device)
                save_sae(sae, folder / "sae")
                log(
                    f"trained {config.architecture}-{config.d_sae} at layer {layer}: FVU "
                    f"{info.final_fvu:.3f} L0 {info.final_l0:.1f} {info.epochs} epochs "
                    f"({time.time() - t:.0f} s)"
                )
                return TrainedSAE(**vars(info), layer=layer, seconds=time.time() - t, device=device)

            self.run_.trained[name] = self.cache.run(stage, TrainedSAE, fit)
            self.keys[name] = stage.key
            folders[name] = self.cache.path(stage) / "sae"
        return folders

    # -- sections on the trained SAEs -------------------------------------------------------
    def analyze(self, folders: dict[str, Path]) -> None:
        """Every section on the trained SAEs over one capture of evaluation rows."""
        from structlens.causal_dim.model import token_prompt_ids
        from structlens.causal_dim.stages import eval_rows
        from structlens.sae import load_sae

        s = self.s
        torch.manual_seed(s["seed"])
        self.saes = {n: load_sae(path) for n, path in sorted(folders.items())}
        L = s["sweep_layer"]
        self.layers = sorted({L, *s["depth_layers"]})
        evalp = self.prompts.sae_eval
        st = Stage("eval-grads", {"layers": self.layers}, model=self.fp, data=data_digest(evalp))
        self.ev = self.cache.run(st, LayerRows, lambda _: eval_rows(self.model, self.layers, evalp))
        self.keys["eval-grads"] = st.key
        self.pairs = {layer: self.ev.pairs(layer) for layer in self.layers}
        self.acts = {layer: self.ev.of(layer) for layer in self.layers}
        # row r of batch j is prompt prompt_ids[j][r]: the resampling unit of the intervals
        self.prompt_ids = token_prompt_ids(evalp)
        sections = [self.sweep, self.ce, self.arch, self.growth, self.depth, self.fourcell]
        for fn in sections + ([self.ioi] if s["ioi_prompts"] else []):
            self.part(fn.__name__, fn)

    def section(
        self, name: str, kind: type[R], config: dict, names: list[str],
        compute: Callable[[], R], *extra: str,
    ) -> R:  # fmt: skip
        """A section's Result, cached over the evaluation rows, the SAEs ``names`` and the
        stages named in ``extra`` (those that ran)."""
        inputs = (
            self.keys["eval-grads"],
            *(self.keys[n] for n in names),
            *(self.keys[e] for e in extra if e in self.keys),
        )
        return self.cached(self.stage(name, config, inputs=inputs), kind, compute)

    def at(self, archs: list[str], width: int) -> dict[str, Any]:
        """The trained SAEs of ``archs`` at ``width`` by architecture."""
        return {a: self.saes[f"{a}-{width}"] for a in archs if f"{a}-{width}" in self.saes}

    def sweep(self) -> None:
        from structlens.causal_dim.stages import sweep

        p, L, d = self.protocol, self.s["sweep_layer"], self.run_.d_model
        topk = {w: self.saes[f"topk-{w}"] for w in p.sweep_widths if f"topk-{w}" in self.saes}
        if len(topk) < 2:
            return
        exact = next((f.erank for f in self.run_.kappa if f.layer == L), None)
        self.run_.sweep = self.section(
            "sweep", SweepFit, {"layer": L}, [f"topk-{w}" for w in topk],
            lambda: sweep(p, topk, self.ev, L, self.prompts, exact_kappa=exact, d_model=d),
            f"kappa-L{L}",
        )  # fmt: skip

    def ce(self) -> None:
        names = [n for n in self.saes if not n.startswith("depth")]
        saes, L = {n: self.saes[n] for n in names}, self.s["sweep_layer"]
        self.run_.ce = self.section(
            "ce", ex.CERecovered, {"ce": data_digest(self.prompts.ce)}, names,
            lambda: ex.ce_recovered(self.model, L, saes, self.prompts.ce),
        )  # fmt: skip

    def arch(self) -> None:
        s, L, w = self.s, self.s["sweep_layer"], self.s["ablation_width"]
        saes = self.at(["topk", *s["arch_controls"]], w)
        eps = self.run_.sweep.epsilon if self.run_.sweep is not None else None
        self.run_.arch = self.section(
            "arch", ex.ArchitectureCounts, {"width": w}, [f"{a}-{w}" for a in saes],
            lambda: ex.architecture_counts(saes, self.pairs[L], self.acts[L], width=w, layer=L,
                                           sweep_epsilon=eps),
            "sweep",
        )  # fmt: skip

    def growth(self) -> None:
        s, L, widths = self.s, self.s["sweep_layer"], list(self.s["arch_sweep_widths"])
        have = [a for a in s["arch_controls"] if all(f"{a}-{w}" in self.saes for w in widths)]
        names = [f"{a}-{w}" for a in ["topk", *have] for w in widths]
        if len(widths) < 2 or not have or any(n not in self.saes for n in names):
            return  # no growth sweep in this profile (the cpu profile has none)
        saes = {a: {w: self.saes[f"{a}-{w}"] for w in widths} for a in ["topk", *have]}
        self.run_.growth = self.section(
            "arch-growth", ex.ArchitectureGrowth, {"widths": widths}, names,
            lambda: ex.architecture_growth(self.protocol, saes, self.pairs[L], self.acts[L],
                                           prompt_ids=self.prompt_ids, layer=L,
                                           d_model=self.run_.d_model),
        )  # fmt: skip

    def depth(self) -> None:
        L, w = self.s["sweep_layer"], self.s["depth_width"]
        name = {y: f"topk-{w}" if y == L else f"depth-L{y}-topk-{w}" for y in self.layers}
        saes = {y: self.saes[n] for y, n in name.items() if n in self.saes}
        self.run_.depth = self.section(
            "depth", ex.DepthEpsilon, {"width": w}, [name[y] for y in saes],
            lambda: ex.epsilon_by_depth(saes, self.pairs, self.acts, width=w),
        )  # fmt: skip

    def fourcell(self) -> None:
        # The encoder-as-sparsity-filter mechanism can only be removed where the sparsity
        # comes from learned thresholds/biases (JumpReLU, ReLU), not TopK's k: the control
        # runs on every architecture at the ablation width, L0 per cell.
        s, L, w = self.s, self.s["sweep_layer"], self.s["ablation_width"]
        saes = self.at(["topk", *s["arch_controls"]], w)
        self.run_.fourcell = self.section(
            "fourcell", ex.FourCell, {"seed": s["seed"], "width": w}, [f"{a}-{w}" for a in saes],
            lambda: ex.four_cells(saes, self.pairs[L], width=w, layer=L, seed=s["seed"]),
        )  # fmt: skip

    def ioi(self) -> None:
        s, L, name = self.s, self.s["sweep_layer"], f"topk-{self.s['ablation_width']}"
        config = {"n_prompts": s["ioi_prompts"], "layer": L, "seed": s["seed"]}
        st = Stage("ioi", config, model=self.fp, inputs=(self.keys[name],))
        self.run_.ioi = self.cached(st, ex.IOIRecovery, lambda: ex.ioi(
            self.model, L, self.saes[name], n_prompts=s["ioi_prompts"], seed=s["seed"]
        ))  # fmt: skip

    def synthetic(self) -> None:
        steps = self.s["synthetic_steps"]
        config = {"steps": steps, **ex.SYNTHETIC_SAE, "model": ex.SYNTHETIC_MODEL,
                  "readouts": ["rotated", "atoms"]}  # fmt: skip
        self.run_.synthetic = self.cached(
            Stage("synthetic", config), ex.SyntheticRecall, lambda: ex.synthetic_recall(steps)
        )


STAGES = ("jacobian", "train", "analyze", "synthetic")


def run(
    profile: str = "cpu",
    out: str | Path | None = None,
    doc_dir: str | Path | None = None,
    device: str = "cpu",
    stages: tuple[str, ...] = STAGES,
    test_sizes: dict[str, Any] | None = None,
) -> tuple[Run, StageCache]:
    """Run (or resume) the stages of ``profile`` and render the markdown and claims JSON
    into ``doc_dir`` (default: ``docs/replication`` for the cpu/gpu profiles, ``out`` for
    smoke).  ``test_sizes`` (tests only, e.g. :data:`TINY_TEST_SIZES`) overrides the
    profile's sizes so a profile's code path runs on a tiny model."""
    from structlens.replication import default_paths
    from structlens.replication.causal_dim.render import write

    s = PROFILES[profile] | (test_sizes or {})
    out, doc_dir = default_paths(METHOD, profile, out, doc_dir)
    rep = CausalReplication(s, out, device)
    folders: dict[str, Path] = {}
    if "jacobian" in stages:
        log("stage jacobian")
        rep.jacobian()
    if "train" in stages or "analyze" in stages:
        log("stage train")
        folders = rep.train()
    if "analyze" in stages:
        log("stage analyze")
        rep.analyze(folders)
    if "synthetic" in stages:
        log("stage synthetic")
        rep.synthetic()
    md, js = write(rep.run_, doc_dir)
    log(f"wrote {md} and {js}")
    return rep.run_, rep.cache

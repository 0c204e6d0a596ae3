"""Replicate the causal-dimensionality claims on SmolLM2-135M-Instruct.

    python -m structlens.replication causal-dimension                  # CPU profile
    python -m structlens.replication causal-dimension --profile gpu --device cuda

Every profile holds a :class:`~structlens.causal_dim.protocol.CausalProtocol` (the one the
CLI and ``analyze`` run too), and exact κ, the SAE training and the width sweep are the
protocol's stages (:mod:`structlens.causal_dim.stages`); the other sections (CE recovered,
architectures, depth, four-cell, IOI, synthetic) are this replication's own.

Stages, each cached through :class:`~structlens.replication.stage.StageCache` under
``--out`` (default ``results/causal-dimension/<profile>``): exact per-vector Grams in blocks
of 16 vectors, taken in rounds over layers, then κ with CIs (``kappa``); the training
residuals captured once (``train-acts``) and every SAE trained on that one stream (``sae``);
the evaluation residuals and their gradients from one backward pass per batch
(``eval-grads``), reused by the width sweep, CE recovered, the four-cell control, the
architecture and depth comparisons and IOI; and the synthetic AtP-recall check.  A failing
analysis part is logged and left out; the others still run.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

from structlens.causal_dim.protocol import PROFILES as PROTOCOLS
from structlens.replication.stage import Record, Stage, StageCache, data_digest
from structlens.results import Result, to_jsonable

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


@dataclasses.dataclass(frozen=True)
class GramBlock(Result):
    """Exact ``JᵀJ`` [n, d, d] (float64) of consecutive residual vectors of one layer."""

    grams: np.ndarray


def sae_jobs(s: dict[str, Any]) -> list[tuple[str, Any, int]]:
    """(name, SAETrainConfig, layer) in training order: the width sweep (smallest first), the
    architecture controls, the per-architecture growth sweeps, then the depth SAEs; every
    config from the profile's protocol."""
    p = s["protocol"].replace(seed=s["seed"])
    sweep = [(f"topk-{w}", p.sae_config(w), s["sweep_layer"]) for w in p.sweep_widths]
    w0, target = s["ablation_width"], float(p.sae_k)
    arch = [
        (f"{a}-{w0}", p.sae_config(w0, a, target), s["sweep_layer"]) for a in s["arch_controls"]
    ]
    growth = [
        (f"{a}-{w}", p.sae_config(w, a, target), s["sweep_layer"])
        for a in s["arch_controls"]
        for w in s["arch_sweep_widths"]
        if w != w0  # that one is the architecture control's
    ]
    depth = [
        (f"depth-L{layer}-topk-{s['depth_width']}", p.sae_config(s["depth_width"]), layer)
        for layer in s["depth_layers"]
    ]
    return sweep + arch + growth + depth


@dataclasses.dataclass
class Run:
    """What the render step reads: every stage result of one run (``None`` when missing)."""

    settings: dict[str, Any]
    out: Path
    kappa: dict[str, Any] | None = None
    sweep: dict[str, Any] | None = None
    ce: dict[str, Any] | None = None
    fourcell: dict[str, Any] | None = None
    arch: dict[str, Any] | None = None
    growth: dict[str, Any] | None = None
    depth: dict[str, Any] | None = None
    ioi: dict[str, Any] | None = None
    synthetic: dict[str, Any] | None = None
    trained: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
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
        self.run_ = Run(settings=settings | {"protocol": self.protocol.to_json()}, out=out)

    def stage(self, name: str, config: dict[str, Any], **keys: Any) -> Stage:
        """A stage whose config carries the protocol (so every protocol change reaches it)."""
        return Stage(name, config | {"protocol": self.protocol.key()}, **keys)

    def part(self, name: str, fn: Any) -> None:
        """Run one analysis part; a failure is logged and recorded, and the others still run."""
        t = time.time()
        try:
            fn()
            log(f"{name} done ({time.time() - t:.0f} s)")
        except Exception:  # noqa: BLE001 - one broken part must not lose the rest of a long run
            log(f"{name} FAILED\n{traceback.format_exc()}")
            self.run_.failures[name] = traceback.format_exc()

    # -- exact κ ------------------------------------------------------------------------
    def gram_source(self, layer: int, used: list[Stage]) -> Any:
        """``grams(start, stop)`` for :func:`structlens.causal_dim.stages.kappa`: the exact
        Grams of windows ``start:stop`` of ``layer``, computed (or read back) in cached blocks
        of :data:`GRAM_BLOCK` vectors; every block stage used is appended to ``used``."""
        from structlens.causal_dim.stages import exact_grams

        windows, p = self.prompts.kappa_windows, self.protocol
        jacobian = {"output": p.jacobian_output, "positions": p.jacobian_positions}

        def block(a: int, b: int) -> np.ndarray:
            stage = Stage(
                "grams",
                {"layer": layer, "start": a, "stop": b, **jacobian},
                model=self.fp,
                data=data_digest(windows[a:b]),
            )

            def compute(_: Path) -> GramBlock:
                t = time.time()
                g = exact_grams(p, self.model, layer, windows[a:b])
                log(f"layer {layer}: vectors {a}-{b} ({(time.time() - t) / (b - a):.1f} s/vec)")
                return GramBlock(grams=g)

            used.append(stage)
            return self.cache.run(stage, GramBlock, compute).grams

        def grams(start: int, stop: int) -> np.ndarray:
            parts, a = [], start
            while a < stop:
                b = min(stop, (a // GRAM_BLOCK + 1) * GRAM_BLOCK)
                parts.append(block(a, b))
                a = b
            log(f"layer {layer}: {start}-{stop} vectors drawn")
            return np.concatenate(parts)

        return grams

    def jacobian(self) -> list[Stage]:
        """Exact κ of every Jacobian layer (the protocol's stage) from cached Gram blocks."""
        from structlens.causal_dim.stages import KappaFit, kappa

        used: list[Stage] = []
        fits = {
            layer: kappa(
                self.protocol, self.model, layer, self.prompts,
                grams=self.gram_source(layer, used),
            )
            for layer in self.s["jacobian_layers"]
        }  # fmt: skip
        stage = self.stage("kappa", {"layers": list(fits)}, inputs=tuple(st.key for st in used))

        def summarize(_: Path) -> Record:
            layers = [to_jsonable(f) for f in fits.values()]
            return Record.of({"d": self.model.d_model, "layers": layers})

        self.run_.kappa = self.cache.run(stage, Record, summarize).data
        self.kappa_fits = {
            e["layer"]: KappaFit.from_dict(e) for e in (self.run_.kappa or {})["layers"]
        }
        self.kappa_stage = stage
        return used

    # -- SAE training ---------------------------------------------------------------------
    def train(self) -> dict[str, tuple[Stage, Path]]:
        """Capture the training residuals once, then every SAE on that one stream."""
        from structlens.causal_dim.stages import LayerRows, train_sae, training_rows
        from structlens.sae import save_sae

        s, device = self.s, self.device
        layers = sorted({s["sweep_layer"], *s["depth_layers"]})
        train_prompts = self.prompts.sae_train
        acts_stage = Stage(
            "train-acts", {"layers": layers}, model=self.fp, data=data_digest(train_prompts)
        )

        def capture(_: Path) -> LayerRows:
            t = time.time()
            rows = training_rows(self.model, layers, train_prompts)
            log(f"captured {rows.acts.shape[1]} tokens at {layers} ({time.time() - t:.0f} s)")
            return rows

        acts = self.cache.run(acts_stage, LayerRows, capture)
        trained = {}
        for name, config, layer in sae_jobs(s):
            cfg = {"name": name, "sae": dataclasses.asdict(config), "layer": layer}
            stage = self.stage("sae", cfg | {"device": device}, inputs=(acts_stage.key,))

            def fit(folder: Path, config: Any = config, layer: int = layer) -> Record:
                t = time.time()
                sae, info = train_sae(self.protocol, acts.of(layer), config, device=device)
                save_sae(sae, folder / "sae")
                log(
                    f"trained {config.architecture}-{config.d_sae} at layer {layer}: FVU "
                    f"{info.final_fvu:.3f} L0 {info.final_l0:.1f} {info.epochs} epochs "
                    f"({time.time() - t:.0f} s)"
                )
                extra = {"layer": layer, "seconds": time.time() - t, "device": device}
                return Record.of(to_jsonable(info) | extra)

            self.run_.trained[name] = self.cache.run(stage, Record, fit).data
            trained[name] = (stage, self.cache.path(stage) / "sae")
        return trained

    # -- analysis -------------------------------------------------------------------------
    def analyze(self, trained: dict[str, tuple[Stage, Path]]) -> None:
        from structlens.causal_dim import FeatureStats, calibrate_epsilon
        from structlens.causal_dim.experiment import four_cell, ioi_recovery
        from structlens.causal_dim.model import token_prompt_ids
        from structlens.causal_dim.stages import LayerRows, SweepFit, eval_rows
        from structlens.causal_dim.stages import sweep as sweep_stage
        from structlens.causal_dim.sweep import sweep_analysis
        from structlens.sae import load_sae
        from structlens.sae.sweep import ce_recovered_by_width, sae_quality
        from structlens.sites import site_name

        s, model, R, p = self.s, self.model, self.run_, self.protocol
        torch.manual_seed(s["seed"])
        evalp, cep = self.prompts.sae_eval, self.prompts.ce
        L = s["sweep_layer"]
        layers = sorted({L, *s["depth_layers"]})
        saes = {n: load_sae(path) for n, (_, path) in sorted(trained.items())}
        key_of = {n: st.key for n, (st, _) in trained.items()}
        grads_stage = Stage(
            "eval-grads", {"layers": layers}, model=self.fp, data=data_digest(evalp)
        )

        def capture(_: Path) -> LayerRows:
            t = time.time()
            rows = eval_rows(model, layers, evalp)
            n = rows.acts.shape[1]
            log(f"eval acts+grads: {n} tokens at {layers} ({time.time() - t:.0f} s)")
            return rows

        ev = self.cache.run(grads_stage, LayerRows, capture)
        pairs = {layer: ev.pairs(layer) for layer in layers}
        # residual_grads_multi's batches and row selection, so row r of batch j is prompt
        # prompt_ids[j][r] of evalp: the resampling unit of the sweep's intervals
        prompt_ids = token_prompt_ids(evalp)
        eval_acts = {layer: ev.of(layer) for layer in layers}
        fits = getattr(self, "kappa_fits", {})
        exact = fits[L].erank if L in fits else None
        topk = {w: saes[f"topk-{w}"] for w in p.sweep_widths if f"topk-{w}" in saes}
        # the controls' settings: the protocol's (d_model enables the base-width check)
        cfg = p.width_sweep(model.d_model)
        kappa_key = (self.kappa_stage.key,) if hasattr(self, "kappa_stage") else ()

        def stage(name: str, config: dict, sae_names: list[str], extra: tuple = ()) -> Stage:
            inputs = (grads_stage.key, *(key_of[n] for n in sae_names), *extra)
            return self.stage(name, config, inputs=inputs)

        sweep_names = [f"topk-{w}" for w in topk]

        def sweep() -> None:
            def compute(_: Path) -> SweepFit:
                fit = sweep_stage(
                    p, topk, ev, L, self.prompts, exact_kappa=exact, d_model=model.d_model
                )
                log(
                    f"sweep: n_repr {fit.n_repr.tolist()} n_causal {fit.n_causal.tolist()} "
                    f"({fit.sweep_status}; κ̂ {fit.kappa_hat_status})"
                )
                return fit

            st = stage("sweep", {"layer": L}, sweep_names, kappa_key)
            fit = self.cache.run(st, SweepFit, compute)
            training = {str(w): R.trained[f"topk-{w}"] for w in topk}
            R.sweep = to_jsonable(fit) | {"site": site_name("resid_pre", L), "training": training}
            self.sweep_stage = st

        def ce() -> None:
            names = [n for n in saes if not n.startswith("depth")]
            st = stage("ce", {"ce": data_digest(cep)}, names)

            def compute(_: Path) -> Record:
                # keyed by SAE name here (the function accepts any keys, e.g. widths)
                todo: dict[Any, Any] = {n: saes[n] for n in names}
                got = ce_recovered_by_width(model, L, todo, cep)
                return Record.of({str(k): v for k, v in got.items()})

            R.ce = self.cache.run(st, Record, compute).data

        def arch() -> None:
            w = s["ablation_width"]
            names = [f"{a}-{w}" for a in ["topk", *s["arch_controls"]] if f"{a}-{w}" in saes]
            sweep_key = (self.sweep_stage.key,) if hasattr(self, "sweep_stage") else ()
            sweep_eps = R.sweep["epsilon"] if R.sweep else None

            def compute(_: Path) -> Record:
                scores = {}
                for a in ["topk", *s["arch_controls"]]:
                    if f"{a}-{w}" in saes:
                        st = FeatureStats(w, n_blocks=1)
                        for acts, grads in pairs[L]:
                            st.update(saes[f"{a}-{w}"], acts, grads)
                        scores[a] = st.scores()
                # Common thresholds: the sweep's ε (98th percentile at the base width) and
                # TopK's own 98th percentile at this width; each architecture's own ε too.
                eps_topk = calibrate_epsilon(scores["topk"][0], 0.02) if "topk" in scores else None
                rows = {}
                for a, (atp, fires) in scores.items():
                    eps_own = calibrate_epsilon(atp, 0.02)
                    rows[a] = {
                        "n_repr": int((fires >= 1).sum()),
                        "epsilon_own": eps_own,
                        "n_causal_at_sweep_epsilon": int((atp > sweep_eps).sum())
                        if sweep_eps is not None
                        else None,
                        "n_causal_at_topk_epsilon": int((atp > eps_topk).sum())
                        if eps_topk
                        else None,
                        "top2pct_atp_share": float(
                            atp[atp > eps_own].sum() / max(atp.sum(), 1e-300)
                        ),
                        "quality": sae_quality(saes[f"{a}-{w}"], eval_acts[L]),
                        "training": R.trained[f"{a}-{w}"],
                    }
                return Record.of({"width": w, "layer": L, "rows": rows})

            st = stage("arch", {"width": w}, names, sweep_key)
            R.arch = self.cache.run(st, Record, compute).data

        def growth() -> None:
            """N_causal growth over the same widths per architecture at matched L0, each
            from its own base width's ε, with FVU and L0 per width (matched or not)."""
            widths = list(s["arch_sweep_widths"])
            archs = [a for a in s["arch_controls"] if all(f"{a}-{w}" in saes for w in widths)]
            names = [f"{a}-{w}" for a in ["topk", *archs] for w in widths]
            if len(widths) < 2 or not archs or any(n not in saes for n in names):
                return  # no growth sweep in this profile (the cpu profile has none)

            def compute(_: Path) -> Record:
                rows = {}
                for a in ["topk", *archs]:
                    by_width = {w: saes[f"{a}-{w}"] for w in widths}
                    quality = {w: sae_quality(sae, eval_acts[L]) for w, sae in by_width.items()}
                    fvu = {w: q["fvu"] for w, q in quality.items()}
                    res, _stats = sweep_analysis(
                        by_width, pairs[L], dataclasses.replace(cfg, n_bootstrap=0),
                        prompt_ids=prompt_ids, n_blocks=p.sweep_blocks, heldout_fvu=fvu,
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
                return Record.of({"widths": widths, "layer": L, "k": p.sae_k, "rows": rows})

            st = stage("arch-growth", {"widths": widths}, names)
            R.growth = self.cache.run(st, Record, compute).data

        def depth() -> None:
            def name_at(layer: int) -> str:
                w = s["depth_width"]
                return f"topk-{w}" if layer == L else f"depth-L{layer}-topk-{w}"

            names = [name_at(layer) for layer in layers if name_at(layer) in saes]

            def compute(_: Path) -> Record:
                rows = []
                for layer in layers:
                    name = name_at(layer)
                    if name not in saes:
                        continue
                    st = FeatureStats(s["depth_width"], n_blocks=1)
                    gnorm = []
                    for acts, grads in pairs[layer]:
                        st.update(saes[name], acts, grads)
                        gnorm.append(grads.norm(dim=1))
                    atp, fires = st.scores()
                    rows.append(
                        {
                            "layer": layer,
                            "epsilon": calibrate_epsilon(atp, 0.02),
                            "mean_atp": float(atp.mean()),
                            "median_grad_norm": float(torch.cat(gnorm).median()),
                            "n_repr": int((fires >= 1).sum()),
                            "quality": sae_quality(saes[name], eval_acts[layer]),
                        }
                    )
                return Record.of({"width": s["depth_width"], "rows": rows})

            R.depth = self.cache.run(
                stage("depth", {"width": s["depth_width"]}, names), Record, compute
            ).data

        def fourcell() -> None:
            # The encoder-as-sparsity-filter mechanism can only be removed where the
            # sparsity comes from learned thresholds/biases (JumpReLU, ReLU), not TopK's k:
            # the control runs on every architecture at the ablation width, L0 per cell.
            w = s["ablation_width"]
            names = [f"{a}-{w}" for a in ["topk", *s["arch_controls"]] if f"{a}-{w}" in saes]

            def compute(_: Path) -> Record:
                cells = {
                    n.rsplit("-", 1)[0]: four_cell(saes[n], pairs[L], seed=s["seed"]) for n in names
                }
                return Record.of({"width": w, "layer": L, "architectures": cells})

            st = stage("fourcell", {"seed": s["seed"], "width": w}, names)
            R.fourcell = self.cache.run(st, Record, compute).data

        def ioi() -> None:
            name = f"topk-{s['ablation_width']}"

            def compute(_: Path) -> Record:
                res = ioi_recovery(model, L, saes[name], n_prompts=s["ioi_prompts"], seed=s["seed"])
                return Record.of(res)

            st = Stage(
                "ioi",
                {"n_prompts": s["ioi_prompts"], "layer": L, "seed": s["seed"]},
                model=self.fp,
                inputs=(key_of[name],),
            )
            R.ioi = self.cache.run(st, Record, compute).data

        if len(topk) >= 2:
            self.part("sweep", sweep)
        parts = [("ce", ce), ("arch", arch), ("growth", growth), ("depth", depth)]
        for name, fn in [*parts, ("fourcell", fourcell)]:
            self.part(name, fn)
        if s["ioi_prompts"]:
            self.part("ioi", ioi)

    def synthetic(self) -> None:
        from structlens.causal_dim import SyntheticCausalModel, atp_recall
        from structlens.sae import SAETrainConfig, train_sae

        steps = self.s["synthetic_steps"]
        # The paper's ground truth: causal read-out directions are rotated mixtures of the
        # atoms, not atoms an SAE could learn one by one.
        model_kw: dict[str, Any] = {
            "d": 32,
            "n_atoms": 256,
            "n_causal": 8,
            "vocab": 64,
            "active": 4,
        }
        model_kw |= {"seed": 0}

        def recall(readout: str) -> dict[int, Any]:
            model = SyntheticCausalModel(**model_kw, readout=readout)
            sae = train_sae(
                SAETrainConfig(architecture="topk", d_sae=512, k=4, lr=2e-3),
                (model.sample(512) for _ in range(steps)),
            ).sae
            acts = model.sample(4000)
            grads = model.metric_grads(acts)
            return {
                k: atp_recall(sae, model.causal, acts, grads, top_k=k).to_json()
                for k in (8, 11, 26)
            }

        def compute(_: Path) -> Record:
            # "atoms" is the positive control: read-out directions an SAE can learn
            return Record.of({"rotated": recall("rotated"), "atoms": recall("atoms")})

        config = {
            "steps": steps, "d_sae": 512, "k": 4, "lr": 2e-3, "model": model_kw,
            "readouts": ["rotated", "atoms"],
        }  # fmt: skip
        self.run_.synthetic = self.cache.run(Stage("synthetic", config), Record, compute).data


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
    trained: dict[str, tuple[Stage, Path]] = {}
    if "jacobian" in stages:
        log("stage jacobian")
        rep.jacobian()
    if "train" in stages or "analyze" in stages:
        log("stage train")
        trained = rep.train()
    if "analyze" in stages:
        log("stage analyze")
        rep.analyze(trained)
    if "synthetic" in stages:
        log("stage synthetic")
        rep.synthetic()
    md, js = write(rep.run_, doc_dir)
    log(f"wrote {md} and {js}")
    return rep.run_, rep.cache

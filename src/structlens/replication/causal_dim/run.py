"""Replicate the causal-dimensionality claims on SmolLM2-135M-Instruct.

    python -m structlens.replication causal-dimension                  # CPU profile
    python -m structlens.replication causal-dimension --profile gpu --device cuda

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
import json
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

from structlens.replication.stage import Record, Stage, StageCache, data_digest
from structlens.results import Result, to_jsonable
from structlens.sites import site_name

METHOD = "causal-dimension"
GRAM_BLOCK = 16  # vectors per cached Gram block

CPU = {
    "profile": "cpu",
    "model": "smollm2-135m",
    # Three layers on the CPU (each vector costs ~4 s here); five on the gpu profile.
    "jacobian_layers": [15, 5, 25],
    # Exact κ: start with kappa_start vectors per layer and double until κ(n)/κ(n/2) <
    # kappa_tolerance or kappa_max_vectors (kappa_until_converged).
    "kappa_start": 16,
    "kappa_max_vectors": 128,  # ~4 s a vector on one core (idle)
    "kappa_tolerance": 1.05,
    "jacobian_prompt_tokens": 24,
    # Each curve draw is one eigendecomposition of a d × d matrix.
    "kappa_curve_draws": 10,
    "sweep_layer": 15,
    # Base width 4·d (d = 576; the paper's is ≈ 7·d) up to 8× the base on the CPU: one epoch
    # over 10⁵ tokens costs ~4·d·m flops a token (≈ 1.5 min at 18432 latents on one idle core,
    # up to 10 epochs each), so the paper's 64× span (to 147456) to convergence is the gpu
    # profile's.
    "widths": [2304, 4608, 9216, 18432],
    "architecture": "topk",
    "k": 32,
    # Width-scaled rate lr_base / sqrt(m / 2**14) (Gao et al. 2024): 1.3e-3 at 2304,
    # 1.6e-4 at 147456 (a fixed 1e-3 diverged at narrow widths with lr_base 1e-3).
    "lr": None,
    "lr_base": 5e-4,
    "batch_size": 256,
    # Training to convergence: epochs over the training tokens until the FVU on a held-out
    # tenth of them improves by less than converge_tol (relative) or max_epochs.
    "max_epochs": 10,
    "converge_tol": 0.01,
    # Features silent for this many training tokens count as dead and get the aux-k loss.
    "dead_tokens": 25_000,
    "prompt_tokens": 128,
    "n_train_prompts": 760,  # every full window not held out (~10⁵ tokens)
    "n_eval_prompts": 36,
    "n_eval_extra": 12,
    "train_tokens": None,  # cap on the captured tokens each SAE trains on (None = all)
    "n_ce_prompts": 8,
    "n_blocks": 64,
    "n_bootstrap": 200,
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
    "jacobian_layers": [15, 5, 10, 20, 25],
    "widths": [2304, 4608, 9216, 18432, 36864, 73728, 147456],
    "arch_sweep_widths": [2304, 4608, 9216, 18432, 36864, 73728, 147456],
    "kappa_start": 64,
    "kappa_max_vectors": 2048,
    "batch_size": 4096,
    "max_epochs": 100,
    "dead_tokens": 100_000,
    "depth_layers": [1, 4, 7, 10, 13, 16, 19, 22, 25, 27],
    "synthetic_steps": 3000,
}
SMOKE = CPU | {
    "profile": "smoke",
    "model": "tiny-llama",
    "jacobian_layers": [1, 2],
    "kappa_start": 2,
    "kappa_max_vectors": 8,
    "jacobian_prompt_tokens": 8,
    "kappa_curve_draws": 3,
    "sweep_layer": 1,
    "widths": [256, 512, 1024],  # d = 64: base 4·d
    "k": 4,
    "batch_size": 64,
    "max_epochs": 3,
    "dead_tokens": 1000,
    "prompt_tokens": 32,
    "n_train_prompts": 40,
    "n_eval_prompts": 8,
    "n_eval_extra": 4,
    "n_ce_prompts": 4,
    "n_blocks": 8,
    "n_bootstrap": 20,
    "ablation_width": 256,
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


@dataclasses.dataclass(frozen=True)
class LayerActivations(Result):
    """Residuals [n_layers, n_tokens, d] (``acts``) and, for evaluation, the gradient of the
    summed next-token loss at the same rows (``grads``), with the batch sizes they came in."""

    layers: list[int]
    acts: np.ndarray
    grads: np.ndarray | None = None
    batch_sizes: list[int] | None = None

    def of(self, layer: int) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(self.acts[self.layers.index(layer)]))

    def pairs(self, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(acts, grads) per original batch, as the analysis consumed them when captured."""
        if self.grads is None or self.batch_sizes is None:
            raise ValueError("these activations were captured without gradients.")
        i = self.layers.index(layer)
        a = torch.from_numpy(np.ascontiguousarray(self.acts[i]))
        g = torch.from_numpy(np.ascontiguousarray(self.grads[i]))
        return list(zip(a.split(self.batch_sizes), g.split(self.batch_sizes), strict=True))


def prompts_split(model: Any, s: dict) -> tuple[list, list, list]:
    """(train, eval, ce) prompts: every 20th full window is held out; eval = the first
    held-out windows plus the training windows left over, CE = the next held-out ones."""
    from structlens.data.corpus import chunk_documents, load_texts

    chunks = chunk_documents(load_texts(None), model.tokenizer, max_tokens=s["prompt_tokens"])
    full = [list(c.token_ids) for c in chunks if len(c.token_ids) == s["prompt_tokens"]]
    held = full[::20]
    other = [p for i, p in enumerate(full) if i % 20]
    n_tr, n_ev = s["n_train_prompts"], s["n_eval_prompts"]
    evalp = held[:n_ev] + other[n_tr : n_tr + s["n_eval_extra"]]
    return other[:n_tr], evalp, held[n_ev : n_ev + s["n_ce_prompts"]]


def jacobian_windows(model: Any, s: dict) -> tuple[list[list[int]], list[int]]:
    """Windows of ``jacobian_prompt_tokens`` tokens, chunk-major within a window index (the
    first vectors all come from different chunks): the held-out chunks first, then the
    others, so the vector cap of the convergence rule is not bounded by the held-out pool
    (κ involves no SAE, so the SAE training chunks may serve).  Returns the windows and the
    corpus chunk each was cut from (the jackknife's unit: windows of one chunk share text)."""
    from structlens.data.corpus import chunk_documents, load_texts

    chunks = chunk_documents(load_texts(None), model.tokenizer, max_tokens=s["prompt_tokens"])
    full = [list(c.token_ids) for c in chunks if len(c.token_ids) == s["prompt_tokens"]]
    index = list(range(len(full)))
    held, other = index[::20], [i for i in index if i % 20]
    n = s["jacobian_prompt_tokens"]
    starts = range(0, s["prompt_tokens"] - n + 1, n + 2)
    order = [(i, a) for pool in (held, other) for a in starts for i in pool]
    return [full[i][a : a + n] for i, a in order], [i for i, _ in order]


def jacobian_prompts(model: Any, s: dict) -> list[list[int]]:
    """The windows of :func:`jacobian_windows` without their chunk indices."""
    return jacobian_windows(model, s)[0]


def sae_jobs(s: dict) -> list[tuple[str, dict, int]]:
    """(name, SAETrainConfig kwargs, layer) in training order: the width sweep (smallest
    first), the architecture controls, the per-architecture growth sweeps, then the depth
    SAEs."""
    base = {
        "k": s["k"],
        "lr": s["lr"],
        "lr_base": s["lr_base"],
        "seed": s["seed"],
        "dead_tokens": s["dead_tokens"],
    }
    sweep = [
        (f"topk-{w}", base | {"architecture": "topk", "d_sae": w}, s["sweep_layer"])
        for w in s["widths"]
    ]
    arch = [
        (
            f"{a}-{s['ablation_width']}",
            base | {"architecture": a, "d_sae": s["ablation_width"], "target_l0": float(s["k"])},
            s["sweep_layer"],
        )
        for a in s["arch_controls"]
    ]
    growth = [
        (
            f"{a}-{w}",
            base | {"architecture": a, "d_sae": w, "target_l0": float(s["k"])},
            s["sweep_layer"],
        )
        for a in s["arch_controls"]
        for w in s["arch_sweep_widths"]
        if w != s["ablation_width"]  # that one is the architecture control's
    ]
    depth = [
        (f"depth-L{layer}-topk-{s['depth_width']}", base | {"d_sae": s["depth_width"]}, layer)
        for layer in s["depth_layers"]
    ]
    return sweep + arch + growth + depth


# Tokens whose residual norm exceeds this multiple of the median (SmolLM2's massive
# activations beyond position 0) are left out of SAE training, as the attention sink is;
# with them the MSE of those few rows dominates the batches they fall in.
MASSIVE_NORM_FACTOR = 10.0


def drop_massive(x: torch.Tensor, factor: float = MASSIVE_NORM_FACTOR) -> tuple[torch.Tensor, int]:
    """``x`` without the rows whose norm exceeds ``factor`` × the median row norm, and how
    many were dropped."""
    norms = x.norm(dim=1)
    keep = norms <= factor * norms.median()
    return x[keep], int((~keep).sum())


def train_to_convergence(
    config: Any,
    x: torch.Tensor,
    *,
    batch_size: int,
    max_epochs: int,
    tol: float,
    seed: int,
    device: str = "cpu",
) -> tuple[Any, list[float]]:
    """Train one SAE on the first nine tenths of ``x`` epoch by epoch (fresh shuffles) until
    the FVU on the last tenth (other prompts: rows are prompt-contiguous) improves by less
    than ``tol`` (relative) or ``max_epochs`` is reached.  Returns the training result and
    the held-out FVU after each epoch."""
    from structlens.sae import evaluate_sae
    from structlens.sae.sweep import shuffled_batches
    from structlens.sae.train import SAETrainer

    n_val = max(batch_size, x.shape[0] // 10)
    if x.shape[0] - n_val < batch_size:
        raise ValueError(
            f"{x.shape[0]} training tokens leave fewer than one batch of {batch_size} after "
            f"holding out {n_val}; capture more training prompts or lower batch_size."
        )
    x_fit, x_val = x[:-n_val], x[-n_val:]
    trainer = SAETrainer(config, x.shape[1], tail_tokens=20_000, device=device)
    curve: list[float] = []
    for epoch in range(max_epochs):
        for batch in shuffled_batches(x_fit, batch_size, 1, seed + epoch):
            trainer.step(batch)
        curve.append(float(evaluate_sae(trainer.sae, x_val).fvu))
        if len(curve) >= 2 and curve[-2] - curve[-1] < tol * curve[-2]:
            break
    return trainer.result(), curve


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
        from structlens.models import load_model

        self.s, self.device = s, device
        self.cache = StageCache(out / "stages")
        self.model = load_model(s["model"], device=device)
        self.fp = self.model.fingerprint()
        self.run_ = Run(settings=s, out=out)

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
    def gram_draw(self, layer: int, prompts: list, cfg: Any, used: list[Stage]) -> Any:
        """``draw(k)`` for :func:`kappa_until_converged`: the next ``k`` exact per-vector
        Grams of ``layer``, computed (or read back) in cached blocks of :data:`GRAM_BLOCK`
        vectors; every block stage used is appended to ``used``."""
        from structlens.causal_dim.model import vector_grams

        have = [0]

        def block(a: int, b: int) -> np.ndarray:
            stage = Stage(
                "grams",
                {"layer": layer, "start": a, "stop": b, "output": "log_probs"},
                model=self.fp,
                data=data_digest(prompts[a:b]),
            )

            def compute(_: Path) -> GramBlock:
                t = time.time()
                g = [x.numpy() for x in vector_grams(self.model, layer, prompts[a:b], cfg)]
                log(f"layer {layer}: vectors {a}-{b} ({(time.time() - t) / (b - a):.1f} s/vec)")
                return GramBlock(grams=np.stack(g))

            used.append(stage)
            return self.cache.run(stage, GramBlock, compute).grams

        def draw(k: int) -> np.ndarray:
            start, stop, parts = have[0], have[0] + k, []
            while have[0] < stop:
                a = have[0]
                b = min(stop, (a // GRAM_BLOCK + 1) * GRAM_BLOCK)
                parts.append(block(a, b))
                have[0] = b
            log(f"layer {layer}: {start}-{stop} vectors drawn")
            return np.concatenate(parts)

        return draw

    def jacobian(self) -> list[Stage]:
        """Exact per-vector Grams per layer, doubled until κ(n)/κ(n/2) < the tolerance (or
        the cap), then κ with jackknife CIs."""
        from structlens.causal_dim import JacobianConfig
        from structlens.causal_dim.kappa import (
            kappa_curve,
            kappa_from_grams,
            kappa_until_converged,
        )

        s = self.s
        prompts, chunk_of = jacobian_windows(self.model, s)
        cfg = JacobianConfig(output="log_probs", max_rows=self.model.d_model)
        cap = min(s["kappa_max_vectors"], len(prompts))
        used: list[Stage] = []
        conv = {}
        for layer in s["jacobian_layers"]:
            draw = self.gram_draw(layer, prompts, cfg, used)
            conv[layer] = kappa_until_converged(
                draw, min(s["kappa_start"], cap), tolerance=s["kappa_tolerance"], max_vectors=cap
            )
        # the point is the bias-corrected jackknife estimate over corpus chunks; results of
        # the per-vector jackknife with the plug-in as point live under another key
        point = {"kappa_point": "bias-corrected", "jackknife_unit": "corpus chunk"}
        stage = Stage(
            "kappa",
            {k: s[k] for k in ("kappa_curve_draws", "kappa_tolerance", "seed")} | point,
            inputs=tuple(st.key for st in used),
        )

        def summarize(_: Path) -> Record:
            layers = []
            for layer, c in conv.items():
                g = c.grams
                res = kappa_from_grams(g, groups=chunk_of[: len(g)])
                sizes = sorted(
                    {n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if n < len(g)} | {len(g)}
                )
                curve = kappa_curve(g, sizes, n_draws=s["kappa_curve_draws"], seed=s["seed"])
                layers.append(
                    to_jsonable(res)
                    | {"layer": layer, "curve": to_jsonable(curve)}
                    | {
                        "convergence": {
                            "n_vectors": c.n_vectors,
                            "erank": c.erank,
                            "ratios": c.ratios,
                            "converged": c.converged,
                            "tolerance": c.tolerance,
                            "max_vectors": cap,
                        }
                    }
                )
            settings = {
                "output": "log_probs",
                "outputs": "same",
                "position": "last token of each window",
                "prompt_tokens": s["jacobian_prompt_tokens"],
                "rule": f"double n until κ(n)/κ(n/2) < {s['kappa_tolerance']} or n = {cap}",
                "jackknife_unit": "corpus chunk (windows of one chunk form one group)",
            }
            d = layers[0]["d"] if layers else None
            return Record.of({"d": d, "settings": settings, "layers": layers})

        self.run_.kappa = self.cache.run(stage, Record, summarize).data
        self.kappa_stage = stage
        return used

    # -- SAE training ---------------------------------------------------------------------
    def train(self) -> dict[str, tuple[Stage, Path]]:
        """Capture the training residuals once, then every SAE on that one stream."""
        from structlens.capture.residuals import residual_batches_multi
        from structlens.sae import SAETrainConfig, save_sae

        s, device = self.s, self.device
        layers = sorted({s["sweep_layer"], *s["depth_layers"]})
        train_prompts, _, _ = prompts_split(self.model, s)
        acts_stage = Stage(
            "train-acts", {"layers": layers}, model=self.fp, data=data_digest(train_prompts)
        )

        def capture(_: Path) -> LayerActivations:
            t = time.time()
            parts: dict[int, list] = {layer: [] for layer in layers}
            for batch in residual_batches_multi(self.model, layers, train_prompts):
                for layer, a in batch.items():
                    parts[layer].append(a.half())
            acts = np.stack([torch.cat(parts[layer]).cpu().numpy() for layer in layers])
            log(f"captured {acts.shape[1]} tokens at layers {layers} ({time.time() - t:.0f} s)")
            return LayerActivations(layers=layers, acts=acts)

        acts = self.cache.run(acts_stage, LayerActivations, capture)
        trained = {}
        for name, kw, layer in sae_jobs(s):
            cfg = {
                "name": name,
                "sae": kw,
                "layer": layer,
                "batch_size": s["batch_size"],
                "max_epochs": s["max_epochs"],
                "converge_tol": s["converge_tol"],
                "train_tokens": s["train_tokens"],
                "massive_norm_factor": MASSIVE_NORM_FACTOR,
                "seed": s["seed"],
                "device": device,
            }
            stage = Stage("sae", cfg, inputs=(acts_stage.key,))

            def fit(folder: Path, name: str = name, kw: dict = kw, layer: int = layer) -> Record:
                t = time.time()
                x, n_massive = drop_massive(acts.of(layer)[: s["train_tokens"]].float())
                x = x.to(device)
                res, curve = train_to_convergence(
                    SAETrainConfig(**kw),
                    x,
                    batch_size=s["batch_size"],
                    max_epochs=s["max_epochs"],
                    tol=s["converge_tol"],
                    seed=s["seed"],
                    device=device,
                )
                save_sae(res.sae.cpu(), folder / "sae")
                info = {
                    "layer": layer,
                    "n_train_tokens": int(x.shape[0]),
                    "n_massive_dropped": n_massive,
                    "tokens": res.tokens,
                    "steps": res.steps,
                    "epochs": len(curve),
                    "val_fvu_by_epoch": curve,
                    "converged": len(curve) < s["max_epochs"],
                    "final_fvu": res.final_fvu,
                    "final_l0": res.final_l0,
                    "l0_matched": res.l0_matched,
                    "dead_fraction": res.dead_fraction,
                    "learning_rate": res.learning_rate,
                    "seconds": time.time() - t,
                    "device": device,
                }
                log(
                    f"trained {name}: FVU {res.final_fvu:.3f} L0 {res.final_l0:.1f} "
                    f"{len(curve)} epochs ({info['seconds']:.0f} s)"
                )
                return Record.of(info)

            self.run_.trained[name] = self.cache.run(stage, Record, fit).data
            trained[name] = (stage, self.cache.path(stage) / "sae")
        return trained

    # -- analysis -------------------------------------------------------------------------
    def analyze(self, trained: dict[str, tuple[Stage, Path]]) -> None:
        from structlens.causal_dim import FeatureStats, calibrate_epsilon
        from structlens.causal_dim.experiment import four_cell, ioi_recovery, sweep_analysis
        from structlens.causal_dim.model import residual_grads_multi, token_prompt_ids
        from structlens.causal_dim.sweep import WidthSweepConfig, analyze_width_sweep
        from structlens.sae import load_sae
        from structlens.sae.sweep import ce_recovered_by_width, sae_quality

        s, model, R = self.s, self.model, self.run_
        torch.manual_seed(s["seed"])
        _, evalp, cep = prompts_split(model, s)
        L = s["sweep_layer"]
        layers = sorted({L, *s["depth_layers"]})
        saes = {n: load_sae(path) for n, (_, path) in sorted(trained.items())}
        key_of = {n: st.key for n, (st, _) in trained.items()}
        grads_stage = Stage(
            "eval-grads", {"layers": layers}, model=self.fp, data=data_digest(evalp)
        )

        def capture(_: Path) -> LayerActivations:
            t = time.time()
            pairs: dict[int, list] = {layer: [] for layer in layers}
            for batch in residual_grads_multi(model, layers, evalp):
                for layer, ag in batch.items():
                    pairs[layer].append(ag)
            sizes = [a.shape[0] for a, _ in pairs[L]]
            acts = np.stack([torch.cat([a for a, _ in pairs[y]]).numpy() for y in layers])
            grads = np.stack([torch.cat([g for _, g in pairs[y]]).numpy() for y in layers])
            log(f"eval acts+grads: {sum(sizes)} tokens at {layers} ({time.time() - t:.0f} s)")
            return LayerActivations(layers=layers, acts=acts, grads=grads, batch_sizes=sizes)

        ev = self.cache.run(grads_stage, LayerActivations, capture)
        pairs = {layer: ev.pairs(layer) for layer in layers}
        # residual_grads_multi's batches and row selection, so row r of batch j is prompt
        # prompt_ids[j][r] of evalp: the resampling unit of the sweep's intervals
        prompt_ids = token_prompt_ids(evalp)
        if [len(p) for p in prompt_ids] != list(ev.batch_sizes or []):
            raise ValueError(
                "the cached eval-grads batches do not match the evaluation prompts' token "
                "counts; delete the eval-grads stage and rerun."
            )
        eval_acts = {layer: ev.of(layer) for layer in layers}
        exact = None
        for e in (R.kappa or {}).get("layers", []):
            if e["layer"] == L:
                exact = e["erank"]
        topk = {w: saes[f"topk-{w}"] for w in s["widths"] if f"topk-{w}" in saes}
        # d_model enables the base-width check (base ≥ 4·d, else a clear error).
        cfg = WidthSweepConfig(n_bootstrap=s["n_bootstrap"], seed=s["seed"], d_model=model.d_model)
        kappa_key = (self.kappa_stage.key,) if hasattr(self, "kappa_stage") else ()

        def stage(name: str, config: dict, sae_names: list[str], extra: tuple = ()) -> Stage:
            inputs = (grads_stage.key, *(key_of[n] for n in sae_names), *extra)
            return Stage(name, config, inputs=inputs)

        sweep_names = [f"topk-{w}" for w in topk]

        def sweep() -> None:
            def compute(_: Path) -> Record:
                # The gate: held-out FVU must fall with width, else the sweep is reported as
                # not interpretable rather than fitted.
                quality = {w: sae_quality(sae, eval_acts[L]) for w, sae in topk.items()}
                fvu = {w: q["fvu"] for w, q in quality.items()}
                res, stats = sweep_analysis(
                    topk, pairs[L], cfg, prompt_ids=prompt_ids, n_blocks=s["n_blocks"],
                    exact_erank=exact, heldout_fvu=fvu,
                )  # fmt: skip
                # Total and largest AtP per width: does a wider SAE split the same causal mass?
                atp = {str(w): st.scores()[0] for w, st in stats.items()}
                mass = {w: {"sum": float(a.sum()), "max": float(a.max())} for w, a in atp.items()}
                # The headline check: how κ̂ moves with the base width (ε from the top 2% of
                # each base, same tokens, widths ≥ base; three widths per fit at least).
                bases = {}
                for b in sorted(topk)[:-2]:
                    sub = {w: st for w, st in stats.items() if w >= b}
                    r = analyze_width_sweep(
                        sub, dataclasses.replace(cfg, n_bootstrap=0), heldout_fvu=fvu
                    )
                    bases[str(b)] = {
                        "widths": r.widths.tolist(),
                        "n_causal": r.n_causal.tolist(),
                        "epsilon": r.epsilon,
                        "n_causal_growth": float(r.n_causal_growth[-1]),
                        "kappa_hat": r.kappa_hat,
                        "kappa_hat_status": r.kappa_hat_status,
                        "kappa_hat_reason": r.kappa_hat_reason,
                    }
                training = {str(w): R.trained[f"topk-{w}"] for w in topk}
                log(
                    f"sweep: n_repr {res.n_repr.tolist()} n_causal {res.n_causal.tolist()} "
                    f"({res.sweep_status}; κ̂ {res.kappa_hat_status})"
                )
                return Record(
                    payload=json.dumps(
                        to_jsonable(res)
                        | {"layer": L, "site": site_name("resid_pre", L)}
                        | {"quality": {str(w): q for w, q in quality.items()}}
                        | {"training": training, "atp_mass": mass}
                        | {"base_width_sensitivity": bases},
                        default=str,
                    )
                )

            config = {
                "n_bootstrap": s["n_bootstrap"],
                "n_blocks": s["n_blocks"],
                "seed": s["seed"],
                "resampling_unit": "prompt",  # blocks hold whole prompts
                "distinct_count_ci": "jackknife",
            }
            st = stage("sweep", config, sweep_names, kappa_key)
            R.sweep = self.cache.run(st, Record, compute).data
            self.sweep_stage = st

        def ce() -> None:
            names = [n for n in saes if not n.startswith("depth")]
            st = stage("ce", {"n_ce_prompts": s["n_ce_prompts"], "ce": data_digest(cep)}, names)

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
                        prompt_ids=prompt_ids, n_blocks=s["n_blocks"], heldout_fvu=fvu,
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
                return Record.of({"widths": widths, "layer": L, "k": s["k"], "rows": rows})

            st = stage("arch-growth", {"widths": widths, "n_blocks": s["n_blocks"]}, names)
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

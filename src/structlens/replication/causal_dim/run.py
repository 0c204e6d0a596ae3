"""Replicate the causal-dimensionality claims on SmolLM2-135M-Instruct.

    python -m structlens.replication causal-dimension                  # CPU profile
    python -m structlens.replication causal-dimension --profile gpu --device cuda

Every section is a typed stage of :mod:`structlens.causal_dim` under the profile's protocol
(exact κ and SAE training from :mod:`~structlens.causal_dim.stages`, the sections on trained
SAEs from :mod:`~structlens.causal_dim.sections`).  This module only caches them under
``--out``: exact Grams in blocks of 16 vectors, then κ; the training residuals and every SAE
on them; the evaluation residuals and gradients once, read by every section.  A failing
section is logged and left out; the others still run.  The SAEs train on the protocol's
corpus chunks and on texts the model generates (cached like every other input); the
ε-by-depth SAEs are searched for (:func:`~structlens.causal_dim.stages.match_k`), every
trial SAE cached under its own name.
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
from structlens.causal_dim.protocol import REPLICATION_PROFILES as PROFILES
from structlens.causal_dim.protocol import ReplicationProfile
from structlens.causal_dim.stages import (
    GeneratedText,
    KappaFit,
    KMatch,
    LayerRows,
    PromptSets,
    SweepFit,
    TrainedSAE,
    depth_sae_name,
    match_k,
    sae_jobs,
)
from structlens.pipeline.cache import Stage, StageCache, data_digest
from structlens.pipeline.progress import log
from structlens.results import Result, to_jsonable

R = TypeVar("R", bound=Result)

METHOD = "causal-dimension"
GRAM_BLOCK = 16  # vectors per cached Gram block


@dataclasses.dataclass
class Run:
    """What the render step reads: every section's typed Result (``None`` when it did not
    run), each SAE's training, the k search of every ε-by-depth layer, how many corpus chunks
    and generated texts the SAEs trained on, the sections that failed, and the cross-family
    model's exact κ at the layer of matched relative depth to each of ours."""

    settings: dict[str, Any]  # the profile's JSON
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
    depth_k: dict[int, KMatch] = dataclasses.field(default_factory=dict)
    n_train_chunks: int = 0
    n_generated: int = 0
    failures: dict[str, str] = dataclasses.field(default_factory=dict)
    n_layers: int = 0
    cross_model: str | None = None  # the cross-family model, its width, its layer count
    cross_d_model: int = 0
    cross_n_layers: int = 0
    cross_kappa: dict[int, KappaFit] = dataclasses.field(default_factory=dict)  # by our layer


class CausalReplication:
    """The stages of one profile, sharing one model, one cache and one :class:`Run`."""

    def __init__(self, s: ReplicationProfile, out: Path, device: str = "cpu") -> None:
        from structlens.causal_dim.stages import prompt_sets
        from structlens.models import load_model

        self.s, self.device = s, device
        self.protocol = s.protocol.replace(seed=s.seed)
        self.cache = StageCache(out / "stages")
        self.model = load_model(s.model, device=device)
        self.fp = self.model.fingerprint()
        self.prompts = prompt_sets(self.protocol, self.model.tokenizer)
        self.run_ = Run(s.replace(protocol=self.protocol).to_json(), out, self.model.d_model,
                        n_train_chunks=len(self.prompts.sae_train),
                        n_layers=self.model.n_layers)  # fmt: skip
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
    def gram_source(
        self, model: Any, prompts: PromptSets, layer: int, used: list[Stage]
    ) -> Callable[[int, int], np.ndarray]:
        """``grams(start, stop)`` for :func:`structlens.causal_dim.stages.kappa`: the exact
        Grams of ``model`` at windows ``start:stop`` of ``prompts`` at ``layer``, computed (or
        read back) in cached blocks of :data:`GRAM_BLOCK` vectors; every block stage used is
        appended to ``used``."""
        from structlens.causal_dim.stages import GramBlock, blocked_grams, exact_grams

        windows, p, fp = prompts.kappa_windows, self.protocol, model.fingerprint()
        jacobian = {"output": p.jacobian_output, "positions": p.jacobian_positions}

        def block(a: int, b: int) -> np.ndarray:
            config = {"layer": layer, "start": a, "stop": b, **jacobian}
            stage = Stage("grams", config, model=fp, data=data_digest(windows[a:b]))

            def compute(_: Path) -> GramBlock:
                t = time.time()
                g = exact_grams(p, model, layer, windows[a:b])
                log(f"layer {layer}: vectors {a}-{b} ({(time.time() - t) / (b - a):.1f} s/vec)")
                return GramBlock(grams=g)

            used.append(stage)
            return self.cache.run(stage, GramBlock, compute).grams

        return blocked_grams(block, GRAM_BLOCK)

    def kappa_fit(self, model: Any, prompts: PromptSets, layer: int, key: str) -> KappaFit:
        """Exact κ of ``model`` at ``layer`` (the protocol's stage) from cached Gram blocks,
        cached as one :class:`KappaFit` over the blocks it drew."""
        from structlens.causal_dim.kappa import IDENTIFICATION_RULE
        from structlens.causal_dim.stages import kappa

        used: list[Stage] = []
        fit = kappa(self.protocol, model, layer, prompts,
                    grams=self.gram_source(model, prompts, layer, used))  # fmt: skip
        config = {"layer": layer, "rule": IDENTIFICATION_RULE}
        stage = self.stage("kappa", config, inputs=tuple(st.key for st in used))
        # computed above (it reads the Gram blocks' cache)
        return self.cached(stage, KappaFit, lambda: fit, key)

    def jacobian(self) -> None:
        """Exact κ of every Jacobian layer."""
        fits = [self.kappa_fit(self.model, self.prompts, layer, f"kappa-L{layer}")
                for layer in self.s.jacobian_layers]  # fmt: skip
        self.run_.kappa = sorted(fits, key=lambda f: f.layer)

    def cross_family(self) -> None:
        """Exact κ of the profile's cross-family model at the layer of matched relative depth
        to each Jacobian layer, on windows the protocol's rule cuts from the same corpus in its
        own tokens."""
        from structlens.causal_dim.stages import matched_layer, prompt_sets
        from structlens.models import load_model

        name = self.s.cross_family
        if name is None:
            return
        other = load_model(name, device=self.device)
        prompts = prompt_sets(self.protocol, other.tokenizer)
        r = self.run_
        r.cross_model, r.cross_d_model, r.cross_n_layers = name, other.d_model, other.n_layers
        for layer in sorted(self.s.jacobian_layers):
            theirs = matched_layer(layer, self.model.n_layers, other.n_layers)
            key = f"cross-kappa-L{theirs}"
            r.cross_kappa[layer] = self.kappa_fit(other, prompts, theirs, key)

    # -- SAE training ---------------------------------------------------------------------
    def generated(self) -> GeneratedText:
        """The texts the model generates for SAE training (cached: sampling costs about as
        much per token as a forward pass over a whole text)."""
        from structlens.causal_dim.stages import generated_text

        p = self.protocol
        config = {"n": p.sae_generated_prompts, "prefix": p.sae_generated_prefix,
                  "tokens": p.chunk_tokens, "seed": p.seed, "device": self.device}  # fmt: skip
        stage = Stage("generated", config, model=self.fp, data=data_digest(self.prompts.sae_train))
        return self.cache.run(
            stage, GeneratedText, lambda _: generated_text(p, self.model, self.prompts)
        )

    def train(self) -> dict[str, Path]:
        """Capture the training residuals once (corpus chunks and generated texts), then
        train every SAE on that one stream: the fixed jobs, then the k search of each
        ε-by-depth layer against the sweep layer's held-out FVU; returns each SAE's folder by
        name."""
        from structlens.causal_dim.stages import training_prompts, training_rows

        s = self.s
        layers = sorted({s.sweep_layer, *s.depth_layers})
        generated = self.generated()
        self.run_.n_generated = len(generated.texts)
        texts = training_prompts(self.prompts, generated)
        acts_stage = Stage("train-acts", {"layers": layers}, model=self.fp, data=data_digest(texts))
        acts = self.cache.run(
            acts_stage, LayerRows, lambda _: training_rows(self.model, layers, texts)
        )
        folders: dict[str, Path] = {}
        fit = partial(self.fit_sae, acts, acts_stage.key, folders)
        for name, config, layer in sae_jobs(self.protocol, **s.sae_layout()):
            fit(name, config, layer)
        w = s.depth_width
        target = self.run_.trained[f"topk-{w}"].val_fvu_by_epoch[-1]
        for layer in s.depth_search_layers():

            def trial(config: Any, layer: int = layer) -> TrainedSAE:
                return fit(depth_sae_name(layer, w, config.k), config, layer)

            self.run_.depth_k[layer] = match_k(
                self.protocol, trial, layer=layer, width=w, target_fvu=target
            )
        return folders

    def fit_sae(
        self, acts: LayerRows, acts_key: str, folders: dict[str, Path], name: str, config: Any,
        layer: int,
    ) -> TrainedSAE:  # fmt: skip
        """One SAE ``name`` trained (or read back) on the rows of ``layer``; its training is
        recorded and its folder added to ``folders``."""
        from structlens.causal_dim.stages import train_sae
        from structlens.sae import save_sae

        device = self.device
        # "record": 2 marks the typed Result (a JSON record before), so old caches recompute
        cfg = {"name": name, "sae": dataclasses.asdict(config), "layer": layer, "record": 2}
        stage = self.stage("sae", cfg | {"device": device}, inputs=(acts_key,))

        def compute(folder: Path) -> TrainedSAE:
            t = time.time()
            sae, info = train_sae(self.protocol, acts.of(layer), config, device=device)
            save_sae(sae, folder / "sae")
            log(
                f"trained {name} at layer {layer}: FVU {info.final_fvu:.3f} L0 "
                f"{info.final_l0:.1f} {info.epochs} epochs ({time.time() - t:.0f} s)"
            )
            return TrainedSAE(**vars(info), layer=layer, seconds=time.time() - t, device=device)

        self.run_.trained[name] = done = self.cache.run(stage, TrainedSAE, compute)
        self.keys[name] = stage.key
        folders[name] = self.cache.path(stage) / "sae"
        return done

    # -- sections on the trained SAEs -------------------------------------------------------
    def analyze(self, folders: dict[str, Path]) -> None:
        """Every section (:func:`structlens.causal_dim.sections.sections`) on the trained SAEs
        over one capture of evaluation rows, each cached over the rows, the SAEs it reads and
        the earlier stages it reads (those that ran)."""
        from structlens.causal_dim.sections import Trained, sections
        from structlens.causal_dim.stages import eval_rows
        from structlens.sae import load_sae

        s, evalp = self.s, self.prompts.sae_eval
        torch.manual_seed(s.seed)
        saes = {n: load_sae(path) for n, path in sorted(folders.items())}
        layers = sorted({s.sweep_layer, *s.depth_layers})
        st = Stage("eval-grads", {"layers": layers}, model=self.fp, data=data_digest(evalp))
        ev = self.cache.run(st, LayerRows, lambda _: eval_rows(self.model, layers, evalp))
        self.keys["eval-grads"] = st.key
        trained = Trained(s, self.protocol, self.model, saes, ev, self.prompts, self.run_.kappa,
                          training=self.run_.trained, depth_k=self.run_.depth_k)  # fmt: skip
        done: dict[str, Result] = {}
        for sec in sections(trained):

            def run(sec: Any = sec) -> None:
                inputs = (self.keys["eval-grads"], *(self.keys[n] for n in sec.saes),
                          *(self.keys[e] for e in sec.after if e in self.keys))  # fmt: skip
                stage = self.stage(sec.name, sec.config, inputs=inputs)
                got = self.cached(stage, sec.kind, partial(sec.compute, done))
                done[sec.name] = got
                setattr(self.run_, sec.field, got)

            self.part(sec.name, run)

    def synthetic(self) -> None:
        steps = self.s.synthetic_steps
        config = {"steps": steps, **ex.SYNTHETIC_SAE, "model": ex.SYNTHETIC_MODEL,
                  "readouts": ["rotated", "atoms"]}  # fmt: skip
        self.run_.synthetic = self.cached(
            Stage("synthetic", config), ex.SyntheticRecall, lambda: ex.synthetic_recall(steps)
        )


STAGES = ("jacobian", "train", "analyze", "synthetic", "cross_family")


def run(
    profile: str = "cpu",
    out: str | Path | None = None,
    doc_dir: str | Path | None = None,
    device: str = "cpu",
    stages: tuple[str, ...] = STAGES,
) -> tuple[Run, StageCache]:
    """Run (or resume) the stages of ``profile`` and render the markdown and claims JSON
    into ``doc_dir`` (default: ``docs/replication`` for the cpu/gpu profiles, ``out`` for
    smoke)."""
    from structlens.replication import default_paths
    from structlens.replication.causal_dim.render import write

    s = PROFILES[profile]
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
    if "cross_family" in stages and s.cross_family is not None:
        log("stage cross_family")
        rep.part("cross_family", rep.cross_family)
    md, js = write(rep.run_, doc_dir)
    log(f"wrote {md} and {js}")
    return rep.run_, rep.cache

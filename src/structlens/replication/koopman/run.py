"""Replicate the Koopman spectral-identifiability claims on SmolLM2-135M-Instruct.

    python -m structlens.replication koopman [--profile cpu|gpu|smoke]

Captures resid_pre / attn_out over the bundled corpus plus IOI prompts for a layer range (the
activation store is content-hashed), then runs each section as a cached stage of
:mod:`structlens.koopman.stages` under the profile's protocol: split-half rate, per-layer
fits (non-normality, dissociation, tails), invariance gap at equal size, the IOI ablation
ordering per layer, SAE seeds with and without the invariance penalty, universality across
models, and reduction bounds on the pooled operator.  :mod:`structlens.koopman.verdicts`
judges them; :mod:`.render` writes them.  Everything is seeded.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from structlens.koopman import stages as st
from structlens.koopman import verdicts as v
from structlens.koopman.protocol import REPLICATION_PROFILES as PROFILES
from structlens.koopman.protocol import ReplicationProfile, dictionary_label
from structlens.pipeline.cache import Stage, StageCache, data_digest
from structlens.pipeline.progress import log
from structlens.results import Result

METHOD = "koopman"

# Every stage's config carries the version of its Result's layout, so that a stage cached in
# an older layout recomputes.
RECORD = 5
T = TypeVar("T", bound=Result)


class KoopmanReplication:
    """The sections of one profile over one activation store, each a method returning its
    typed stage Results (every one cached); ``settings`` is the claims JSON's block."""

    def __init__(self, s: ReplicationProfile, out: Path, device: str = "cpu") -> None:
        from structlens.koopman.data import capture_depth, depth_prompts
        from structlens.models import load_model

        self.s, self.out, self.t0 = s, out, time.time()
        self.protocol = p = s.protocol.replace(seed=s.seed)
        self.cache = StageCache(out / "stages")
        self.layers = list(range(s.layers[0], s.layers[1] + 1))
        self.probes = list(s.probe_layers)
        self.model = load_model(s.model, device=device)
        self.prompts = depth_prompts(
            self.model.tokenizer, n_corpus=s.n_corpus, max_tokens=s.prompt_tokens,
            n_task=s.n_task, seed=s.seed,
        )  # fmt: skip
        self.data = data_digest([repr(q) for q in self.prompts])
        self.store = capture_depth(self.model, self.prompts, self.layers, root=out / "activations")
        log(f"captured {self.store.n_tokens} tokens x {len(self.store.sites)} sites")
        keys = ("n_corpus", "prompt_tokens", "seed", "n_ioi", "sae_seeds", "sae_epochs")
        self.settings: dict[str, Any] = {
            "profile": s.profile, "model": s.model, "n_prompts": len(self.prompts),
            **{k: getattr(s, k) for k in (*keys, "sae_penalty", "invariance_sae_width")},
            "n_ioi_in_fit": s.n_task, "tokens_per_layer": int(self.store.n_tokens),
            "layers": self.layers, "probe_layers": self.probes, "ioi_layers": list(s.ioi_layers),
            "machine": f"{platform.machine()}, 2 shared CPU cores", "protocol": p.to_json(),
            # the protocol's row and split rules, also at the top (the claims schema's keys)
            "exclude_position0": p.exclude_position0, "dictionary_fit_split": p.dictionary_fit,
            "control_energy": p.control_energy, "invariance_n": st.invariance_size(p),
            "henrici_blocks": p.henrici_blocks,
        }  # fmt: skip

    def stage(
        self, name: str, config: dict[str, Any], kind: type[T], compute: Callable[[], T]
    ) -> T:
        """``compute()``, cached under ``name`` by ``config``, the protocol, model and prompts."""
        config = config | {"protocol": self.protocol.to_json(), "record": RECORD}
        stage = Stage(name, config, model=self.model.fingerprint(), data=self.data)
        got = self.cache.run(stage, kind, lambda _: compute())
        log(f"{name} {config.get('layer', '')} done")
        return got

    def rows(self, layers: list[int], store: Any = None) -> st.LayerRows:
        return st.layer_rows(self.protocol, store or self.store, layers)

    def per_probe(self, name: str, specs: Any, kind: type[T], fn: Any) -> dict[str, T]:
        """``fn(protocol, rows, spec)`` at every probe layer and dictionary ``spec``, keyed
        ``L<layer>/<dictionary>``."""

        def compute(layer: int, spec: Any) -> T:
            return fn(self.protocol, self.rows([layer]), spec)

        return {
            f"L{layer}/{dictionary_label(spec)}": self.stage(
                name, {"layer": layer, "dictionary": spec}, kind, partial(compute, layer, spec)
            )
            for layer in self.probes for spec in specs
        }  # fmt: skip

    def split_half(self) -> dict[str, st.SplitHalfFit]:
        """Split-half convergence at every probe layer and dictionary, on the section's own
        prompts (``split_half_corpus``), captured lazily: a cached section reads no store."""
        from structlens.koopman.data import capture_depth, depth_prompts

        s = self.s
        prompts = depth_prompts(
            self.model.tokenizer, n_corpus=s.split_half_corpus, max_tokens=s.prompt_tokens,
            n_task=s.n_task, seed=s.seed,
        )  # fmt: skip
        self.settings["split_half_prompts"] = len(prompts)
        self.settings["split_half_corpus_text"] = (
            "every bundled-corpus chunk" if s.split_half_corpus is None
            else f"{s.split_half_corpus} bundled-corpus chunks"
        )  # fmt: skip
        data = data_digest([repr(q) for q in prompts])
        store: list[Any] = []

        def compute(layer: int, spec: str) -> st.SplitHalfFit:
            if not store:
                root = self.out / "activations"
                store.append(capture_depth(self.model, prompts, self.probes, root=root))
            return st.split_half(self.protocol, self.rows([layer], store[0]), spec)

        return {
            f"L{layer}/{dictionary_label(spec)}": self.stage(
                "split-half", {"layer": layer, "dictionary": spec, "prompts": data},
                st.SplitHalfFit, partial(compute, layer, spec),
            )
            for layer in self.probes for spec in self.protocol.split_half_dictionaries
        }  # fmt: skip

    def fits(self) -> dict[str, st.SpectrumFit]:
        return self.per_probe("fits", self.protocol.fit_dictionaries, st.SpectrumFit, st.spectrum)

    def invariance(self) -> st.SAEInvariance:
        s, layer = self.s, self.probes[0]
        n, width = st.invariance_size(self.protocol), s.invariance_sae_width
        config = {"layer": layer, "sae_epochs": s.sae_epochs, "n": n, "sae_width": width}
        return self.stage("invariance", config, st.SAEInvariance, lambda: st.sae_invariance(
            self.protocol, self.rows([layer]), n, width=width, epochs=s.sae_epochs
        ))  # fmt: skip

    def ioi(self) -> dict[str, st.AblationEffects]:
        """IOI ablation ordering (position 0 never ablated; "all" = every other position)."""
        from structlens.data.tasks import make_task
        from structlens.koopman.data import capture_depth

        s, p = self.s, self.protocol
        if not s.ioi_layers:
            return {}
        task = make_task("ioi", self.model.tokenizer, n=s.n_ioi, seed=s.seed + 1)
        extra = [v for v in s.ioi_layers if v not in self.layers]
        root = self.out / "activations"
        more = capture_depth(self.model, self.prompts, extra, root=root) if extra else None

        def compute(layer: int, pos: str) -> st.AblationEffects:
            rows = self.rows([layer], self.store if layer in self.layers else more)
            return st.mode_ablation(
                p, self.model, task, rows, p.headline_dictionary, v.IOI_K, positions=pos,
                n_random=3,
            )  # fmt: skip

        return {
            f"L{layer}/{pos}": self.stage(
                "ioi", {"layer": layer, "n_ioi": s.n_ioi, "positions": pos},
                st.AblationEffects, partial(compute, layer, pos),
            )
            for layer in s.ioi_layers for pos in ("all", "END")
        }  # fmt: skip

    def sae_seeds(self) -> list[st.SAESeedRun]:
        """The invariance penalty: residual and run-to-run variability across SAE seeds."""
        s, layer = self.s, self.probes[0]
        config = {"layer": layer, **{k: getattr(s, k) for k in ("sae_seeds", "sae_epochs", "seed")}}

        def compute(lam: float) -> st.SAESeedRun:
            return st.sae_seed_run(
                self.protocol, self.rows([layer]), lam, s.sae_seeds, epochs=s.sae_epochs
            )

        return [
            self.stage("sae-seeds", config | {"penalty": lam}, st.SAESeedRun, partial(compute, lam))
            for lam in (0.0, s.sae_penalty)
        ]

    def universality(self, seed_models: dict[str, Path | None]) -> st.Universality:
        """Seed and depth replicas, and a fine-tuned copy, against sampling nulls."""
        s, n = self.s, self.s.universality_resamples
        models = {k: str(v) if v else None for k, v in sorted(seed_models.items())}
        config = {"resamples": n, "seed": s.seed, "models": models}
        return self.stage("universality", config, st.Universality, lambda: st.universality(
            self.protocol, self.model, self.prompts, models, probe_layer=self.probes[-1],
            n_corpus=s.n_corpus, root=self.out / "activations", n_resamples=n,
        ))  # fmt: skip

    def reduction(self) -> st.Reduction:
        p, layers = self.protocol, self.layers
        return self.stage("reduction", {"layers": layers}, st.Reduction, lambda: st.Reduction(
            st.reduction(p, self.rows(layers), p.reduction_dictionary, v.REDUCTION_ORDERS)
        ))  # fmt: skip

    def results(self, seed_models: dict[str, Path | None]) -> v.ReplicationResults:
        """Every section, in the document's order of computation."""
        split, fits, inv, ioi = self.split_half(), self.fits(), self.invariance(), self.ioi()
        seeds, u = self.sae_seeds(), self.universality(seed_models)
        return v.ReplicationResults(
            split, fits, {f"L{self.probes[0]}/{f.dictionary}": f for f in inv.fits}, ioi,
            seeds, u.comparisons, u.not_run, self.reduction().rows, inv.sae,
        )  # fmt: skip


def run(
    profile: str = "cpu",
    out: str | Path | None = None,
    doc_dir: str | Path | None = None,
    device: str = "cpu",
) -> tuple[v.ReplicationResults, StageCache]:
    """Run (or resume) every section of ``profile``; write the figures, the markdown and the
    claims JSON."""
    from structlens.replication import default_paths
    from structlens.replication.equivalence.run import model_dirs
    from structlens.replication.koopman.render import write

    s = PROFILES[profile]
    out, doc_dir = default_paths(METHOD, profile, out, doc_dir)
    rep = KoopmanReplication(s, out, device)
    t = rep.results(model_dirs(s.seed_models_profile) if s.seed_models_profile else {})
    md, js = write(rep.settings, t, time.time() - rep.t0, doc_dir, figure_dir=out)
    log(f"wrote {md} and {js}")
    return t, rep.cache

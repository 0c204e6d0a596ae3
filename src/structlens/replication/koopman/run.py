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
from pathlib import Path
from typing import Any

from structlens.koopman import stages as st
from structlens.koopman.protocol import PROFILES as PROTOCOLS
from structlens.koopman.protocol import dictionary_label
from structlens.koopman.verdicts import IOI_K, REDUCTION_ORDERS
from structlens.pipeline.cache import Stage, StageCache, data_digest
from structlens.replication.stage import Record
from structlens.results import to_jsonable

METHOD = "koopman"

CPU: dict[str, Any] = {
    "profile": "cpu",
    "model": "smollm2-135m",
    "n_corpus": 150,
    "prompt_tokens": 64,
    "n_task": 40,
    "layers": [5, 11],
    "probe_layers": [6, 10],
    "n_ioi": 24,
    "ioi_layers": [6, 10, 14, 18, 22],  # layers of the IOI ablation depth sweep
    "sae_seeds": 3,
    "sae_epochs": 20,
    "sae_penalty": 10.0,  # λ of the invariance run
    # the wide SAE whose features are chosen at the protocol's invariance size N
    "invariance_sae_width": 1024,
    "universality_resamples": 200,
    # the seed replicas and fine-tune come from this profile of the equivalence replication
    "seed_models_profile": "cpu",
    "seed": 0,
    # every scientific choice of the sections: the protocol the CLI and `analyze` run too
    "protocol": PROTOCOLS["paper"],
}
# On an accelerator: the same sections with a wider SAE for the equal-N invariance comparison.
GPU = CPU | {"profile": "gpu", "invariance_sae_width": 4096}
SMOKE = CPU | {
    "profile": "smoke",
    "model": "tiny-llama",
    "n_corpus": 64,
    "prompt_tokens": 32,
    "n_task": 0,  # the byte-level test tokenizer has no single-token names (no IOI)
    "layers": [0, 1],
    "probe_layers": [1],
    "n_ioi": 0,
    "ioi_layers": [],
    "sae_seeds": 2,
    "sae_epochs": 1,
    "invariance_sae_width": 64,
    "universality_resamples": 20,
    "seed_models_profile": None,  # no trained replicas: the universality claim says so
    "protocol": PROTOCOLS["smoke"],
}
PROFILES = {"cpu": CPU, "gpu": GPU, "smoke": SMOKE}
# Test-only override of a profile's sizes (``run(..., test_sizes=TINY_TEST_SIZES)``): the
# tiny model at the smoke sizes, so the gpu profile runs end to end on the CPU in the tests.
TINY_TEST_SIZES = {k: v for k, v in SMOKE.items() if k != "profile"}
# Stages whose record layout changed carry this in their config, so old records recompute.
RECORD = 3


def log(msg: str, t0: float) -> None:
    print(f"[{time.time() - t0:7.1f}s] {msg}", flush=True)


class KoopmanReplication:
    """The sections of one profile as cached stages over one activation store; ``R`` holds
    each section's record (the JSON form of its stage Results)."""

    def __init__(self, s: dict[str, Any], out: Path, device: str = "cpu") -> None:
        from structlens.koopman.data import capture_depth, depth_prompts
        from structlens.models import load_model

        self.s, self.out, self.t0 = s, out, time.time()
        self.protocol = p = s["protocol"].replace(seed=s["seed"])
        self.cache = StageCache(out / "stages")
        self.layers = list(range(s["layers"][0], s["layers"][1] + 1))
        self.probes = list(s["probe_layers"])
        self.model = load_model(s["model"], device=device)
        self.prompts = depth_prompts(
            self.model.tokenizer, n_corpus=s["n_corpus"], max_tokens=s["prompt_tokens"],
            n_task=s["n_task"], seed=s["seed"],
        )  # fmt: skip
        self.data = data_digest([repr(q) for q in self.prompts])
        self.store = capture_depth(self.model, self.prompts, self.layers, root=out / "activations")
        log(f"captured {self.store.n_tokens} tokens x {len(self.store.sites)} sites", self.t0)
        keys = ("n_corpus", "prompt_tokens", "seed", "n_ioi", "sae_seeds", "sae_epochs")
        self.R: dict[str, Any] = {"settings": {
            "profile": s["profile"], "model": s["model"], "n_prompts": len(self.prompts),
            **{k: s[k] for k in (*keys, "sae_penalty", "invariance_sae_width")},
            "n_ioi_in_fit": s["n_task"], "tokens_per_layer": int(self.store.n_tokens),
            "layers": self.layers, "probe_layers": self.probes, "ioi_layers": s["ioi_layers"],
            "machine": f"{platform.machine()}, 2 shared CPU cores", "protocol": p.to_json(),
            # the protocol's row and split rules, also at the top (the claims schema's keys)
            "exclude_position0": p.exclude_position0, "dictionary_fit_split": p.dictionary_fit,
            "control_energy": p.control_energy, "invariance_n": st.invariance_size(p),
            "henrici_blocks": p.henrici_blocks,
        }}  # fmt: skip

    def run_stage(self, name: str, config: dict[str, Any], compute: Any) -> Any:
        config = config | {"protocol": self.protocol.to_json()}
        stage = Stage(name, config, model=self.model.fingerprint(), data=self.data)
        data = self.cache.run(stage, Record, lambda _: Record.of(to_jsonable(compute())))
        log(f"{name} done", self.t0)
        return data.data

    def rows(self, layers: list[int], store: Any = None) -> st.LayerRows:
        return st.layer_rows(self.protocol, store or self.store, layers)

    def split_half(self) -> None:
        p = self.protocol
        self.R["split_half"] = self.run_stage("split-half", {"probes": self.probes}, lambda: {
            f"L{r.layers[0]}/{r.dictionary}": r
            for layer in self.probes for spec in p.split_half_dictionaries
            for r in [st.split_half(p, self.rows([layer]), spec)]
        })  # fmt: skip

    def fits(self) -> None:
        p = self.protocol
        self.R["fits"] = self.run_stage("fits", {"probes": self.probes}, lambda: {"fits": {
            f"L{r.layers[0]}/{r.dictionary}": r
            for layer in self.probes for spec in p.fit_dictionaries
            for r in [st.spectrum(p, self.rows([layer]), spec)]
        }})["fits"]  # fmt: skip

    def invariance(self) -> None:
        s, p, layer = self.s, self.protocol, self.probes[0]
        n, width = st.invariance_size(p), s["invariance_sae_width"]

        def compute() -> dict[str, Any]:
            info, fits = st.sae_invariance(
                p, self.rows([layer]), n, width=width, epochs=s["sae_epochs"]
            )
            return {"invariance": {f"L{layer}/{f.dictionary}": f for f in fits}} | {
                "sae": info, "n": n,
            }  # fmt: skip

        config = {"layer": layer, "sae_epochs": s["sae_epochs"], "n": n, "sae_width": width}
        got = self.run_stage("invariance", config, compute)
        self.R |= {"invariance": got["invariance"], "sae": got["sae"], "invariance_n": got["n"]}

    def ioi(self) -> None:
        """IOI ablation ordering (position 0 never ablated; "all" = every other position)."""
        from structlens.data.tasks import make_task
        from structlens.koopman.data import capture_depth

        s, p, self.R["ioi"] = self.s, self.protocol, {}
        if not s["ioi_layers"]:
            return
        task = make_task("ioi", self.model.tokenizer, n=s["n_ioi"], seed=s["seed"] + 1)
        extra = [v for v in s["ioi_layers"] if v not in self.layers]
        root = self.out / "activations"
        more = capture_depth(self.model, self.prompts, extra, root=root) if extra else None
        for layer in s["ioi_layers"]:
            rows = self.rows([layer], self.store if layer in self.layers else more)
            got = self.run_stage("ioi", {"layer": layer, "n_ioi": s["n_ioi"]}, lambda rows=rows: {
                pos: st.mode_ablation(
                    p, self.model, task, rows, p.headline_dictionary, IOI_K, positions=pos,
                    n_random=3,
                ) for pos in ("all", "END")
            })  # fmt: skip
            self.R["ioi"] |= {f"L{layer}/{pos}": got[pos] for pos in ("all", "END")}

    def sae_seeds(self) -> None:
        """The invariance penalty: residual and run-to-run variability across SAE seeds."""
        s, p, layer = self.s, self.protocol, self.probes[0]
        keys = ("sae_seeds", "sae_epochs", "sae_penalty", "seed")
        config = {"layer": layer, "record": RECORD, **{k: s[k] for k in keys}}
        self.R["sae_seeds"] = self.run_stage("sae-seeds", config, lambda: st.sae_seed_runs(
            p, self.rows([layer]), (0.0, s["sae_penalty"]), s["sae_seeds"], epochs=s["sae_epochs"]
        ))  # fmt: skip

    def universality(self, seed_models: dict[str, Path | None]) -> None:
        """Seed and depth replicas, and a fine-tuned copy, against sampling nulls."""
        s, n = self.s, self.s["universality_resamples"]
        models = {k: str(v) if v else None for k, v in sorted(seed_models.items())}
        config = {"resamples": n, "seed": s["seed"], "models": models, "record": RECORD}
        self.R["universality"] = self.run_stage("universality", config, lambda: dict(zip(
            ("comparisons", "not_run"), st.universality(
                self.protocol, self.model, self.prompts, models, probe_layer=self.probes[-1],
                n_corpus=s["n_corpus"], root=self.out / "activations", n_resamples=n,
            ), strict=True,
        )))  # fmt: skip

    def reduction(self) -> None:
        p, layers = self.protocol, self.layers
        spec = p.reduction_dictionary

        def compute() -> dict[str, Any]:
            got = st.reduction(p, self.rows(layers), spec, REDUCTION_ORDERS)
            label = {"layers": f"{layers[0]}-{layers[-1]}", "horizon": len(layers)}
            return label | {"dictionary": dictionary_label(spec)} | {str(r.order): r for r in got}

        self.R["reduction"] = self.run_stage("reduction", {"layers": layers}, compute)


def run(
    profile: str = "cpu",
    out: str | Path | None = None,
    doc_dir: str | Path | None = None,
    device: str = "cpu",
    test_sizes: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], StageCache]:
    """Run (or resume) every section of ``profile``; write the figures, the markdown and the
    claims JSON.  ``test_sizes`` (tests only, e.g. :data:`TINY_TEST_SIZES`) overrides the
    profile's sizes so a profile's code path runs on a tiny model."""
    from structlens.replication import default_paths
    from structlens.replication.equivalence.run import model_dirs
    from structlens.replication.koopman.render import write

    s = PROFILES[profile] | (test_sizes or {})
    out, doc_dir = default_paths(METHOD, profile, out, doc_dir)
    rep = KoopmanReplication(s, out, device)
    rep.split_half()
    rep.fits()
    rep.invariance()
    rep.ioi()
    rep.sae_seeds()
    rep.universality(model_dirs(s["seed_models_profile"]) if s["seed_models_profile"] else {})
    rep.reduction()
    rep.R["wall_seconds"] = time.time() - rep.t0
    md, js = write(rep.R, doc_dir, figure_dir=out)
    log(f"wrote {md} and {js}", rep.t0)
    return rep.R, rep.cache

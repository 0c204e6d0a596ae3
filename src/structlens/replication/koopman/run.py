"""Replicate the Koopman spectral-identifiability claims on SmolLM2-135M-Instruct.

    python -m structlens.replication koopman [--profile cpu|gpu|smoke]

Captures resid_pre / attn_out over the bundled corpus plus IOI prompts for a layer range
(the activation store is content-hashed), then runs the sections as cached stages: split-half
rate, per-layer fits (non-normality, dissociation, tails), invariance gap, the IOI ablation
ordering per layer, SAE seeds with and without the invariance penalty, universality across
models, and reduction bounds on the pooled operator.  Everything is seeded.

Protocol: position 0 (the attention sink) is dropped from every fit and ablation;
every dictionary is fitted on training prompts only and scored on held-out prompts; the
control basis keeps 90% of Var(u) (split-half: rank 16); Henrici departures come with a
split-half noise floor; tails are reported as max/norm kurtosis and Gram-entry tails before
and after lifting; the invariance gap compares dictionaries of equal size N, SAE features
chosen from a wide SAE by variance and by frequency.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from structlens.koopman.protocol import PROFILES as PROTOCOLS
from structlens.koopman.protocol import dictionary_label
from structlens.replication.stage import Record, Stage, StageCache, data_digest
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
    # Invariance at equal dictionary size N: SAE features chosen from a wide SAE (by variance
    # and by frequency), spectral modes, random lifts, all with N features.
    "invariance_sae_width": 1024,
    "universality_resamples": 200,
    # the seed replicas and fine-tune come from this profile of the equivalence replication
    "seed_models_profile": "cpu",
    "seed": 0,
    # every scientific choice of the sections (rows, splits, control basis, block filter,
    # dictionaries): the protocol the CLI and `analyze` run too
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
    "seed_models_profile": None,  # no trained replicas: the universality section says so
    "protocol": PROTOCOLS["smoke"],
}
PROFILES = {"cpu": CPU, "gpu": GPU, "smoke": SMOKE}
# Test-only override of a profile's sizes (``run(..., test_sizes=TINY_TEST_SIZES)``): the
# tiny model at the smoke sizes, so the gpu profile runs end to end on the CPU in the tests.
TINY_TEST_SIZES = {k: v for k, v in SMOKE.items() if k != "profile"}


def log(msg: str, t0: float) -> None:
    print(f"[{time.time() - t0:7.1f}s] {msg}", flush=True)


def invariance_size(protocol: Any) -> int:
    """The one size N of the protocol's invariance dictionaries (the gap is compared at equal
    N); ``ValueError`` if they differ."""
    from structlens.koopman.protocol import parse_dictionary

    sizes = {parse_dictionary(spec)[1] for spec in protocol.invariance_dictionaries}
    if len(sizes) != 1:
        raise ValueError(
            f"the invariance gap compares dictionaries of equal size; the protocol's "
            f"invariance_dictionaries have sizes {sorted(sizes)}."
        )
    return sizes.pop()


def load_rows(store: Any, layer: int, protocol: Any) -> tuple[np.ndarray, ...]:
    """``(X, U, Y, prompt_ids)`` of one layer with the protocol's row rule (position 0 out)."""
    from structlens.koopman.stages import layer_rows

    r = layer_rows(protocol, store, [layer])
    return r.X, r.U, r.Y, r.prompt_ids


class KoopmanReplication:
    """The sections of one profile as cached stages over one activation store."""

    def __init__(self, s: dict[str, Any], out: Path, device: str = "cpu") -> None:
        from structlens.koopman.data import capture_depth, depth_prompts
        from structlens.models import load_model

        self.s, self.out, self.t0 = s, out, time.time()
        self.protocol = s["protocol"].replace(seed=s["seed"])
        self.cache = StageCache(out / "stages")
        lo, hi = s["layers"]
        self.layers = list(range(lo, hi + 1))
        self.probes = list(s["probe_layers"])
        self.model = load_model(s["model"], device=device)
        self.fp = self.model.fingerprint()
        self.prompts = depth_prompts(
            self.model.tokenizer,
            n_corpus=s["n_corpus"],
            max_tokens=s["prompt_tokens"],
            n_task=s["n_task"],
            seed=s["seed"],
        )
        self.data = data_digest([repr(p) for p in self.prompts])
        self.store = capture_depth(self.model, self.prompts, self.layers, root=out / "activations")
        log(f"captured {self.store.n_tokens} tokens x {len(self.store.sites)} sites", self.t0)
        # Split-half and universality fit halves of single prompt blocks (the protocol's
        # fixed small control rank); every other fit keeps the protocol's control energy.
        self.cfg_small = self.protocol.edmdc(split_half=True)
        self.cfg = self.protocol.edmdc()
        self.R: dict[str, Any] = {"settings": self.settings()}

    def settings(self) -> dict[str, Any]:
        s = self.s
        return {
            "profile": s["profile"],
            "model": s["model"],
            "n_prompts": len(self.prompts),
            "n_corpus": s["n_corpus"],
            "prompt_tokens": s["prompt_tokens"],
            "n_ioi_in_fit": s["n_task"],
            "tokens_per_layer": int(self.store.n_tokens),
            "layers": self.layers,
            "probe_layers": self.probes,
            "seed": s["seed"],
            "machine": f"{platform.machine()}, 2 shared CPU cores",
            "n_ioi": s["n_ioi"],
            "ioi_layers": list(s["ioi_layers"]),
            "sae_seeds": s["sae_seeds"],
            "sae_epochs": s["sae_epochs"],
            "sae_penalty": s["sae_penalty"],
            "protocol": self.protocol.to_json(),
            # the protocol's row and split rules, also at the top (the claims schema's keys)
            "exclude_position0": self.protocol.exclude_position0,
            "dictionary_fit_split": self.protocol.dictionary_fit,
            "control_energy": self.protocol.control_energy,
            "invariance_n": invariance_size(self.protocol),
            "invariance_sae_width": s["invariance_sae_width"],
            "henrici_blocks": self.protocol.henrici_blocks,
        }

    def stage(self, name: str, config: dict[str, Any]) -> Stage:
        return Stage(
            name, config | {"protocol": self.protocol.to_json()}, model=self.fp, data=self.data
        )

    def run_stage(self, name: str, config: dict[str, Any], compute: Any) -> Any:
        data = self.cache.run(self.stage(name, config), Record, lambda _: Record.of(compute()))
        log(f"{name} done", self.t0)
        return data.data

    # 1. split-half rate
    def split_half(self) -> None:
        from structlens.koopman.stages import layer_rows, split_half
        from structlens.report.koopman import plot_split_half

        p = self.protocol

        def compute() -> dict[str, Any]:
            out = {}
            for layer in self.probes:
                rows = layer_rows(p, self.store, [layer])
                for spec in p.split_half_dictionaries:
                    r = split_half(p, rows, spec)
                    out[f"L{layer}/{r.dictionary}"] = to_jsonable(r)
            return out

        self.R["split_half"] = self.run_stage("split-half", {"probes": self.probes}, compute)
        curves = {
            k.replace("/", " "): (np.array(v["n_samples"]), np.array(v["w_inf_mean"]), v["slope"])
            for k, v in self.R["split_half"].items()
        }
        plot_split_half(curves, self.out / "split_half.png")

    # 2. non-normality (with its noise floor) and dissociation; 5. tails before/after lifting
    def fits(self) -> None:
        from structlens.koopman.stages import layer_rows, spectrum
        from structlens.report.koopman import plot_eigenvalues

        p = self.protocol

        def compute() -> dict[str, Any]:
            fits: dict[str, Any] = {}
            tails: dict[str, Any] = {}
            for layer in self.probes:
                rows = layer_rows(p, self.store, [layer])
                for spec in p.fit_dictionaries:
                    r = spectrum(p, rows, spec)
                    key = f"L{layer}/{r.dictionary}"
                    fits[key] = to_jsonable(r)
                    tails.setdefault(f"L{layer}/state", r.state_tails)
                    if r.lifted_tails is not None:
                        tails[f"{key}_lifted"] = r.lifted_tails
                    if r.mom_bottleneck is not None:
                        tails[f"{key}_mom_vs_mean_winf"] = r.mom_bottleneck
            return {"fits": fits, "tails": tails}

        got = self.run_stage("fits", {"probes": self.probes}, compute)
        self.R["fits"], self.R["tails"] = got["fits"], got["tails"]
        head = dictionary_label(p.headline_dictionary)
        spectra = {
            k.replace("/", " "): np.array([complex(*z) for z in v["eigenvalues"]])
            for k, v in got["fits"].items()
            if k.endswith("/" + head)
        }
        plot_eigenvalues(spectra, self.out / "eigenvalues.png")

    # 3. invariance gap at equal dictionary size N
    def invariance(self) -> None:
        from structlens.koopman import select_sae_features, train_sae_dictionary
        from structlens.koopman.stages import invariance, layer_rows

        s, p, layer = self.s, self.protocol, self.probes[0]
        n = invariance_size(p)  # SAE features are chosen at the protocol dictionaries' size

        def compute() -> dict[str, Any]:
            rows = layer_rows(p, self.store, [layer])
            # The SAE and its feature choice see the protocol's training prompts only.
            train = rows.fit_rows(p)
            width = s["invariance_sae_width"]
            sae, sae_info = train_sae_dictionary(
                rows.X[train], d_sae=width, k=16, epochs=s["sae_epochs"], seed=p.seed
            )
            info = {k: v for k, v in sae_info.items() if k != "decoder"} | {"d_sae": width}
            log(f"SAE trained {info}", self.t0)
            inv = {}
            for rule in ("variance", "frequency"):
                chosen = select_sae_features(sae, rows.X[train], n, rule)
                label = f"sae_{rule}{n}"
                r = invariance(p, rows, label, dictionary=chosen, label=label)
                inv[f"L{layer}/{label}"] = to_jsonable(r)
            for spec in p.invariance_dictionaries:
                r = invariance(p, rows, spec)
                inv[f"L{layer}/{r.dictionary}"] = to_jsonable(r)
            return {"invariance": inv, "sae": info, "n": n}

        config = {
            "layer": layer,
            "sae_epochs": s["sae_epochs"],
            "n": n,
            "sae_width": s["invariance_sae_width"],
        }
        got = self.run_stage("invariance", config, compute)
        self.R["invariance"], self.R["sae"] = got["invariance"], got["sae"]
        self.R["invariance_n"] = got["n"]

    # 4. IOI ablation ordering (position 0 never ablated; "all" = every other position)
    def ioi(self) -> None:
        from structlens.data.tasks import make_task
        from structlens.koopman.data import capture_depth
        from structlens.koopman.stages import layer_rows, mode_ablation
        from structlens.report.koopman import plot_ablation

        s, model = self.s, self.model
        ioi_layers = list(s["ioi_layers"])
        self.R["ioi"] = {}
        if not ioi_layers:
            return
        task = make_task("ioi", model.tokenizer, n=s["n_ioi"], seed=s["seed"] + 1)
        extra = [v for v in ioi_layers if v not in self.layers]
        ioi_store = (
            capture_depth(model, self.prompts, extra, root=self.out / "activations")
            if extra
            else None
        )
        rows = []
        p = self.protocol
        for layer in ioi_layers:

            def compute(layer: int = layer) -> dict[str, Any]:
                store = self.store if layer in self.layers else ioi_store
                lr = layer_rows(p, store, [layer])
                got = {}
                for positions in ("all", "END"):
                    c = mode_ablation(
                        p, model, task, lr, p.headline_dictionary, 4, positions=positions,
                        n_random=3,
                    )  # fmt: skip
                    got[positions] = to_jsonable(c) | {
                        m: {"mean": c.mean[j], "ci": c.ci[j]} for j, m in enumerate(c.methods)
                    }
                return got

            config = {"layer": layer, "n_ioi": s["n_ioi"]}
            got = self.run_stage("ioi", config, compute)
            for positions in ("all", "END"):
                v = got[positions]
                self.R["ioi"][f"L{layer}/{positions}"] = v
                methods = ("modes", "pca", "random")
                rows.append(
                    (
                        f"L{layer} {positions}",
                        list(methods),
                        np.array([v[m]["mean"] for m in methods]),
                        np.array([v[m]["ci"] for m in methods]),
                    )
                )
        if rows:
            plot_ablation(rows, self.out / "ioi_ablation.png")

    # 7. invariance penalty: residual and run-to-run variability across SAE seeds
    def sae_seeds(self) -> None:
        from structlens.koopman import (
            decoder_agreement,
            invariance_residual_split,
            train_sae_dictionary,
        )
        from structlens.koopman.invariance import prompt_split

        s, layer = self.s, self.probes[0]

        def compute() -> dict[str, Any]:
            X, U, Y, pid = load_rows(self.store, layer, self.protocol)
            train = ~prompt_split(pid, s["seed"])  # the residual is scored on the other half
            runs: dict[str, Any] = {}
            for lam in (0.0, s["sae_penalty"]):
                decoders = []
                for sd in range(s["sae_seeds"]):
                    dic, info = train_sae_dictionary(
                        X[train],
                        U[train],
                        Y[train],
                        d_sae=256,
                        k=16,
                        invariance_weight=lam,
                        epochs=s["sae_epochs"],
                        batch_size=512,
                        seed=sd,
                    )
                    inv = invariance_residual_split(dic, X, U, Y, pid, self.cfg, seed=s["seed"])
                    decoders.append(info.pop("decoder"))
                    runs.setdefault(str(lam), {"fits": []})["fits"].append(
                        {**info, "seed": sd, "invariance_pooled": inv.pooled, "n_dead": inv.n_dead}
                    )
                    log(f"SAE λ={lam} seed {sd}: residual {inv.pooled:.4f}", self.t0)
                runs[str(lam)]["agreement"] = [
                    {"seeds": [i, j], **decoder_agreement(decoders[i], decoders[j])}
                    for i in range(len(decoders))
                    for j in range(i + 1, len(decoders))
                ]
            return {"layer": layer, "runs": runs}

        keys = ("sae_seeds", "sae_epochs", "sae_penalty", "seed")
        self.R["sae_seeds"] = self.run_stage(
            "sae-seeds", {"layer": layer, **{k: s[k] for k in keys}}, compute
        )

    # 8. universality: seed replicas and a fine-tuned copy
    def universality(self, seed_models: dict[str, Path | None]) -> None:
        from structlens.koopman import (
            EDMDc,
            PCADictionary,
            spectral_distance_test,
            universality_test,
        )
        from structlens.koopman.data import capture_depth, depth_prompts
        from structlens.models import load_model

        s, model, cfg, seed = self.s, self.model, self.cfg_small, self.s["seed"]
        n_res = s["universality_resamples"]

        def blocks_of(m: Any, layer: int, pr: list, dic: Any = None, n_blocks: int = 16):
            st = capture_depth(m, pr, [layer], root=self.out / "activations")
            X, U, Y, pid = load_rows(st, layer, self.protocol)
            dic = dic or PCADictionary(8).fit(X)
            return EDMDc(dic, cfg).statistics(X, U, Y, pid, n_blocks=n_blocks, seed=seed), X

        def compute() -> dict[str, Any]:
            res: dict[str, Any] = {"pairs": {}}
            small = {n: seed_models.get(n) for n in ("L4-s0", "L4-s1", "L4-s2", "L8-s0")}
            if all(p is not None for p in small.values()):
                models = {n: load_model(str(p)) for n, p in small.items()}
                pr = depth_prompts(
                    models["L4-s0"].tokenizer, n_corpus=s["n_corpus"], max_tokens=64, n_task=0
                )
                layer_of = {"L4-s0": 2, "L4-s1": 2, "L4-s2": 2, "L8-s0": 4}
                blocks = {n: blocks_of(m, layer_of[n], pr)[0] for n, m in models.items()}
                pairs = [
                    ("L4-s0", "L4-s1"), ("L4-s0", "L4-s2"), ("L4-s1", "L4-s2"), ("L4-s0", "L8-s0")
                ]  # fmt: skip
                for x, y in pairs:
                    t = spectral_distance_test(
                        blocks[x], blocks[y], cfg, n_resamples=n_res, seed=seed
                    )
                    res["pairs"][f"{x}@{layer_of[x]} vs {y}@{layer_of[y]}"] = {
                        "test": "split-half null, own PCA-8",
                        "distance": t.distance,
                        "null_q95": float(np.quantile(t.null, 0.95)),
                        "p_value": t.p_value,
                        "n_samples": t.n_samples,
                    }
                    log(f"universality {x} vs {y}: d={t.distance:.3f} p={t.p_value:.3f}", self.t0)
            else:
                res["small_models"] = "not run: the equivalence replication's seed replicas " + (
                    "are missing"
                )
            ft = seed_models.get("smollm2-ft-ioi")
            if ft is not None and model.n_layers > 20:
                tuned = load_model(str(ft))
                # the fine-tune updated layers 15-29 only: layer probes[-1] is an
                # exact-equality check, layer 20 the real comparison
                for layer in (self.probes[-1], 20):
                    base_blocks, X = blocks_of(model, layer, self.prompts)
                    shared = PCADictionary(16).fit(X)
                    base_shared, _ = blocks_of(model, layer, self.prompts, shared)
                    ft_blocks, _ = blocks_of(tuned, layer, self.prompts)
                    ft_shared, _ = blocks_of(tuned, layer, self.prompts, shared)
                    t = spectral_distance_test(
                        base_blocks, ft_blocks, cfg, n_resamples=n_res, seed=seed
                    )
                    u = universality_test(
                        base_shared, ft_shared, cfg, n_permutations=n_res, seed=seed
                    )
                    res["pairs"][f"smollm2@{layer} vs smollm2-ft-ioi@{layer}"] = {
                        "test": "split-half null, own PCA-8; permutation null, shared PCA-16",
                        "distance": t.distance,
                        "null_q95": float(np.quantile(t.null, 0.95)),
                        "p_value": t.p_value,
                        "n_samples": t.n_samples,
                        "shared_distance": u.distance,
                        "shared_null_q95": float(np.quantile(u.null, 0.95)),
                        "shared_p_value": u.p_value,
                        "layer_fine_tuned": layer >= 15,
                    }
                    log(f"universality smollm2 vs ft @{layer}: d={t.distance:.3f}", self.t0)
            else:
                res["finetuned"] = "not run: the equivalence replication's smollm2-ft-ioi " + (
                    "is missing"
                )
            return res

        config = {
            "resamples": n_res,
            "seed": seed,
            "models": {k: str(v) if v else None for k, v in sorted(seed_models.items())},
        }
        self.R["universality"] = self.run_stage("universality", config, compute)

    # 6. reduction bounds on the pooled operator
    def reduction(self) -> None:
        from structlens.koopman.stages import layer_rows, reduction

        layers, p = self.layers, self.protocol

        def compute() -> dict[str, Any]:
            rows = layer_rows(p, self.store, layers)
            got = reduction(p, rows, p.reduction_dictionary, (4, 8, 16))
            out: dict[str, Any] = {
                "layers": rows.label,
                "horizon": len(layers),
                "dictionary": dictionary_label(p.reduction_dictionary),
            }
            return out | {
                str(r.order): to_jsonable(r)
                | {"bound_ratio": r.bound_ratio, "instance_ratio": r.instance_ratio}
                for r in got
            }

        self.R["reduction"] = self.run_stage("reduction", {"layers": layers}, compute)


def run(
    profile: str = "cpu",
    out: str | Path | None = None,
    doc_dir: str | Path | None = None,
    device: str = "cpu",
    test_sizes: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], StageCache]:
    """Run (or resume) every section of ``profile``; write the markdown and claims JSON.
    ``test_sizes`` (tests only, e.g. :data:`TINY_TEST_SIZES`) overrides the profile's sizes
    so a profile's code path runs on a tiny model."""
    from structlens.replication import default_paths
    from structlens.replication.equivalence.run import model_dirs
    from structlens.replication.koopman.render import write

    s = PROFILES[profile] | (test_sizes or {})
    out, doc_dir = default_paths(METHOD, profile, out, doc_dir)
    rep = KoopmanReplication(s, out, device)
    # Same order as the documented run (each section is its own stage).
    rep.split_half()
    rep.fits()
    rep.invariance()
    rep.ioi()
    rep.sae_seeds()
    models_profile = s["seed_models_profile"]
    rep.universality(model_dirs(models_profile) if models_profile else {})
    rep.reduction()
    rep.R["wall_seconds"] = time.time() - rep.t0
    md, js = write(rep.R, doc_dir)
    log(f"wrote {md} and {js}", rep.t0)
    return rep.R, rep.cache

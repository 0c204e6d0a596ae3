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

from structlens.replication.stage import Record, Stage, StageCache, data_digest

METHOD = "koopman"
CONTROL_ENERGY = 0.9  # share of Var(u) the control basis keeps
EXCLUDE_POSITION0 = True  # drop the attention-sink rows from fits and ablations

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
    "invariance_n": 64,
    "invariance_sae_width": 1024,
    "henrici_blocks": 16,  # prompt blocks of the Henrici noise floor (halves and quarters)
    "split_half_blocks": 32,
    "split_half_repeats": 10,
    "universality_resamples": 200,
    # the seed replicas and fine-tune come from this profile of the equivalence replication
    "seed_models_profile": "cpu",
    "seed": 0,
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
    "invariance_n": 16,
    "invariance_sae_width": 64,
    "henrici_blocks": 8,
    "split_half_blocks": 8,
    "split_half_repeats": 3,
    "universality_resamples": 20,
    "seed_models_profile": None,  # no trained replicas: the universality section says so
}
PROFILES = {"cpu": CPU, "gpu": GPU, "smoke": SMOKE}
# Test-only override of a profile's sizes (``run(..., test_sizes=TINY_TEST_SIZES)``): the
# tiny model at the smoke sizes, so the gpu profile runs end to end on the CPU in the tests.
TINY_TEST_SIZES = {k: v for k, v in SMOKE.items() if k != "profile"}


def log(msg: str, t0: float) -> None:
    print(f"[{time.time() - t0:7.1f}s] {msg}", flush=True)


def load_rows(store: Any, layer: int) -> tuple[np.ndarray, ...]:
    """``(X, U, Y, prompt_ids)`` of one layer with the protocol's row rule (position 0 out)."""
    from structlens.koopman.data import load_layer

    return load_layer(store, layer, exclude_position0=EXCLUDE_POSITION0)


class KoopmanReplication:
    """The sections of one profile as cached stages over one activation store."""

    def __init__(self, s: dict[str, Any], out: Path, device: str = "cpu") -> None:
        from structlens.koopman import EDMDcConfig
        from structlens.koopman.data import capture_depth, depth_prompts
        from structlens.models import load_model

        self.s, self.out, self.t0 = s, out, time.time()
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
        # Split-half and universality fit halves of single prompt blocks, which must hold more
        # samples than features + controls: a fixed small control rank there.  Every other
        # fit keeps the fewest control components holding 90% of Var(u) (the rank it picked
        # is reported with each fit).
        self.cfg_small = EDMDcConfig(alpha=1e-6, control_rank=16)
        self.cfg = EDMDcConfig(alpha=1e-6, control_energy=CONTROL_ENERGY)
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
            # Position 0 (the attention sink) is left out of every fit and ablation, and every
            # dictionary is fitted on the training prompts only (scores on held-out prompts).
            "exclude_position0": EXCLUDE_POSITION0,
            "dictionary_fit_split": "train",
            "control_energy": CONTROL_ENERGY,
            "control_rank_split_half": 16,
            "invariance_n": s["invariance_n"],
            "invariance_sae_width": s["invariance_sae_width"],
            "henrici_blocks": s["henrici_blocks"],
        }

    def stage(self, name: str, config: dict[str, Any]) -> Stage:
        protocol = {"exclude_position0": EXCLUDE_POSITION0, "dictionary_fit_split": "train"}
        return Stage(name, config | protocol, model=self.fp, data=self.data)

    def run_stage(self, name: str, config: dict[str, Any], compute: Any) -> Any:
        data = self.cache.run(self.stage(name, config), Record, lambda _: Record.of(compute()))
        log(f"{name} done", self.t0)
        return data.data

    # 1. split-half rate
    def split_half(self) -> None:
        from structlens.koopman import EDMDc, PCADictionary, split_half_convergence
        from structlens.report.koopman import plot_split_half_results

        s = self.s

        def compute() -> dict[str, Any]:
            out, curves = {}, {}
            for layer in self.probes:
                X, U, Y, pid = load_rows(self.store, layer)
                for name, dic in (("pca32", PCADictionary(32)), ("pca8", PCADictionary(8))):
                    dic.fit(X)
                    blocks = EDMDc(dic, self.cfg_small).statistics(
                        X, U, Y, pid, n_blocks=s["split_half_blocks"], seed=s["seed"]
                    )
                    # A hashed prompt block can be (nearly) empty; a half built from one block
                    # must still have more samples than features + controls.
                    need = 2 * (dic.n_features + 16)
                    blocks = [b for b in blocks if b.n > need]
                    sh = split_half_convergence(
                        blocks,
                        self.cfg_small,
                        n_repeats=s["split_half_repeats"],
                        seed=s["seed"],
                    )
                    out[f"L{layer}/{name}"] = {
                        "slope": sh.slope,
                        "slope_ci": sh.slope_ci,
                        "slope_last4": sh.slope_last4,
                        "slope_w2": sh.slope_w2,
                        "n_samples": sh.n_samples.tolist(),
                        "w_inf_mean": sh.w_inf_mean.tolist(),
                        "eig_condition_max": sh.eig_condition_max,
                        "eig_condition_median": float(np.median(sh.eig_condition)),
                        "n_blocks": len(blocks),
                    }
                    curves[f"L{layer} {name}"] = sh
            plot_split_half_results(curves, self.out / "split_half.png")
            return out

        keys = ("split_half_blocks", "split_half_repeats", "seed")
        config = {"probes": self.probes, **{k: s[k] for k in keys}}
        self.R["split_half"] = self.run_stage("split-half", config, compute)

    # 2. non-normality (with its noise floor) and dissociation; 5. tails before/after lifting
    def fits(self) -> None:
        from structlens.koopman import (
            EDMDc,
            IdentityDictionary,
            PCADictionary,
            RandomFourierDictionary,
            merge_statistics,
            solve,
        )
        from structlens.koopman.diagnostics import (
            henrici_noise_floor,
            lifting_tails,
            tail_statistics,
        )
        from structlens.koopman.invariance import prompt_split
        from structlens.koopman.pipeline import summarise_fit
        from structlens.report.koopman import plot_fit_spectra
        from structlens.stats.matching import bottleneck_distance

        s, seed = self.s, self.s["seed"]

        def compute() -> dict[str, Any]:
            fits: dict[str, Any] = {}
            tails: dict[str, Any] = {}
            spectra = {}
            for layer in self.probes:
                X, U, Y, pid = load_rows(self.store, layer)
                train = ~prompt_split(pid, seed)
                tails[f"L{layer}/state"] = tail_statistics(X, seed=seed)
                for name, dic in (
                    ("identity", IdentityDictionary()),
                    ("pca64", PCADictionary(64)),
                    ("pca32", PCADictionary(32)),
                    ("rff256s", RandomFourierDictionary(256, seed=seed, include_state=True)),
                ):
                    dic.fit(X[train], U[train], Y[train])
                    est = EDMDc(dic, self.cfg)
                    blocks = est.statistics(X, U, Y, pid, n_blocks=s["henrici_blocks"], seed=seed)
                    res = solve(merge_statistics(blocks), self.cfg, dic)
                    # A quarter of the prompt blocks must over-determine the fit; the
                    # smallest quarters bound every quarter from below.
                    quarter = sum(sorted(b.n for b in blocks)[: len(blocks) // 4])
                    need = res.A.shape[0] + res.control_rank
                    floor = (
                        henrici_noise_floor(blocks, self.cfg, seed=seed).to_json()
                        if quarter > need
                        else {"not_measured": f"a quarter holds {quarter} samples, need > {need}"}
                    )
                    fits[f"L{layer}/{name}"] = summarise_fit(res, 8) | {
                        "henrici_noise_floor": floor
                    }
                    if name != "identity":
                        tails[f"L{layer}/{name}_lifted"] = lifting_tails(X, dic, seed=seed)[
                            "lifted"
                        ]
                    if name == "pca32":
                        mom = est.fit_median_of_means(X, U, Y, pid, n_blocks=10, seed=seed)
                        tails[f"L{layer}/pca32_mom_vs_mean_winf"] = bottleneck_distance(
                            mom.eigenvalues, res.eigenvalues
                        )
                        spectra[f"L{layer} pca32"] = res
                rff = RandomFourierDictionary(256, seed=seed, include_state=False).fit(X[train])
                tails[f"L{layer}/rff256_lifted"] = lifting_tails(X, rff, seed=seed)["lifted"]
            plot_fit_spectra(spectra, self.out / "eigenvalues.png")
            return {"fits": fits, "tails": tails}

        config = {
            "probes": self.probes,
            "seed": seed,
            "control_energy": CONTROL_ENERGY,
            "henrici_blocks": s["henrici_blocks"],
        }
        got = self.run_stage("fits", config, compute)
        self.R["fits"], self.R["tails"] = got["fits"], got["tails"]

    # 3. invariance gap at equal dictionary size N
    def invariance(self) -> None:
        from structlens.koopman import (
            RandomFourierDictionary,
            RandomReLUDictionary,
            SpectralDictionary,
            invariance_residual_split,
            select_sae_features,
            train_sae_dictionary,
        )
        from structlens.koopman.invariance import prompt_split

        s, seed, layer, n = self.s, self.s["seed"], self.probes[0], self.s["invariance_n"]

        def compute() -> dict[str, Any]:
            X, U, Y, pid = load_rows(self.store, layer)
            # The split invariance_residual_split scores on: the SAE and its feature choice
            # see the training prompts only.
            train = ~prompt_split(pid, seed)
            width = s["invariance_sae_width"]
            sae, sae_info = train_sae_dictionary(
                X[train], d_sae=width, k=16, epochs=s["sae_epochs"], seed=seed
            )
            info = {k: v for k, v in sae_info.items() if k != "decoder"} | {"d_sae": width}
            log(f"SAE trained {info}", self.t0)
            inv = {}
            for name, dic in (
                (f"sae_variance{n}", select_sae_features(sae, X[train], n, "variance")),
                (f"sae_frequency{n}", select_sae_features(sae, X[train], n, "frequency")),
                (f"spectral{n}", SpectralDictionary(n_modes=n, k=max(2 * n, 32), q=6)),
                (f"rff{n}", RandomFourierDictionary(n, seed=seed, include_state=False)),
                (f"relu{n}", RandomReLUDictionary(n, seed=seed)),
            ):
                r = invariance_residual_split(dic, X, U, Y, pid, self.cfg, seed=seed)
                inv[f"L{layer}/{name}"] = {
                    "pooled": r.pooled,
                    "mean": r.mean,
                    "median": r.median,
                    "n_dead": r.n_dead,
                    "n_features": n,
                    "dictionary_fit_split": r.dictionary_fit_split,
                }
            return {"invariance": inv, "sae": info, "n": n}

        config = {
            "layer": layer,
            "sae_epochs": s["sae_epochs"],
            "seed": seed,
            "n": n,
            "sae_width": s["invariance_sae_width"],
            "control_energy": CONTROL_ENERGY,
        }
        got = self.run_stage("invariance", config, compute)
        self.R["invariance"], self.R["sae"] = got["invariance"], got["sae"]
        self.R["invariance_n"] = got["n"]

    # 4. IOI ablation ordering (position 0 never ablated; "all" = every other position)
    def ioi(self) -> None:
        from structlens.data.tasks import make_task
        from structlens.koopman import EDMDc, PCADictionary
        from structlens.koopman.data import capture_depth
        from structlens.koopman.interventions import compare_ablations
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
        for layer in ioi_layers:

            def compute(layer: int = layer) -> dict[str, Any]:
                X, U, Y, pid = load_rows(self.store if layer in self.layers else ioi_store, layer)
                dic = PCADictionary(32).fit(X)
                res = EDMDc(dic, self.cfg).fit(X, U, Y)
                got = {}
                for positions in ("all", "END"):
                    c = compare_ablations(
                        model, task, layer, res, dic, 4, positions=positions, n_random=3,
                        exclude_position0=EXCLUDE_POSITION0, seed=s["seed"],
                    )  # fmt: skip
                    got[positions] = {
                        "dimension": c.dimension,
                        "clean_logit_diff": c.clean_metric_mean,
                        "depth_to_readout": model.n_layers - layer,
                        **{
                            m: {"mean": float(c.mean[j]), "ci": c.ci[j].tolist()}
                            for j, m in enumerate(c.methods)
                        },
                    }
                return got

            config = {"layer": layer, "n_ioi": s["n_ioi"], "seed": s["seed"]}
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
            X, U, Y, pid = load_rows(self.store, layer)
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
            X, U, Y, pid = load_rows(st, layer)
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
        from structlens.koopman import EDMDc, PCADictionary, balanced_truncation
        from structlens.koopman.data import load_layers

        layers = self.layers

        def compute() -> dict[str, Any]:
            X, U, Y, pid = load_layers(self.store, layers, exclude_position0=EXCLUDE_POSITION0)
            dic = PCADictionary(32).fit(X)
            res = EDMDc(dic, self.cfg).fit(X, U, Y)
            out: dict[str, Any] = {"layers": f"{layers[0]}-{layers[-1]}", "horizon": len(layers)}
            for r in (4, 8, 16):
                red = balanced_truncation(
                    res.A, res.B, res.C, r, len(layers), input_cov=res.control_cov
                )
                out[str(r)] = {
                    "error": red.error,
                    "enns_glover": red.enns_glover,
                    "markov_bound": red.markov_bound,
                    "instance_error": red.instance_error,
                    "instance_bound": red.instance_bound,
                    "effective_rank": red.effective_rank,
                    "rho0": red.rho0,
                }
            return out

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

"""Stage 3: NDM subspaces, the patching-test Gini against baselines, the preimage index (the
stages of :mod:`structlens.ndm.stages` under the profile's protocol)."""

from __future__ import annotations

from typing import Any

import numpy as np

from structlens.analyze.common import caveat, number, t_interval
from structlens.analyze.config import AnalyzeConfig
from structlens.analyze.runtime import ExecutorView, StageProgress


def run(
    model: Any, cfg: AnalyzeConfig, step: StageProgress, executor: ExecutorView
) -> dict[str, Any]:
    """The patching tests (the paper's, with RoPE-transferable ones on rotary models) that
    this tokenizer supports, each screened first by its whole-space effect
    (:func:`structlens.ndm.stages.screen`); NDM trained at the layers of the tests
    that pass (at the first test layer, for the browser only, when none does) and, for those
    tests, the patching-test Gini of NDM against baseline rotations (bootstrap CIs over
    prompts); the preimage browser at the first trained layer."""
    from structlens.ndm import stages
    from structlens.ndm.data import capture_residuals
    from structlens.sites import site_name

    protocol = cfg.settings.ndm.replace(seed=cfg.seed)
    caveats: list[dict[str, str]] = []
    plan = stages.plan_tests(protocol, model)
    if plan.skipped:
        caveats.append(
            caveat(
                "not_run", f"patching tests {list(plan.skipped)} need tasks this tokenizer "
                "cannot build.",
            )
        )  # fmt: skip
    # Screen first: a test whose whole-space effect is below the screen carries no signal, so
    # NDM is trained only at layers where some test passes (one layer for the browser if none).
    screens = []
    tests_out = []
    for test in plan.tests:
        step(f"screen {test.name}")
        sc = stages.screen(protocol, model, test, plan.layers[test.name])
        screens.append(sc)
        full = sc.run.full_effect
        full_ci = t_interval(full)
        tests_out.append({"test": test.name, "layer": sc.layer, "full_effect": float(full.mean()),
                          "full_effect_ci": full_ci, "whole_space_share": sc.whole_space_share,
                          "screened": sc.screened})  # fmt: skip
        if sc.screened:
            continue
        # Below the screen the subspace effects are mostly noise (noise alone gives a Gini
        # near 0.41): the test is reported as "no signal", its subspaces unpatched.
        share = sc.whole_space_share
        removed = (
            f"removes {share:.1%} of the clean metric"
            if np.isfinite(share)
            else "cannot remove a behaviour the model lacks (mean clean metric <= 0)"
        )
        caveats.append(
            caveat(
                "null_effect",
                f"{test.name}: patching the whole space at layer {sc.layer} {removed} (effect "
                f"{full.mean():+.3f}, CI [{full_ci[0]:+.3f}, {full_ci[1]:+.3f}]), below the "
                f"{protocol.min_share:.0%} screen: no signal, no Gini.",
            )
        )
    candidate_layers = sorted(set(plan.layers.values())) or [model.n_layers // 2]
    layers = sorted({sc.layer for sc in screens if sc.screened}) or candidate_layers[:1]
    if not any(sc.screened for sc in screens):
        caveats.append(
            caveat(
                "null_effect",
                f"no patching test passes the screen; NDM is trained at layer {layers[0]} for "
                "the preimage browser only.",
            )
        )
    step("capture")
    prompts = stages.training_prompts(protocol, model)
    store = capture_residuals(
        model, prompts, layers, cfg.out / "activations", progress=executor.progress
    )
    index = store.load_index()
    trained: dict[int, dict[str, Any]] = {}
    decompositions: dict[int, Any] = {}
    hs: dict[int, np.ndarray] = {}
    for layer in layers:
        step(f"train layer {layer}")
        h = store.load(site_name("resid_post", layer)).double().numpy()
        hs[layer] = h
        with step.loop(f"NDM steps, layer {layer}", protocol.steps) as done:
            res = stages.train(
                protocol,
                h,
                checkpoint_dir=cfg.out / "cache" / f"ndm-ckpt-L{layer}",
                # mypy cannot infer a lambda whose defaults bind loop variables
                progress=lambda n, loss, partition, done=done: done(n),  # type: ignore[misc]
            )
        trained[layer] = _trained(layer, res, h.shape[0])
        if not res.converged:
            caveats.append(
                caveat(
                    "not_converged",
                    f"layer {layer}: NDM stopped at the step limit ({res.steps} steps) with "
                    "subspace pairs still above the MI threshold; the partition is not the "
                    "method's fixed point.",
                )
            )
        decompositions[layer] = stages.decompose(
            protocol, h, layer, res.rotation, res.partition, executor=executor
        )
    runs: dict[str, Any] = {}
    for entry, sc in zip(tests_out, screens, strict=True):
        if not sc.screened:
            runs[sc.name] = {"whole": sc.run}
            continue
        step(f"patch {sc.name}")
        runs[sc.name] = stages.patch(protocol, model, sc.test, decompositions[sc.layer])
        entry["normalized"] = {m: r.normalized_effects().tolist() for m, r in runs[sc.name].items()}
    summary = stages.gini(protocol, screens, runs, decompositions)
    headline: dict[str, Any] = {}
    gini: dict[str, Any] = {}
    if summary.mean is not None:
        doc = summary.to_json()
        gini = {
            "mean": {m: v["dimension"] for m, v in doc["gini_mean"].items()},
            "per_test": {
                t: by if by == "no signal" else {m: v["dimension"] for m, v in by.items()}
                for t, by in doc["gini"].items()
            },
            "ndm_minus": {m: v["dimension"] for m, v in doc["gini_mean_diff"].items()},
            "variant": "dimension-normalised Gini of the mean subspace patching effects, over "
            "the tests that pass the screen",
        }
        for m, v in gini["mean"].items():
            headline[f"gini_{m}"] = number(v["value"], v["ci"], "", f"Gini ({m})")
        for m, v in gini["ndm_minus"].items():
            if v["ci"][0] <= 0:
                caveats.append(
                    caveat(
                        "not_significant",
                        f"NDM's Gini is not above the {m} baseline "
                        f"({v['value']:+.3f}, CI [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]).",
                    )
                )
    step("preimage index")
    first = layers[0]
    browser = stages.preimage_index(
        protocol, model.tokenizer, hs[first], prompts, index["prompt_index"].numpy(),
        index["position"].numpy(), decompositions[first].rotations["ndm"],
        decompositions[first].partition,
    )  # fmt: skip
    browser["layer"] = int(first)
    headline["n_subspaces"] = number(
        len(trained[first]["partition"]), None, "", f"subspaces (layer {first})"
    )
    return {
        "headline": headline,
        "caveats": caveats,
        "details": {
            "protocol": protocol.to_json(),
            "trained": list(trained.values()),
            "tests": tests_out,
            "gini": gini,
            "browser": browser,
        },
    }


def _trained(layer: int, res: Any, n_rows: int) -> dict[str, Any]:
    """One layer's training record in the report."""
    return {
        "layer": int(layer),
        "partition": list(res.partition),
        "steps": int(res.steps),
        "converged": bool(res.converged),
        "stop_reason": (
            "no subspace pair above the MI threshold"
            if res.converged
            else f"step limit {res.config['max_steps']} reached with pairs above the MI threshold"
        ),
        "merge_history": [
            {"step": m["step"], "max_mi": m["max_mi"], "n_subspaces": len(m["partition_after"])}
            for m in res.merge_history
        ],
        "threshold": res.config["merge_threshold"],
        "n_activations": int(n_rows),
    }

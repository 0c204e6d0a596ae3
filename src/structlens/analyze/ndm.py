"""Stage 3: NDM subspaces, the patching-test Gini against baselines, the preimage index."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from structlens.analyze.common import caveat, number, t_interval
from structlens.analyze.config import AnalyzeConfig
from structlens.analyze.runtime import ExecutorView, StageProgress


def _context(tokenizer: Any, ids: Sequence[int], pos: int, left: int = 12, right: int = 4):
    """``[before, token, after]`` decoded around ``ids[pos]`` (kept apart for escaping), line
    breaks shown as ``↵`` so a context stays on one line (and fits a one-line query box)."""

    def dec(ids: list[int]) -> str:
        return tokenizer.decode(ids).replace("\r\n", "↵").replace("\n", "↵").replace("\r", "↵")

    return [
        dec(list(ids[max(0, pos - left) : pos])),
        dec([ids[pos]]),
        dec(list(ids[pos + 1 : pos + 1 + right])),
    ]


def preimage_browser(
    tokenizer: Any,
    h: np.ndarray,
    prompts: Sequence[tuple[str, Sequence[int]]],
    prompt_index: np.ndarray,
    position: np.ndarray,
    rotation: np.ndarray,
    partition: Sequence[int],
    *,
    top: int,
    pool: int,
    neighbours: int,
    seed: int = 0,
) -> dict[str, Any]:
    """A bounded preimage index for the report.

    For each subspace ``s`` the ``top`` stored activations with the largest norm of their
    projection ``|h R_s|`` (at most one per prompt) are its top activating contexts.  The
    union of those, topped up with random rows to ``pool`` entries, is the embedded index;
    for every entry and subspace the ``neighbours`` nearest other entries by cosine similarity
    of the projections are precomputed with :class:`structlens.ndm.SubspaceIndex`, so the
    page answers "nearest stored activations to this context" without any computation.
    """
    from structlens.ndm.preimage import SubspaceIndex

    bounds = np.concatenate([[0], np.cumsum(partition)])
    chosen: list[int] = []
    tops: list[list[int]] = []
    for s in range(len(partition)):
        norm = np.linalg.norm(h @ rotation[:, bounds[s] : bounds[s + 1]], axis=1)
        rows, seen = [], set()
        for r in np.argsort(-norm, kind="stable"):
            if int(prompt_index[r]) in seen:
                continue
            seen.add(int(prompt_index[r]))
            rows.append(int(r))
            if len(rows) == top:
                break
        tops.append(rows)
        chosen += rows
    chosen = list(dict.fromkeys(chosen))
    rng = np.random.default_rng(seed)
    rest = np.setdiff1d(np.arange(h.shape[0]), chosen)
    chosen += rng.choice(rest, min(len(rest), max(0, pool - len(chosen))), replace=False).tolist()
    slot = {r: i for i, r in enumerate(chosen)}
    index = SubspaceIndex(rotation, partition)
    index.add(h[chosen])
    k = min(neighbours, len(chosen) - 1)
    near = []
    for s in range(len(partition)):
        idx, sims = index.query(h[chosen], s, k=k, exclude=range(len(chosen)))
        near.append(
            [[[int(i), round(float(v), 4)] for i, v in zip(a, b)] for a, b in zip(idx, sims)]
        )
    entries = []
    for r in chosen:
        pid, toks = prompts[int(prompt_index[r])]
        entries.append(
            {
                "prompt": pid,
                "position": int(position[r]),
                "context": _context(tokenizer, toks, int(position[r])),
            }
        )
    return {
        "entries": entries,
        "top": [[slot[r] for r in rows] for rows in tops],
        "neighbours": near,
        "partition": list(map(int, partition)),
    }


def _buildable(model: Any, test: Any, seed: int) -> bool:
    """Whether this tokenizer can build the test's task (its words must be single tokens)."""
    from structlens.ndm.evaluate import make_test_task

    try:
        make_test_task(test, model.tokenizer, n=2, seed=seed)
    except ValueError:
        return False
    return True


def run(
    model: Any, cfg: AnalyzeConfig, step: StageProgress, executor: ExecutorView
) -> dict[str, Any]:
    """The patching tests (the paper's, with RoPE-transferable ones on rotary models) that
    this tokenizer supports, each screened first by its whole-space effect
    (:func:`structlens.ndm.evaluate.screen_table`); NDM trained at the layers of the tests
    that pass (at the first test layer, for the browser only, when none does) and, for those
    tests, the patching-test Gini of NDM against baseline rotations (bootstrap CIs over
    prompts); the preimage browser at the first trained layer."""
    from structlens.ndm import NDM, NDMConfig, subspace_variances
    from structlens.ndm.data import capture_residuals, training_prompts
    from structlens.ndm.evaluate import (
        DEFAULT_MIN_SHARE,
        corrupted_prompts,
        make_test_task,
        map_layer,
        patch_positions,
        patch_subspaces,
        patch_tests_for,
        screen_table,
        screened_summary,
        whole_space_run,
    )
    from structlens.ndm.pipeline import baseline_rotations
    from structlens.sites import site_name

    p = cfg.settings
    caveats: list[dict[str, str]] = []
    candidates = patch_tests_for(model)
    buildable = {t.task for t in candidates if _buildable(model, t, cfg.seed)}
    tests = [t for t in candidates if t.task in buildable]
    skipped = [t.name for t in candidates if t.task not in buildable]
    if skipped:
        caveats.append(
            caveat("not_run", f"patching tests {skipped} need tasks this tokenizer cannot build.")
        )
    layer_of = {t.name: map_layer(t.gpt2_layer, model.n_layers) for t in tests}
    # Screen first: a test whose whole-space effect is below the screen carries no signal, so
    # NDM is trained only at layers where some test passes (one layer for the browser if none).
    screened: dict[str, tuple[Any, Any, Any]] = {}
    runs: dict[str, Any] = {}
    tests_out = []
    for test in tests:
        step(f"screen {test.name}")
        task = make_test_task(test, model.tokenizer, n=p.patch_prompts, seed=cfg.seed)
        layer = layer_of[test.name]
        corrupted = corrupted_prompts(task, test.corruption)
        positions = patch_positions(task, test.positions)
        whole = whole_space_run(model, task, corrupted, layer, positions)
        screen = screen_table({test.name: whole}, {test.name: layer}, DEFAULT_MIN_SHARE)[0]
        full = whole.full_effect
        full_ci = t_interval(full)
        tests_out.append({"test": test.name, "layer": int(layer), "full_effect": float(full.mean()),
                          "full_effect_ci": full_ci, **screen})  # fmt: skip
        if screen["screened"]:
            screened[test.name] = (task, corrupted, positions)
            continue
        # Below the screen the subspace effects are mostly noise (noise alone gives a Gini
        # near 0.41): the test is reported as "no signal", its subspaces unpatched.
        runs[test.name] = {"whole": whole}
        share = screen["whole_space_share"]
        removed = (
            f"removes {share:.1%} of the clean metric"
            if np.isfinite(share)
            else "cannot remove a behaviour the model lacks (mean clean metric <= 0)"
        )
        caveats.append(
            caveat(
                "null_effect",
                f"{test.name}: patching the whole space at layer {layer} {removed} (effect "
                f"{full.mean():+.3f}, CI [{full_ci[0]:+.3f}, {full_ci[1]:+.3f}]), below the "
                f"{DEFAULT_MIN_SHARE:.0%} screen: no signal, no Gini.",
            )
        )
    candidate_layers = sorted(set(layer_of.values())) or [model.n_layers // 2]
    layers = sorted({layer_of[t] for t in screened}) or candidate_layers[:1]
    if not screened:
        caveats.append(
            caveat(
                "null_effect",
                f"no patching test passes the screen; NDM is trained at layer {layers[0]} for "
                "the preimage browser only.",
            )
        )
    step("capture")
    prompts = training_prompts(
        model, corpus_prompts=p.ndm_corpus, task_prompts=0, max_tokens=p.ndm_tokens, seed=cfg.seed
    )
    store = capture_residuals(
        model, prompts, layers, cfg.out / "activations", progress=executor.progress
    )
    index = store.load_index()
    d = model.d_model
    unit = p.ndm_unit if d % p.ndm_unit == 0 else math.gcd(d, p.ndm_unit)
    trained: dict[int, dict[str, Any]] = {}
    rotations: dict[int, dict[str, np.ndarray]] = {}
    variances: dict[int, dict[str, list[float]]] = {}
    hs: dict[int, np.ndarray] = {}
    for layer in layers:
        step(f"train layer {layer}")
        h = store.load(site_name("resid_post", layer)).double().numpy()
        hs[layer] = h
        refresh = max(1, min(p.ndm_refresh, (h.shape[0] - p.ndm_bank) // p.ndm_batch))
        ncfg = NDMConfig(
            unit_size=unit, batch_size=p.ndm_batch, max_steps=p.ndm_steps,
            bank_size=min(p.ndm_bank, h.shape[0] // 2), refresh_interval=refresh,
            merge_start=p.ndm_merge_start, merge_interval=p.ndm_merge_interval,
            mi_samples=min(p.ndm_mi_samples, h.shape[0] // 2), log_interval=10, seed=cfg.seed,
        )  # fmt: skip
        with step.loop(f"NDM steps, layer {layer}", p.ndm_steps) as done:
            res = NDM(ncfg).fit(
                h,
                checkpoint_dir=cfg.out / "cache" / f"ndm-ckpt-L{layer}",
                # mypy cannot infer a lambda whose defaults bind loop variables
                progress=lambda n, loss, partition, done=done: done(n),  # type: ignore[misc]
            )
        trained[layer] = {
            "layer": int(layer),
            "partition": list(res.partition),
            "steps": int(res.steps),
            "converged": bool(res.converged),
            "stop_reason": (
                "no subspace pair above the MI threshold"
                if res.converged
                else f"step limit {p.ndm_steps} reached with pairs above the MI threshold"
            ),
            "merge_history": [
                {"step": m["step"], "max_mi": m["max_mi"], "n_subspaces": len(m["partition_after"])}
                for m in res.merge_history
            ],
            "threshold": ncfg.merge_threshold,
            "n_activations": int(h.shape[0]),
        }
        if not res.converged:
            caveats.append(
                caveat(
                    "not_converged",
                    f"layer {layer}: NDM stopped at the step limit ({res.steps} steps) with "
                    "subspace pairs still above the MI threshold; the partition is not the "
                    "method's fixed point.",
                )
            )
        base, _ = baseline_rotations(
            h, res.partition, p.baselines, seed=cfg.seed, executor=executor
        )
        rotations[layer] = {"ndm": np.asarray(res.rotation), **base}
        variances[layer] = {
            m: subspace_variances(h, r, res.partition) for m, r in rotations[layer].items()
        }
    for entry in tests_out:
        name = entry["test"]
        if name not in screened:
            continue
        step(f"patch {name}")
        task, corrupted, positions = screened[name]
        layer = layer_of[name]
        bounds = np.concatenate([[0], np.cumsum(trained[layer]["partition"])])
        bases = {
            m: [r[:, bounds[s] : bounds[s + 1]] for s in range(len(bounds) - 1)]
            for m, r in rotations[layer].items()
        }
        runs[name] = patch_subspaces(model, task, corrupted, layer, positions, bases)
        entry["normalized"] = {m: r.normalized_effects().tolist() for m, r in runs[name].items()}
    runs = {t.name: runs[t.name] for t in tests}  # the tests' order (bootstrap seeds follow it)
    gini: dict[str, Any] = {}
    headline: dict[str, Any] = {}
    summary: dict[str, Any] = (
        screened_summary(
            runs,
            {t: trained[layer_of[t]]["partition"] for t in screened},
            {t: variances[layer_of[t]] for t in screened},
            layer_of,
            min_share=DEFAULT_MIN_SHARE,
            n_boot=p.gini_bootstrap,
            seed=cfg.seed,
        )
        if runs
        else {"gini_mean": "no signal"}
    )
    if summary["gini_mean"] != "no signal":
        gini = {
            "mean": {m: v["dimension"] for m, v in summary["gini_mean"].items()},
            "per_test": {
                t: by if by == "no signal" else {m: v["dimension"] for m, v in by.items()}
                for t, by in summary["gini"].items()
            },
            "ndm_minus": {m: v["dimension"] for m, v in summary.get("gini_mean_diff", {}).items()},
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
    browser = preimage_browser(
        model.tokenizer, hs[first], prompts, index["prompt_index"].numpy(),
        index["position"].numpy(), rotations[first]["ndm"], trained[first]["partition"],
        top=p.browser_top, pool=p.browser_pool, neighbours=p.browser_neighbours, seed=cfg.seed,
    )  # fmt: skip
    browser["layer"] = int(first)
    headline["n_subspaces"] = number(
        len(trained[first]["partition"]), None, "", f"subspaces (layer {first})"
    )
    return {
        "headline": headline,
        "caveats": caveats,
        "details": {
            "trained": list(trained.values()),
            "tests": tests_out,
            "gini": gini,
            "browser": browser,
        },
    }

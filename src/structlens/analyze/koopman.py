"""Stage 2: Koopman spectral analysis of the depth dynamics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from structlens.analyze.common import caveat, contains, number
from structlens.analyze.config import AnalyzeConfig
from structlens.analyze.runtime import ExecutorView, StageProgress


def _spectrum_bootstrap(
    blocks: Sequence[Any], config: Any, dictionary: Any, n_boot: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Spectral radius over bootstrap resamples of prompt blocks, and the pooled resampled
    eigenvalues (for the figure)."""
    from structlens.koopman import merge_statistics, solve

    rng = np.random.default_rng(seed)
    radii, clouds = np.empty(n_boot), []
    for b in range(n_boot):
        counts = np.bincount(rng.integers(0, len(blocks), len(blocks)), minlength=len(blocks))
        ev = solve(merge_statistics(blocks, counts), config, dictionary).eigenvalues
        radii[b] = float(np.max(np.abs(ev)))
        if b < 20:
            clouds.append(ev)
    return radii, np.concatenate(clouds)


def run(
    model: Any,
    cfg: AnalyzeConfig,
    layers: Sequence[int],
    step: StageProgress,
    executor: ExecutorView,
) -> dict[str, Any]:
    """Per layer (PCA-k dictionary fitted on half the prompts, position 0 excluded):
    split-half convergence, spectrum with a block bootstrap, non-normality with its noise
    floor (pooled fit: control basis keeping 90% of Var(u)), max/norm kurtosis; at the middle
    analysis layer, held-out invariance residuals of every dictionary."""
    from structlens.koopman import EDMDc, EDMDcConfig, merge_statistics, solve
    from structlens.koopman import split_half_convergence as shc
    from structlens.koopman.convergence import half_sizes_for
    from structlens.koopman.data import capture_depth, depth_prompts, load_layer
    from structlens.koopman.diagnostics import henrici_noise_floor, tail_statistics
    from structlens.koopman.invariance import invariance_residual
    from structlens.koopman.pipeline import complex_list, make_dictionary, summarise_fit

    p = cfg.settings
    step("capture")
    prompts = depth_prompts(
        model.tokenizer, n_corpus=p.koopman_corpus, max_tokens=p.koopman_tokens, task=None
    )
    store = capture_depth(
        model,
        prompts,
        layers,
        root=cfg.out / "activations",
        executor=executor,
        progress=executor.progress,
    )
    # The control (attention output) is compressed to as many components as the dictionary
    # has features, so every half of the smallest split still over-determines the fit.
    econf = EDMDcConfig(alpha=1e-6, control_rank=min(p.koopman_pca, model.d_model))
    # The pooled fit keeps the control components holding 90% of Var(u).
    fconf = EDMDcConfig(alpha=1e-6, control_energy=0.9)
    n_blocks = min(p.koopman_blocks, len(prompts) // 3)
    per_layer, caveats = [], []
    for layer in layers:
        step(f"layer {layer}")
        X, U, Y, pid = load_layer(store, layer)  # position 0 (the attention sink) dropped
        train = pid % 2 == 0  # the dictionary only sees even-numbered prompts
        k = min(p.koopman_pca, X.shape[1] - 1)
        dic = make_dictionary("pca", k, seed=cfg.seed).fit(X[train])
        blocks = EDMDc(dic, econf).statistics(X, U, Y, pid, n_blocks=n_blocks, seed=cfg.seed)
        blocks = [b for b in blocks if b.n > 0]  # a hashed block may have received no prompt
        # halves of at least 2 blocks, so the smallest split still over-determines the fit
        halves = half_sizes_for(len(blocks), smallest=2)
        conv = shc(
            blocks, econf, half_sizes=halves, n_repeats=p.koopman_repeats, seed=cfg.seed,
        )  # fmt: skip
        res = solve(merge_statistics(blocks), fconf, dic)
        fit = summarise_fit(res)
        # Henrici noise floor from prompt halves/quarters, where a quarter over-determines
        # the fit (the smallest quarters bound every quarter from below).
        quarter = sum(sorted(b.n for b in blocks)[: len(blocks) // 4])
        floor = (
            henrici_noise_floor(blocks, fconf, seed=cfg.seed)
            if len(blocks) >= 4 and quarter > res.A.shape[0] + res.control_rank
            else None
        )
        tails = tail_statistics(X, seed=cfg.seed)
        radii, cloud = _spectrum_bootstrap(blocks, fconf, dic, p.koopman_bootstrap, cfg.seed)
        row = {
            "layer": int(layer),
            "dictionary": f"pca-{k}",
            "n_samples": int(X.shape[0]),
            "slope": conv.slope,
            "slope_ci": list(conv.slope_ci),
            "eig_condition_max": conv.eig_condition_max,
            "half_samples": conv.n_samples.tolist(),
            "w_inf_mean": conv.w_inf_mean.tolist(),
            "spectral_radius": fit["spectral_radius"],
            "spectral_radius_ci": np.percentile(radii, [2.5, 97.5]).tolist(),
            "eigenvalues": fit["eigenvalues"],
            "bootstrap_eigenvalues": complex_list(cloud),
            "henrici_relative": fit["non_normality"]["henrici_relative"],
            "henrici_noise_floor_relative": floor.noise_floor_relative if floor else None,
            "henrici_extrapolated_relative": (
                floor.henrici_extrapolated_relative if floor else None
            ),
            "control_rank": fit["control_rank"],
            "control_energy_kept": fit["control_energy_kept"],
            "max_excess_kurtosis": tails["max_excess_kurtosis"],
            "norm_kurtosis": tails["norm_kurtosis"],
            "kappa_V": fit["non_normality"]["kappa_V"],
            "dissociation_mean_cos2": fit.get("dissociation", {}).get("mean_cos2"),
        }
        per_layer.append(row)
        if not contains(conv.slope_ci, -0.5):
            caveats.append(
                caveat(
                    "not_converged",
                    f"layer {layer}: the split-half slope {conv.slope:+.2f} "
                    f"[{conv.slope_ci[0]:+.2f}, {conv.slope_ci[1]:+.2f}] excludes the M^-1/2 "
                    "rate; the spectrum is not yet in its sampling-limited regime, so its "
                    "eigenvalues are not identified at this sample size.",
                )
            )
        if conv.eig_condition_max**2 > X.shape[0] / 2:
            caveats.append(
                caveat(
                    "ill_conditioned",
                    f"layer {layer}: eigenvalue condition number {conv.eig_condition_max:.0f} is "
                    "not small against sqrt(M); individual eigenvalues are unreliable.",
                )
            )
    mid = layers[len(layers) // 2]
    step(f"invariance (layer {mid})")
    X, U, Y, pid = load_layer(store, mid)
    train = pid % 2 == 0
    invariance = []
    n_train = int(train.sum())
    # Random lifts get 4d features, or fewer when the training half could not fit them.
    lift = min(4 * X.shape[1], n_train // 2)
    sizes = {"pca": min(p.koopman_pca, X.shape[1] - 1), "spectral": max(2, p.koopman_pca // 4)}
    for name in p.koopman_dictionaries:
        dic = make_dictionary(name, sizes.get(name, lift), seed=cfg.seed).fit(X[train])
        if dic.n_features + (econf.control_rank or U.shape[1]) >= n_train:
            caveats.append(
                caveat(
                    "not_run",
                    f"invariance residual of the {name} dictionary: {dic.n_features} features "
                    f"need more than the {n_train} training samples at layer {mid}.",
                )
            )
            continue
        est = EDMDc(dic, econf)
        inv = invariance_residual(
            est.statistics(X[train], U[train], Y[train])[0],
            est.statistics(X[~train], U[~train], Y[~train])[0],
            econf,
        )
        invariance.append(
            {
                "dictionary": name,
                "n_features": int(dic.n_features),
                "pooled": inv.pooled,
                "median": inv.median,
                "n_dead": inv.n_dead,
            }
        )
    # The headline is the middle analysis layer, fixed in advance (not the best-looking one).
    row = next(r for r in per_layer if r["layer"] == mid)
    at = f"layer {mid}"
    headline = {
        "slope": number(row["slope"], row["slope_ci"], "", f"split-half slope ({at})"),
        "spectral_radius": number(
            row["spectral_radius"], row["spectral_radius_ci"], "", f"spectral radius ({at})"
        ),
        "henrici_relative": number(
            row["henrici_relative"], None, "", f"relative Henrici departure ({at})"
        ),
    }
    return {
        "headline": headline,
        "caveats": caveats,
        "details": {
            "layers": per_layer,
            "invariance_layer": int(mid),
            "invariance": invariance,
            "n_prompts": len(prompts),
        },
    }

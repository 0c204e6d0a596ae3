"""Stage 2: Koopman spectral analysis of the depth dynamics (the stages of
:mod:`structlens.koopman.stages` under the profile's protocol)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from structlens.analyze.common import caveat, contains, number
from structlens.analyze.config import AnalyzeConfig
from structlens.analyze.runtime import ExecutorView, StageProgress


def _row(sh: Any, sp: Any) -> dict[str, Any]:
    """One layer of the report table from its split-half and spectrum results."""
    from structlens.results import to_jsonable

    spectrum = to_jsonable(sp)
    return {
        "layer": sp.layers[0],
        "dictionary": sp.dictionary,
        "n_samples": sp.n_samples,
        "slope": sh.slope,
        "slope_ci": sh.slope_ci,
        "eig_condition_max": sh.eig_condition_max,
        "half_samples": sh.n_samples.tolist(),
        "w_inf_mean": sh.w_inf_mean.tolist(),
        **{k: spectrum[k] for k in (
            "spectral_radius", "spectral_radius_ci", "eigenvalues", "mom_eigenvalues",
            "henrici_relative", "henrici_noise_floor_relative", "henrici_extrapolated_relative",
            "control_rank", "control_energy_kept", "kappa_V", "dissociation_mean_cos2",
        )},
        "max_excess_kurtosis": sp.state_tails["max_excess_kurtosis"],
        "norm_kurtosis": sp.state_tails["norm_kurtosis"],
    }  # fmt: skip


def run(
    model: Any,
    cfg: AnalyzeConfig,
    layers: Sequence[int],
    step: StageProgress,
    executor: ExecutorView,
) -> dict[str, Any]:
    """Per layer, the protocol's headline dictionary: split-half convergence and the spectrum
    (block-bootstrap radius, non-normality with its noise floor, tails); at the middle
    analysis layer, the held-out invariance residual of the protocol's dictionaries."""
    from structlens.koopman.data import capture_depth, depth_prompts
    from structlens.koopman.stages import invariance, layer_rows, spectrum, split_half

    p = cfg.settings
    protocol = p.koopman.replace(seed=cfg.seed)
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
    head = protocol.headline_dictionary
    per_layer, caveats = [], []
    for layer in layers:
        step(f"layer {layer}")
        rows = layer_rows(protocol, store, [layer])
        sh = split_half(protocol, rows, head)
        per_layer.append(_row(sh, spectrum(protocol, rows, head)))
        if not contains(sh.slope_ci, -0.5):
            caveats.append(
                caveat(
                    "not_converged",
                    f"layer {layer}: the split-half slope {sh.slope:+.2f} "
                    f"[{sh.slope_ci[0]:+.2f}, {sh.slope_ci[1]:+.2f}] excludes the M^-1/2 "
                    "rate; the spectrum is not yet in its sampling-limited regime, so its "
                    "eigenvalues are not identified at this sample size.",
                )
            )
        if sh.eig_condition_max**2 > len(rows.X) / 2:
            caveats.append(
                caveat(
                    "ill_conditioned",
                    f"layer {layer}: eigenvalue condition number {sh.eig_condition_max:.0f} is "
                    "not small against sqrt(M); individual eigenvalues are unreliable.",
                )
            )
    mid = layers[len(layers) // 2]
    step(f"invariance (layer {mid})")
    rows = layer_rows(protocol, store, [mid])
    inv = []
    for spec in protocol.invariance_dictionaries:
        try:
            r = invariance(protocol, rows, spec)
        except ValueError as err:
            caveats.append(caveat("not_run", f"invariance residual of {spec}: {err}"))
            continue
        inv.append(
            {k: getattr(r, k) for k in ("dictionary", "n_features", "pooled", "median", "n_dead")}
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
            "protocol": protocol.to_json(),
            "layers": per_layer,
            "invariance_layer": int(mid),
            "invariance": inv,
            "n_prompts": len(prompts),
        },
    }

"""Stage 4: causal dimensionality (the stages of :mod:`structlens.causal_dim.stages` under the
profile's protocol: exact κ by layer, the SAE width-sweep wedge)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from structlens.analyze.common import caveat, number
from structlens.analyze.config import AnalyzeConfig
from structlens.analyze.runtime import ExecutorView, StageProgress

# Fewer residual vectors than this per layer and κ is flagged (the replication uses 128).
MIN_KAPPA_VECTORS = 32


def _kappa_row(fit: Any) -> dict[str, Any]:
    """One layer of the report table from its :class:`~structlens.causal_dim.stages.KappaFit`."""
    return {
        "layer": fit.layer,
        # point and interval are both the bias-corrected jackknife's
        "kappa": fit.erank,
        "kappa_ci": list(fit.erank_ci),
        "kappa_ci_method": fit.ci_method,
        "kappa_plugin": fit.erank_plugin,
        "kappa_pr": fit.participation_ratio,
        "kappa_pr_ci": list(fit.participation_ratio_ci),
        "kappa_pr_plugin": fit.participation_ratio_plugin,
        "n_vectors": fit.n_vectors,
        "n_groups": fit.n_groups,
        "unit": fit.unit,
        # the doubling ratio is the plug-in's, so is this mean of the two halves
        "kappa_half": fit.erank_plugin / fit.ratio_last_doubling,
        "convergence_ratio": fit.ratio_last_doubling,
        "converged": fit.converged,
        "eigenvalues": np.asarray(fit.eigenvalues).tolist(),
    }


def _sweep_view(fit: Any) -> dict[str, Any]:
    """The report's view of a :class:`~structlens.causal_dim.stages.SweepFit`."""
    identified = fit.kappa_hat_status == "identified"
    return {
        "layer": fit.layer,
        "widths": fit.widths.tolist(),
        "n_repr": fit.n_repr.tolist(),
        "n_causal": fit.n_causal.tolist(),
        "n_repr_ci": fit.n_repr_ci.tolist(),
        "n_causal_ci": fit.n_causal_ci.tolist(),
        "wedge": fit.wedge,
        "wedge_ci": list(fit.wedge_ci),
        "distinct_ci_method": fit.distinct_ci_method,
        "distinct_ci_reason": fit.distinct_ci_reason,
        "fit_model": fit.fit_model,
        "kappa_hat": fit.kappa_hat,
        "kappa_hat_ci": list(fit.kappa_hat_ci) if identified else None,
        "kappa_hat_status": fit.kappa_hat_status,
        "kappa_hat_reason": fit.kappa_hat_reason,
        "identified": identified,
        "base_width": fit.base_width,
        "heldout_fvu": fit.heldout_fvu,
        "fvu_monotone": fit.fvu_monotone,
        "sweep_status": fit.sweep_status,
        "fit": {
            k: v for k, v in fit.fits.get(fit.fit_model, {}).items() if isinstance(v, (int, float))
        },
    }


def _kappa_caveats(fit: Any) -> list[dict[str, str]]:
    out = []
    # κ(Σ̂) is concave in the spectrum, so it is biased low at small n.
    if fit.n_vectors < MIN_KAPPA_VECTORS:
        out.append(
            caveat(
                "too_few_vectors",
                f"layer {fit.layer}: κ from {fit.n_vectors} vectors (fewer than "
                f"{MIN_KAPPA_VECTORS}); the plug-in is biased low at small n, the jackknife "
                "removes only the first-order bias, and the interval covers vector sampling "
                "only.",
            )
        )
    if not fit.converged:
        out.append(
            caveat(
                "not_converged",
                f"layer {fit.layer}: κ(n)/κ(n/2) = {fit.ratio_last_doubling:.2f} is not below "
                f"{fit.tolerance} at the cap of {fit.max_vectors} vectors; κ is still rising "
                "with n and is a lower bound.",
            )
        )
    return out


def run(
    model: Any,
    cfg: AnalyzeConfig,
    layers: Sequence[int],
    step: StageProgress,
    executor: ExecutorView,
) -> dict[str, Any]:
    """Exact κ = erank(E[JᵀJ]) at each κ layer under the doubling rule (the bias-corrected
    jackknife estimate with its interval, the plug-in beside it); the SAE width-sweep wedge
    at the middle analysis layer."""
    from structlens.causal_dim.stages import (
        eval_rows,
        kappa,
        prompt_sets,
        sweep,
        train_sweep,
        training_rows,
    )
    from structlens.errors import InputError
    from structlens.results import to_jsonable

    protocol = cfg.settings.causal_dim.replace(seed=cfg.seed)
    d = model.d_model
    sets = prompt_sets(protocol, model.tokenizer)
    fits, caveats = [], []
    mid = layers[len(layers) // 2]  # the width sweep's layer, always among the κ layers
    for layer in kappa_layers(layers, cfg.settings.kappa_layers):
        step(f"κ layer {layer}")
        fit = kappa(protocol, model, layer, sets)
        fits.append(fit)
        caveats += _kappa_caveats(fit)
    sweep_fit = None
    try:
        protocol.check_widths(d)
    except InputError as err:
        caveats.append(caveat("base_width", f"width sweep (layer {mid}) not run: {err}"))
    else:
        step(f"SAE widths (layer {mid})")
        trained = train_sweep(
            protocol, training_rows(model, [mid], sets.sae_train).of(mid), d_model=d,
            executor=executor,
        )  # fmt: skip
        step("AtP over widths")
        exact = next(f.erank for f in fits if f.layer == mid)
        sweep_fit = sweep(
            protocol, {w: sae for w, (sae, _) in trained.items()},
            eval_rows(model, [mid], sets.sae_eval), mid, sets, exact_kappa=exact, d_model=d,
        )  # fmt: skip
        if sweep_fit.kappa_hat_status != "identified":
            caveats.append(
                caveat(
                    "unidentified",
                    f"width sweep (layer {mid}): κ̂ is {sweep_fit.kappa_hat_status} "
                    f"({sweep_fit.kappa_hat_reason or 'no saturating fit'}); no κ̂ is reported.",
                )
            )
    headline = {
        f"kappa_L{f.layer}": number(f.erank, list(f.erank_ci), "dims", f"κ (layer {f.layer})")
        for f in fits
    }
    view = _sweep_view(sweep_fit) if sweep_fit is not None else {}
    if view:
        headline["wedge"] = number(view["wedge"], view["wedge_ci"], "", "width-sweep wedge")
        headline["kappa_hat"] = number(
            view["kappa_hat"] if view["identified"] else None,
            view["kappa_hat_ci"],
            "features",
            "κ̂ (saturating fit)" + ("" if view["identified"] else ": unidentified"),
        )
    return {
        "headline": headline,
        "caveats": caveats,
        "details": {
            "protocol": protocol.to_json(),
            "layers": [_kappa_row(f) for f in fits],
            "d_model": int(d),
            "prompts": {
                "sae_train": len(sets.sae_train),
                "sae_eval": len(sets.sae_eval),
                # κ involves no SAE: windows may come from SAE training chunks (counted here)
                "kappa_windows_from_sae_training": sets.kappa_train_chunks,
            },
            "sweep": view,
            # the stage results themselves, as the CLI and the replication write them
            "kappa_fits": [to_jsonable(f) for f in fits],
            "sweep_fit": to_jsonable(sweep_fit) if sweep_fit is not None else None,
        },
    }


def kappa_layers(layers: Sequence[int], count: int) -> list[int]:
    """``count`` evenly spaced entries of ``layers``, the middle one always among them."""
    n = len(layers)
    if count >= n:
        return list(layers)
    idx = {int(i) for i in np.linspace(0, n - 1, count).round()}
    if n // 2 not in idx:
        idx.remove(min(idx, key=lambda i: abs(i - n // 2)))
        idx.add(n // 2)
    return [layers[i] for i in sorted(idx)]

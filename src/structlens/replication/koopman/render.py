"""Markdown and claims JSON of the Koopman replication.

:func:`write` renders ``koopman.md`` (one section per claim, each with its verdict) and
``koopman.json`` (:class:`~structlens.replication.claims.ClaimsDocument`, one claim per
verdict, plus the protocol settings) from the section results of one run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from structlens.koopman.protocol import dictionary_label
from structlens.replication.claims import ClaimsDocument
from structlens.replication.koopman.run import METHOD
from structlens.replication.markdown import (
    ci,
    count_verdict,
    finite_ci,
    verdict_moves,
    write_text,
)
from structlens.verdicts import Claim

HEAVY = 10.0  # max excess kurtosis above which a coordinate set counts as heavy-tailed


def what_changed(s: dict[str, Any]) -> list[str]:
    """The "what changed and why" section: each protocol deviation the current protocol
    fixed."""
    return [
        "## What changed and why\n",
        "- **Leakage fixed.** Every dictionary (PCA, random lifts, spectral, SAE and its "
        "feature choice) is fitted on the training prompts only and scored on held-out "
        f"prompts (`dictionary_fit = {s['protocol']['dictionary_fit']!r}`); before, the "
        "spectral dictionary was fitted on all rows and then scored on a split of them.",
        "- **Attention sink left out.** Position 0 is dropped from every fit and never "
        f"ablated (`exclude_position0 = {s['protocol']['exclude_position0']}`): at layer 6 "
        "PC1 was the position-0 offset, so 'ablate PCA' broke the sink at every layer.",
        "- **Equal dictionary size.** The invariance gap compares dictionaries of equal size "
        f"N = {s['invariance_n']}; SAE features come from one wide SAE "
        f"(width {s['invariance_sae_width']}), chosen by variance and by frequency, both "
        "reported (before: SAE 256 vs spectral 16).",
        "- **Heavy tails.** Max and norm kurtosis and Gram-entry tails, before and after "
        "lifting, replace the 95th percentile of per-coordinate kurtosis, which hid the "
        "outlier dimensions.",
        "- **Non-normality.** Henrici departure with a split-half noise floor and its "
        "M → ∞ extrapolation, for the full-state (identity) fit and the truncated ones; "
        f"control rank = fewest components holding {s['control_energy']:.0%} of Var(u) "
        "(rank 32 kept 56–68%).",
        "- **Split-half CI.** The slope CI is a delete-a-group jackknife over prompt blocks, "
        "so it covers data-set variation rather than repeats within one data set.",
        "",
        "How each verdict moved:\n",
    ]


MOVES = "<!-- verdict moves -->"
# The previous protocol's claims (docs/replication/koopman.json at PREVIOUS_COMMIT), kept as
# history for the table of moves; nothing here enters a verdict.
PREVIOUS_COMMIT = "c955016"
PREVIOUS = {
    "split_half_rate": ("-0.469", "reproduced"),
    "non_normal_dissociated": ("0.05", "partly"),
    "invariance_gap": ("0.0104", "partly"),
    "ioi_ablation_ordering": ("5 of 10 settings", "partly"),
    "heavy_tails_removed_by_lifting": ("3.75", "not tested"),
    "reduction_bound": ("238", "reproduced"),
    "invariance_penalty_identifiability": ("0.327", "not reproduced"),
    "spectrum_universal_across_seeds": ("3 of 3 seed pairs differ", "not reproduced"),
}


def ci3(c: list[float]) -> str:
    return ci(c, 3)


def _unfinished(L: list[str], section: int) -> str:
    L.append(
        f"**Not measured in this run** (sections {section}–6 did not finish in the time "
        "available on the shared machine); rerun the script to complete them.\n"
    )
    return "\n".join(L) + "\n"


def _abs_interval(ci: list[float]) -> tuple[float, float]:
    """The interval of ``|x|`` for ``x`` in ``[lo, hi]``."""
    lo, hi = ci
    if lo <= 0 <= hi:
        return 0.0, max(-lo, hi)
    return min(abs(lo), abs(hi)), max(abs(lo), abs(hi))


def _ordering(v: dict[str, Any]) -> str:
    """``holds`` when |PCA| > |modes| > |random| with separated intervals in both pairs,
    ``reversed`` when a pair separates the other way, else ``tie``."""
    iv = {m: _abs_interval(v[m]["ci"]) for m in ("pca", "modes", "random")}
    pairs = [("pca", "modes"), ("modes", "random")]
    if all(iv[a][0] > iv[b][1] for a, b in pairs):
        return "holds"
    if any(iv[b][0] > iv[a][1] for a, b in pairs):
        return "reversed"
    return "tie"


def render(R: dict[str, Any], source: str, claims: list[Claim]) -> str:
    """The markdown of one run's sections; each verdict is also appended to ``claims``."""
    s = R["settings"]
    pr = s["protocol"]
    L = []
    L.append("# Replication: Koopman spectral identifiability on SmolLM2-135M-Instruct\n")
    L.append(
        f"Produced by `{source}` (figures and cached stages under "
        "`results/replication/koopman/`). The paper has no public code; each claim is the "
        "one its summary states.\n"
    )
    L.append(
        f"Settings: {s['n_prompts']} prompts ({s['n_corpus']} bundled-corpus chunks of "
        f"{s['prompt_tokens']} tokens plus {s['n_ioi_in_fit']} IOI prompts), "
        f"{s['tokens_per_layer']} token samples per layer, one sample per token; x = "
        "resid_pre(l), u = attn_out(l), y = resid_pre(l+1). Per-layer operators at layers "
        f"{s['probe_layers']}; pooled operator over layers {s['layers'][0]}-{s['layers'][-1]}. "
        f"Position 0 excluded from fits and ablations: {pr['exclude_position0']}; dictionaries "
        f"fitted on the {pr['dictionary_fit']} prompts. Ridge α = {pr['alpha']:g} (relative); "
        f"control rank = fewest components holding {pr['control_energy']:.0%} of Var(u) (the "
        f"rank picked is in each fit's row; {pr['split_half_control_rank']} for split-half, so "
        f"that one prompt block has more samples than features). Seed {s['seed']}. The "
        "protocol (`settings.protocol` in the JSON) is the one `structlens koopman` and "
        "`structlens analyze` run. "
        f"{s['machine']}; wall time "
        f"of the last run {R.get('wall_seconds', float('nan')) / 60:.1f} min (an interrupted or "
        "extended run reuses finished sections from the stage cache; the full run here took "
        "≈ 30 min under a load average of ≈ 12).\n"
    )
    L += what_changed(s)
    L.append(MOVES)  # the table of moves, filled in by write() once every claim is known
    L.append("## 1. Split-half rate ≈ −1/2\n")
    if "split_half" not in R:
        return _unfinished(L, 1)
    L.append(
        "| fit | slope (W∞) | 95% CI | slope last 4 | slope W₂ | max κ(λ) | median κ(λ) | M range |"
    )
    L.append("|---|---|---|---|---|---|---|---|")
    slopes = []
    for key, v in R["split_half"].items():
        slopes.append(v)
        L.append(
            f"| {key} | {v['slope']:.3f} | {ci3(v['slope_ci'])} | {v['slope_last4']:.3f} | "
            f"{v['slope_w2']:.3f} | {v['eig_condition_max']:.3g} | "
            f"{v['eig_condition_median']:.3g} | {v['n_samples'][0]:.0f}–{v['n_samples'][-1]:.0f} |"
        )
    inside = sum(v["slope_ci"][0] <= -0.5 <= v["slope_ci"][1] for v in slopes)
    verdict = "reproduced" if inside == len(slopes) else "partly" if inside else "not reproduced"
    L.append(
        f"\n32 hashed prompt blocks (blocks with <= 2(N + r) samples dropped; kept: "
        f"{[v['blocks_used'] for v in slopes]}), halves of 1, 2, 4, ... blocks, 10 random half "
        "pairs per size; CI: delete-a-group jackknife over prompt blocks (t). "
        f"−0.5 lies inside {inside} of {len(slopes)} CIs. "
        f"**Verdict: {verdict}.** "
        "The rate is asymptotic and needs κ(λ) ≪ √M; compare the κ columns with √M.\n"
    )
    first = next(iter(R["split_half"].values()))
    claims.append(
        Claim(
            "split_half_rate",
            "W∞ between split-half spectra falls as M^-1/2 (slope −0.5)",
            first["slope"],
            finite_ci(first["slope_ci"]),
            count_verdict(inside, len(slopes)),
            {"fits": list(R["split_half"]), "n_blocks": [v["blocks_used"] for v in slopes]},
            ci_reason=None if finite_ci(first["slope_ci"]) else "no finite jackknife interval",
            note=f"ours is {next(iter(R['split_half']))}; −0.5 lies inside {inside} of "
            f"{len(slopes)} CIs",
        )
    )
    L.append("## 2. Non-normal realisation with modal/principal dissociation\n")
    if "fits" not in R:
        return _unfinished(L, 2)
    L.append(
        "| fit | ρ(A) | control rank (Var(u) kept) | Henrici rel. | noise floor rel. | "
        "extrapolated rel. | κ(V) | max κ(λ) | dissociation k | largest angle (°) | mean cos² |"
    )
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for key, v in R["fits"].items():
        floor = (
            "— | —"
            if v["henrici_noise_floor_relative"] is None
            else f"{v['henrici_noise_floor_relative']:.3f} | "
            f"{v['henrici_extrapolated_relative']:.3f}"
        )
        k = v["dissociation_k"]
        angle, cos2 = v["dissociation_largest_angle_deg"], v["dissociation_mean_cos2"]
        L.append(
            f"| {key} | {v['spectral_radius']:.3f} | {v['control_rank']} "
            f"({v['control_energy_kept']:.2f}) | {v['henrici_relative']:.3f} | "
            f"{floor} | "
            f"{v['kappa_V']:.3g} | {v['eig_condition_max']:.3g} | {'-' if k is None else k} | "
            f"{float('nan') if angle is None else angle:.1f} | "
            f"{float('nan') if cos2 is None else cos2:.3f} |"
        )
    # Fits whose quarters could not over-determine the operator have no floor: they are
    # judged by their plain relative departure (listed in the claim's settings).
    extrapolated = {
        k: v["henrici_relative"]
        if v["henrici_extrapolated_relative"] is None
        else v["henrici_extrapolated_relative"]
        for k, v in R["fits"].items()
    }
    no_floor = [k for k, v in R["fits"].items() if v["henrici_noise_floor_relative"] is None]
    # The headline is the protocol's pre-registered dictionary at every probe layer; the other
    # fits are listed per setting and never chosen from.
    head = dictionary_label(pr["headline_dictionary"])
    headline = {k: v for k, v in R["fits"].items() if k.endswith("/" + head)}
    cos2 = {k: v["dissociation_mean_cos2"] for k, v in R["fits"].items()}
    holds = {k: (extrapolated[k] > 0.1, cos2[k] is not None and cos2[k] < 0.5) for k in headline}
    both = sum(a and b for a, b in holds.values())
    either = sum(a or b for a, b in holds.values())
    verdict = "reproduced" if both == len(holds) else "partly" if either else "not reproduced"
    first = next(iter(headline))
    claims.append(
        Claim(
            "non_normal_dissociated",
            "non-normal realisation (Henrici > 0.1) with modal/principal dissociation",
            extrapolated[first],
            None,
            verdict,
            {
                "headline": f"{head} at the probe layers (the protocol's headline dictionary)",
                "fits": list(headline),
                "rule": "noise-floor-extrapolated henrici_relative > 0.1; mean cos² < 0.5",
                "control_rank": {k: v["control_rank"] for k, v in R["fits"].items()},
                "control_energy": s["control_energy"],
                "no_noise_floor": no_floor,
            },
            ci_reason="point estimates of full-data fits; the noise floor is in the markdown",
            note=f"ours = the extrapolated relative Henrici departure of {first}",
            per_setting={
                k: {
                    "henrici_extrapolated_relative": extrapolated[k],
                    "henrici_noise_floor_relative": R["fits"][k]["henrici_noise_floor_relative"],
                    "mean_cos2": cos2[k],
                }
                for k in R["fits"]
            },
        )
    )
    L.append(
        "\nHenrici departure dep_F(Â) relative to ‖Â‖_F; noise floor = the part sampling alone "
        f"gives (mean dep² over random prompt halves and quarters of {pr['henrici_blocks']} "
        "prompt blocks, dep² ≈ D² + c/M); extrapolated = √(dep² − c/M), the M → ∞ value. "
        f"Rule, at the headline dictionary {head} fixed in advance: non-normal if the "
        "extrapolated relative departure > 0.1, dissociated if the mean cos² between the top-k "
        "PCA directions and the dominant modes' span is < 0.5, at every probe layer (the "
        f"other fits are in the table and in the JSON's `per_setting`). **Verdict: {verdict}.**\n"
    )
    L.append("## 3. Invariance gap: SAE vs spectral vs random\n")
    if "invariance" not in R or len(R["invariance"]) < 4:
        return _unfinished(L, 3)
    n = R.get("invariance_n", s["invariance_n"])
    L.append(
        f"Every dictionary has N = {n} features and is fitted on the training half of the "
        "prompts; the residual is measured on the held-out half. SAE features: the N "
        f"latents of one wide TopK SAE ({R.get('sae')}) with the largest code variance "
        "(`variance`) or firing on the most rows (`frequency`) on the training prompts "
        "(`select_sae_features`); the paper says the gap depends on this rule, so both are "
        "reported.\n"
    )
    L.append("| dictionary | pooled 1−R² (held-out prompts) | mean | median | dead |")
    L.append("|---|---|---|---|---|")
    inv = R["invariance"]
    for key, v in inv.items():
        L.append(
            f"| {key} | {v['pooled']:.4f} | {v['mean']:.4f} | {v['median']:.4f} | {v['n_dead']} |"
        )
    g = {k.split("/")[1]: v["pooled"] for k, v in inv.items()}
    sae_rules = {r: g[f"sae_{r}{n}"] for r in ("variance", "frequency")}
    others = (g[f"spectral{n}"], g[f"relu{n}"])
    wins = {r: sum(v > o for o in others) for r, v in sae_rules.items()}
    ok = all(w == 2 for w in wins.values())
    partly = any(w > 0 for w in wins.values())
    verdict = "reproduced" if ok else "partly" if partly else "not reproduced"
    claims.append(
        Claim(
            "invariance_gap",
            "the SAE's invariance residual exceeds the spectral and random dictionaries'",
            min(sae_rules.values()),
            None,
            "reproduced" if ok else "partly" if partly else "not reproduced",
            {
                "dictionaries": g,
                "split": "held-out prompts",
                "n_features": n,
                "sae_selection": ["variance", "frequency"],
            },
            ci_reason="pooled residuals on one held-out split; no resampling was run",
            note="ours = the smaller of the two SAE selections' pooled held-out 1 − R²",
        )
    )
    L.append(
        "\nClaim: the SAE's residual is larger than both the spectral and the random "
        f"dictionary's at equal N. By variance: SAE {sae_rules['variance']:.4f}; by frequency: "
        f"SAE {sae_rules['frequency']:.4f}; spectral {others[0]:.4f}; ReLU {others[1]:.4f}. "
        f"**Verdict: {verdict}.** The spectral dictionary is selected for invariance on the "
        "training prompts, so a lower residual there is expected; the held-out split keeps "
        "that selection from scoring itself.\n"
    )
    L.append("## 4. IOI ablation ordering PCA > modes > random\n")
    if "ioi" not in R:
        return _unfinished(L, 4)
    if not R["ioi"]:
        L.append("**Not run in this profile** (no IOI prompts: `ioi_layers` is empty).\n")
    else:
        L.append(
            "Normalised logit-difference change (LD_abl − LD_clean)/mean LD_clean, k = 4 real "
            "dimensions, mean-ablation to the corpus mean at resid_pre(l), 95% bootstrap CI over "
            "prompts; random = mean of 3 orthonormal draws. Fits and ablations leave position 0 "
            "out (`all` = every task position but 0; `END` = the final position).\n"
        )
        L.append("| layer/positions | layers to read-out | modes | PCA | random |")
        L.append("|---|---|---|---|---|")
        orders = []
        for key, v in R["ioi"].items():
            L.append(
                f"| {key} | {v['depth_to_readout']} | {v['modes']['mean']:+.3f} {ci3(v['modes']['ci'])} | "  # noqa: E501
                f"{v['pca']['mean']:+.3f} {ci3(v['pca']['ci'])} | {v['random']['mean']:+.3f} {ci3(v['random']['ci'])} |"  # noqa: E501
            )
            orders.append(_ordering(v))
        n_holds = sum(o == "holds" for o in orders)
        n_reversed = sum(o == "reversed" for o in orders)
        # an ordering counts only where the intervals separate; ties decide nothing
        verdict = (
            "reproduced"
            if n_holds == len(orders)
            else "partly"
            if n_holds
            else "not reproduced"
            if n_reversed
            else "unidentified"
        )
        claims.append(
            Claim(
                "ioi_ablation_ordering",
                "IOI ablation effect |PCA| > |modes| > |random|",
                f"{n_holds} of {len(orders)} settings",
                None,
                verdict,
                {
                    "settings": list(R["ioi"]),
                    "k": 4,
                    "ablation": "mean, resid_pre",
                    "rule": "an ordering holds where the 95% CIs of |effect| separate in both "
                    "pairs, is reversed where one pair separates the other way, else a tie",
                },
                ci_reason="a count of settings; per-setting CIs are in the markdown",
                per_setting=dict(zip(R["ioi"], orders, strict=True)),
            )
        )
        trend = "; ".join(
            f"{pos}: "
            + ", ".join(
                f"{v['depth_to_readout']} → {abs(v['pca']['mean']) - abs(v['modes']['mean']):+.2f}"
                for k, v in sorted(R["ioi"].items(), key=lambda kv: kv[1]["depth_to_readout"])
                if k.endswith("/" + pos)
            )
            for pos in ("all", "END")
        )
        L.append(
            f"\nOrdering by |effect| PCA > modes > random, counted only where the 95% intervals "
            f"of |effect| separate: holds in {n_holds}, reversed in {n_reversed}, tied in "
            f"{len(orders) - n_holds - n_reversed} of {len(orders)} settings. "
            f"**Verdict: {verdict}.** Gap |PCA| − |modes| by distance to the read-out "
            f"(layers to read-out → gap): {trend}.\n"
        )
    L.append("## 5. Heavy tails removed by lifting?\n")
    L.append(
        "| features | max excess kurtosis | p95 excess kurtosis | norm kurtosis (Gaussian) | "
        "Gram-entry max excess kurtosis | Gram-entry 99.9%/mean | heavy (max > 10) |"
    )
    L.append("|---|---|---|---|---|---|---|")
    rows = {k: v for k, v in R["tails"].items() if isinstance(v, dict)}
    for key, v in rows.items():
        L.append(
            f"| {key} | {v['max_excess_kurtosis']:.2f} | {v['p95_excess_kurtosis']:.2f} | "
            f"{v['norm_kurtosis']:.2f} ({v['norm_kurtosis_gaussian']:.2f}) | "
            f"{v['gram_max_excess_kurtosis']:.2f} | {v['gram_tail_ratio']:.1f} | "
            f"{v['max_excess_kurtosis'] > HEAVY} |"
        )
    mom = {k: v for k, v in R["tails"].items() if not isinstance(v, dict)}
    L.append(
        "\nPer-coordinate excess kurtosis (maximum, not the 95th percentile that hides the "
        "outlier dimensions), norm kurtosis E‖x − μ‖⁴/(E‖x − μ‖²)² against its isotropic-"
        "Gaussian value (d + 2)/d, and the tails of the Gram entries z_i z_j (standardised "
        "coordinates, what the EDMDc Gram averages), of the states and of each lift. "
        f"W∞ between median-of-means (10 prompt blocks) and plain spectra: {mom}.\n"
    )
    raw = [v["max_excess_kurtosis"] for k, v in rows.items() if k.endswith("/state")]
    lifted = [v["max_excess_kurtosis"] for k, v in rows.items() if k.endswith("_lifted")]
    raw_heavy = [x > HEAVY for x in raw]
    lift_heavy = [x > HEAVY for x in lifted]
    if not any(raw_heavy):
        verdict = (
            "not reproduced: the residual states are not heavy-tailed at these layers "
            f"(max excess kurtosis ≤ {HEAVY}), so there is nothing for lifting to remove"
        )
    elif not any(lift_heavy):
        verdict = "reproduced"
    else:
        verdict = "partly" if not all(lift_heavy) else "not reproduced"
    L.append(f"**Verdict: {verdict}.**\n")
    claims.append(
        Claim(
            "heavy_tails_removed_by_lifting",
            "lifting removes the heavy tails of the residual states",
            max(raw),
            None,
            "not tested"
            if not any(raw_heavy)
            else "reproduced"
            if not any(lift_heavy)
            else "partly"
            if not all(lift_heavy)
            else "not reproduced",
            {
                "statistic": "max excess kurtosis over coordinates",
                "heavy": f"> {HEAVY}",
                "lifted_max_excess_kurtosis": dict(
                    (k, v["max_excess_kurtosis"]) for k, v in rows.items() if "lifted" in k
                ),
                "norm_kurtosis": {k: v["norm_kurtosis"] for k, v in rows.items()},
            },
            ci_reason="a maximum over coordinates of one sample",
            note="ours = the states' max excess kurtosis (max over probe layers)",
        )
    )
    L.append("## 6. Reduction bound sharper than Enns–Glover\n")
    if "reduction" not in R:
        return _unfinished(L, 6)
    red = R["reduction"]
    L.append(
        f"Pooled operator over layers {red['layers']} ({red['dictionary']}), "
        f"horizon {red['horizon']}.\n"
    )
    L.append(
        "| order | actual error | Enns–Glover | a-posteriori Markov | instance error | instance bound | eff. rank Σ_u | ρ₀ |"  # noqa: E501
    )
    L.append("|---|---|---|---|---|---|---|---|")
    tighter = []
    for r in ("4", "8", "16"):
        v = red[r]
        L.append(
            f"| {r} | {v['error']:.3g} | {v['enns_glover']:.3g} | {v['markov_bound']:.3g} | "
            f"{v['instance_error']:.3g} | {v['instance_bound']:.3g} | {v['effective_rank']:.2f} | {v['rho0']:.3f} |"  # noqa: E501
        )
        tighter.append(v["instance_bound"] < v["enns_glover"] and v["error"] <= v["enns_glover"])
    verdict = "reproduced" if all(tighter) else "partly" if any(tighter) else "not reproduced"
    claims.append(
        Claim(
            "reduction_bound",
            "the instance bound is sharper than Enns–Glover",
            red["8"]["instance_bound"],
            None,
            count_verdict(sum(tighter), len(tighter)),
            {
                "orders": [4, 8, 16],
                "layers": red["layers"],
                "horizon": red["horizon"],
                "enns_glover_order8": red["8"]["enns_glover"],
            },
            ci_reason="deterministic bounds of one fitted operator",
            note="ours = the instance bound at order 8 (Enns–Glover in settings)",
        )
    )
    cert_orders = ("4", "8", "16")
    cert_holds = [red[r]["error"] <= red[r]["enns_glover"] for r in cert_orders]
    # older stage records lack the control; it is then not measured
    flagged = [bool(red[r].get("control_flagged", False)) for r in cert_orders]
    claims.append(
        Claim(
            "reduction_certificate_cert_holds",
            "balanced truncation's error is at most the Enns–Glover bound",
            min(red[r]["bound_ratio"] for r in cert_orders) if "bound_ratio" in red["4"] else None,
            None,
            count_verdict(sum(cert_holds), len(cert_holds)),
            {"orders": [4, 8, 16], "norm": "‖T_L − T_L^r‖₂ over the horizon"},
            ci_reason="deterministic bounds of one fitted operator",
            note="ours = the smallest Enns–Glover bound / error over the orders (>= 1 holds)",
            kind="check",
            per_setting={
                r: {"error": red[r]["error"], "enns_glover": red[r]["enns_glover"]}
                for r in cert_orders
            },
            positive_control={
                "passed": all(flagged),
                "what": "C_r scaled so the triangle inequality puts its error above "
                "2 × Enns–Glover; the same comparison must reject it",
                "control_error": {r: red[r].get("control_error") for r in cert_orders},
            },
        )
    )
    L.append(
        f"\nThe instance bound certifies the error on inputs shaped like the attention writes "
        f"(a different norm from Enns–Glover's worst case), so the comparison is of certificates. "
        f"**Verdict: {verdict}.**\n"
    )
    L += render_seeds_and_universality(R, claims)
    return "\n".join(L) + "\n"


def render_seeds_and_universality(R: dict[str, Any], claims: list[Claim]) -> list[str]:
    L = ["## 7. Invariance penalty and run-to-run variability of SAE dictionaries\n"]
    if "sae_seeds" not in R:
        return [*L, "**Not measured in this run.**\n"]
    ss = R["sae_seeds"]
    L.append(
        f"TopK SAEs (256 features, k = 16, {R['settings']['sae_epochs']} epochs, batch 512) on "
        "resid_pre of layer "
        f"{ss['layer']}, seeds 0–{len(next(iter(ss['runs'].values()))['fits']) - 1}, without "
        f"(λ = 0) and with (λ = {R['settings']['sae_penalty']:g}) the in-batch invariance penalty "
        "(`train_sae_dictionary(..., invariance_weight=λ)`). Residual: held-out-prompt pooled "
        "1 − R² of the one-step fit; agreement: decoder directions matched one to one "
        "(Hungarian on |cos|) between every pair of seeds.\n"
    )
    L.append(
        "| λ | held-out residual (per seed) | FVU (per seed) | matched \\|cos\\| (per pair) "
        "| share > 0.9 |"
    )
    L.append("|---|---|---|---|---|")
    summary = {}
    for lam, run in ss["runs"].items():
        res = [f["invariance_pooled"] for f in run["fits"]]
        fvu = [f["final_fvu"] for f in run["fits"]]
        agree = [p["mean_cos"] for p in run["agreement"]]
        share = [p["share_above"] for p in run["agreement"]]
        summary[lam] = (float(np.mean(res)), float(np.mean(agree)))
        L.append(
            f"| {lam} | {', '.join(f'{v:.4f}' for v in res)} | "
            f"{', '.join(f'{v:.3f}' for v in fvu)} | "
            f"{', '.join(f'{v:.3f}' for v in agree)} | {', '.join(f'{v:.2f}' for v in share)} |"
        )
    (r0, a0), (r1, a1) = summary.values()
    shares = [p["share_above"] for run in ss["runs"].values() for p in run["agreement"]]
    claims.append(
        Claim(
            "invariance_penalty_identifiability",
            "an invariance penalty makes SAE dictionaries agree across seeds",
            a1,
            None,
            "not reproduced" if max(shares, default=0) == 0 else "partly",
            {"layer": ss["layer"], "penalty": R["settings"]["sae_penalty"]},
            ci_reason="mean over seed pairs; too few seeds for an interval",
            note=f"ours = mean matched |cos| with the penalty (without: {a0:.3f}); held-out "
            f"residual {r0:.4f} → {r1:.4f}",
        )
    )
    L.append(
        f"\nWith the penalty the mean held-out residual goes {r0:.4f} → {r1:.4f} "
        f"({(r1 - r0) / r0:+.0%}) and the mean matched |cos| between seeds {a0:.3f} → {a1:.3f}. "
        "The penalty does what it is for (a more invariant span at the same reconstruction "
        "error) but does not make the dictionary identifiable: no decoder direction of one seed "
        "has a partner above 0.9 in another, with or without it. These SAEs see ≈ 10⁴ tokens, "
        "so run-to-run variability here mixes non-identifiability with too little data.\n"
    )
    L.append("## 8. Universality of the spectrum across models\n")
    u = R.get("universality")
    if not u:
        return [*L, "**Not measured in this run.**\n"]
    L.append(
        "W∞ between the spectra of two models' realisations at the same relative depth, "
        "against a sampling null. Seed/depth replicas (4-layer and 8-layer d = 128 LMs trained "
        "on the bundled corpus by the equivalence replication) have unrelated bases: each "
        "is lifted by the PCA-8 of its own states and the null is W∞ between random prompt "
        "halves of one model, rescaled by √((1/M_A + 1/M_B)/(4/M_X)) "
        "(`spectral_distance_test`; it relies on the M^-1/2 rate of section 1). The "
        "fine-tuned SmolLM2 copy shares the base basis and is also tested with one shared "
        "PCA-16 and the block-permutation null (`universality_test`). 200 resamples.\n"
    )
    L.append("| pair | W∞ | null 95% | p | shared-basis W∞ | null 95% | p |")
    L.append("|---|---|---|---|---|---|---|")
    for k, v in u.get("pairs", {}).items():
        sh = (
            f"{v['shared_distance']:.3f} | {v['shared_null_q95']:.3f} | {v['shared_p_value']:.3f}"
            if "shared_distance" in v
            else "— | — | —"
        )
        L.append(f"| {k} | {v['distance']:.3f} | {v['null_q95']:.3f} | {v['p_value']:.3f} | {sh} |")
    for key in ("small_models", "finetuned"):
        if key in u:
            L.append(f"\n{u[key]}.")
    L.append(
        "\nA p-value above 0.05 means the two realisations' spectra are indistinguishable at "
        "this sample size (universal up to sampling error); below, they differ. Where the two "
        "tests are both run they use different dictionaries (own PCA-8 vs shared PCA-16): the "
        "16-feature spectrum has more eigenvalues and a wider null, so a difference that the "
        "PCA-8 test resolves can sit inside the PCA-16 null. The unchanged layer of the "
        "fine-tuned copy gives W∞ = 0 exactly, a check of the pipeline.\n"
    )
    seeds = [v for k, v in u.get("pairs", {}).items() if k.startswith("L4-s") and "L8" not in k]
    if seeds:
        differ = sum(v["p_value"] < 0.05 for v in seeds)
        claims.append(
            Claim(
                "spectrum_universal_across_seeds",
                "the depth spectrum is universal across seed replicas",
                f"{differ} of {len(seeds)} seed pairs differ beyond sampling error",
                None,
                count_verdict(len(seeds) - differ, len(seeds)),
                {"pairs": [k for k in u.get("pairs", {}) if k.startswith("L4-s")]},
                ci_reason="one test per pair against its own sampling null",
            )
        )
        L.append(
            f"**Verdict:** seed replicas differ beyond sampling error in {sum(v['p_value'] < 0.05 for v in seeds)}"  # noqa: E501
            f" of {len(seeds)} pairs (W∞ {min(v['distance'] for v in seeds):.3f}–"
            f"{max(v['distance'] for v in seeds):.3f} against null 95% quantiles "
            f"{min(v['null_q95'] for v in seeds):.3f}–{max(v['null_q95'] for v in seeds):.3f}): "
            "at this M the depth spectrum of these small byte-level LMs is "
            "seed-specific, not universal.\n"
        )
    return L


def write(R: dict[str, Any], doc_dir: str | Path) -> tuple[Path, Path]:
    """Write ``koopman.md`` and ``koopman.json`` into ``doc_dir``."""
    from structlens.replication import command

    doc_dir = Path(doc_dir)
    source = command(METHOD, R["settings"].get("profile", "cpu"))
    found: list[Claim] = []
    text = render(R, source, found)
    moves = "\n".join(verdict_moves(PREVIOUS, found, PREVIOUS_COMMIT)) + "\n"
    md = write_text(doc_dir / f"{METHOD}.md", text.replace(MOVES, moves, 1))
    doc = ClaimsDocument(METHOD, source, tuple(found), {"settings": dict(R["settings"])})
    return md, doc.write(doc_dir / f"{METHOD}.json")

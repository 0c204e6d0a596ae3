"""Figures, markdown and claims JSON of the Koopman replication: templates over the typed stage
Results of one run and the Claims :mod:`structlens.koopman.verdicts` computes from them.

Every section is a :class:`Part`: a table (a header and a row template filled from each row's
Results) between an introduction and a closing text, then the verdicts of its claims.
Templates are ``str.format`` strings where ``None`` renders as ``—``, a list as its items and
a dict as its ``key: value`` pairs.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from structlens.koopman import stages as st
from structlens.koopman import verdicts as v
from structlens.koopman.protocol import dictionary_label
from structlens.replication.claims import ClaimsDocument
from structlens.replication.koopman.run import METHOD
from structlens.replication.markdown import with_calibration, write_text
from structlens.verdicts import Claim

METHODS = ("modes", "pca", "random")  # the IOI ablation's methods, in table order


class _Format(string.Formatter):
    def format_field(self, value: Any, spec: str) -> str:
        if value is None:
            return "—"
        if isinstance(value, dict):
            return "; ".join(f"{k}: {x}" for k, x in value.items()) or "none"
        if isinstance(value, (list, tuple)):
            return ", ".join(self.format_field(x, spec) for x in value)
        return super().format_field(value, spec)


fill = _Format().format


def results(R: dict[str, Any]) -> v.ReplicationResults:
    """The typed Results of the records in ``R`` (what :class:`KoopmanReplication` ran)."""

    def each(cls: type, records: dict[str, Any]) -> dict[str, Any]:
        return {k: st.from_record(cls, r) for k, r in records.items()}

    u, red = R["universality"], R["reduction"]
    return v.ReplicationResults(
        each(st.SplitHalfFit, R["split_half"]), each(st.SpectrumFit, R["fits"]),
        each(st.InvarianceFit, R["invariance"]), each(st.AblationEffects, R["ioi"]),
        [st.from_record(st.SAESeedRun, r) for r in R["sae_seeds"]],
        [st.from_record(st.SpectralComparison, r) for r in u["comparisons"]], u["not_run"],
        [st.from_record(st.ReductionRow, red[str(k)]) for k in v.REDUCTION_ORDERS],
    )  # fmt: skip


def figures(t: v.ReplicationResults, head: str, out: Path) -> None:
    """The split-half curves, the headline dictionary's spectra and the IOI ablations."""
    from structlens.report.koopman import plot_ablation, plot_eigenvalues, plot_split_half

    name = {k: k.replace("/", " ") for k in [*t.split_half, *t.fits, *t.ioi]}
    plot_split_half(
        {name[k]: (f.n_samples, f.w_inf_mean, f.slope) for k, f in t.split_half.items()},
        out / "split_half.png",
    )
    spectra = {name[k]: f.eigenvalues for k, f in t.fits.items() if f.dictionary == head}
    plot_eigenvalues(spectra, out / "eigenvalues.png")
    if t.ioi:
        cells = []
        for k, e in t.ioi.items():
            means, cis = zip(*_ioi(e).values(), strict=True)
            cells.append((name[k], list(METHODS), np.array(means), np.array(cis)))
        plot_ablation(cells, out / "ioi_ablation.png")


def _ioi(e: st.AblationEffects) -> dict[str, tuple[float, list[float]]]:
    return {m: (e.mean[e.methods.index(m)], e.ci[e.methods.index(m)]) for m in METHODS}


Rows = Callable[[v.ReplicationResults], Iterable[dict[str, Any]]]


@dataclass(frozen=True)
class Part:
    """One section: ``title``, ``intro``, a table (``header`` and a ``row`` template filled
    from each of ``rows``), ``text`` and the verdicts of ``claims``.  ``intro`` and ``text``
    are filled with ``s`` (the settings), ``R`` (the records), ``c`` (the claims) and ``mom``
    (the median-of-means fits' distances to the plain ones)."""

    title: str
    claims: tuple[str, ...]
    header: str
    row: str
    rows: Rows
    intro: str = ""
    text: str = ""


def _items(name: str) -> Rows:
    return lambda t: ({"k": k, "f": f} for k, f in getattr(t, name).items())


def _each(name: str) -> Rows:
    return lambda t: ({"f": f} for f in getattr(t, name))


PARTS = (
    Part(
        "1. Split-half rate ≈ −1/2", ("split_half_rate",),
        "| fit | slope (W∞) | 95% CI | slope last 4 | slope W₂ | max κ(λ) | median κ(λ) | M |",
        "| {k} | {f.slope:.3f} | [{f.slope_ci:.3f}] | {f.slope_last4:.3f} | {f.slope_w2:.3f} | "
        "{f.eig_condition_max:.3g} | {f.eig_condition_median:.3g} | "
        "{f.n_samples[0]:.0f}–{top:.0f} |",
        lambda t: ({"k": k, "f": f, "top": f.n_samples[-1]} for k, f in t.split_half.items()),
        text="CI: delete-a-group jackknife over prompt blocks ({c[split_half_rate].settings"
        "[n_blocks]} blocks kept by the block filter). The rate is asymptotic and needs κ(λ) ≪ √M.",
    ),
    Part(
        "2. Non-normal realisation with modal/principal dissociation", ("non_normal_dissociated",),
        "| fit | ρ(A) | control rank (Var(u) kept) | Henrici rel. | noise floor rel. | "
        "extrapolated rel. | κ(V) | dissociation k | largest angle (°) | mean cos² |",
        "| {k} | {f.spectral_radius:.3f} | {f.control_rank} ({f.control_energy_kept:.2f}) | "
        "{f.henrici_relative:.3f} | {f.henrici_noise_floor_relative:.3f} | "
        "{f.henrici_extrapolated_relative:.3f} | {f.kappa_V:.3g} | {f.dissociation_k} | "
        "{f.dissociation_largest_angle_deg:.1f} | {f.dissociation_mean_cos2:.3f} |", _items("fits"),
        text="Noise floor: the part of the departure sampling alone gives (random prompt halves "
        "and quarters of {s[henrici_blocks]} blocks, dep² ≈ D² + c/M); extrapolated = "
        "√(dep² − c/M). Rule, at {c[non_normal_dissociated].settings[headline]}: "
        "{c[non_normal_dissociated].settings[rule]}.",
    ),
    Part(
        "3. Invariance gap: SAE vs spectral vs random", ("invariance_gap",),
        "| dictionary | pooled 1−R² (held-out prompts) | mean | median | dead |",
        "| {k} | {f.pooled:.4f} | {f.mean:.4f} | {f.median:.4f} | {f.n_dead} |",
        _items("invariance"),
        intro="Every dictionary has N = {s[invariance_n]} features, fitted on the training "
        "prompts and scored on the held-out ones; SAE features are the N latents of one wide "
        "TopK SAE ({R[sae]}) with the largest code variance or firing frequency.",
    ),
    Part(
        "4. IOI ablation ordering PCA > modes > random, and its fall with depth",
        ("ioi_ablation_ordering", "ioi_gap_falls_with_depth_distance"),
        "| layer/positions | layers to read-out | modes | PCA | random | ordering |",
        "| {k} | {e.depth_to_readout} | {m[modes][0]:+.3f} [{m[modes][1]:.3f}] | "
        "{m[pca][0]:+.3f} [{m[pca][1]:.3f}] | {m[random][0]:+.3f} [{m[random][1]:.3f}] | {o} |",
        lambda t: ({"k": k, "e": e, "m": _ioi(e), "o": v.ordering(e)} for k, e in t.ioi.items()),
        intro=f"Normalised logit-difference change, k = {v.IOI_K} real dimensions, mean-ablation "
        "at resid_pre(l), 95% bootstrap CI over prompts; random = mean of 3 orthonormal draws; "
        "position 0 never ablated (`all` = every other position, `END` = the final one).",
    ),
    Part(
        "5. Heavy tails removed by lifting?", ("heavy_tails_removed_by_lifting",),
        "| features | max excess kurtosis | p95 excess kurtosis | norm kurtosis (Gaussian) | "
        "Gram-entry max excess kurtosis | Gram-entry 99.9%/mean |",
        "| {k} | {f[max_excess_kurtosis]:.2f} | {f[p95_excess_kurtosis]:.2f} | "
        "{f[norm_kurtosis]:.2f} ({f[norm_kurtosis_gaussian]:.2f}) | "
        "{f[gram_max_excess_kurtosis]:.2f} | {f[gram_tail_ratio]:.1f} |",
        lambda t: ({"k": k, "f": f} for k, f in v.tails(t.fits).items()),
        text=f"Heavy: max excess kurtosis > {v.HEAVY}. W∞ between the median-of-means and the "
        "plain spectra: {mom}.",
    ),
    Part(
        "6. Reduction bound sharper than Enns–Glover",
        ("reduction_bound", "reduction_certificate_cert_holds"),
        "| order | actual error | Enns–Glover | a-posteriori Markov | instance error | "
        "instance bound | eff. rank Σ_u | ρ₀ |",
        "| {f.order} | {f.error:.3g} | {f.enns_glover:.3g} | {f.markov_bound:.3g} | "
        "{f.instance_error:.3g} | {f.instance_bound:.3g} | {f.effective_rank:.2f} | {f.rho0:.3f} |",
        _each("reduction"),
        intro="Pooled operator over layers {R[reduction][layers]} ({R[reduction][dictionary]}), "
        "horizon {R[reduction][horizon]}.",
        text="The instance bound certifies inputs shaped like the attention writes (a different "
        "norm from Enns–Glover's worst case), so the comparison is of certificates.",
    ),
    Part(
        "7. Invariance penalty and run-to-run variability of SAE dictionaries",
        ("invariance_penalty_identifiability",),
        "| λ | held-out residual (per seed) | FVU (per seed) | matched \\|cos\\| | share > 0.9 |",
        "| {f.penalty:g} | {f.residual:.4f} | {f.fvu:.3f} | {f.mean_cos:.3f} | "
        "{f.share_above:.2f} |", _each("sae_runs"),
        text="TopK SAEs (k = 16) on resid_pre of the first probe layer, trained on the training "
        "prompts; residual on the held-out prompts; decoders matched one to one (Hungarian on "
        "|cos|) between every pair of seeds.",
    ),
    Part(
        "8. Universality of the spectrum across models", ("spectrum_universal_across_seeds",),
        "| pair | test | W∞ | null 95% | p | shared-basis W∞ | null 95% | p |",
        "| {f.pair} | {f.test} | {f.distance:.3f} | {f.null_q95:.3f} | {f.p_value:.3f} | "
        "{f.shared_distance:.3f} | {f.shared_null_q95:.3f} | {f.shared_p_value:.3f} |",
        _each("comparisons"),
        text=f"p > {v.ALPHA}: the two spectra are indistinguishable at this sample size. Not "
        "run: {R[universality][not_run]}. The unchanged layer of the fine-tuned copy must give "
        "W∞ = 0 exactly (the fine-tune updated layers 15-29 only).",
    ),
)  # fmt: skip

HEADER = """# Replication: Koopman spectral identifiability on SmolLM2-135M-Instruct

Produced by `{source}` (figures and cached stages under `results/replication/koopman/`). The \
paper has no public code; each claim is the one its summary states.

Settings: {s[n_prompts]} prompts ({s[n_corpus]} bundled-corpus chunks of {s[prompt_tokens]} \
tokens plus {s[n_ioi_in_fit]} IOI prompts), {s[tokens_per_layer]} token samples per layer; \
x = resid_pre(l), u = attn_out(l), y = resid_pre(l+1). Per-layer operators at layers \
{s[probe_layers]}; pooled operator over layers {s[layers][0]}-{last}. Position 0 \
excluded: {s[exclude_position0]}; dictionaries fitted on the {s[dictionary_fit_split]} \
prompts. Ridge α = {s[protocol][alpha]:g} (relative); control rank = fewest components \
holding {s[control_energy]:.0%} of Var(u) ({s[protocol][split_half_control_rank]} for \
split-half). Seed {s[seed]}. The protocol (`settings.protocol` in the JSON) is the one \
`structlens koopman` and `structlens analyze` run. {s[machine]}; wall time of the last run \
{minutes:.1f} min (finished sections come from the stage cache).
"""


def _verdict(c: Claim) -> str:
    check = c.kind == "check" and c.positive_control
    kind = f" (a check; positive control passed: {check['passed']})" if check else ""
    return f"**Verdict{kind}: {c.verdict}.** {c.note or ''}"


def render(R: dict[str, Any], t: v.ReplicationResults, c: dict[str, Claim], source: str) -> str:
    """The markdown of one run: settings, then one section per :class:`Part`."""
    mom = {k: f.mom_bottleneck for k, f in t.fits.items() if f.mom_bottleneck is not None}
    kw = {"s": R["settings"], "R": R, "c": c, "mom": mom}
    minutes = R.get("wall_seconds", float("nan")) / 60
    L = [fill(HEADER, source=source, minutes=minutes, last=R["settings"]["layers"][-1], **kw)]
    for part in PARTS:
        rows = [fill(part.row, **row) for row in part.rows(t)]
        table = [part.header, "|" + "---|" * (part.header.count(" | ") + 1), *rows, ""]
        L += [f"## {part.title}\n", *([fill(part.intro, **kw) + "\n"] if part.intro else [])]
        L += [*(table if rows else []), *([fill(part.text, **kw)] if part.text else [])]
        L += [_verdict(c[cid]) + "\n" for cid in part.claims]
    return "\n".join(L) + "\n"


def write(
    R: dict[str, Any], doc_dir: str | Path, figure_dir: Path | None = None
) -> tuple[Path, Path]:
    """Write ``koopman.md`` and ``koopman.json`` into ``doc_dir`` (the figures into
    ``figure_dir``)."""
    from structlens.replication import command

    s, doc_dir = R["settings"], Path(doc_dir)
    source = command(METHOD, s.get("profile", "cpu"))
    t, head = results(R), dictionary_label(s["protocol"]["headline_dictionary"])
    found = v.claims(t, head, s["control_energy"], s["invariance_n"])
    if figure_dir is not None:
        figures(t, head, figure_dir)
    text = with_calibration(render(R, t, found, source), "koopman")
    md = write_text(doc_dir / f"{METHOD}.md", text)
    doc = ClaimsDocument(METHOD, source, tuple(found.values()), {"settings": dict(s)})
    return md, doc.write(doc_dir / f"{METHOD}.json")

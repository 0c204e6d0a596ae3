"""Figures, markdown and claims JSON of the Koopman replication: ``template.md`` filled from
the typed stage Results of one run and the Claims :mod:`structlens.koopman.verdicts` computes
from them.

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
from structlens.koopman.diagnostics import KURTOSIS_ALPHA, KURTOSIS_BLOCKS
from structlens.koopman.protocol import dictionary_label
from structlens.replication.claims import ClaimsDocument
from structlens.replication.koopman.run import METHOD
from structlens.replication.markdown import Template, with_calibration, write_text
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
    """One section: its blocks ``* name`` of ``template.md``, the table's ``rows`` (one
    field dict per row) and the verdicts of ``claims`` below it."""

    name: str
    claims: tuple[str, ...]
    rows: Rows


def _items(name: str) -> Rows:
    return lambda t: ({"k": k, "f": f} for k, f in getattr(t, name).items())


def _each(name: str) -> Rows:
    return lambda t: ({"f": f} for f in getattr(t, name))


PARTS = (
    Part("split_half", ("split_half_rate",), lambda t: (
        {"k": k, "f": f, "top": f.n_samples[-1], "decision": v.rate_decision(f.slope_ci)}
        for k, f in t.split_half.items()
    )),
    Part("non_normal", ("non_normal_dissociated",), _items("fits")),
    Part("invariance", ("invariance_gap",), _items("invariance")),
    Part("ioi", ("ioi_ablation_ordering", "ioi_gap_falls_with_depth_distance"), lambda t: (
        {"k": k, "e": e, "m": _ioi(e), "o": v.ordering(e)} for k, e in t.ioi.items()
    )),
    Part("tails", ("heavy_tails_removed_by_lifting",), lambda t: (
        {"k": k, "f": f, "c": v.tail_class(f)} for k, f in v.tails(t.fits).items()
    )),
    Part("reduction", ("reduction_bound", "reduction_certificate_cert_holds"), _each("reduction")),
    Part("sae_seeds", ("invariance_penalty_identifiability",), _each("sae_runs")),
    Part("universality", ("spectrum_universal_across_seeds",), _each("comparisons")),
)  # fmt: skip
TEMPLATE = Path(__file__).with_name("template.md")


def _verdict(c: Claim) -> str:
    check = c.kind == "check" and c.positive_control
    kind = f" (a check; positive control passed: {check['passed']})" if check else ""
    return f"**Verdict{kind}: {c.verdict}.** {c.note or ''}"


def render(
    s: dict[str, Any], t: v.ReplicationResults, c: dict[str, Claim], source: str, seconds: float
) -> str:
    """The markdown of one run: settings, then one section per :class:`Part`."""
    blocks = Template(TEMPLATE).blocks
    red = t.reduction[0]
    mom = {k: f.mom_bottleneck for k, f in t.fits.items() if f.mom_bottleneck is not None}
    kw = {"s": s, "t": t, "c": c, "v": v, "mom": mom, "red": red, "last": s["layers"][-1]}
    kw |= {"pooled": f"{red.layers[0]}-{red.layers[-1]}", "source": source}
    kw |= {"tail_blocks": KURTOSIS_BLOCKS, "tail_alpha": KURTOSIS_ALPHA}
    L = [fill(blocks["header"], minutes=seconds / 60, **kw) + "\n"]
    for part in PARTS:

        def block(kind: str, part: Part = part) -> list[str]:
            text = blocks.get(f"{kind} {part.name}")
            return [fill(text, **kw) + ("\n" if kind == "intro" else "")] if text else []

        header = blocks[f"header {part.name}"]
        rows = [fill(blocks[f"row {part.name}"], **row) for row in part.rows(t)]
        table = [header, "|" + "---|" * (header.count(" | ") + 1), *rows, ""]
        L += [f"## {blocks[f'title {part.name}']}\n", *block("intro"), *(table if rows else [])]
        L += [*block("text"), *(_verdict(c[cid]) + "\n" for cid in part.claims)]
    return "\n".join(L) + "\n"


def write(
    settings: dict[str, Any],
    t: v.ReplicationResults,
    seconds: float,
    doc_dir: str | Path,
    figure_dir: Path | None = None,
) -> tuple[Path, Path]:
    """Write ``koopman.md`` and ``koopman.json`` into ``doc_dir`` (the figures into
    ``figure_dir``); ``seconds`` is the run's wall time."""
    from structlens.replication import command

    s, doc_dir = settings, Path(doc_dir)
    source = command(METHOD, s.get("profile", "cpu"))
    head = dictionary_label(s["protocol"]["headline_dictionary"])
    found = v.claims(t, s["protocol"], s["invariance_n"])
    if figure_dir is not None:
        figures(t, head, figure_dir)
    text = with_calibration(render(s, t, found, source, seconds), METHOD)
    md = write_text(doc_dir / f"{METHOD}.md", text)
    doc = ClaimsDocument(METHOD, source, tuple(found.values()), {"settings": dict(s)})
    return md, doc.write(doc_dir / f"{METHOD}.json")

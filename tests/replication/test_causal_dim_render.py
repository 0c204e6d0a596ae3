"""The causal-dimension render step shows what the stages produced and leaves out the rest; its
claims are the verdict functions' (checked on Claim fields)."""

from __future__ import annotations

import dataclasses

import numpy as np

from structlens.causal_dim.experiment import FourCell
from structlens.causal_dim.kappa import KappaResult, kappa_curve, kappa_from_grams, residual_bias
from structlens.causal_dim.protocol import PROFILES
from structlens.causal_dim.stages import KappaFit
from structlens.replication.causal_dim.render import (
    IOI_NOT_RUN,
    TEMPLATE,
    claims,
    claims_of,
    render_markdown,
)
from structlens.replication.causal_dim.run import Run
from structlens.replication.markdown import Template

SETTINGS = {"profile": "smoke", "model": "tiny", "protocol": PROFILES["smoke"].to_json()}


def _run(tmp_path) -> Run:
    g = np.zeros((8, 10, 10))
    for i in range(8):
        g[i, i, i] = 1.0  # Σ̂ has 8 equal eigenvalues: plug-in κ = κ_PR = 8
    res = kappa_from_grams(g)
    # without a vector κ = 7, so the jackknife's bias-corrected κ = 8·8 − 7·7 = 15, projected
    # onto [1, d = 10]: the reported κ (and κ_PR) is 10, the plug-in 8 beside it; halves of
    # 4 give 4·4 − 3·3 = 7, so the residual bias is (15 − 7)/3
    assert (res.erank, res.participation_ratio) == (10.0, 10.0)
    assert abs(res.erank_plugin - 8.0) < 1e-9
    curve = kappa_curve(g, [1, 8], n_draws=3)
    fit = KappaFit(
        **{f.name: getattr(res, f.name) for f in dataclasses.fields(KappaResult)},
        layer=3, identified=False, residual_bias=residual_bias(g), tolerance=1.05,
        curve_sizes=curve.sizes, curve_erank=curve.erank, curve_erank_sd=curve.erank_sd,
        curve_pr=curve.pr, curve_pr_sd=curve.pr_sd,
    )  # fmt: skip
    cell = {
        "width": 64,
        "n_causal": {"learned_enc/learned_dec": 4, "random_enc/learned_dec": 12},
        "n_repr": {"learned_enc/learned_dec": 60, "random_enc/learned_dec": 64},
        "inflation": {"learned_enc/learned_dec": 1.0, "random_enc/learned_dec": 3.0},
        "l0": {"learned_enc/learned_dec": 4.0, "random_enc/learned_dec": 9.5},
        "epsilon": 0.1,
        "n_tokens": 100,
    }
    # TopK without inflation, ReLU with: the verdict is read off the thresholded SAE
    topk = cell | {"inflation": {"learned_enc/learned_dec": 1.0, "random_enc/learned_dec": 1.0}}
    four = FourCell(width=64, layer=1, architectures={"topk": topk, "relu": cell})
    return Run(settings=SETTINGS, out=tmp_path, d_model=10, kappa=[fit], fourcell=four)


def test_claims_of_kappa_and_four_cell(tmp_path):
    run = _run(tmp_path)
    by_id = {c.id: c for c in claims_of(run)}
    c = by_id["random_encoder_inflation"]  # the paper's JumpReLU did not run: no headline
    assert c.verdict == "not tested" and "jumprelu" in c.note
    c = by_id["kappa_pr_lower_bound"]
    assert (c.kind, c.verdict) == ("check", "reproduced") and c.positive_control["passed"]
    c = by_id["exact_kappa"]
    assert abs(c.ours - 10.0) < 1e-9 and abs(c.settings["kappa_over_d"] - 1.0) < 1e-12
    assert c.verdict == "unidentified"  # not identified
    # the sections that did not run are claims not tested, each with its reason
    assert by_id["wedge"].verdict == "not tested" and by_id["wedge"].note
    assert (by_id["ioi_atp_recall"].verdict, by_id["ioi_atp_recall"].note) == (
        "not tested", IOI_NOT_RUN)  # fmt: skip
    # κ(8) = 8 over the mean erank of the two disjoint halves (4 each): ratio 2
    doc = claims(run, "test").to_json()
    assert list(doc["kappa"]["ratio_last_doubling"]) == ["3"]
    assert abs(doc["kappa"]["ratio_last_doubling"]["3"] - 2.0) < 1e-9
    assert doc["sweep"]["not_run"] and doc["sweep"]["base_width"] is None


def test_markdown_shows_the_sections_that_ran(tmp_path):
    run = _run(tmp_path)
    doc = render_markdown(run, "test")
    assert "| 3 | 8 | 8 | False | 10.0 | 0.0 | [10.0, 10.0] | 2.67 | 8.0 | 1.000 | 2.00 |" in doc
    assert "| relu | random_enc/learned_dec | 9.5 | 64 | 12 | 3.00× |" in doc  # L0 per cell
    assert "| 3 | 1.0 ± 0.0 | 8.0 ± 0.0 |" in doc  # the κ-vs-n row
    assert "## Width sweep" not in doc and "## IOI" not in doc
    assert "What changed" not in doc  # protocol history is in docs/, not generated
    # one claims-table row per claim, in the claims' order
    rows = doc.split("## Claims vs measurements")[1].split("\n## ")[0]
    rows = [r for r in rows.splitlines() if r.startswith("| ") and "---" not in r][1:]
    assert len(rows) == len(claims_of(run))
    assert (tmp_path / "sigma_spectrum.png").exists() and (tmp_path / "kappa_vs_n.png").exists()


def test_every_template_row_belongs_to_a_section():
    blocks = Template(TEMPLATE).blocks
    rows = {k.split(" ", 1)[1] for k in blocks if k.startswith("row ")}
    sections = {k.split(" ", 1)[1] for k in blocks if k.startswith("section ")}
    assert rows <= sections and all("{rows}" in blocks[f"section {r}"] for r in rows)


def test_cross_family_section_and_claim_read_the_same_fits(tmp_path):
    """The section's rows and the claim come from the run's cross-family fits: the headline
    row's ratio is the claim's, and a run without them shows neither."""
    run = _run(tmp_path)
    assert "Cross-family" not in render_markdown(run, "test")
    other = dataclasses.replace(run.kappa[0], layer=2, erank=5.0, erank_ci=(4.0, 6.0))
    run = dataclasses.replace(run, n_layers=4, cross_model="other", cross_d_model=8,
                              cross_n_layers=3, cross_kappa={3: other})  # fmt: skip
    doc = render_markdown(run, "test")
    assert "## Cross-family stand-in at matched relative depth" in doc
    # κ, its interval and the plug-in (8, the clipped bias correction's source) of each model
    row = "| 3 | 2 | 0.75 / 0.67 | 10.0 | [10.0, 10.0] | 8.0 | 1.000 | 5.0 | [4.0, 6.0] | 8.0 |"
    assert row in doc
    c = {c.id: c for c in claims_of(run)}["scale_invariance"]
    assert c.settings["ratio"] == 2.0 and c.verdict == "not reproduced"  # bounds 1.67 .. 2.5
    assert claims(run, "test").to_json()["cross_family"]["layers"] == {"3": 2}
    # a failed cross-family stage is named as the reason, not "no cross-family model"
    failed = dataclasses.replace(run, cross_kappa={}, failures={"cross_family": "Traceback"})
    c = {c.id: c for c in claims_of(failed)}["scale_invariance"]
    assert c.verdict == "not tested" and "stage failed" in c.note

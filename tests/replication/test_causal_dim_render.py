"""The causal-dimension render step shows what the stages produced and leaves out the rest."""

from __future__ import annotations

import dataclasses

import numpy as np

from structlens.causal_dim.kappa import KappaResult, kappa_curve, kappa_from_grams
from structlens.causal_dim.protocol import PROFILES
from structlens.causal_dim.stages import KappaFit
from structlens.replication.causal_dim.render import claims, render_markdown
from structlens.replication.causal_dim.run import Run
from structlens.results import to_jsonable

SETTINGS = {"profile": "smoke", "protocol": PROFILES["smoke"].to_json()}


def test_render_from_kappa_and_four_cell(tmp_path):
    g = np.zeros((8, 10, 10))
    for i in range(8):
        g[i, i, i] = 1.0  # Σ̂ has 8 equal eigenvalues: plug-in κ = κ_PR = 8
    res = kappa_from_grams(g)
    # without a vector κ = 7, so the jackknife's bias-corrected κ = 8·8 − 7·7 = 15, projected
    # onto [1, d = 10]: the reported κ (and κ_PR) is 10, the plug-in 8 beside it
    assert (res.erank, res.participation_ratio) == (10.0, 10.0)
    assert abs(res.erank_plugin - 8.0) < 1e-9
    curve = kappa_curve(g, [1, 8], n_draws=3)
    fit = KappaFit(
        **{f.name: getattr(res, f.name) for f in dataclasses.fields(KappaResult)},
        layer=3, converged=False, tolerance=1.05, curve_sizes=curve.sizes,
        curve_erank=curve.erank, curve_erank_sd=curve.erank_sd, curve_pr=curve.pr,
        curve_pr_sd=curve.pr_sd,
    )  # fmt: skip
    entry = to_jsonable(fit)
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
    four = {"width": 64, "layer": 1, "architectures": {"topk": topk, "relu": cell}}
    run = Run(settings=SETTINGS, out=tmp_path, kappa={"d": 10, "layers": [entry]}, fourcell=four)
    doc = render_markdown(run, "test")
    assert "L3: κ = 10 " in doc and "κ/d = 1.000" in doc
    assert "L3: κ_PR = 10.0" in doc and "(plug-in 8.0 vs 8.0)" in doc
    assert "reproduced (PR ≤ erank" in doc
    assert "| 3 | 8 | 8 | False | 10.0 | 0.0 | [10.0, 10.0] | 8.0 | 1.000 | 2.00 |" in doc
    assert "topk: 1.00×, relu: 3.00× (random enc/learned dec" in doc
    assert "reproduced (direction)" in doc
    assert "| relu | random_enc/learned_dec | 9.5 | 64 | 12 | 3.00× |" in doc  # L0 per cell
    assert "## What changed and why" in doc
    assert "| 3 | 1.0 ± 0.0 | 8.0 ± 0.0 |" in doc  # the κ-vs-n row
    assert "| Wedge | 15.6× vs 4.35× | not run | — |" in doc
    assert "## Width sweep" not in doc and "## IOI" not in doc
    assert (tmp_path / "sigma_spectrum.png").exists() and (tmp_path / "kappa_vs_n.png").exists()
    # the claims carry the same numbers and verdicts as the table
    by_id = {c.id: c for c in claims(run, "test").claims}
    assert by_id["random_encoder_inflation"].ours == 3.0
    assert by_id["random_encoder_inflation"].verdict == "reproduced"
    assert by_id["random_encoder_inflation"].settings["architecture"] == "relu"
    assert by_id["kappa_pr_lower_bound"].verdict == "reproduced"
    assert abs(by_id["exact_kappa"].ours - 10.0) < 1e-9
    assert abs(by_id["exact_kappa"].settings["kappa_over_d"] - 1.0) < 1e-12
    # κ(8) = 8 over the mean erank of the two disjoint halves (4 each): ratio 2
    doc_json = claims(run, "test").to_json()
    assert list(doc_json["kappa"]["ratio_last_doubling"]) == ["3"]
    assert abs(doc_json["kappa"]["ratio_last_doubling"]["3"] - 2.0) < 1e-9
    assert by_id["exact_kappa"].verdict == "unidentified"  # 2 ≥ 1.05: not converged

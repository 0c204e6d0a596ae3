"""The replication report renders what the JSON files hold (and leaves out what is missing)."""

from __future__ import annotations

import json

import numpy as np

from structlens.causal_dim.kappa import kappa_curve, kappa_from_grams
from structlens.report.causal import write_replication_doc
from structlens.results import to_jsonable

SETTINGS = {"profile": "quick", "k": 4, "jacobian_prompt_tokens": 8, "n_ce_prompts": 2}


def test_report_from_kappa_and_four_cell(tmp_path):
    g = np.zeros((8, 10, 10))
    for i in range(8):
        g[i, i, i] = 1.0  # Σ̂ has 8 equal eigenvalues: κ = κ_PR = 8
    res = kappa_from_grams(g)
    entry = to_jsonable(res) | {"layer": 3, "curve": kappa_curve(g, [1, 8], n_draws=3)}
    (tmp_path / "kappa.json").write_text(json.dumps({"d": 10, "layers": [entry]}))
    four = {
        "width": 64,
        "n_causal": {"learned_enc/learned_dec": 4, "random_enc/learned_dec": 12},
        "n_repr": {"learned_enc/learned_dec": 60, "random_enc/learned_dec": 64},
        "inflation": {"learned_enc/learned_dec": 1.0, "random_enc/learned_dec": 3.0},
        "epsilon": 0.1,
        "n_tokens": 100,
    }
    (tmp_path / "fourcell.json").write_text(json.dumps(four))
    doc = write_replication_doc(tmp_path, SETTINGS, tmp_path / "doc.md").read_text()
    assert "L3: κ = 8 " in doc and "κ/d = 0.800" in doc
    assert "L3: κ_PR = 8.0" in doc and "reproduced (PR ≤ erank" in doc
    assert "| 3.00× (random enc/learned dec" in doc and "reproduced (direction)" in doc
    assert "| 3 | 1.0 ± 0.0 | 8.0 ± 0.0 |" in doc  # the κ-vs-n row
    assert "| Wedge | 15.6× vs 4.35× | not run | — |" in doc
    assert "## Width sweep" not in doc and "## IOI" not in doc
    assert (tmp_path / "sigma_spectrum.png").exists() and (tmp_path / "kappa_vs_n.png").exists()

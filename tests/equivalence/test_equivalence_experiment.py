"""The equivalence experiment in the library: configs reject bad values at construction,
``run`` gives the numbers ``equiv similarity`` writes, and ``Comparison`` (arrays only)
recovers a known permutation of components."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from structlens.cli import equiv
from structlens.equivalence.compare import CompareConfig, Comparison
from structlens.equivalence.experiment import EquivalenceExperimentConfig, run
from structlens.models import load_model


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    [
        (CompareConfig, dict(layer_matching="greedy"), "layer_matching must be one of"),
        (CompareConfig, dict(representation="chars"), "representation must be one of"),
        (CompareConfig, dict(ci="normal"), "ci must be one of"),
        (CompareConfig, dict(heldout_fraction=1.0), "heldout_fraction"),
        (EquivalenceExperimentConfig, dict(task="nope"), "unknown probe task"),
        (EquivalenceExperimentConfig, dict(n=4), "too few probe prompts"),
    ],
)
def test_configs_reject_bad_values_at_construction(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**kwargs)


def test_comparison_recovers_a_permutation_of_layers_and_heads():
    rng = np.random.default_rng(0)
    resid = [rng.normal(size=(80, 8)) for _ in range(3)]
    heads = [rng.normal(size=(80, 3, 4)) for _ in range(3)]
    perm = [2, 0, 1]
    heads_b = [h[:, perm] for h in heads]
    cfg = CompareConfig(metric="linear_cka", layer_matching="hungarian")
    m = Comparison(cfg).fit((resid, heads), (resid[::-1], heads_b[::-1]))
    assert sorted(m.matching["layers"]["pairs"]) == [[0, 2], [1, 1], [2, 0]]
    for (la, ha), (lb, hb) in m.matching["heads"]["pairs"]:
        assert lb == 2 - la and perm[hb] == ha
    assert np.allclose(m.matching["heads"]["similarities"], 1.0)


def test_run_equals_cli(tmp_path):
    a = load_model("tiny-llama", seed=0)
    b = load_model("tiny-llama", seed=1)
    cmp = CompareConfig(validate=False, congruity=False, batch_size=8)
    result = run(EquivalenceExperimentConfig(n=12, compare=cmp), a, b)
    r = CliRunner().invoke(
        equiv.app, ["similarity", "tiny-llama", "tiny-llama", "-n", "12", "--out", str(tmp_path),
                    "-q"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "similarity.json").read_text())
    ours = json.loads(json.dumps(result.summary()))
    for key in ("score", "score_ci", "matching", "layer_similarity", "validation_method"):
        assert ours[key] == doc[key], key

"""The equivalence protocol: bad values fail at construction with one-line errors (also when
read from JSON through the CLI), its compare settings carry every field, the copied task names
equal the registry's, and ``Comparison`` (arrays only) recovers a known permutation."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from structlens.cli import equiv
from structlens.equivalence.compare import CompareConfig, Comparison
from structlens.equivalence.protocol import PROBE_TASKS, PROFILES, EquivalenceProtocol
from structlens.errors import InputError


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(probe="nope"), "unknown probe 'nope'"),
        (dict(probe_prompts=4), "probe_prompts must be an integer >= 12"),
        (dict(metric="cosine"), "unknown metric"),
        (dict(layer_matching="greedy"), "layer_matching must be one of"),
        (dict(null="shuffle"), "null must be one of"),
        (dict(heldout_fraction=1.0), "heldout_fraction must lie in (0, 1)"),
        (dict(null_alpha=0.0), "null_alpha must lie in (0, 1)"),
        (dict(max_validate_heads=0), "max_validate_heads must be >= 1"),
        (dict(max_kl=-1.0), "max_kl must be >= 0"),
        (dict(probe_prompts="many"), "probe_prompts must be int"),
        (dict(head_subset="congruity_kl"), "head_subset must be one of null_kl, random"),
        (dict(relation="sibling"), "relation must be one of independent, copy"),
        (dict(layer_map_rows_per_dim=0.5), "layer_map_rows_per_dim must be >= 1"),
        (dict(first_layer=-1), "first_layer must be an integer >= 0"),
        (dict(encoder_context=-1), "encoder_context must be an integer >= 0"),
    ],
)
def test_protocol_rejects_bad_values_in_one_line(changes, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        EquivalenceProtocol(**changes)
    assert "\n" not in str(e.value)


def test_profiles_keep_the_rules_and_differ_in_sizes():
    paper, smoke = PROFILES["paper"], PROFILES["smoke"]
    rules = ("metric", "layer_matching", "head_matching", "null", "null_alpha", "equivalent_at",
             "max_kl", "min_top1", "exclude_position0", "heldout_fraction")  # fmt: skip
    for p in PROFILES.values():
        assert all(getattr(p, r) == getattr(paper, r) for r in rules)
    assert smoke.probe_prompts < paper.probe_prompts and smoke.key() != paper.key()
    assert paper.replace() == paper and paper.replace().key() == paper.key()


def test_compare_config_carries_every_choice():
    p = PROFILES["paper-subset"].replace(map_method="procrustes", layer_map="ridge", seed=7)
    cfg = p.compare_config()
    assert isinstance(cfg, CompareConfig)
    assert (cfg.map_method, cfg.layer_map, cfg.seed) == ("procrustes", "ridge", 7)
    assert (cfg.max_validate_heads, cfg.max_validate_layers) == (30, 4)
    # the heads validated under a cap are chosen without CONGRUITY, on the fit prompts
    assert cfg.head_subset == "null_kl" and EquivalenceProtocol(
        max_validate_heads=4, congruity=False
    )
    row = p.replace(relation="copy", first_layer=15, layer_map_rows_per_dim=20.0).compare_config()
    assert (row.relation, row.first_layer, row.layer_map_rows_per_dim) == ("copy", 15, 20.0)
    assert (cfg.criterion.max_kl, cfg.criterion.min_top1) == (p.max_kl, p.min_top1)
    assert cfg.preprocess.exclude_bos and cfg.null_baseline
    assert not EquivalenceProtocol(null="none").compare_config().null_baseline


def test_copied_task_names_equal_the_registry():
    from structlens.data.tasks.registry import TASKS

    assert PROBE_TASKS == tuple(TASKS)


def test_a_bad_protocol_file_is_a_one_line_cli_error(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(PROFILES["smoke"].to_json() | {"probe_prompts": 2}))
    r = CliRunner().invoke(equiv.app, ["sanity", "tiny-llama", "--protocol", str(path), "-q"])
    assert r.exit_code == 2 and "must be an integer >= 12; got 2" in r.output
    path.write_text(json.dumps({"no_such_field": 1}))
    r = CliRunner().invoke(equiv.app, ["sanity", "tiny-llama", "--protocol", str(path), "-q"])
    assert r.exit_code == 2 and "no_such_field" in r.output


def test_protocol_json_round_trips():
    p = PROFILES["paper-sentence"]
    assert EquivalenceProtocol(**json.loads(json.dumps(p.to_json()))) == p
    assert {f.name for f in dataclasses.fields(p)} == set(p.to_json())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(layer_matching="greedy"), "layer_matching must be one of"),
        (dict(representation="chars"), "representation must be one of"),
        (dict(ci="normal"), "ci must be one of"),
        (dict(heldout_fraction=1.0), "heldout_fraction"),
    ],
)
def test_compare_configs_reject_bad_values_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CompareConfig(**kwargs)


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

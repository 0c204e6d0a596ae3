"""The equivalence calibration scores the production paired decision on planted outcomes."""

from __future__ import annotations

import numpy as np

from structlens.calibration.equivalence import (
    HEADS_PER_LAYER,
    NULL_PASS,
    PROTOCOL,
    calibrate_decision,
    planted_outcomes,
)


def test_shared_outcomes_give_every_head_of_a_layer_one_fate():
    partner, null = planted_outcomes(0.5, 12, shared=True, seed=4)
    for x in (partner, null):
        assert x.shape == (12,)
        assert all(len(set(x[i : i + HEADS_PER_LAYER])) == 1 for i in range(0, 12, 3))
    a, b = planted_outcomes(0.5, 12, shared=False, seed=4)
    np.testing.assert_array_equal(a, planted_outcomes(0.5, 12, shared=False, seed=4)[0])


def test_exact_mcnemar_keeps_its_level_on_independent_heads():
    """The exact conditional test is conservative: at most α, within Monte-Carlo error."""
    r = calibrate_decision("null", NULL_PASS, 30, 400, unit="head", first_seed=7)
    assert not r.expected and r.rate_ci[0] <= PROTOCOL.null_alpha


def test_shared_fate_breaks_the_head_unit_and_the_clustered_test_keeps_its_level():
    """Seeds 7 on, apart from the document's scoring seeds."""
    independent = calibrate_decision("null", NULL_PASS, 12, 400, unit="head", first_seed=7)
    by_head = calibrate_decision("null", NULL_PASS, 12, 400, shared=True, unit="head", first_seed=7)
    assert PROTOCOL.null_unit == "layer"
    assert by_head.rate > independent.rate + 0.05
    for heads in (12, 30):
        for shared in (False, True):
            by_layer = calibrate_decision(
                "null", NULL_PASS, heads, 400, shared=shared, first_seed=7
            )
            assert by_layer.unit == "layer"
            assert by_layer.rate_ci[0] <= PROTOCOL.null_alpha < by_head.rate_ci[0]


def test_the_clustered_test_has_power_at_four_layers():
    """Unlike the sign-flip test over layers (smallest p-value 2 / 2**4 at 12 heads), the
    clustered McNemar test decides with four layers, and its power grows with the effect."""
    for heads in (12, 30):
        power = [
            calibrate_decision("alt", p, heads, 200, first_seed=7).rate for p in (0.5, 0.7, 0.9)
        ]
        assert power == sorted(power) and power[-1] > (0.5 if heads == 12 else 0.9)
    head = calibrate_decision("alt", 0.7, 30, 200, unit="head", first_seed=7)
    layer = calibrate_decision("alt", 0.7, 30, 200, first_seed=7)
    assert layer.rate > 0.5 * head.rate > 0


def test_the_group_rule_claims_strong_rows_and_holm_only_removes_claims():
    """Known answer: on 30 heads, partners passing 19 in 20 beat a null passing 3 in 10 in
    every row of most groups; with partners no better the adjusted rule never claims a row that the
    unadjusted one does not."""
    from structlens.calibration.equivalence import calibrate_group

    strong = calibrate_group("alternative", 0.95, 30, 40, first_seed=0)
    assert strong.expected and strong.all_rate >= 0.8 and strong.rate >= strong.all_rate
    null = calibrate_group("null", 0.3, 12, 200, first_seed=0)
    assert not null.expected and null.rate <= null.raw_rate and null.rows == 3


def test_planted_copies_are_a_s_implementations_in_b_s_basis():
    """Known structure: a copy in the same basis is A's group itself; a rotated copy has A's
    inner products between every pair of implementations (one orthogonal map) but not A's
    coordinates; each intervention changes the clean representation along one direction."""
    from structlens.calibration.equivalence import planted_implementations

    a, b = planted_implementations("copy, same basis", 0.0, 3)
    assert len(a) == PROTOCOL.congruity_top_k + 1
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    a, b = planted_implementations("copy, rotated basis", 0.0, 3)
    for x, y in zip(a, b, strict=True):
        for x2, y2 in zip(a, b, strict=True):
            np.testing.assert_allclose(x @ x2.T, y @ y2.T, atol=1e-9)
        assert not np.allclose(x, y)
    assert all(np.linalg.matrix_rank(x - a[0]) == 1 for x in a[1:])
    same = planted_implementations("private variables, rotated basis", 0.0, 3)
    for x, y in zip(same[1], b, strict=True):
        np.testing.assert_array_equal(x, y)


def test_the_private_share_is_the_share_of_variance_the_other_model_lacks():
    """With many prompts, B's representation at ε differs from √(1 − ε) times its ε = 0
    version (the variables it shares with A) by a share ε of its variance, and that part is
    uncorrelated with A's."""
    from structlens.calibration.equivalence import planted_implementations

    wide = PROTOCOL.replace(probe_prompts=20_000)
    family = "private variables, rotated basis"
    a0, b0 = planted_implementations(family, 0.0, 5, protocol=wide)
    for eps in (0.05, 0.2):
        a, b = planted_implementations(family, eps, 5, protocol=wide)
        private = b[0] - np.sqrt(1 - eps) * b0[0]
        assert abs(private.var(0).sum() / b[0].var(0).sum() - eps) < 0.01
        cross = (private - private.mean(0)).T @ (a[0] - a[0].mean(0)) / len(private)
        assert np.abs(cross).max() < 0.02


def test_congruity_never_calls_identical_groups_different_and_always_separates_distinct_ones():
    """Known answers: with B's group A's own, a within-model triple wins only where its two
    draws differ from each other and from the cross draw, p ≤ 0.4, so no estimate says
    different; where each model carries 30% of its variance in variables the other lacks,
    the within-model encodings always win and both estimates say different."""
    from structlens.calibration.equivalence import congruity_decision, planted_implementations

    for seed in range(3):
        same = congruity_decision(*planted_implementations("copy, same basis", 0.0, seed))
        assert [e.decision for e in same.estimates] == ["unidentified"] * 2
        assert max(same.mean_p_ab, same.mean_p_ba) <= 0.45
        apart = planted_implementations("private variables, rotated basis", 0.3, seed)
        assert [e.decision for e in congruity_decision(*apart).estimates] == ["different"] * 2


def test_congruity_decision_is_the_verdict_a_comparison_reaches(monkeypatch):
    """The calibration's decision on a comparison's own implementations (the tiny model
    against its rotated copy, recorded from the production run) is the production verdict,
    every statistic equal."""
    from _models import get_model
    from structlens.calibration.equivalence import congruity_decision
    from structlens.equivalence import patching, stages
    from structlens.equivalence.protocol import PROFILES
    from structlens.equivalence.scenarios import rotate_and_permute

    protocol = PROFILES["smoke"]
    model = get_model("tiny-llama")
    copy, _, _ = rotate_and_permute(model, seed=protocol.rotation_seed)
    seen: list[tuple] = []
    statistics = patching._congruity_statistics

    def record(*args):
        seen.append(args)
        return statistics(*args)

    monkeypatch.setattr(patching, "_congruity_statistics", record)
    probe = stages.probe_for(protocol, model, copy)
    production = stages._congruity(
        patching.congruity(model, copy, probe, protocol.compare_config())
    )
    group_a, group_b, inter_a, inter_b = seen[0][:4]
    for group, intervened in ((group_a, inter_a), (group_b, inter_b)):
        assert len(intervened) == len(group) - 1
        assert all(x is y for x, y in zip(intervened, group[1:], strict=True))
    ours = congruity_decision(group_a, group_b, protocol=protocol)
    assert production is not None
    assert ours.estimates == production.estimates

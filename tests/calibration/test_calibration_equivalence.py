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

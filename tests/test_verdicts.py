"""The shared verdict helpers: intervals that can stand as a Claim's ci, verdicts over settings,
and headline numbers that never carry a non-finite value."""

import math

from structlens.verdicts import Number, count_verdict, finite_ci


def test_finite_ci_keeps_only_ordered_finite_pairs():
    assert finite_ci([0.1, 0.4]) == (0.1, 0.4)
    assert finite_ci(("1", 2)) == (1.0, 2.0)
    for bad in (None, [], [1.0], [0.4, 0.1], [float("nan"), 1.0], ["nan", "inf"], [None, 1]):
        assert finite_ci(bad) is None


def test_count_verdict_is_reproduced_only_when_every_setting_holds():
    assert count_verdict(3, 3) == "reproduced"
    assert count_verdict(1, 3) == "partly"
    assert count_verdict(0, 3) == "not reproduced"
    assert count_verdict(0, 0) == "not reproduced"


def test_numbers_map_non_finite_values_and_intervals_to_none():
    n = Number.of(float("nan"), (0.0, math.inf), "", "x")
    assert n.value is None and n.ci is None
    assert Number.of(3, (1, 5)).to_json() == {"value": 3, "ci": [1.0, 5.0], "unit": "", "label": ""}

"""The Koopman IOI ordering counts a setting only where the intervals of |effect| separate."""

from __future__ import annotations

import pytest

from structlens.replication.koopman.render import _abs_interval, _ordering


def _setting(pca, modes, random):
    return {m: {"mean": sum(ci) / 2, "ci": ci} for m, ci in zip(
        ("pca", "modes", "random"), (pca, modes, random), strict=True
    )}  # fmt: skip


@pytest.mark.parametrize(
    ("ci", "want"),
    [([-0.5, -0.2], (0.2, 0.5)), ([0.1, 0.3], (0.1, 0.3)), ([-0.2, 0.4], (0.0, 0.4))],
)
def test_abs_interval(ci, want):
    assert _abs_interval(ci) == pytest.approx(want)


def test_separated_intervals_hold_overlapping_ones_tie():
    assert _ordering(_setting([-0.9, -0.7], [-0.5, -0.3], [-0.1, 0.05])) == "holds"
    # the point estimates are ordered, the intervals of PCA and modes overlap: a tie
    assert _ordering(_setting([-0.9, -0.4], [-0.5, -0.3], [-0.1, 0.05])) == "tie"
    # modes separate above PCA: the ordering is reversed
    assert _ordering(_setting([-0.3, -0.2], [-0.9, -0.7], [-0.1, 0.05])) == "reversed"

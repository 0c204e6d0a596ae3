"""The positive control of the κ_PR <= κ check passes with the production estimators and
fails when an estimator is wrong (so the check's "holds" means something)."""

from __future__ import annotations

import numpy as np

import structlens.stats.ranks as ranks


def test_the_control_passes_with_the_real_estimators():
    got = ranks.rank_ordering_control()
    assert got["passed"] is True
    np.testing.assert_allclose(got["entropy_effective_rank"], got["expected"][0], rtol=1e-12)
    np.testing.assert_allclose(got["participation_ratio"], got["expected"][1], rtol=1e-12)


def test_the_control_fails_on_a_broken_estimator(monkeypatch):
    # a participation ratio that returned the entropy rank would make PR <= erank trivially
    # true on every model; the control must catch it
    monkeypatch.setattr(ranks, "participation_ratio", ranks.entropy_effective_rank)
    assert ranks.rank_ordering_control()["passed"] is False

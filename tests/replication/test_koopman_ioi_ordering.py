"""The Koopman IOI ordering counts a setting only where the intervals of |effect| separate:
widening one interval until it overlaps its neighbour turns a held ordering into a tie and
moves the claim's verdict, on the Claim's fields."""

from __future__ import annotations

import numpy as np

from structlens.koopman.stages import AblationEffects
from structlens.koopman.verdicts import ioi_claim


def _setting(pca, modes, random):
    cis = [list(pca), list(modes), list(random)]
    return AblationEffects(
        layer=6, dictionary="pca8", positions="END", dimension=4, clean_metric=2.0,
        depth_to_readout=24, methods=["modes", "pca", "random"],
        mean=[sum(c) / 2 for c in (cis[1], cis[0], cis[2])], ci=[cis[1], cis[0], cis[2]],
        mode_eigenvalues=np.array([0.9]),
    )  # fmt: skip


def test_overlapping_intervals_tie_and_decide_nothing():
    held = {"L6/END": _setting([-0.9, -0.7], [-0.5, -0.3], [-0.1, 0.05])}
    c = ioi_claim(held)
    assert (c.verdict, c.ours, c.per_setting) == (
        "reproduced",
        "1 of 1 settings",
        {"L6/END": "holds"},
    )
    # PCA's interval widened into the modes': the point estimates keep their order
    tied = {"L6/END": _setting([-0.9, -0.4], [-0.5, -0.3], [-0.1, 0.05])}
    c = ioi_claim(tied)
    assert (c.verdict, c.per_setting) == ("unidentified", {"L6/END": "tie"})
    assert c.ci is None and c.ci_reason
    # modes separate above PCA: the ordering is reversed, which is evidence against it
    flipped = {"L6/END": _setting([-0.3, -0.2], [-0.9, -0.7], [-0.1, 0.05])}
    c = ioi_claim(flipped)
    assert (c.verdict, c.per_setting) == ("not reproduced", {"L6/END": "reversed"})

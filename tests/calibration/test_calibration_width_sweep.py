"""The planted width sweeps behind the wedge and κ̂ calibrations: their counts are the planted
curves, and the accumulators they fill hold the planted means."""

from __future__ import annotations

import math

import numpy as np
import pytest

from structlens.calibration import width_sweep as ws
from structlens.causal_dim.protocol import PROFILES

WIDTHS = (2304, 4608, 9216, 18432)


def test_planted_curves_pass_through_the_base_count_with_their_stated_shape():
    sat, k = ws.planted_counts("saturating", 3.0, WIDTHS, 47)
    assert sat[0] == 47 and k == pytest.approx(47 * 4)  # K m/(m + 3 m0) = 47 at m0
    assert np.allclose(sat, np.round(k * np.array(WIDTHS) / (np.array(WIDTHS) + 3 * 2304)))
    lin, k_lin = ws.planted_counts("power", 1.0, WIDTHS, 47)
    assert np.array_equal(lin, [47, 94, 188, 376]) and math.isinf(k_lin)
    for wedge in ws.WEDGES:
        counts, _ = ws.planted_counts("wedge", wedge, WIDTHS, 47)
        # N_repr grows by the span (8), N_causal by 8 / wedge up to rounding the counts
        assert 8 / (counts[-1] / counts[0]) == pytest.approx(wedge, rel=0.01)
    with pytest.raises(ValueError, match="growth"):
        ws.planted_counts("wedge", 0.5, WIDTHS, 47)


def test_the_accumulators_hold_the_planted_means_and_the_protocols_blocks():
    """Averaged over evaluation sets, each feature's AtP (FeatureStats.scores) is its planted
    mean |AtP| and its firing count the planted rate times the tokens."""
    protocol = PROFILES["smoke"]
    counts, _ = ws.planted_counts("power", 1.0, protocol.sweep_widths, 6)
    pops = ws._populations(counts, (9, 9), protocol)
    m = protocol.sweep_widths[0]
    n_tokens = (protocol.sae_eval_prompts + protocol.sae_eval_extra) * protocol.chunk_tokens
    atp, fires = np.zeros(m), np.zeros(m)
    sets = 300
    for seed in range(sets):
        st = ws.planted_stats(pops, seed=seed, protocol=protocol)[m]
        assert st.tokens.sum() == n_tokens and st.n_blocks == protocol.sweep_blocks
        a, f = st.scores()
        atp += a / sets
        fires += f / sets
    pop = pops[m]
    strong = pop.rates * n_tokens > 20  # enough firings for the average to settle
    assert np.allclose(atp[strong], pop.mean_atp[strong], rtol=0.15)
    assert np.allclose(fires[strong], pop.rates[strong] * n_tokens, rtol=0.15)
    assert np.all(fires[pop.rates == 0] == 0)  # dead features never fire
    # the planted causal features are the top n of the population, above the threshold 1
    assert np.sum(pop.mean_atp > 1) == counts[0]

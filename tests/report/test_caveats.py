import numpy as np

from structlens.analyze.causal import _fit_at_bound
from structlens.causal_dim import fit_saturating


def test_a_saturating_sweep_is_identified():
    m = np.array([512.0, 1024, 2048, 4096, 8192, 16384])
    n = 300 * m / (m + 2000)  # Michaelis-Menten with K = 300 inside the range
    fit = fit_saturating(m, n, "michaelis_menten")
    assert abs(fit["K"] - 300) < 1
    assert _fit_at_bound(fit, m, n) == ""


def test_a_flat_sweep_pins_k_at_the_largest_count():
    m = np.array([512.0, 1024, 2048, 4096])
    n = np.array([12.0, 12, 12, 12])  # no growth: the fit can only cap the count
    fit = fit_saturating(m, n, "michaelis_menten")
    assert "at the lower edge" in _fit_at_bound(fit, m, n)


def test_a_linear_sweep_is_unidentified():
    m = np.array([512.0, 1024, 2048, 4096])
    n = m / 8  # still proportional to width: no saturation in sight
    fit = fit_saturating(m, n, "michaelis_menten")
    assert "beyond the largest width" in _fit_at_bound(fit, m, n)

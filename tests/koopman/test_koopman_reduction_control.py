"""The distance behind the reduction certificates agrees with balanced truncation's own error
and obeys the triangle inequality the positive control of the bound check rests on."""

from __future__ import annotations

import numpy as np

from structlens.koopman.reduction import (
    balanced_truncation,
    markov_parameters,
    operator_distance,
    toeplitz_operator,
)


def _system(rng, n=10, m=3, p=4):
    A = rng.normal(size=(n, n))
    A *= 0.8 / np.max(np.abs(np.linalg.eigvals(A)))
    return A, rng.normal(size=(n, m)), rng.normal(size=(p, n))


def test_operator_distance_is_the_truncation_error(rng):
    A, B, C = _system(rng)
    red = balanced_truncation(A, B, C, 3, 5)
    got = operator_distance((A, B, C), (red.A_r, red.B_r, red.C_r), 5)
    np.testing.assert_allclose(got, red.error, rtol=1e-12)
    # an independent computation: the largest singular value of the Toeplitz difference
    T = toeplitz_operator(markov_parameters(A, B, C, 5))
    Tr = toeplitz_operator(markov_parameters(red.A_r, red.B_r, red.C_r, 5))
    np.testing.assert_allclose(got, np.linalg.svd(T - Tr, compute_uv=False)[0], rtol=1e-12)


def test_distance_is_a_metric_on_realisations(rng):
    a, b, c = _system(rng), _system(rng), _system(rng)
    d = lambda x, y: operator_distance(x, y, 4)  # noqa: E731
    assert d(a, a) == 0.0
    np.testing.assert_allclose(d(a, b), d(b, a), rtol=1e-12)
    assert d(a, c) <= d(a, b) + d(b, c) + 1e-12

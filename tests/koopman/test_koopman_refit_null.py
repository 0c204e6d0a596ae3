"""The between-model spectral test whose null refits each half's dictionary: the observed
distance is the one of the two models' own fits, moved spectra are found, the null holds
the fitted basis's own variability, and bad input says what to do."""

from __future__ import annotations

import numpy as np
import pytest

from structlens.calibration.koopman import PROTOCOL, linear_rows
from structlens.koopman import IdentityDictionary, PCADictionary
from structlens.koopman.convergence import refit_distance_test, spectral_distance_test
from structlens.koopman.stages import compare_spectra, row_blocks
from structlens.stats.matching import bottleneck_distance

CFG = PROTOCOL.edmdc(split_half=True)
LAM = np.array([0.9, 0.6, 0.3, -0.4])


def rows(shift=0.0, seed=1, B=None):
    A = np.diag(LAM + shift * (np.arange(4) == 1))
    r = linear_rows(A, seed=seed, B=B, n_prompts=128)
    return r, (r.X, r.U, r.Y, r.prompt_ids)


def test_the_observed_distance_is_between_the_two_models_own_fits():
    B = 0.3 * np.random.default_rng(0).standard_normal((4, 2))
    (ra, a), (rb, b) = rows(seed=1, B=B), rows(seed=2, B=B)
    t = refit_distance_test(a, b, lambda X: IdentityDictionary().fit(X), CFG, n_resamples=5)
    blocks = [row_blocks(PROTOCOL, r, IdentityDictionary().fit(r.X)) for r in (ra, rb)]
    frozen = spectral_distance_test(*blocks, CFG, n_resamples=5)
    assert t.distance == pytest.approx(frozen.distance, rel=1e-9)
    assert t.n_samples == frozen.n_samples and len(t.null) == 5


def test_a_moved_eigenvalue_is_found_and_one_system_is_not():
    B = 0.3 * np.random.default_rng(0).standard_normal((4, 2))
    fit = lambda X: PCADictionary(4).fit(X)  # noqa: E731  (a rotation of the states)
    moved = refit_distance_test(rows(seed=1, B=B)[1], rows(0.3, 2, B)[1], fit, CFG, n_resamples=30)
    assert moved.p_value == pytest.approx(1 / 31)
    same = refit_distance_test(rows(seed=1, B=B)[1], rows(0.0, 2, B)[1], fit, CFG, n_resamples=30)
    assert same.p_value > 0.05


def test_the_refitted_null_holds_the_basis_variability():
    """Halves lifted by one frozen PCA differ less than halves that refit it: the refitting
    null is wider where a fitted basis moves with the sample."""
    _, a = rows(seed=3)
    fit = lambda X: PCADictionary(2).fit(X)  # noqa: E731
    refit = refit_distance_test(a, a, fit, CFG, n_resamples=40, seed=1)
    assert refit.distance == 0.0 and np.all(refit.null >= 0)
    r, _ = rows(seed=3)
    frozen = spectral_distance_test(*[row_blocks(PROTOCOL, r, fit(r.X))] * 2, CFG, n_resamples=40)
    assert np.median(refit.null) > np.median(frozen.null)


def test_compare_spectra_names_its_lift_and_rejects_others():
    (ra, _), (rb, _) = rows(seed=1), rows(0.3, 2)
    c = compare_spectra(PROTOCOL, ra, rb, pair="a vs b", kind="seeds", n_resamples=10)
    assert c.test == "split-half null, identity" and c.n_resamples == 10
    assert c.distance == pytest.approx(
        bottleneck_distance(
            *[np.linalg.eigvals(np.diag(LAM + s * (np.arange(4) == 1))) for s in (0, 0.3)]
        ),
        abs=0.05,
    )
    with pytest.raises(ValueError, match="identity, pca"):
        compare_spectra(PROTOCOL, ra, rb, pair="a", kind="seeds", n_resamples=2, dictionary="rff")


def test_too_few_blocks_or_unequal_lifts_say_what_to_do():
    _, a = rows(seed=1)
    one_prompt = tuple(x[:16] for x in a)
    with pytest.raises(ValueError, match="more prompts"):
        refit_distance_test(one_prompt, a, lambda X: PCADictionary(2).fit(X), CFG, n_resamples=2)
    sizes = iter([2, 3])
    with pytest.raises(ValueError, match="equal size"):
        refit_distance_test(a, a, lambda X: PCADictionary(next(sizes)).fit(X), CFG, n_resamples=2)

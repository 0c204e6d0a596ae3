import numpy as np
import pytest
import torch
import torch.nn.functional as F

from structlens.equivalence import (
    EncodingConfig,
    PointTestResult,
    accumulated_representation,
    bootstrap_point_test,
    encoding_score,
    kl_from_logits,
    point_test,
    rank_heads,
    selectivity_test,
)
from structlens.equivalence.encoding import supported_width


def test_accumulated_representation_last_and_mean_with_padding(rng):
    resid = [rng.normal(size=(3, 5, 4)) for _ in range(3)]
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 1, 1, 1]], dtype=bool)
    last = accumulated_representation(resid, "last", mask)
    assert last.shape == (3, 12)
    for b, pos in enumerate([4, 2, 4]):
        np.testing.assert_array_equal(last[b], np.concatenate([r[b, pos] for r in resid]))
    mean = accumulated_representation(np.stack(resid), "mean", mask)
    for b in range(3):
        want = np.concatenate([r[b, mask[b]].mean(0) for r in resid])
        np.testing.assert_allclose(mean[b], want)


def test_kl_from_logits_matches_torch_reference(rng):
    clean, patched = rng.normal(size=(6, 11)) * 3, rng.normal(size=(6, 11)) * 3
    want = F.kl_div(
        F.log_softmax(torch.tensor(patched), -1),
        F.softmax(torch.tensor(clean), -1),
        reduction="batchmean",
    ).item()
    assert kl_from_logits(clean, patched) == pytest.approx(want, abs=1e-12)
    assert kl_from_logits(clean, clean + 4.0) == pytest.approx(0.0, abs=1e-12)


def test_rank_heads():
    kl = np.array([[0.1, 0.5], [0.5, 0.0], [0.9, 0.2]])
    np.testing.assert_array_equal(rank_heads(kl, 3), [[2, 0], [0, 1], [1, 0]])
    assert rank_heads(kl).shape == (6, 2)


def _implementations(rng, latent, k, noise):
    """k implementations of one algorithm: random linear read-outs of a shared latent."""
    return [
        latent @ rng.normal(size=(latent.shape[1], 12))
        + noise * rng.normal(size=(latent.shape[0], 12))
        for _ in range(k)
    ]


CFG = EncodingConfig(n_folds=3)


def test_point_test_separates_different_algorithms(rng):
    n = 80
    la, lb = rng.normal(size=(n, 3)), rng.normal(size=(n, 3))
    g1 = _implementations(rng, la, 4, 0.1)
    g2 = _implementations(rng, lb, 4, 0.1)
    diff = bootstrap_point_test(g1, g2, n=20, straps=10, seed=0, config=CFG)
    assert diff.decision_rate == 1.0 and np.all(diff.p_values == 1.0)
    same = bootstrap_point_test(g1, g1, n=20, straps=10, seed=0, allow_same=False, config=CFG)
    assert same.decision_rate == 0.0
    p, decided = point_test(g1, g2, n=20, seed=0, config=CFG)
    assert p == 1.0 and decided
    assert isinstance(diff, PointTestResult) and diff.p_values.shape == (10,)


def test_selectivity_intervention_that_destroys_the_mechanism(rng):
    n = 80
    latent = rng.normal(size=(n, 3))
    base = _implementations(rng, latent, 3, 0.05)
    intervened = [rng.normal(size=(n, 12)) for _ in base]
    targets = _implementations(rng, latent, 5, 0.05)
    res = selectivity_test(base, intervened, targets, seed=1, config=CFG)
    assert res.score == 1.0 and res.n_targets == 5
    i, t = res.pair_index[0], targets[0]
    assert res.base_scores[0] == pytest.approx(encoding_score(base[i], t, CFG))
    # an intervention that changes nothing is never selective
    null = selectivity_test(base, base, targets, seed=1, config=CFG)
    assert null.score == 0.0


def test_point_test_p_values_equal_fresh_encoding_scores(rng):
    # the point test factorises each predictor once for all its targets; its p must be the
    # share of wins computed with independent encoding_score calls on the same draws
    n, trials = 40, 15
    latent = rng.normal(size=(n, 3))
    g1 = _implementations(rng, latent, 3, 0.5)
    g2 = _implementations(rng, latent, 3, 0.5)
    res = bootstrap_point_test(g1, g2, n=trials, straps=3, seed=4, config=CFG)
    draw = np.random.default_rng(4)
    for p in res.p_values:
        wins = 0
        for _ in range(trials):
            i, j, k = (int(draw.integers(3)) for _ in range(3))
            wins += encoding_score(g1[i], g1[j], CFG) > encoding_score(g1[i], g2[k], CFG)
        assert p == wins / trials


def test_wide_accumulated_representations_are_reduced_and_the_results_say_so(rng):
    # accumulated residual streams are much wider than a probe set has prompts
    n, width = 60, 300
    latent_a, latent_b = rng.normal(size=(n, 3)), rng.normal(size=(n, 3))

    def wide(latent, k):
        return [
            latent @ rng.normal(size=(3, width)) + 0.05 * rng.normal(size=(n, width))
            for _ in range(k)
        ]

    g1, g2 = wide(latent_a, 3), wide(latent_b, 3)
    kept = supported_width(n, CFG)
    pt = bootstrap_point_test(g1, g2, n=10, straps=3, seed=0, config=CFG)
    sel = selectivity_test(g1, [rng.normal(size=(n, width)) for _ in g1], g1, config=CFG)
    for res in (pt, sel):
        assert res.reduced_to == kept < width
        assert f"{width} features" in res.caveat
    # the reduction keeps what the implementations share: the groups still separate
    assert pt.decision_rate == 1.0 and sel.score == 1.0
    narrow = bootstrap_point_test(
        [g[:, :kept] for g in g1], [g[:, :kept] for g in g2], n=10, straps=3, config=CFG
    )
    assert narrow.reduced_to is None and narrow.caveat is None


def test_uniform_r2_calls_a_rotated_exact_copy_different_and_weighted_r2_does_not(rng):
    """The sanity copy's failure on planted arrays: implementations whose variance sits in a
    few massive coordinates, against the same implementations in a rotated basis.  Uniform
    R² rewards encoding the rotated copy (every rotated coordinate carries massive signal)
    and penalises encoding the original basis (most coordinates are noise), so B's group
    wins within itself and the point test calls the exact copy different (B → A);
    variance-weighted R² is blind to the rotation and finds no difference."""
    from scipy.stats import ortho_group

    n, d = 80, 24
    latent = rng.normal(size=(n, 3))
    w = 0.1 * rng.normal(size=(3, d))
    w[:, :3] *= 300.0  # three massive coordinates
    group_a = [latent @ w + rng.normal(size=(n, d)) for _ in range(3)]
    q = ortho_group.rvs(d, random_state=1)
    group_b = [g @ q for g in group_a]  # the same implementations, rotated
    rates = {}
    for how in ("uniform_average", "variance_weighted"):
        cfg = EncodingConfig(multioutput=how)
        ab = bootstrap_point_test(group_a, group_b, n=20, straps=20, seed=0, config=cfg)
        ba = bootstrap_point_test(group_b, group_a, n=20, straps=20, seed=0, config=cfg)
        rates[how] = (ab.decision_rate, ba.decision_rate)
    assert rates["uniform_average"][1] > 0.5  # "different": a false alarm on an exact copy
    assert rates["uniform_average"][0] == 0.0  # ...in one direction only
    assert rates["variance_weighted"] == (0.0, 0.0)

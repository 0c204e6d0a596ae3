"""The width sweep's resampling unit is the prompt, and distinct counts get a jackknife.

Planted data: tokens of one prompt share a random effect, so a token-level bootstrap (the old
``t mod n_blocks`` blocks, every block holding tokens of every prompt) is too narrow, while
whole-prompt blocks cover at about the nominal rate.  N_repr (a count of distinct features
that fire) is biased low in a bootstrap resample (fewer distinct prompts), so its percentile
interval misses its own point estimate; the delete-one-block jackknife does not.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from structlens.causal_dim import FeatureStats, WidthSweepConfig, analyze_width_sweep
from structlens.causal_dim.model import token_prompt_ids
from structlens.causal_dim.sweep import block_bootstrap_weights, distinct_count_jackknife
from structlens.sae.models import ReLUSAE


def _identity_sae(m: int) -> ReLUSAE:
    """``f = relu(x)`` and ``W_dec = I``: with ``grads = −1`` a feature's AtP is its input."""
    sae = ReLUSAE(m, m, dtype=torch.float64)
    with torch.no_grad():
        sae.W_enc_t.copy_(torch.eye(m, dtype=torch.float64))
        sae.W_dec.copy_(torch.eye(m, dtype=torch.float64))
    return sae


def _percentile(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    a = 100 * (1 - level) / 2
    lo, hi = np.percentile(samples, [a, 100 - a], axis=0)
    return lo, hi


def test_prompt_blocks_cover_a_prompt_correlated_mean_where_token_blocks_do_not():
    rng = np.random.default_rng(0)
    n_prompts, n_tokens, n_blocks, mu = 30, 20, 15, 10.0
    sae = _identity_sae(1)
    prompt_of = np.repeat(np.arange(n_prompts), n_tokens)
    covered = {"prompt": 0, "token": 0}
    n_sets = 200
    for _ in range(n_sets):
        # each prompt shifts all its tokens by a shared effect (sd 2) on top of token noise
        x = mu + rng.normal(0, 2.0, n_prompts)[prompt_of] + rng.normal(0, 1.0, prompt_of.size)
        acts = torch.from_numpy(x[:, None])
        grads = -torch.ones_like(acts)
        for unit, ids in (("prompt", prompt_of), ("token", np.arange(prompt_of.size))):
            st = FeatureStats(1, n_blocks)
            st.update(sae, acts, grads, ids)
            boot = [st.scores(w)[0][0] for w in block_bootstrap_weights(st.tokens, 200, rng)]
            lo, hi = _percentile(np.asarray(boot))
            covered[unit] += lo <= mu <= hi
    rate = {k: v / n_sets for k, v in covered.items()}
    # 15 whole-prompt blocks: about nominal (a percentile bootstrap over 15 units runs a
    # little narrow); token blocks ignore the shared effect and cover far less often
    assert rate["prompt"] >= 0.85, rate
    assert rate["token"] <= 0.6, rate


def _firing_draw(rng, base, topic, n_prompts, n_tokens):
    """Per-token firing ``[P·T, m]`` (bool): feature i fires with probability
    ``base_i · g_{p, topic_i}`` on a token of prompt p (``g`` a prompt × topic effect)."""
    g = rng.gamma(0.5, 2.0, (n_prompts, topic.max() + 1))
    p = np.clip(base[None, :] * g[:, topic], 0, 1)  # [P, m]
    return rng.random((n_prompts, n_tokens, base.size)) < p[:, None, :]


def test_distinct_count_jackknife_contains_its_point_and_covers_where_bootstrap_does_not():
    rng = np.random.default_rng(1)
    n_prompts, n_tokens, n_blocks = 40, 10, 20
    widths = (100, 400)
    planted = {}
    for m in widths:
        r = np.random.default_rng(m)
        planted[m] = (np.exp(r.normal(-5.5, 1.5, m)), r.integers(0, 8, m))
    # the estimand: the expected N_repr (and its growth) on an evaluation set of 40 prompts
    draws = []
    for _ in range(400):
        n = [_firing_draw(rng, *planted[m], n_prompts, n_tokens).any((0, 1)).sum() for m in widths]
        draws.append([n[0], n[1], n[1] / n[0]])
    truth = np.mean(draws, axis=0)
    saes = {m: _identity_sae(m) for m in widths}
    cfg = WidthSweepConfig(n_bootstrap=0)
    prompt_of = np.repeat(np.arange(n_prompts), n_tokens)
    n_sets, covered, boot_has_point = 200, np.zeros(3), np.zeros(3)
    for _ in range(n_sets):
        stats = []
        for m in widths:
            fires = _firing_draw(rng, *planted[m], n_prompts, n_tokens).reshape(-1, m)
            acts = torch.from_numpy(fires.astype(np.float64))
            st = FeatureStats(m, n_blocks)
            st.update(saes[m], acts, -torch.ones_like(acts), prompt_of)
            stats.append(st)
        jack = distinct_count_jackknife(stats, cfg)
        n_repr = np.array([np.sum(s.scores()[1] >= 1) for s in stats], dtype=np.float64)
        point = np.r_[n_repr, n_repr[1] / n_repr[0]]
        lo = np.r_[jack["n_repr_ci"][0], jack["n_repr_growth_ci"][0][1]]
        hi = np.r_[jack["n_repr_ci"][1], jack["n_repr_growth_ci"][1][1]]
        assert not jack["reason"]
        assert np.all(lo <= point) and np.all(point <= hi)  # its own point, always
        covered += (lo <= truth) & (truth <= hi)
        boot = []
        for w in block_bootstrap_weights(stats[0].tokens, 100, rng):
            r = np.array([np.sum(s.scores(w)[1] >= 1) for s in stats], dtype=np.float64)
            boot.append(np.r_[r, r[1] / r[0]])
        b_lo, b_hi = _percentile(np.asarray(boot))
        boot_has_point += (b_lo <= point) & (point <= b_hi)
    rate = covered / n_sets
    assert np.all(rate >= 0.88), rate  # nominal 95%
    # the resampled counts sit below the observed ones: the percentile interval of the counts
    # almost never even holds its own point estimate
    assert np.all(boot_has_point[:2] / n_sets <= 0.2), boot_has_point / n_sets


def test_sweep_result_uses_the_jackknife_for_distinct_counts_and_resamples_filled_blocks():
    rng = np.random.default_rng(2)
    n_prompts, n_tokens = 12, 8
    prompt_of = np.repeat(np.arange(n_prompts), n_tokens)
    stats = {}
    for m in (100, 200, 400):
        base, topic = np.exp(rng.normal(-3.5, 1.0, m)), rng.integers(0, 4, m)
        fires = _firing_draw(rng, base, topic, n_prompts, n_tokens).reshape(-1, m)
        acts = torch.from_numpy(fires * rng.uniform(0.5, 2.0, fires.shape))
        grads = -torch.ones_like(acts)
        st = FeatureStats(m, 64)  # more blocks than prompts: 52 blocks stay empty
        st.update(_identity_sae(m), acts, grads, prompt_of)
        stats[m] = st
    res = analyze_width_sweep(stats, WidthSweepConfig(n_bootstrap=40))
    assert res.n_blocks_filled == n_prompts and res.n_prompts == n_prompts
    assert np.all(res.n_repr_ci[0] <= res.n_repr) and np.all(res.n_repr <= res.n_repr_ci[1])
    assert np.all(res.n_repr_growth_ci[0] <= res.n_repr_growth)
    assert np.all(res.n_repr_growth <= res.n_repr_growth_ci[1])
    assert "delete-one-block jackknife over 12 prompt blocks" in res.distinct_ci_method
    assert "12 filled prompt blocks" in res.definitions["bootstrap"]
    # only the filled blocks are drawn: every bootstrap row has 12 draws on them
    w = block_bootstrap_weights(stats[100].tokens, 5, np.random.default_rng(0))
    assert w.shape == (5, 64) and np.all(w.sum(1) == 12)
    assert np.all(w[:, stats[100].tokens.numpy() == 0] == 0)


def test_one_block_gives_no_interval_and_says_why():
    m = 100
    acts = torch.rand(40, m, dtype=torch.float64)
    stats = {}
    for width in (m, 2 * m):
        st = FeatureStats(width, 4)
        a = torch.cat([acts, acts], 1) if width > m else acts
        st.update(_identity_sae(width), a, -torch.ones_like(a), np.zeros(40, dtype=int))
        stats[width] = st
    res = analyze_width_sweep(stats, WidthSweepConfig(n_bootstrap=10))
    assert res.n_blocks_filled == 1 and "at least 2" in res.distinct_ci_reason
    assert np.all(np.isnan(res.n_repr_ci)) and np.all(np.isnan(res.wedge_ci))
    assert np.all(np.isnan(res.n_causal_ci))  # no bootstrap over a single unit either


def test_feature_stats_refuses_missing_or_misshaped_prompt_ids():
    sae = _identity_sae(3)
    acts = torch.rand(6, 3, dtype=torch.float64)
    grads = -torch.ones_like(acts)
    st = FeatureStats(3, 4)
    with pytest.raises(ValueError, match="needs the prompt id of every token"):
        st.update(sae, acts, grads)
    with pytest.raises(ValueError, match=r"shape \(6,\)"):
        st.update(sae, acts, grads, torch.arange(5))
    with pytest.raises(ValueError, match=r"shape \(6,\)"):
        st.update(sae, acts, grads, torch.zeros(6, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="integers"):
        st.update(sae, acts, grads, torch.zeros(6))
    with pytest.raises(ValueError, match="non-negative"):
        st.update(sae, acts, grads, -torch.ones(6, dtype=torch.long))
    assert st.n_seen == 0 and float(st.tokens.sum()) == 0  # nothing was added
    st.update(sae, acts, grads, [0, 0, 1, 1, 5, 5])
    # block = prompt id mod n_blocks: prompts 1 and 5 share block 1
    assert st.tokens.tolist() == [2.0, 4.0, 0.0, 0.0] and st.n_prompts == 3
    one = FeatureStats(3, 1)
    one.update(sae, acts, grads)  # a single block resamples nothing: no unit needed
    assert one.tokens.tolist() == [6.0]


def test_token_prompt_ids_follow_the_rows_of_residual_grads():
    prompts = [[1, 2, 3, 4], [5, 6], [7, 8, 9], [10]]
    ids = token_prompt_ids(prompts, batch_size=3)
    # position 0 is dropped and pads carry no rows: prompt-major, len − 1 rows each
    assert [t.tolist() for t in ids] == [[0, 0, 0, 1, 2, 2], []]
    keep = token_prompt_ids(prompts, batch_size=2, skip_first=False, offset=100)
    assert [t.tolist() for t in keep] == [[100] * 4 + [101] * 2, [102] * 3 + [103]]


def test_sweep_analysis_needs_prompt_ids_aligned_with_the_batches():
    from structlens.causal_dim.sweep import sweep_analysis

    saes = {m: _identity_sae(m) for m in (100, 200)}
    acts = torch.rand(10, 100, dtype=torch.float64)
    batches = [(acts, -torch.ones_like(acts))]
    with pytest.raises(ValueError, match="needs prompt_ids"):
        sweep_analysis(saes, batches)
    with pytest.raises(ValueError, match="1 batches|2 batches"):
        sweep_analysis(saes, batches, prompt_ids=[torch.arange(5), torch.arange(5)])


def test_counts_under_many_weights_at_once_equal_the_counts_one_weight_at_a_time():
    from structlens.causal_dim.sweep import _counts_batch, calibrate_epsilon

    rng = np.random.default_rng(3)
    stats = []
    for m in (50, 100):
        st = FeatureStats(m, 6)
        st.abs_atp = torch.from_numpy(rng.exponential(1.0, (6, m)))
        st.fires = torch.from_numpy(rng.poisson(0.5, (6, m)).astype(np.float64))
        st.tokens = torch.full((6,), 10.0, dtype=torch.float64)
        stats.append(st)
    cfg = WidthSweepConfig(n_bootstrap=0)
    weights = block_bootstrap_weights(stats[0].tokens, 7, rng)
    n_repr, n_causal, eps = _counts_batch(stats, cfg, weights)
    for i, w in enumerate(weights):
        atp0, _ = stats[0].scores(w)
        e = calibrate_epsilon(atp0, 1 - cfg.percentile / 100)
        assert eps[i] == pytest.approx(e, rel=1e-12)  # one matrix product, not many: round-off
        for j, st in enumerate(stats):
            a, c = st.scores(w)
            assert n_causal[i, j] == np.sum(a > e) and n_repr[i, j] == np.sum(c >= 1)


def test_the_wedge_interval_has_its_sampling_spread_where_a_delete_one_jackknife_does_not():
    """Planted sweeps (the calibration's populations, one population, fresh evaluation sets):
    the wedge's delete-half standard error is near the spread of the wedge over evaluation
    sets, while the delete-one-block jackknife it replaced overstates it more than twofold
    (N_causal counts means above a sample quantile)."""
    from structlens.calibration import width_sweep as ws
    from structlens.causal_dim.sweep import _counts, _distinct
    from structlens.stats.intervals import group_jackknife

    protocol = ws.PROTOCOL
    counts, _ = ws.planted_counts("wedge", 2.0, protocol.sweep_widths, 47)
    pops = ws._populations(counts, (1, 200), protocol)
    cfg = protocol.width_sweep(None, n_bootstrap=0)
    wedges, half_se, one_se = [], [], []
    for seed in range(24):
        stats = ws.planted_stats(pops, seed=seed, protocol=protocol)
        res = analyze_width_sweep(stats, cfg)
        wedges.append(res.wedge)
        half_se.append(res.wedge_se)
        ordered = [stats[m] for m in sorted(stats)]
        reps = []
        for b in np.flatnonzero(ordered[0].tokens.numpy() > 0):
            w = np.ones(ordered[0].n_blocks)
            w[b] = 0.0
            reps.append(_distinct(*_counts(ordered, cfg, w)[:2])[2])
        one_se.append(float(group_jackknife(res.wedge, np.asarray(reps)).se))
    spread = np.std(wedges, ddof=1)
    assert 0.6 <= np.mean(half_se) / spread <= 1.6, (np.mean(half_se), spread)
    assert np.mean(one_se) / spread >= 1.8, (np.mean(one_se), spread)
    assert "delete-half jackknife (100 random halves of 48" in res.wedge_ci_method

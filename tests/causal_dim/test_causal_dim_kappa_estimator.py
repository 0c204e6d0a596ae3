"""κ by the estimator protocol: KappaEstimator against kappa_from_grams, the statistics'
in-place merge and pickling, and the config's validation."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
import torch

from structlens.causal_dim import (
    CausalDimension,
    EJOPAccumulator,
    JacobianConfig,
    KappaConfig,
    KappaEstimator,
)
from structlens.causal_dim.kappa import kappa_from_grams
from structlens.errors import InputError

GEN = torch.Generator().manual_seed(0)
W1 = torch.randn(9, 5, generator=GEN, dtype=torch.float64)
W2 = torch.randn(7, 9, generator=GEN, dtype=torch.float64)
H = torch.randn(12, 5, generator=GEN, dtype=torch.float64)


def f(h: torch.Tensor) -> torch.Tensor:
    return torch.tanh(h @ W1.T) @ W2.T


def g(h: torch.Tensor) -> torch.Tensor:  # a second "prompt" with its own map
    return torch.sin(h @ W1.T) @ W2.T


def _gram(fn, h: torch.Tensor, output: str) -> torch.Tensor:
    est = CausalDimension(JacobianConfig(output=output, n_groups=1)).partial_fit((fn, h))
    return est.statistics.sums[0]


def test_estimator_equals_kappa_from_grams_when_every_vector_is_its_own_group():
    chunks = [(f, H[:6]), (g, H[6:])]
    cfg = KappaConfig(output="log_probs", n_groups=12, ci=0.9, unit="vector")
    res = KappaEstimator(cfg).fit(chunks)
    grams = [_gram(fn, hs[i : i + 1], "log_probs") for fn, hs in chunks for i in range(6)]
    ref = kappa_from_grams(torch.stack(grams), ci=0.9)
    for field in dataclasses.fields(ref):
        a, b = getattr(res, field.name), getattr(ref, field.name)
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)
        else:
            assert a == b, field.name
    assert res.ci_method == (
        "delete-one jackknife, bias-corrected, its standard error a jackknife of it over 12 "
        "blocks of groups, t interval (11 df)"
    )
    assert res.n_vectors == 12 and res.erank_ci[0] < res.erank < res.erank_ci[1]


def test_estimator_groups_by_chunk_by_default_as_kappa_from_grams_groups():
    """A chunk's vectors share its map (one prompt's context): one jackknife group each."""
    chunks = [(f, H[:4]), (g, H[4:8]), (f, H[8:])]
    res = KappaEstimator(KappaConfig(output="log_probs", n_groups=12, ci=0.9)).fit(chunks)
    grams = [_gram(fn, hs[i : i + 1], "log_probs") for fn, hs in chunks for i in range(4)]
    ref = kappa_from_grams(torch.stack(grams), ci=0.9, groups=[0] * 4 + [1] * 4 + [2] * 4)
    for field in dataclasses.fields(ref):
        a, b = getattr(res, field.name), getattr(ref, field.name)
        if isinstance(a, np.ndarray):
            np.testing.assert_allclose(a, b, rtol=1e-12)
        elif isinstance(a, float):
            assert a == pytest.approx(b, rel=1e-12), field.name
        elif isinstance(a, list):
            assert a == pytest.approx(b, rel=1e-12), field.name
        else:
            assert a == b, field.name
    assert res.n_groups == 3 and res.n_vectors == 12
    assert res.ci_method.startswith("delete-a-group jackknife over 3 groups")
    per_vector = kappa_from_grams(torch.stack(grams), ci=0.9)
    assert per_vector.n_groups == 12 and per_vector.erank_plugin == pytest.approx(res.erank_plugin)
    with pytest.raises(InputError, match="one group"):
        kappa_from_grams(torch.stack(grams), groups=[0] * 12)
    with pytest.raises(InputError, match="one per vector"):
        kappa_from_grams(torch.stack(grams), groups=[0, 1])


def test_statistics_merge_in_place_pickle_and_equal_one_pass():
    cfg = KappaConfig(n_groups=4, unit="vector")
    one_pass = KappaEstimator(cfg).partial_fit((f, H)).statistics
    # each worker deals its vectors round-robin over all 4 groups (8 as pairs, 4 singly)
    a = KappaEstimator(cfg).partial_fit((f, H[:8])).statistics
    b = KappaEstimator(cfg).partial_fit((f, H[8:])).statistics
    b_sums = b.sums.clone()
    merged = a.merge(b)
    assert merged is a and merged.n == 12 and merged.sums.dtype == torch.float64
    torch.testing.assert_close(b.sums, b_sums, rtol=0, atol=0)  # other is left as it was
    torch.testing.assert_close(merged.sigma(), one_pass.sigma(), rtol=1e-12, atol=1e-12)
    restored = pickle.loads(pickle.dumps(merged))
    est = KappaEstimator(cfg)
    res = est.fit_from_statistics(merged)
    again = est.fit_from_statistics(restored)
    assert (again.erank, again.erank_ci) == (res.erank, res.erank_ci)
    assert res.n_vectors == 12
    assert res.ci_method.startswith("delete-a-group jackknife over 4 groups")


def test_causal_dimension_speaks_the_protocol():
    est = CausalDimension(JacobianConfig(n_groups=3))
    assert est.partial_fit((f, H[:4])) is est
    est.partial_fit((f, [H[4:8], H[8:]]))
    assert est.statistics is not None and est.statistics.n == 12
    streamed = est.fit_from_statistics(est.statistics)
    # fit starts from fresh statistics, so repeating it gives the same result
    assert est.fit(f, H).erank == est.fit(f, H).erank
    assert est.statistics.n == 12
    np.testing.assert_allclose(streamed.sigma, est.fit(f, H).sigma, rtol=1e-12)


def test_from_grams_leaves_read_only_input_alone():
    grams = np.stack([np.diag([1.0, 2.0, 0.0])] * 3)
    grams.setflags(write=False)
    acc = EJOPAccumulator.from_grams(grams)
    acc.update(torch.eye(3, dtype=torch.float64), 1)
    assert acc.n == 4 and grams[0, 0, 0] == 1.0
    assert kappa_from_grams(grams).erank_se == pytest.approx(0.0, abs=1e-12)


def test_bad_config_and_input():
    with pytest.raises(InputError, match="n_groups"):
        KappaConfig(n_groups=1)
    with pytest.raises(InputError, match="ci"):
        KappaConfig(ci=1.0)
    with pytest.raises(InputError, match="output"):
        KappaConfig(output="logits")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="max_rows"):
        KappaConfig(max_rows=0)
    est = KappaEstimator()
    with pytest.raises(InputError, match="no chunks"):
        est.fit([])
    with pytest.raises(InputError, match="pair"):
        est.partial_fit(H)  # type: ignore[arg-type]
    single = KappaEstimator(KappaConfig(n_groups=2)).partial_fit((f, H[:1])).statistics
    with pytest.raises(InputError, match="at least 2 groups"):
        est.fit_from_statistics(single)
    with pytest.raises(InputError, match="same d and n_groups"):
        single.merge(EJOPAccumulator(5, 3))

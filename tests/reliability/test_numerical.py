"""API-level numerical inputs: a statistic that is undefined or meaningless for its input
raises (or is NaN with a reason), never a confident number; valid inputs give the right one.

Each row is ``(id, call, expected)``: ``expected`` is an exception type (with a message
pattern), or a predicate on the result that a correct answer satisfies.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from structlens.equivalence import (
    EncodingConfig,
    encoding_scores,
    linear_cka,
    procrustes_similarity,
    pwcca,
    svcca,
)
from structlens.equivalence.encoding import supported_width
from structlens.errors import DegenerateInputError
from structlens.sae import SAETrainConfig, SAETrainer, TopKSAE, ce_loss_recovered, evaluate_sae
from structlens.stats.gini import gini
from structlens.stats.mutual_info import mutual_information

R = np.random.default_rng(0)
X = R.standard_normal((400, 6))
Y = X @ R.standard_normal((6, 5)) + 0.1 * R.standard_normal((400, 5))
INDEP = R.standard_normal((400, 5))


def _with(a, i, j, v):
    a = a.copy()
    a[i, j] = v
    return a


def _const_col(a):
    a = a.copy()
    a[:, 0] = 3.0
    return a


def _sae_steps(x, steps=1):
    t = SAETrainer(SAETrainConfig(architecture="topk", d_sae=8, k=2, seed=0), x.shape[1])
    for _ in range(steps):
        t.step(x)
    return t.result()


CASES = [
    # n < dim, n = 1: CCA-family statistics are 1 by construction, or undefined
    (
        "svcca-n-below-dim",
        lambda: svcca(R.standard_normal((10, 50)), R.standard_normal((10, 50))),
        (DegenerateInputError, "by construction"),
    ),
    (
        "svcca-n-equal-dims",
        lambda: svcca(X[:11], INDEP[:11], keep=1.0),
        (DegenerateInputError, "by construction"),
    ),
    ("svcca-n-1", lambda: svcca(X[:1], Y[:1]), (ValueError, "at least 2")),
    ("cka-n-1", lambda: linear_cka(X[:1], Y[:1]), (ValueError, "at least 2")),
    ("procrustes-n-1", lambda: procrustes_similarity(X[:1], Y[:1]), (ValueError, "at least 2")),
    # NaN / Inf
    ("svcca-nan", lambda: svcca(_with(X, 0, 0, np.nan), Y), (ValueError, "NaN or infinite")),
    ("svcca-inf", lambda: svcca(_with(X, 0, 0, np.inf), Y), (ValueError, "NaN or infinite")),
    ("cka-nan", lambda: linear_cka(_with(X, 0, 0, np.nan), Y), (ValueError, "NaN or infinite")),
    ("cka-inf", lambda: linear_cka(X, _with(Y, 3, 1, -np.inf)), (ValueError, "NaN or infinite")),
    ("pwcca-nan", lambda: pwcca(_with(X, 0, 0, np.nan), Y), (ValueError, "NaN or infinite")),
    ("gini-nan", lambda: gini([1.0, np.nan, 2.0]), (ValueError, "NaN or infinite")),
    (
        "mi-nan",
        lambda: mutual_information(_with(X[:, :2], 0, 0, np.nan), X[:, 2:4]),
        (ValueError, "NaN or infinite"),
    ),
    # mismatched rows
    ("svcca-rows", lambda: svcca(X, Y[:-1]), (ValueError, "same probe set")),
    ("cka-rows", lambda: linear_cka(X, Y[:-1]), (ValueError, "same probe set")),
    ("procrustes-rows", lambda: procrustes_similarity(X, Y[:-1]), (ValueError, "same probe set")),
    ("mi-rows", lambda: mutual_information(X[:, :2], X[:-1, 2:4]), (ValueError, "paired")),
    # constant data
    ("svcca-constant", lambda: svcca(np.ones((50, 3)), Y[:50]), (ValueError, "constant")),
    ("cka-constant", lambda: linear_cka(np.ones((50, 3)), Y[:50]), (ValueError, "undefined")),
    ("svcca-one-constant-column", lambda: svcca(_const_col(X), Y), lambda v: 0.5 < v <= 1.0),
    (
        "cka-one-constant-column",
        lambda: linear_cka(_const_col(X), Y),
        lambda v: abs(v - linear_cka(X[:, 1:], Y)) < 1e-9,
    ),
    # correct answers on valid input
    ("svcca-independent", lambda: svcca(X, INDEP), lambda v: 0.0 <= v < 0.3),
    (
        "svcca-linear-map",
        lambda: svcca(X, X @ R.standard_normal((6, 6))),
        lambda v: abs(v - 1.0) < 1e-9,
    ),
    ("cka-self", lambda: linear_cka(X, X), lambda v: abs(v - 1.0) < 1e-12),
    (
        "cka-float16",
        lambda: linear_cka(X.astype(np.float16), Y.astype(np.float16)),
        lambda v: abs(v - linear_cka(X, Y)) < 1e-3,
    ),
    (
        "svcca-float16",
        lambda: svcca(X.astype(np.float16), Y.astype(np.float16)),
        lambda v: abs(v - svcca(X, Y)) < 1e-3,
    ),
    # encoding scores: predictors wider than the fit rows support
    (
        "encoding-wide-reduced",
        lambda: encoding_scores(R.standard_normal((40, 120)), Y[:40]),
        lambda s: s.reduced_to_xy == supported_width(40) and "principal components" in s.caveat,
    ),
    (
        "encoding-too-few-rows",
        lambda: encoding_scores(R.standard_normal((12, 40)), Y[:12], EncodingConfig(n_folds=2)),
        (DegenerateInputError, "principal components"),
    ),
    # SAE training
    (
        "sae-1-row-batch",
        lambda: _sae_steps(torch.randn(1, 6)),
        (DegenerateInputError, "at least 2"),
    ),
    ("sae-nan-batch", lambda: _sae_steps(torch.full((8, 6), float("nan"))), (ValueError, "NaN")),
    (
        "sae-constant-batch",
        lambda: _sae_steps(torch.ones(16, 6)),
        (DegenerateInputError, "constant .*zero variance"),
    ),
    (
        "sae-eval-constant",
        lambda: evaluate_sae(TopKSAE(6, 8, k=2), torch.ones(16, 6)),
        (DegenerateInputError, "zero variance"),
    ),
    (
        "sae-ce-recovered-tie",
        lambda: ce_loss_recovered(TopKSAE(6, 8, k=2), lambda fn: 3.0),
        lambda r: np.isnan(r.ce_loss_recovered) and "unchanged" in r.undefined_reason,
    ),
    (
        "sae-fvu-in-range",
        lambda: _sae_steps(torch.randn(64, 6), steps=5).final_fvu,
        lambda v: 0.0 <= v < 2.0,
    ),
    (
        "sae-wrong-width",
        lambda: SAETrainer(SAETrainConfig(d_sae=8, k=2), 6).step(torch.randn(8, 7)),
        (ValueError, "d_in"),
    ),
]


@pytest.mark.parametrize("call,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_numerical_case(call, expected):
    if isinstance(expected, tuple):
        err, pattern = expected
        with pytest.raises(err, match=pattern):
            call()
    else:
        value = call()
        assert expected(value), value

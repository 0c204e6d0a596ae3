"""The whole-layer validation on planted layers whose answer is known.

A comparison validates a matched layer pair by replacing B's layer with A's, mapped into B's
space by the map :func:`~structlens.equivalence.choose_layer_map` picks for the pair's
relation (an affine ridge map, its penalty chosen by K-fold cross-validation, for independent
models, on at least ``layer_map_rows_per_dim`` fit rows per dimension; orthogonal Procrustes
for a copy) and fitted on the fit rows (:func:`~structlens.equivalence.fit_layer_map`); the
layer passes when B's predictions on the held-out rows move by at most ``max_kl`` nats with a
top-1 agreement of at least ``min_top1`` (the protocol's
:class:`~structlens.equivalence.ValidationCriterion`, applied by
:func:`~structlens.equivalence.equivalence_score`).  Each layer is its own decision: the
layer score is the share of layers passing, with no test across them.

Planted layers (:func:`planted_layers`): A's layer ``X`` (rows standard normal with
variances ``∝ j^-1`` in a random basis, unit mean variance) and B's layer
``Y = √(1 − η) S + √η S'`` with ``S = X F Q`` (``F`` a Gaussian map scaled to unit mean
variance for independent models, the identity for a copy; ``Q`` a random rotation) and
``S'`` the same map of an independent ``X'``: ``Y`` has the same covariance at every ``η``,
and ``η = 1`` makes it independent of ``X``.  What B does downstream is a planted readout,
logits ``y W_U`` over :data:`VOCAB` tokens (``W_U`` Gaussian, logits of standard deviation
about :data:`READOUT_SCALE`).  The best any map can do is ``E[Y | X] = √(1 − η) S``; the truth
is whether that planted map passes the criterion in the population (its KL and top-1
agreement on :data:`TRUTH_INSTANCES` instances of :data:`TRUTH_ROWS` held-out rows, seeds
apart from the scoring seeds), so the rule errs where the fitted map or the finite held-out
sample decide otherwise.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from structlens.equivalence.congruity import LogitReference
from structlens.equivalence.layer_map import choose_layer_map, fit_layer_map
from structlens.equivalence.protocol import PROFILES, EquivalenceProtocol
from structlens.equivalence.score import equivalence_score
from structlens.stats.intervals import wilson_interval

__all__ = ["PROTOCOL", "LAYER_WIDTH", "VOCAB", "READOUT_SCALE", "TRUTH_ROWS",
           "TRUTH_INSTANCES", "PlantedLayers", "planted_layers", "LayerCheck", "validate_layer",
           "planted_truth", "LayerMapRate", "calibrate_layer_map"]  # fmt: skip

#: The paper protocol's layer-map and validation settings.
PROTOCOL: EquivalenceProtocol = PROFILES["paper"]
#: Width of both planted layers.
LAYER_WIDTH = 32
#: Tokens of B's planted readout, and the standard deviation of its logits on a typical row.
VOCAB = 64
READOUT_SCALE = 3.0
#: Held-out rows and instances of the population truth; its seeds start at 0, apart from the
#: scoring seeds.
TRUTH_ROWS = 20_000
TRUTH_INSTANCES = 10


@dataclass(frozen=True)
class PlantedLayers:
    """One planted pair of layers: A's fit and held-out rows ``x_*`` ``[rows, width]``, B's
    ``y_*``, the planted map's output on the held-out rows ``planted`` (``E[Y | X]``), and B's
    readout ``[width, VOCAB]``."""

    relation: str
    x_fit: np.ndarray
    y_fit: np.ndarray
    x_held: np.ndarray
    y_held: np.ndarray
    planted: np.ndarray
    readout: np.ndarray


def _rotation(rng: np.random.Generator, width: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((width, width)))
    return q * np.sign(np.diag(r))  # Haar-distributed


def planted_layers(
    relation: str, noise: float, rows: int, seed: int, *, width: int = LAYER_WIDTH
) -> PlantedLayers:
    """``rows`` fit and ``rows`` held-out rows of a planted layer pair (module docstring):
    ``relation`` ``"independent"`` (a Gaussian map) or ``"copy"`` (an orthogonal one), B's
    share ``noise`` (η) of variance independent of A's layer."""
    if relation not in ("independent", "copy"):
        raise ValueError(f"relation must be 'independent' or 'copy', got {relation!r}.")
    if not 0 <= noise <= 1:
        raise ValueError(f"noise must lie in [0, 1], got {noise}.")
    rng = np.random.default_rng(seed)
    var = 1 / np.arange(1, width + 1, dtype=np.float64)
    var *= width / var.sum()
    basis = _rotation(rng, width)
    f = np.eye(width)
    if relation == "independent":
        f = rng.standard_normal((width, width))
        # unit mean variance of S: tr(Fᵀ Σ_x F) = width
        f /= np.sqrt(np.sum((basis.T @ f) ** 2 * var[:, None]) / width)
    to_b = f @ _rotation(rng, width)
    readout = rng.standard_normal((width, VOCAB)) * READOUT_SCALE / np.sqrt(width)

    def layer(n: int) -> np.ndarray:
        return (rng.standard_normal((n, width)) * np.sqrt(var)) @ basis.T

    x = layer(2 * rows)
    signal = np.sqrt(1 - noise) * (x @ to_b)
    y = signal + np.sqrt(noise) * (layer(2 * rows) @ to_b)
    return PlantedLayers(
        relation=relation, x_fit=x[:rows], y_fit=y[:rows], x_held=x[rows:], y_held=y[rows:],
        planted=signal[rows:], readout=readout,
    )  # fmt: skip


@dataclass(frozen=True)
class LayerCheck:
    """One layer's validation: the map used (``None``: the layer is not validated, for the
    reason ``reason``), the mean KL (nats) of B's held-out predictions with its layer
    replaced, their top-1 agreement, and whether the criterion passes the layer."""

    method: str | None
    reason: str
    kl: float
    top1: float
    passed: bool


def _behaviour(y: np.ndarray, replaced: np.ndarray, readout: np.ndarray) -> tuple[float, float]:
    """Mean KL (nats) of B's predictions with its layer ``y`` replaced by ``replaced``, and
    their top-1 agreement, as :func:`structlens.equivalence.patching.validate` measures
    them."""
    ref = y @ readout
    logits = replaced @ readout
    kl = float(np.mean(LogitReference(ref).kl(logits)))
    return kl, float(np.mean(np.argmax(logits, 1) == np.argmax(ref, 1)))


def _judge(kl: float, top1: float, protocol: EquivalenceProtocol) -> bool:
    """The protocol's criterion on one layer pair, through the score production computes."""
    score = equivalence_score(
        [(0, 0)], protocol.compare_config().criterion, kl=[kl], top1=[top1], ci=protocol.ci
    )
    return bool(score.validation[0]["passed"])


def validate_layer(
    layers: PlantedLayers, *, protocol: EquivalenceProtocol = PROTOCOL
) -> LayerCheck:
    """The layer's validation as a comparison makes it: the map
    :func:`~structlens.equivalence.choose_layer_map` picks under ``protocol`` (its
    ``layer_map``, ``layer_map_rows_per_dim``) for the planted relation, fitted on the fit
    rows by :func:`~structlens.equivalence.fit_layer_map` with that method (as the validation
    writers fit it), applied to the held-out rows and judged by the protocol's criterion."""
    rows, width_a = layers.x_fit.shape
    choice = choose_layer_map(
        rows, width_a, layers.y_fit.shape[1], protocol.layer_map, layers.relation,
        protocol.layer_map_rows_per_dim,
    )  # fmt: skip
    if choice.method is None:
        return LayerCheck(None, choice.reason, float("nan"), float("nan"), False)
    lmap = fit_layer_map(layers.x_fit, layers.y_fit, choice.method)
    kl, top1 = _behaviour(layers.y_held, lmap.apply(layers.x_held), layers.readout)
    return LayerCheck(choice.method, choice.reason, kl, top1, _judge(kl, top1, protocol))


@functools.cache  # the truth does not depend on the fit rows scored
def planted_truth(relation: str, noise: float) -> tuple[float, float]:
    """Mean KL (nats) and top-1 agreement of B's predictions with its layer replaced by the
    planted map ``E[Y | X]``, over :data:`TRUTH_INSTANCES` instances of :data:`TRUTH_ROWS`
    held-out rows (seeds 0, ...)."""
    kl, top1 = [], []
    for seed in range(TRUTH_INSTANCES):
        layers = planted_layers(relation, noise, TRUTH_ROWS, seed)
        k, t = _behaviour(layers.y_held, layers.planted, layers.readout)
        kl.append(k)
        top1.append(t)
    return float(np.mean(kl)), float(np.mean(top1))


@dataclass(frozen=True)
class LayerMapRate:
    """The layer validation on ``n`` planted instances of one family.

    ``family`` names the relation and its map; ``effect`` is η, B's share of variance
    independent of A's layer; ``d`` the layers' width, ``m`` the fit rows (as many held-out
    rows); ``truth_kl`` / ``truth_top1`` the planted map's population KL and top-1 agreement
    (:func:`planted_truth`) and ``expected`` whether they pass the criterion.  ``rate``: share
    of instances whose layer passes, with its Wilson interval; ``planted_rate``: share where
    the planted map itself passes on the same held-out rows (the rule's error beyond it is
    the fitted map's); ``mean_kl`` / ``mean_top1`` and ``planted_mean_kl`` /
    ``planted_mean_top1``: their means over instances."""

    family: str
    relation: str
    method: str
    effect: float
    d: int
    m: int
    truth_kl: float
    truth_top1: float
    expected: bool
    n: int
    rate: float
    rate_ci: tuple[float, float]
    planted_rate: float
    planted_rate_ci: tuple[float, float]
    mean_kl: float
    mean_top1: float
    planted_mean_kl: float
    planted_mean_top1: float
    seeds: tuple[int, int]


def calibrate_layer_map(
    relation: str,
    noise: float,
    rows_per_dim: float,
    n: int,
    *,
    first_seed: int = 0,
    protocol: EquivalenceProtocol = PROTOCOL,
) -> LayerMapRate:
    """:func:`validate_layer` on ``n`` planted instances (seeds ``first_seed, ...``) with
    ``rows_per_dim × LAYER_WIDTH`` fit rows."""
    rows = int(round(rows_per_dim * LAYER_WIDTH))
    checks, planted = [], []
    for seed in range(first_seed, first_seed + n):
        layers = planted_layers(relation, noise, rows, seed)
        checks.append(validate_layer(layers, protocol=protocol))
        kl, top1 = _behaviour(layers.y_held, layers.planted, layers.readout)
        planted.append((kl, top1, _judge(kl, top1, protocol)))
    methods = {c.method for c in checks}
    if len(methods) != 1 or None in methods:
        raise ValueError(f"{rows} fit rows do not give one layer map for {relation!r} layers.")
    truth_kl, truth_top1 = planted_truth(relation, noise)
    k = sum(c.passed for c in checks)
    k_planted = sum(p[2] for p in planted)
    method = str(methods.pop())
    return LayerMapRate(
        family=f"{relation} ({method})", relation=relation, method=method,
        effect=float(noise), d=LAYER_WIDTH, m=rows, truth_kl=truth_kl, truth_top1=truth_top1,
        expected=_judge(truth_kl, truth_top1, protocol), n=n, rate=k / n,
        rate_ci=wilson_interval(k, n), planted_rate=k_planted / n,
        planted_rate_ci=wilson_interval(k_planted, n),
        mean_kl=float(np.mean([c.kl for c in checks])),
        mean_top1=float(np.mean([c.top1 for c in checks])),
        planted_mean_kl=float(np.mean([p[0] for p in planted])),
        planted_mean_top1=float(np.mean([p[1] for p in planted])),
        seeds=(first_seed, first_seed + n - 1),
    )  # fmt: skip

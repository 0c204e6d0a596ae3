"""Linear encoding scores (the interpretive-equivalence paper's similarity) and linear maps.

The encoding score from ``X`` to ``Y`` is how well a ridge regression from ``X`` predicts ``Y``
on held-out samples: ``sqrt(max(R^2_test, 0))``, a **similarity in [0, 1]** (1 = ``Y`` is an
exact affine function of ``X``). It is **directional**: ``score(X -> Y)`` and
``score(Y -> X)`` differ in general, so both are reported.

Protocol (reference code: ``encoder_fit`` in alansun17904/interp-equiv, ``RidgeCV`` with
``alpha_per_target=False``, intercept, 90/10 split): a seeded permutation splits rows into
train and test (``test_fraction``, default 0.1, test size rounded up); on the training rows a
single ridge penalty shared by all targets is chosen from a fixed grid by K-fold
cross-validation over fixed, seeded, contiguous folds (the reference's ``RidgeCV`` uses
leave-one-out instead; K-fold keeps the folds explicit); the model is refitted on all
training rows and scored on the test rows with scikit-learn's ``R^2`` convention (mean of
per-target ``R^2``, or variance-weighted). Everything is deterministic under ``seed``.

Wide predictors: a linear map from ``d`` features fitted on ``m`` centred rows is not
determined once ``d ≥ m - 1`` (any target is interpolated exactly), and the held-out ``R^2``
then measures the ridge penalty more than the representations. The accumulated residual
streams of CONGRUITY (``(L + 1) d`` features from a few hundred prompts) are always in that
regime. A predictor wider than :func:`supported_width` -- half the rows of the smallest fit
the protocol makes, a cross-validation fold's training part -- is therefore reduced to that
many principal components, computed in every fit from that fit's own training rows (the
training half for the reported fit, never the test rows). The outcome records it
(``reduced_to``, ``caveat``). Below :data:`MIN_REDUCED_WIDTH` components the score is refused
(:class:`~structlens.errors.DegenerateInputError`). Targets are never reduced: each target
column is a separate regression whose determinacy depends on the predictor's width only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from ..errors import DegenerateInputError
from ..results import Result
from ._checks import check_pair

__all__ = [
    "EncodingConfig",
    "EncodingScores",
    "LinearMap",
    "MIN_REDUCED_WIDTH",
    "MULTIOUTPUTS",
    "encoding_r2",
    "encoding_score",
    "encoding_scores",
    "fit_linear_map",
    "supported_width",
]

DEFAULT_ALPHAS = (0.1, 1.0, 10.0)

#: How per-target ``R^2`` are combined (scikit-learn's names): the reference's uniform mean of
#: per-target ``R^2`` first, then the variance-weighted one (``1 - Σ SS_res / Σ SS_tot``).
MULTIOUTPUTS = ("uniform_average", "variance_weighted")

#: Fewest principal components a wide predictor may be reduced to; fewer rows than this
#: supports give no meaningful encoding score.
MIN_REDUCED_WIDTH = 4


@dataclasses.dataclass(frozen=True)
class EncodingConfig:
    """Settings of the encoding score.

    Attributes
    ----------
    alphas : tuple of float
        Ridge penalties tried (on the centred, unscaled design); default is ``RidgeCV``'s.
    n_folds : int
        Folds of the inner cross-validation choosing ``alpha``.
    test_fraction : float
        Share of rows held out for the reported ``R^2``.
    multioutput : {"uniform_average", "variance_weighted"}
        How per-target ``R^2`` are combined (scikit-learn's names; the reference uses uniform).
    seed : int
        Seed of the split and the folds.
    """

    alphas: tuple[float, ...] = DEFAULT_ALPHAS
    n_folds: int = 5
    test_fraction: float = 0.1
    multioutput: str = "uniform_average"
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.alphas or any(not a > 0 for a in self.alphas):
            raise ValueError(f"alphas must be a non-empty tuple of positive values: {self.alphas}")
        if self.n_folds < 2:
            raise ValueError(f"n_folds must be at least 2, got {self.n_folds}.")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must lie in (0, 1), got {self.test_fraction}.")
        if self.multioutput not in MULTIOUTPUTS:
            raise ValueError(
                "multioutput must be 'uniform_average' or 'variance_weighted', "
                f"got {self.multioutput!r}."
            )


def _x_factors(
    x_tr: np.ndarray, width: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Centre the training rows; return ``(mean_x, V^T, s, U^T)`` of their thin SVD.

    With ``U^T (y - mean_y)`` (:func:`_y_factor`) predictions for any penalty follow without
    forming the ``[d_x, d_y]`` coefficients (:func:`_ridge_predict`), which matters when both
    widths are large (accumulated residual streams have ``(L + 1) d`` features) and ``n`` is
    small. The SVD depends on ``x`` only, so it is shared by every target ``y``.

    ``width`` keeps the top ``width`` singular triplets: ridge on the truncated factors is
    ridge on the rows' first ``width`` principal components (fitted on these rows), and new
    rows are projected onto the same components by ``xc @ V^T.T``.
    """
    mx = x_tr.mean(0)
    u, s, vt = np.linalg.svd(x_tr - mx, full_matrices=False)
    if width is not None:
        u, s, vt = u[:, :width], s[:width], vt[:width]
    return mx, vt, s, u.T


def _y_factor(ut: np.ndarray, y_tr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(mean_y, U^T (y - mean_y))`` for the SVD factors of :func:`_x_factors`."""
    my = y_tr.mean(0)
    return my, ut @ (y_tr - my)


def _ridge_predict(
    xc: np.ndarray, vt: np.ndarray, s: np.ndarray, uty: np.ndarray, alpha: float
) -> np.ndarray:
    """Centred predictions ``xc @ coef(alpha)`` with ``coef = V diag(s / (s^2 + a)) U^T y``."""
    return ((xc @ vt.T) * (s / (s**2 + alpha))) @ uty


def _ridge_paths(
    x_tr: np.ndarray, y_tr: np.ndarray, alphas: Sequence[float]
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Centre the training rows and return (mean_x, mean_y, [coef for each alpha])."""
    mx, vt, s, ut = _x_factors(x_tr)
    my, uty = _y_factor(ut, y_tr)
    coefs = [vt.T @ ((s / (s**2 + a))[:, None] * uty) for a in alphas]
    return mx, my, coefs


def _r2(y: np.ndarray, pred: np.ndarray, multioutput: str) -> float:
    ss_res = np.sum((y - pred) ** 2, axis=0)
    ss_tot = np.sum((y - y.mean(0)) ** 2, axis=0)
    if multioutput == "variance_weighted":
        total = ss_tot.sum()
        if total == 0:
            return 1.0 if ss_res.sum() == 0 else 0.0
        return float(1.0 - ss_res.sum() / total)
    # scikit-learn's force_finite convention for constant targets
    per = np.where(ss_tot > 0, 1.0 - ss_res / np.where(ss_tot > 0, ss_tot, 1.0), 0.0)
    per = np.where((ss_tot == 0) & (ss_res == 0), 1.0, per)
    return float(per.mean())


def _split(n: int, cfg: EncodingConfig) -> tuple[np.ndarray, np.ndarray]:
    n_test = math.ceil(cfg.test_fraction * n)
    n_train = n - n_test
    if n_test < 2 or n_train < 2 * cfg.n_folds:
        raise ValueError(
            f"{n} samples are too few for a {cfg.test_fraction:.0%} test split and "
            f"{cfg.n_folds}-fold cross-validation (need >= 2 test rows and >= 2 rows per "
            "fold); use a larger probe set or fewer folds."
        )
    perm = np.random.default_rng(cfg.seed).permutation(n)
    return perm[n_test:], perm[:n_test]


def supported_width(n_samples: int, config: EncodingConfig | None = None) -> int:
    """The widest predictor that ``n_samples`` rows support under ``config``'s protocol.

    Half the rows of the smallest fit the protocol makes (a cross-validation fold's training
    part within the training split), so every fit has at least as many residual degrees of
    freedom as coefficients per target; wider predictors are reduced to this many principal
    components.
    """
    cfg = config or EncodingConfig()
    n_train = n_samples - math.ceil(cfg.test_fraction * n_samples)
    smallest_fit = n_train - math.ceil(n_train / cfg.n_folds)
    return max(smallest_fit // 2, 0)


class _Predictor:
    """One predictor ``x`` factorised for every fit the protocol makes: the K cross-validation
    folds of its rows and all its rows. Encoding the same ``x`` into many targets (the
    CONGRUITY point test draws dozens of pairs from a few implementations) then costs one set
    of SVDs instead of one per target; the numbers are those of a fresh fit."""

    def __init__(self, x: np.ndarray, cfg: EncodingConfig, width: int | None = None) -> None:
        self.x = x
        self.cfg = cfg
        rows = np.arange(x.shape[0])
        self.folds = []
        for val in np.array_split(rows, cfg.n_folds):
            tr = np.setdiff1d(rows, val, assume_unique=True)
            self.folds.append((tr, val, _x_factors(x[tr], width)))
        self.full = _x_factors(x, width)

    def choose_alpha(self, y: np.ndarray) -> float:
        """The penalty of the grid with the least K-fold validation error."""
        err = np.zeros(len(self.cfg.alphas))
        for tr, val, (mx, vt, sv, ut) in self.folds:
            my, uty = _y_factor(ut, y[tr])
            xv = self.x[val] - mx
            for i, a in enumerate(self.cfg.alphas):
                err[i] += np.sum((y[val] - my - _ridge_predict(xv, vt, sv, uty, a)) ** 2)
        return float(self.cfg.alphas[int(np.argmin(err))])


def _choose_alpha(x: np.ndarray, y: np.ndarray, cfg: EncodingConfig) -> float:
    return _Predictor(x, cfg).choose_alpha(y)


class _XEncoder:
    """Encoding scores from one predictor ``x`` (rows already checked, float64) into any
    number of targets, factorising ``x`` once (train/test split, folds, full training fit).

    ``reduced_to`` is the number of principal components a too-wide ``x`` was reduced to
    (``None``: used as is) and ``caveat`` says so in words (module doc)."""

    def __init__(self, x: np.ndarray, cfg: EncodingConfig) -> None:
        self.cfg = cfg
        n, d = x.shape
        self.train, self.test = _split(n, cfg)
        self.x_test = x[self.test]
        width = supported_width(n, cfg)
        self.reduced_to: int | None = None
        self.caveat: str | None = None
        if d > width:
            if width < MIN_REDUCED_WIDTH:
                raise DegenerateInputError(
                    f"a {d}-feature representation cannot be encoded from {n} samples: the "
                    f"smallest fit of the {cfg.n_folds}-fold protocol supports only {width} "
                    f"features, fewer than the {MIN_REDUCED_WIDTH} principal components it "
                    "could be reduced to; use more probe prompts or fewer folds."
                )
            self.reduced_to = width
            self.caveat = (
                f"the predictor has {d} features but the fit half only {self.train.size} "
                f"rows, too few to determine a linear encoding map, so it was reduced to its "
                f"top {width} principal components (fitted on the fit half only); the score "
                "is that of those components"
            )
        self.predictor = _Predictor(x[self.train], cfg, self.reduced_to)

    def r2(self, y: np.ndarray) -> tuple[float, float]:
        """``(held-out R^2, chosen alpha)`` of the encoding ``x -> y``."""
        if y.shape[0] != self.x_test.shape[0] + self.train.size:
            raise ValueError(
                f"x has {self.x_test.shape[0] + self.train.size} rows and y {y.shape[0]}; "
                "rows must be the same inputs."
            )
        y_tr = y[self.train]
        alpha = self.predictor.choose_alpha(y_tr)
        mx, vt, sv, ut = self.predictor.full
        my, uty = _y_factor(ut, y_tr)
        pred = _ridge_predict(self.x_test - mx, vt, sv, uty, alpha) + my
        return _r2(y[self.test], pred, self.cfg.multioutput), alpha


def encoding_r2(x: object, y: object, config: EncodingConfig | None = None) -> tuple[float, float]:
    """Held-out ``R^2`` of the ridge encoding ``x -> y`` and the penalty chosen.

    Returns ``(r2, alpha)``; ``r2`` can be negative (worse than predicting the mean). A
    predictor wider than :func:`supported_width` is reduced first (module doc);
    :func:`encoding_scores` reports when that happened.
    """
    cfg = config or EncodingConfig()
    a, b = check_pair(x, y)
    a = a.astype(np.float64, copy=False)
    b = b.astype(np.float64, copy=False)
    return _XEncoder(a, cfg).r2(b)


def encoding_score(x: object, y: object, config: EncodingConfig | None = None) -> float:
    """Encoding similarity ``sqrt(max(R^2_test, 0))`` of ``y`` from ``x``, in ``[0, 1]``.

    Parameters
    ----------
    x, y : array_like
        ``[n, d_x]`` predictors and ``[n, d_y]`` targets on the same inputs (rows).
    config : EncodingConfig, optional
        Split, folds, penalty grid and seed; see the module docstring.
    """
    r2, _ = encoding_r2(x, y, config)
    return float(np.sqrt(max(r2, 0.0)))


@dataclasses.dataclass(frozen=True)
class EncodingScores(Result):
    """Encoding similarities in both directions, with their ``R^2`` and chosen penalties.

    ``reduced_to_xy`` / ``reduced_to_yx``: principal components the predictor of that
    direction (``x``, resp. ``y``) was reduced to, ``None`` when it was used whole;
    ``caveat``: what the reduction means, ``None`` when there was none (module doc).
    """

    score_xy: float
    score_yx: float
    r2_xy: float
    r2_yx: float
    alpha_xy: float
    alpha_yx: float
    n_samples: int
    config: dict
    reduced_to_xy: int | None = None
    reduced_to_yx: int | None = None
    caveat: str | None = None

    @property
    def symmetric(self) -> float:
        """Mean of the two directions (a symmetric summary; report both)."""
        return 0.5 * (self.score_xy + self.score_yx)


def encoding_scores(x: object, y: object, config: EncodingConfig | None = None) -> EncodingScores:
    """Encoding scores ``x -> y`` and ``y -> x`` with the same split, folds and grid."""
    cfg = config or EncodingConfig()
    a, b = check_pair(x, y)
    a = a.astype(np.float64, copy=False)
    b = b.astype(np.float64, copy=False)
    enc_x, enc_y = _XEncoder(a, cfg), _XEncoder(b, cfg)
    r_xy, a_xy = enc_x.r2(b)
    r_yx, a_yx = enc_y.r2(a)
    notes = [f"{k}: {e.caveat}" for k, e in (("x -> y", enc_x), ("y -> x", enc_y)) if e.caveat]
    return EncodingScores(
        score_xy=float(np.sqrt(max(r_xy, 0.0))),
        score_yx=float(np.sqrt(max(r_yx, 0.0))),
        r2_xy=r_xy,
        r2_yx=r_yx,
        alpha_xy=a_xy,
        alpha_yx=a_yx,
        n_samples=int(a.shape[0]),
        config=dataclasses.asdict(cfg),
        reduced_to_xy=enc_x.reduced_to,
        reduced_to_yx=enc_y.reduced_to,
        caveat="; ".join(notes) + "." if notes else None,
    )


@dataclasses.dataclass(frozen=True)
class LinearMap(Result):
    """An affine map ``y ~ x @ weight + bias`` between representation spaces.

    Used to replace a component's activations in model B by the mapped activations of its
    matched component in model A when the two spaces differ.
    """

    weight: np.ndarray  # [d_x, d_y]
    bias: np.ndarray  # [d_y]
    method: str
    alpha: float
    r2_train: float

    def apply(self, x: object) -> np.ndarray:
        """Map rows ``x`` ``[n, d_x]`` (or ``[..., d_x]``) into the target space."""
        a = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
        if a.shape[-1] != self.weight.shape[0]:
            raise ValueError(
                f"input width {a.shape[-1]} does not match the map's source width "
                f"{self.weight.shape[0]}."
            )
        return a @ self.weight + self.bias


def fit_linear_map(
    x: object,
    y: object,
    method: str = "ridge",
    alpha: float | None = None,
    config: EncodingConfig | None = None,
) -> LinearMap:
    """Fit an affine map from ``x`` ``[n, d_x]`` to ``y`` ``[n, d_y]`` (rows = same inputs).

    Parameters
    ----------
    method : {"ridge", "procrustes"}
        ``"ridge"``: least squares with penalty ``alpha`` (chosen by the cross-validation of
        :class:`EncodingConfig` on all rows when ``None``). ``"procrustes"``: a scaled
        (semi-)orthogonal map ``s Q`` (``Q^T Q = I`` or ``Q Q^T = I`` when widths differ)
        fitted on centred data, preserving geometry; ``alpha`` is unused.
    """
    cfg = config or EncodingConfig()
    a, b = check_pair(x, y)
    a = a.astype(np.float64, copy=False)
    b = b.astype(np.float64, copy=False)
    if method == "ridge":
        if alpha is None:
            if a.shape[0] < 2 * cfg.n_folds:
                raise ValueError(
                    f"{a.shape[0]} samples are too few to choose alpha by {cfg.n_folds}-fold "
                    "cross-validation; pass alpha explicitly or use more samples."
                )
            alpha = _choose_alpha(a, b, cfg)
        elif not alpha > 0:
            raise ValueError(f"alpha must be positive, got {alpha}.")
        mx, my, (w,) = _ridge_paths(a, b, (alpha,))
    elif method == "procrustes":
        mx, my = a.mean(0), b.mean(0)
        xc, yc = a - mx, b - my
        u, s, vt = np.linalg.svd(xc.T @ yc, full_matrices=False)
        denom = float(np.sum(xc**2))
        if denom == 0:
            raise ValueError("x is constant; a Procrustes map is undefined.")
        w = (s.sum() / denom) * (u @ vt)
        alpha = 0.0
    else:
        raise ValueError(f"method must be 'ridge' or 'procrustes', got {method!r}.")
    bias = my - mx @ w
    return LinearMap(
        weight=w,
        bias=bias,
        method=method,
        alpha=float(alpha),
        r2_train=_r2(b, a @ w + bias, "variance_weighted"),
    )

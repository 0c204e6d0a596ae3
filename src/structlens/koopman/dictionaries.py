"""Frozen, seeded dictionaries (lifts) ``Ψ: R^d → R^N`` for EDMDc.

Conventions: rows are samples; ``transform(X)`` maps an ``(m, d)`` array to an ``(m, N)``
float64 array.  A dictionary is *fitted once* (PCA directions, RFF bandwidth, spectral
eigenfunctions) and then frozen: split halves, seeds and layers that should be comparable must
share one fitted dictionary, or split-half distances measure dictionary randomness instead of
sampling error.  ``save(dir)`` / :func:`load_dictionary` round-trip every dictionary through
``dictionary.json`` + ``dictionary.safetensors``.

``state_slice`` names the columns of Ψ that equal ``x`` itself (the identity block); when it is
set the EDMDc read-out ``C`` is the exact selector, otherwise it is fitted by least squares.
``affine_map()`` returns ``(L, c)`` with ``Ψ(x) = x @ L + c`` for dictionaries that are affine in
``x`` (identity, PCA) and ``None`` otherwise; mode ablation is an exact affine map on the state
only for those.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, overload

import numpy as np

from structlens.errors import InputError, reading
from structlens.registry import Registry
from structlens.results import atomic_write_bytes, atomic_write_json, read_json_object
from structlens.stats.validation import check_array

#: Dictionary classes by their saved ``kind`` (filled by subclassing), for :func:`load_dictionary`.
DICTIONARY_KINDS: Registry[type[Dictionary]] = Registry("dictionary kind")


class Dictionary:
    """Base class: subclasses set ``kind`` and implement ``_fit``/``_lift``/``_state``."""

    kind: ClassVar[str] = ""
    dim: int | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("kind"):  # abstract intermediates (no own kind) are not loadable
            DICTIONARY_KINDS.register(cls.kind, cls, replace=True)

    # -- public API -----------------------------------------------------------------------
    def fit(
        self, X: np.ndarray, U: np.ndarray | None = None, Y: np.ndarray | None = None
    ) -> Dictionary:
        """Fit the data-dependent parts on states ``X`` (and ``U``, ``Y`` where needed)."""
        x = check_array(X, name="X")
        if x.shape[0] < 2:
            raise ValueError(f"need at least 2 samples to fit a dictionary; got {x.shape[0]}.")
        self.dim = x.shape[1]
        self._fit(x, U, Y)
        return self

    def transform(self, X: np.ndarray, *, finite: bool = True) -> np.ndarray:
        """Lift ``X`` (m, d) to Ψ(X) (m, n_features), float64.

        ``finite=False`` skips the NaN/inf scan (for callers whose reductions check it).
        """
        if self.dim is None:
            raise ValueError(f"{type(self).__name__} is not fitted; call .fit(X) first.")
        x = check_array(X, name="X", n_cols=self.dim, finite=finite)
        return self._lift(x)

    @property
    def n_features(self) -> int:
        if self.dim is None:
            raise ValueError(f"{type(self).__name__} is not fitted; call .fit(X) first.")
        return self._n_features()

    def _fitted_dim(self) -> int:
        if self.dim is None:
            raise ValueError(f"{type(self).__name__} is not fitted; call .fit(X) first.")
        return self.dim

    @property
    def state_slice(self) -> slice | None:
        """Columns of Ψ equal to the raw state ``x``, or ``None``."""
        return self._state()

    def affine_map(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(L, c)`` with ``Ψ(x) = x @ L + c`` when Ψ is affine, else ``None``."""
        return None

    def config(self) -> dict[str, Any]:
        """JSON-able settings (including seeds and the fitted scalars)."""
        return {"kind": self.kind, "dim": self.dim, **self._config()}

    def arrays(self) -> dict[str, np.ndarray]:
        """Fitted arrays (PCA directions, random weights, encoder weights)."""
        return self._arrays()

    def save(self, directory: str | Path) -> Path:
        """Write ``dictionary.json`` and ``dictionary.safetensors`` atomically."""
        from safetensors.numpy import save as save_arrays

        directory = Path(directory)
        arrays = {k: np.ascontiguousarray(v) for k, v in self.arrays().items()}
        atomic_write_bytes(directory / "dictionary.safetensors", save_arrays(arrays))
        atomic_write_json(directory / "dictionary.json", self.config())
        return directory

    # -- subclass hooks -------------------------------------------------------------------
    def _fit(self, x: np.ndarray, U: np.ndarray | None, Y: np.ndarray | None) -> None:
        return None

    def _lift(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _n_features(self) -> int:
        raise NotImplementedError

    def _state(self) -> slice | None:
        return None

    def _config(self) -> dict[str, Any]:
        return {}

    def _arrays(self) -> dict[str, np.ndarray]:
        return {}

    def _restore(self, config: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        return None


def load_dictionary(directory: str | Path) -> Dictionary:
    """Rebuild a fitted dictionary saved by :meth:`Dictionary.save`."""
    from safetensors.numpy import load_file

    directory = Path(directory)
    config = read_json_object(directory / "dictionary.json", "Koopman dictionary (JSON)")
    kind = config.get("kind")
    if not isinstance(kind, str) or kind not in DICTIONARY_KINDS:
        raise InputError(
            f"{directory / 'dictionary.json'} names no known dictionary kind "
            f"({kind!r}; known: {', '.join(sorted(DICTIONARY_KINDS))})."
        )
    cls = DICTIONARY_KINDS.get(kind)
    with reading(directory / "dictionary.safetensors", "Koopman dictionary (safetensors)"):
        arrays = load_file(str(directory / "dictionary.safetensors"))
    obj = cls.__new__(cls)
    obj.dim = config["dim"]
    obj._restore(config, arrays)
    return obj


class _Normalizer:
    """Centre by the mean and divide by the RMS norm, so ``E‖x̃‖² = 1``.

    Residual-stream norms grow with depth and a few massive-activation coordinates dominate raw
    distances; one scalar scale keeps directions intact while making bandwidths and random
    weights comparable across layers.
    """

    def __init__(self, mean: np.ndarray, scale: float) -> None:
        self.mean, self.scale = mean, scale

    @classmethod
    def fit(cls, x: np.ndarray) -> _Normalizer:
        mean = x.mean(axis=0)
        scale = float(np.sqrt(np.mean(np.sum((x - mean) ** 2, axis=1))))
        if scale == 0.0:
            raise ValueError("all states are identical; the dictionary cannot be fitted.")
        return cls(mean, scale)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return (x - self.mean) / self.scale


class IdentityDictionary(Dictionary):
    """``Ψ(x) = x`` (plain DMDc; the sanity anchor)."""

    kind = "identity"

    def __init__(self) -> None:
        self.dim = None

    def _lift(self, x: np.ndarray) -> np.ndarray:
        return x

    def _n_features(self) -> int:
        return self._fitted_dim()

    def _state(self) -> slice | None:
        return slice(0, self.dim)

    def affine_map(self) -> tuple[np.ndarray, np.ndarray]:
        return np.eye(self._fitted_dim()), np.zeros(self._fitted_dim())


class PCADictionary(Dictionary):
    """Top-``k`` PCA coordinates ``Ψ(x) = (x − μ) V_k`` (columns of V_k: unit eigenvectors)."""

    kind = "pca"

    def __init__(self, k: int) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}.")
        self.k, self.dim = k, None

    def _fit(self, x: np.ndarray, U: np.ndarray | None, Y: np.ndarray | None) -> None:
        if self.k > x.shape[1]:
            raise ValueError(f"k={self.k} exceeds the state dimension {x.shape[1]}.")
        self.mean = x.mean(axis=0)
        evals, evecs = np.linalg.eigh(np.cov(x, rowvar=False, bias=True).reshape(x.shape[1], -1))
        order = np.argsort(evals)[::-1][: self.k]
        self.components = evecs[:, order]
        self.explained_variance = evals[order]

    def _lift(self, x: np.ndarray) -> np.ndarray:
        return (x - self.mean) @ self.components

    def _n_features(self) -> int:
        return self.k

    def affine_map(self) -> tuple[np.ndarray, np.ndarray]:
        return self.components, -self.mean @ self.components

    def _config(self) -> dict[str, Any]:
        return {"k": self.k}

    def _arrays(self) -> dict[str, np.ndarray]:
        return {"mean": self.mean, "components": self.components, "ev": self.explained_variance}

    def _restore(self, config: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.k = config["k"]
        self.mean, self.components = arrays["mean"], arrays["components"]
        self.explained_variance = arrays["ev"]


def median_heuristic_gamma(x: np.ndarray, seed: int, n_pairs: int = 2000) -> float:
    """``γ = 1 / median ‖x̃_i − x̃_j‖²`` over ``n_pairs`` seeded random pairs of distinct rows.

    With this γ the Gaussian kernel ``exp(−γ‖x̃ − ỹ‖²)`` equals ``e^{-1}`` at the median pair
    distance, so the random features neither saturate nor linearise.
    """
    rng = np.random.default_rng(seed)
    m = x.shape[0]
    i = rng.integers(0, m, n_pairs)
    j = (i + rng.integers(1, m, n_pairs)) % m
    d2 = np.sum((x[i] - x[j]) ** 2, axis=1)
    med = float(np.median(d2))
    if med <= 0:
        raise ValueError("median pairwise distance is zero; too many duplicate states.")
    return 1.0 / med


class _RandomFeatureBase(Dictionary):
    def __init__(self, n_features: int, seed: int, include_state: bool) -> None:
        if n_features < 1:
            raise ValueError(f"n_features must be >= 1, got {n_features}.")
        self.width, self.seed, self.include_state, self.dim = n_features, seed, include_state, None

    def _state(self) -> slice | None:
        return slice(0, self.dim) if self.include_state else None

    def _with_state(self, x: np.ndarray, feats: np.ndarray) -> np.ndarray:
        return np.concatenate([x, feats], axis=1) if self.include_state else feats

    def _base_config(self) -> dict[str, Any]:
        return {"n_features": self.width, "seed": self.seed, "include_state": self.include_state}

    def _base_restore(self, config: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.width, self.seed = config["n_features"], config["seed"]
        self.include_state = config["include_state"]
        self.norm = _Normalizer(arrays["norm_mean"], float(config["norm_scale"]))


class RandomFourierDictionary(_RandomFeatureBase):
    """``Ψ(x) = [x, cos(x̃W), sin(x̃W)] / (1, √D, √D)`` with ``W ~ N(0, 2γ I)``, ``D`` draws.

    ``x̃`` is the normalised state (centred, divided by the RMS norm of the fitting data); γ is
    the median heuristic on ``x̃`` (:func:`median_heuristic_gamma`) unless given.  Features
    approximate the Gaussian kernel ``exp(−γ‖x̃ − ỹ‖²)``.  Output width ``d + 2D`` with the
    state, ``2D`` without.
    """

    kind = "rff"

    def __init__(
        self,
        n_features: int = 512,
        seed: int = 0,
        gamma: float | None = None,
        include_state: bool = True,
    ) -> None:
        super().__init__(n_features, seed, include_state)
        self.gamma_given = gamma

    def _fit(self, x: np.ndarray, U: np.ndarray | None, Y: np.ndarray | None) -> None:
        self.norm = _Normalizer.fit(x)
        xt = self.norm(x)
        self.gamma = self.gamma_given or median_heuristic_gamma(xt, self.seed)
        rng = np.random.default_rng(self.seed)
        self.W = rng.standard_normal((x.shape[1], self.width)) * np.sqrt(2.0 * self.gamma)

    def _lift(self, x: np.ndarray) -> np.ndarray:
        proj = self.norm(x) @ self.W
        s = 1.0 / np.sqrt(self.width)
        return self._with_state(x, np.concatenate([np.cos(proj) * s, np.sin(proj) * s], axis=1))

    def _n_features(self) -> int:
        return 2 * self.width + (self._fitted_dim() if self.include_state else 0)

    def _config(self) -> dict[str, Any]:
        return {
            **self._base_config(),
            "gamma": self.gamma,
            "gamma_given": self.gamma_given,
            "norm_scale": self.norm.scale,
        }

    def _arrays(self) -> dict[str, np.ndarray]:
        return {"W": self.W, "norm_mean": self.norm.mean}

    def _restore(self, config: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self._base_restore(config, arrays)
        self.gamma, self.gamma_given, self.W = config["gamma"], config["gamma_given"], arrays["W"]


class RandomReLUDictionary(_RandomFeatureBase):
    """The null dictionary ``Ψ(x) = ReLU(x̃ R + b)``, ``R_ij ~ N(0, 1)``, ``b ~ N(0, 1)``.

    Same normalisation as the RFF dictionary, so ``x̃ R`` has unit variance per feature on
    average.  Use it at matched width to calibrate what a dictionary with no relation to the
    model scores.
    """

    kind = "random_relu"

    def __init__(self, n_features: int = 512, seed: int = 0, include_state: bool = False) -> None:
        super().__init__(n_features, seed, include_state)

    def _fit(self, x: np.ndarray, U: np.ndarray | None, Y: np.ndarray | None) -> None:
        self.norm = _Normalizer.fit(x)
        rng = np.random.default_rng(self.seed)
        self.R = rng.standard_normal((x.shape[1], self.width))
        self.b = rng.standard_normal(self.width)

    def _lift(self, x: np.ndarray) -> np.ndarray:
        return self._with_state(x, np.maximum(self.norm(x) @ self.R + self.b, 0.0))

    def _n_features(self) -> int:
        return self.width + (self._fitted_dim() if self.include_state else 0)

    def _config(self) -> dict[str, Any]:
        return {**self._base_config(), "norm_scale": self.norm.scale}

    def _arrays(self) -> dict[str, np.ndarray]:
        return {"R": self.R, "b": self.b, "norm_mean": self.norm.mean}

    def _restore(self, config: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self._base_restore(config, arrays)
        self.R, self.b = arrays["R"], arrays["b"]


@overload
def _to_float64(a: None) -> None: ...
@overload
def _to_float64(a: np.ndarray) -> np.ndarray: ...
def _to_float64(a: object) -> np.ndarray | None:
    if a is None:
        return None
    if hasattr(a, "detach"):  # torch tensor
        a = a.detach().cpu().double().numpy()
    return np.asarray(a, dtype=np.float64)


class SAEDictionary(Dictionary):
    """SAE encoder features in the SAELens convention ``f(x) = act((x − b_dec) W_enc + b_enc)``.

    Parameters
    ----------
    W_enc : (d_in, d_sae) array;  b_enc : (d_sae,);  b_dec : (d_in,)
    activation : ``"relu"``, ``"topk"`` (keep the ``k`` largest pre-activations, then ReLU) or
        ``"jumprelu"`` (``z · [z > threshold]`` with a per-latent ``threshold``).
    include_state : prepend ``x`` so the read-out ``C`` is the exact selector.
    features : keep only these latents (indices), each computed by the whole SAE (TopK
        competition included), for comparisons at equal dictionary size.
    """

    kind = "sae"

    def __init__(
        self,
        W_enc: np.ndarray,
        b_enc: np.ndarray,
        b_dec: np.ndarray,
        activation: str = "relu",
        k: int | None = None,
        threshold: np.ndarray | None = None,
        include_state: bool = False,
        features: np.ndarray | None = None,
    ) -> None:
        self.features = None if features is None else np.asarray(features, dtype=np.int64)
        self.W_enc, self.b_enc, self.b_dec = (
            _to_float64(W_enc),
            _to_float64(b_enc),
            _to_float64(b_dec),
        )
        self.threshold = _to_float64(threshold)
        self.activation, self.k, self.include_state = activation, k, include_state
        self._validate()
        self.dim = self.W_enc.shape[0]

    def _validate(self) -> None:
        if self.W_enc.ndim != 2:
            raise ValueError(f"W_enc must be (d_in, d_sae); got shape {self.W_enc.shape}.")
        d_in, d_sae = self.W_enc.shape
        if self.b_enc.shape != (d_sae,) or self.b_dec.shape != (d_in,):
            raise ValueError(
                f"b_enc must have shape ({d_sae},) and b_dec ({d_in},); got {self.b_enc.shape} "
                f"and {self.b_dec.shape}. (SAELens stores W_enc as (d_in, d_sae).)"
            )
        if self.activation not in ("relu", "topk", "jumprelu"):
            raise ValueError(f"activation must be relu/topk/jumprelu, got {self.activation!r}.")
        if self.activation == "topk" and not (self.k and 1 <= self.k <= d_sae):
            raise ValueError(f"topk activation needs 1 <= k <= {d_sae}; got k={self.k}.")
        if self.activation == "jumprelu" and (
            self.threshold is None or self.threshold.shape != (d_sae,)
        ):
            raise ValueError(f"jumprelu activation needs a threshold of shape ({d_sae},).")
        f = self.features
        if f is not None and (f.ndim != 1 or f.size == 0 or f.min() < 0 or f.max() >= d_sae):
            raise ValueError(f"features must be a non-empty 1-D index array into {d_sae} latents.")

    def fit(
        self, X: np.ndarray, U: np.ndarray | None = None, Y: np.ndarray | None = None
    ) -> SAEDictionary:
        """No-op apart from shape checks: the SAE is already trained."""
        check_array(X, name="X", n_cols=self.dim)
        return self

    def _lift(self, x: np.ndarray) -> np.ndarray:
        z = (x - self.b_dec) @ self.W_enc + self.b_enc
        if self.activation == "relu":
            f = np.maximum(z, 0.0)
        elif self.activation == "jumprelu":
            f = np.where(z > self.threshold, z, 0.0)
        else:
            assert self.k is not None  # checked by _validate
            idx = np.argpartition(z, -self.k, axis=1)[:, -self.k :]
            f = np.zeros_like(z)
            np.put_along_axis(f, idx, np.maximum(np.take_along_axis(z, idx, axis=1), 0.0), 1)
        if self.features is not None:
            f = f[:, self.features]
        return np.concatenate([x, f], axis=1) if self.include_state else f

    def _n_features(self) -> int:
        n = self.W_enc.shape[1] if self.features is None else self.features.size
        return n + (self._fitted_dim() if self.include_state else 0)

    def _state(self) -> slice | None:
        return slice(0, self.dim) if self.include_state else None

    def _config(self) -> dict[str, Any]:
        return {"activation": self.activation, "k": self.k, "include_state": self.include_state}

    def _arrays(self) -> dict[str, np.ndarray]:
        out = {"W_enc": self.W_enc, "b_enc": self.b_enc, "b_dec": self.b_dec}
        if self.threshold is not None:
            out["threshold"] = self.threshold
        if self.features is not None:
            out["features"] = self.features
        return out

    def _restore(self, config: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.W_enc, self.b_enc, self.b_dec = arrays["W_enc"], arrays["b_enc"], arrays["b_dec"]
        self.threshold = arrays.get("threshold")
        self.features = arrays.get("features")
        self.activation, self.k = config["activation"], config["k"]
        self.include_state = config["include_state"]


class SpectralDictionary(Dictionary):
    """Approximate Koopman eigenfunctions selected by held-out invariance.

    Construction (fitted on ``X, U, Y``):

    1. **Base lift** ``b(x)``: the top-``k`` *whitened* PCA coordinates ``z`` of the state plus
       all products ``z_i z_j`` (i ≤ j) of the top-``q`` of them — a polynomial dictionary
       that is exact for linear dynamics and captures the leading quadratic nonlinearity of
       the MLP update.
    2. **First EDMDc pass** on the first half of the rows (contiguous, so by prompt when rows
       are grouped by prompt): centred ridge regression ``b(y) ≈ A b(x) + B u``.
    3. **Eigenfunctions** ``φ_i(x) = w_iᴴ (b(x) − b̄)`` from the left eigenvectors ``w_i`` of
       ``A``; on the second half each eigenvalue (conjugate pairs as one real 2-D mode) is
       scored by its one-step residual ``E|φ(y) − λφ(x) − w_iᴴBu|² / Var φ(y)``.
    4. Keep the ``n_modes`` best-scoring modes; Ψ holds ``Re φ`` (and ``Im φ`` for pairs).

    Why: the span of exact eigenfunctions is K-invariant, the property (DR2) the spectrum's
    identifiability needs; ranking on held-out data keeps the eigenfunctions whose one-step
    prediction generalises, and drops those that only fit sampling noise.  EDMDc on this
    dictionary returns (approximately) the selected eigenvalues.
    """

    kind = "spectral"

    def __init__(
        self,
        n_modes: int = 32,
        k: int = 64,
        q: int = 8,
        alpha: float = 1e-6,
        include_state: bool = False,
    ) -> None:
        if n_modes < 1 or k < 1 or q < 0 or q > k:
            raise ValueError(f"need n_modes >= 1, k >= 1, 0 <= q <= k; got {n_modes}, {k}, {q}.")
        self.n_modes, self.k, self.q, self.alpha = n_modes, k, q, alpha
        self.include_state, self.dim = include_state, None

    def _base(self, x: np.ndarray) -> np.ndarray:
        z = (x - self.pca_mean) @ self.pca_components
        if self.q == 0:
            return z
        iu, ju = np.triu_indices(self.q)
        return np.concatenate([z, z[:, iu] * z[:, ju]], axis=1)

    def _fit(self, x: np.ndarray, U: np.ndarray | None, Y: np.ndarray | None) -> None:
        if U is None or Y is None:
            raise ValueError("the spectral dictionary needs U and Y to fit (it runs an EDMDc).")
        u = check_array(U, name="U")
        y = check_array(Y, name="Y", n_cols=x.shape[1])
        if not (u.shape[0] == y.shape[0] == x.shape[0]):
            raise ValueError("X, U and Y must have the same number of rows.")
        k = min(self.k, x.shape[1])
        self.pca_mean = x.mean(axis=0)
        evals, evecs = np.linalg.eigh(np.atleast_2d(np.cov(x, rowvar=False, bias=True)))
        order = np.argsort(evals)[::-1][:k]
        self.pca_components = evecs[:, order] / np.sqrt(np.maximum(evals[order], 1e-300))
        self.k = k
        self.q = min(self.q, k)
        bx, by = self._base(x), self._base(y)
        n_base = bx.shape[1]
        half = x.shape[0] // 2
        if half < n_base + u.shape[1]:
            raise ValueError(
                f"{x.shape[0]} samples are too few to fit a spectral dictionary with "
                f"{n_base} base features and {u.shape[1]} controls; need more than "
                f"{2 * (n_base + u.shape[1])}."
            )
        self.base_mean = bx[:half].mean(axis=0)
        z = np.concatenate([bx[:half], u[:half]], axis=1)
        zm = z.mean(axis=0)
        zc, yc = z - zm, by[:half] - by[:half].mean(axis=0)
        g = zc.T @ zc / half
        g[np.diag_indices_from(g)] += self.alpha * np.trace(g) / g.shape[0]
        K = np.linalg.solve(g, zc.T @ yc / half).T
        A, B = K[:, :n_base], K[:, n_base:]
        lam, W = np.linalg.eig(A.T)  # columns of W: left eigenvectors of A
        # score every eigenfunction on the held-out half
        bx2, by2, u2 = bx[half:], by[half:], u[half:] - zm[n_base:]
        phx = (bx2 - self.base_mean) @ W.conj()
        phy = (by2 - self.base_mean) @ W.conj()
        res = phy - phx * lam - u2 @ (B.T @ W.conj())
        var = np.var(phy, axis=0)
        score = np.mean(np.abs(res - res.mean(axis=0)) ** 2, axis=0) / np.maximum(var, 1e-300)
        chosen: list[int] = []
        dims = 0
        for i in np.argsort(score):
            if dims >= self.n_modes:
                break
            if lam[i].imag < 0:  # a pair is represented by its upper-half-plane member
                continue
            chosen.append(int(i))
            dims += 2 if lam[i].imag > 0 else 1
        cols = []
        for i in chosen:
            cols.append(W[:, i].conj().real)
            if lam[i].imag > 0:
                cols.append(W[:, i].conj().imag)
        self.weights = np.stack(cols, axis=1)
        self.selected_eigenvalues = lam[chosen]
        self.selected_scores = score[chosen]

    def _lift(self, x: np.ndarray) -> np.ndarray:
        f = (self._base(x) - self.base_mean) @ self.weights
        return np.concatenate([x, f], axis=1) if self.include_state else f

    def _n_features(self) -> int:
        return self.weights.shape[1] + (self._fitted_dim() if self.include_state else 0)

    def _state(self) -> slice | None:
        return slice(0, self.dim) if self.include_state else None

    def _config(self) -> dict[str, Any]:
        return {
            "n_modes": self.n_modes,
            "k": self.k,
            "q": self.q,
            "alpha": self.alpha,
            "include_state": self.include_state,
            "selected_eigenvalues": [
                [float(v.real), float(v.imag)] for v in self.selected_eigenvalues
            ],
            "selected_scores": [float(s) for s in self.selected_scores],
        }

    def _arrays(self) -> dict[str, np.ndarray]:
        return {
            "pca_mean": self.pca_mean,
            "pca_components": self.pca_components,
            "base_mean": self.base_mean,
            "weights": self.weights,
        }

    def _restore(self, config: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.n_modes, self.k, self.q = config["n_modes"], config["k"], config["q"]
        self.alpha, self.include_state = config["alpha"], config["include_state"]
        self.selected_eigenvalues = np.array(
            [complex(a, b) for a, b in config["selected_eigenvalues"]]
        )
        self.selected_scores = np.array(config["selected_scores"])
        self.pca_mean, self.pca_components = arrays["pca_mean"], arrays["pca_components"]
        self.base_mean, self.weights = arrays["base_mean"], arrays["weights"]

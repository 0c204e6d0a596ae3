"""Synthetic controlled linear systems with a known spectrum (shared by the koopman tests)."""

from __future__ import annotations

import numpy as np


def linear_system(
    rng: np.random.Generator,
    eigenvalues: np.ndarray,
    n_controls: int = 2,
    n_samples: int = 2000,
    noise: float = 0.0,
    tokens_per_prompt: int = 8,
) -> dict[str, np.ndarray]:
    """y = A x + B u + noise with ``A = S diag(λ) S⁻¹`` real (pairs as 2×2 rotation blocks)."""
    blocks = []
    for lam in eigenvalues:
        if abs(lam.imag) > 0:
            if lam.imag > 0:
                blocks.append(np.array([[lam.real, -lam.imag], [lam.imag, lam.real]]))
        else:
            blocks.append(np.array([[lam.real]]))
    D = np.zeros((len(eigenvalues), len(eigenvalues)))
    i = 0
    for b in blocks:
        k = b.shape[0]
        D[i : i + k, i : i + k] = b
        i += k
    d = D.shape[0]
    S = rng.standard_normal((d, d)) + 2 * np.eye(d)
    A = S @ D @ np.linalg.inv(S)
    B = rng.standard_normal((d, n_controls))
    X = rng.standard_normal((n_samples, d))
    U = rng.standard_normal((n_samples, n_controls))
    Y = X @ A.T + U @ B.T + noise * rng.standard_normal((n_samples, d))
    ids = np.arange(n_samples) // tokens_per_prompt
    return {"A": A, "B": B, "X": X, "U": U, "Y": Y, "ids": ids}

"""The toy setting of Huang & Hahn: mutually exclusive feature groups in a small hidden space.

Features come in groups; within a group at most one feature is active at a time (the group is
absent with probability ``p_absent``, otherwise one uniformly chosen feature is active with a
magnitude drawn from U(0, 1)); groups are independent.  A ReLU autoencoder in the style of
Elhage et al.'s toy models of superposition, ``x_hat = ReLU(x W W^T + b)`` with ``W`` of shape
``(n_features, hidden_dim)``, is trained to reconstruct ``x``; the hidden activations
``h = x W`` are what NDM decomposes.  Because features of one group never co-occur they can
share (superpose in) one subspace, while different groups must stay orthogonal, so the ground
truth is one subspace per group: the span of that group's rows of ``W``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from structlens.results import Result


@dataclasses.dataclass
class ToyConfig:
    """Settings of :func:`train_toy_model` (defaults: the paper's toy, 2 groups x 20 in 12 dims)."""

    n_groups: int = 2
    group_size: int = 20
    hidden_dim: int = 12
    p_absent: float = 0.25
    steps: int = 10_000
    batch_size: int = 1_024
    lr: float = 1e-3
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class ToyModel(Result):
    """A trained toy autoencoder: ``W`` ``(n_features, hidden_dim)``, bias ``b``, feature groups
    (``groups[f]`` is the group of feature ``f``), final reconstruction loss, and its config."""

    W: np.ndarray
    b: np.ndarray
    groups: list[int]
    loss: float
    config: dict

    def sample(self, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``n`` feature vectors ``x`` ``(n, n_features)`` and hidden activations ``h = x W``."""
        cfg = ToyConfig(**self.config)
        x = _sample_features(cfg, n, torch.Generator().manual_seed(seed)).numpy()
        return x, (x @ self.W).astype(np.float32)

    def ground_truth_bases(self, energy: float = 0.99) -> list[np.ndarray]:
        """Orthonormal basis ``(hidden_dim, r_g)`` of each group's span of decoder rows.

        ``r_g`` is the smallest rank holding ``energy`` of the squared singular values of the
        group's rows of ``W``, so numerical leakage does not inflate the dimension.
        """
        bases = []
        groups = np.asarray(self.groups)
        for g in range(int(groups.max()) + 1):
            u, s, _ = np.linalg.svd(self.W[groups == g].T, full_matrices=False)
            share = np.cumsum(s**2) / np.sum(s**2)
            rank = int(np.searchsorted(share, energy) + 1)
            bases.append(u[:, :rank])
        return bases


def _sample_features(cfg: ToyConfig, n: int, generator: torch.Generator) -> torch.Tensor:
    x = torch.zeros(n, cfg.n_groups * cfg.group_size)
    for g in range(cfg.n_groups):
        present = torch.rand(n, generator=generator) >= cfg.p_absent
        which = torch.randint(cfg.group_size, (n,), generator=generator)
        value = torch.rand(n, generator=generator)
        rows = torch.nonzero(present).squeeze(1)
        x[rows, g * cfg.group_size + which[rows]] = value[rows]
    return x


def train_toy_model(config: ToyConfig | None = None) -> ToyModel:
    """Train the toy ReLU autoencoder with Adam on mean squared reconstruction error."""
    cfg = config or ToyConfig()
    if cfg.n_groups < 1 or cfg.group_size < 1 or cfg.hidden_dim < 1:
        raise ValueError("n_groups, group_size and hidden_dim must all be >= 1.")
    if not 0.0 <= cfg.p_absent < 1.0:
        raise ValueError(f"p_absent must lie in [0, 1), got {cfg.p_absent}.")
    gen = torch.Generator().manual_seed(cfg.seed)
    n_features = cfg.n_groups * cfg.group_size
    W = torch.nn.Parameter(torch.randn(n_features, cfg.hidden_dim, generator=gen) * 0.1)
    b = torch.nn.Parameter(torch.zeros(n_features))
    opt = torch.optim.Adam([W, b], lr=cfg.lr)
    loss = torch.zeros(())
    for _ in range(cfg.steps):
        x = _sample_features(cfg, cfg.batch_size, gen)
        loss = ((torch.relu(x @ W @ W.T + b) - x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return ToyModel(
        W=W.detach().numpy().astype(np.float64),
        b=b.detach().numpy().astype(np.float64),
        groups=[f // cfg.group_size for f in range(n_features)],
        loss=float(loss.detach()),
        config=dataclasses.asdict(cfg),
    )


@dataclasses.dataclass(frozen=True)
class PlantedPartition:
    """Activations with a known subspace partition (see :func:`planted_partition`).

    ``h`` is ``(n, d)`` float32 (rows = samples); ``bases[g]`` is the orthonormal ``(d, d_g)``
    basis of group ``g``'s subspace (a column block of ``rotation``, in the order of ``sizes``).
    """

    h: np.ndarray
    rotation: np.ndarray
    sizes: list[int]

    def bases(self) -> list[np.ndarray]:
        bounds = np.concatenate([[0], np.cumsum(self.sizes)])
        return [self.rotation[:, bounds[g] : bounds[g + 1]] for g in range(len(self.sizes))]


def planted_partition(
    sizes: Sequence[int],
    n: int,
    *,
    features_per_dim: int = 2,
    p_absent: float = 0.25,
    noise: float = 0.02,
    seed: int = 0,
) -> PlantedPartition:
    """Independent groups of mutually exclusive features in a randomly rotated space.

    Group ``g`` owns ``features_per_dim * sizes[g]`` random unit directions in its own
    ``sizes[g]``-dimensional block; in each sample the group is absent with probability
    ``p_absent``, otherwise one of its features is active with magnitude U(0, 1) (the toy's
    generative rule, without the autoencoder).  Isotropic Gaussian noise of standard deviation
    ``noise`` is added (KSG needs continuous data), and the blocks are rotated by a Haar-random
    orthogonal matrix, so the true subspaces are not basis-aligned.
    """
    sizes = [int(s) for s in sizes]
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"sizes must be positive block dimensions, got {sizes}.")
    if n < 1 or features_per_dim < 1 or not 0.0 <= p_absent < 1.0:
        raise ValueError("need n >= 1, features_per_dim >= 1 and p_absent in [0, 1).")
    rng = np.random.default_rng(seed)
    blocks = []
    for k in sizes:
        dirs = rng.standard_normal((features_per_dim * k, k))
        dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
        which = rng.integers(0, dirs.shape[0], n)
        scale = rng.uniform(0.0, 1.0, n) * (rng.uniform(size=n) >= p_absent)
        blocks.append(dirs[which] * scale[:, None] + noise * rng.standard_normal((n, k)))
    d = sum(sizes)
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    q = q * np.sign(np.diag(r))
    return PlantedPartition(h=(np.hstack(blocks) @ q.T).astype(np.float32), rotation=q, sizes=sizes)


def principal_angles(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Principal angles (radians, ascending) between the column spans of ``a`` and ``b``.

    Both are ``(d, k)`` matrices with orthonormal columns; there are ``min(k_a, k_b)`` angles.
    """
    s = np.linalg.svd(a.T @ b, compute_uv=False)
    return np.sort(np.arccos(np.clip(s, -1.0, 1.0)))


def subspace_overlap(a: np.ndarray, b: np.ndarray) -> float:
    """``|a^T b|_F^2 / min(k_a, k_b)`` in ``[0, 1]``: 1 when one span contains the other,
    0 when they are orthogonal (mean squared cosine of the principal angles)."""
    return float(np.sum((a.T @ b) ** 2) / min(a.shape[1], b.shape[1]))


def recovery_report(found: Sequence[np.ndarray], truth: Sequence[np.ndarray]) -> dict[str, object]:
    """Match found subspaces to ground-truth ones and report how well they agree.

    Returns ``overlap`` (the ``(len(found), len(truth))`` matrix of :func:`subspace_overlap`),
    ``matching`` (pairs ``[found, truth]`` maximising total overlap), ``matched_overlap`` (their
    overlaps), ``principal_angles_deg`` per matched pair, and ``min_matched_overlap``.
    """
    overlap = np.array([[subspace_overlap(f, t) for t in truth] for f in found])
    rows, cols = linear_sum_assignment(-overlap)
    matched = [float(overlap[r, c]) for r, c in zip(rows, cols, strict=True)]
    angles = [
        np.degrees(principal_angles(found[r], truth[c])).tolist()
        for r, c in zip(rows, cols, strict=True)
    ]
    return {
        "overlap": overlap.tolist(),
        "matching": [[int(r), int(c)] for r, c in zip(rows, cols, strict=True)],
        "matched_overlap": matched,
        "principal_angles_deg": angles,
        "min_matched_overlap": float(min(matched)),
    }

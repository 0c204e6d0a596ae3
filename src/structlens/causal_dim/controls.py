"""Controls for the causal-dimensionality claims, at the array/callable level.

* :func:`random_orthonormal_encoder` / :func:`random_orthonormal_decoder` and
  :func:`four_cell_ablation`: learned vs random encoder × learned vs random decoder, with
  ε calibrated on the learned/learned cell and the N_causal inflation factor of each cell.
  Run it on JumpReLU/ReLU SAEs: the random-encoder copy keeps the learned biases and
  thresholds, so the sparsity filter the paper names is what changes; a TopK copy keeps
  exactly k active features per token in every cell, so N_repr cannot move.  L0 (mean
  firing features per token) is logged per cell.
* :class:`SyntheticCausalModel` and :func:`atp_recall`: a toy model whose output depends on
  known directions only, and whether top-AtP SAE features recover those directions.  With
  ``readout="rotated"`` (the paper's ground truth) the causal read-out directions are random
  orthonormal mixtures of several atoms, so no dictionary atom is aligned with one.
Matched L0 lives in :mod:`structlens.sae.train` (``target_l0``); architecture invariance is a
width sweep per architecture fed to :func:`structlens.causal_dim.sweep.analyze_width_sweep`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable

import numpy as np
import torch

from structlens.causal_dim.sweep import FeatureStats, calibrate_epsilon
from structlens.results import Result
from structlens.sae.models import SparseAutoencoder


def _random_frame(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """``[rows, cols]`` with orthonormal columns if rows ≥ cols, else orthonormal rows."""
    a = torch.randn(max(rows, cols), min(rows, cols), generator=gen, dtype=torch.float64)
    q, r = torch.linalg.qr(a)
    q = q * torch.sign(torch.diagonal(r))  # Haar-distributed, not QR-convention biased
    return q if rows >= cols else q.T


@torch.no_grad()
def random_orthonormal_encoder(sae: SparseAutoencoder, seed: int = 0) -> SparseAutoencoder:
    """Copy of ``sae`` whose encoder is a random orthonormal projection.

    ``W_enc`` [d_in, d_sae] gets orthonormal columns (d_sae ≤ d_in) or orthonormal rows (a
    tight frame, d_sae > d_in); each column is then rescaled to the norm of the learned one,
    so pre-activations keep their scale relative to ``b_enc`` and thresholds.
    """
    out = copy.deepcopy(sae)
    q = _random_frame(sae.d_in, sae.d_sae, torch.Generator().manual_seed(seed))
    q = q / q.norm(dim=0, keepdim=True) * sae.W_enc.norm(dim=0, keepdim=True).double()
    out.W_enc_t.copy_(q.T.to(out.W_enc_t.dtype))
    return out


@torch.no_grad()
def random_orthonormal_decoder(sae: SparseAutoencoder, seed: int = 0) -> SparseAutoencoder:
    """Copy of ``sae`` whose decoder rows are a random orthonormal set / tight frame, each
    rescaled to the norm of the learned row."""
    out = copy.deepcopy(sae)
    q = _random_frame(sae.d_sae, sae.d_in, torch.Generator().manual_seed(seed + 1))
    q = q / q.norm(dim=1, keepdim=True) * sae.W_dec.norm(dim=1, keepdim=True).double()
    out.W_dec.copy_(q.to(out.W_dec.dtype))
    return out


@dataclasses.dataclass(frozen=True)
class FourCellResult(Result):
    """N_causal and N_repr per cell, ε from the learned/learned cell, and inflation factors.

    Cells are keyed ``"<encoder>_enc/<decoder>_dec"`` with ``learned`` or ``random``;
    ``inflation[c] = N_causal[c] / N_causal["learned_enc/learned_dec"]``; ``l0[c]`` is the
    mean number of firing features per token; ``architecture`` the SAE class.
    """

    n_causal: dict
    n_repr: dict
    inflation: dict
    epsilon: float
    top_fraction: float
    n_tokens: int
    l0: dict = dataclasses.field(default_factory=dict)
    architecture: str = ""


def four_cell_ablation(
    sae: SparseAutoencoder,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    top_fraction: float = 0.02,
    min_count: int = 1,
    seed: int = 0,
) -> FourCellResult:
    """Run the encoder/decoder ablation on ``(acts, grads)`` batches (grads = ∇_h metric).

    Every cell is spliced with its own error term, so the model output is unchanged and AtP
    is ``−f_i ⟨W_dec[i], g⟩`` with that cell's codes and decoder.
    """
    enc = random_orthonormal_encoder(sae, seed)
    cells = {
        "learned_enc/learned_dec": sae,
        "random_enc/learned_dec": enc,
        "learned_enc/random_dec": random_orthonormal_decoder(sae, seed),
        "random_enc/random_dec": random_orthonormal_decoder(enc, seed),
    }
    stats = {name: FeatureStats(sae.d_sae, n_blocks=1) for name in cells}
    n = 0
    for acts, grads in batches:
        n += acts.shape[0]
        for name, cell in cells.items():
            stats[name].update(cell, acts, grads)
    if n == 0:
        raise ValueError("no (acts, grads) batches were given.")
    scores = {name: s.scores() for name, s in stats.items()}
    eps = calibrate_epsilon(scores["learned_enc/learned_dec"][0], top_fraction)
    n_causal = {name: int(np.sum(a > eps)) for name, (a, _) in scores.items()}
    n_repr = {name: int(np.sum(c >= min_count)) for name, (_, c) in scores.items()}
    base = n_causal["learned_enc/learned_dec"]
    return FourCellResult(
        n_causal=n_causal,
        n_repr=n_repr,
        inflation={k: (v / base if base else float("nan")) for k, v in n_causal.items()},
        epsilon=eps,
        top_fraction=top_fraction,
        n_tokens=n,
        l0={name: float(s.fires.sum() / s.tokens.sum()) for name, s in stats.items()},
        architecture=type(sae).__name__,
    )


class SyntheticCausalModel:
    """Toy residual stream with known causal directions.

    Residuals are sparse nonnegative combinations of ``n_atoms`` random unit atoms in
    ``R^d`` (each token activates ``active`` atoms); the "model" reads out only the first
    ``n_causal`` atoms: ``logits = B tanh(C h)``, ``C`` = causal atoms [n_causal, d], ``B``
    random [vocab, n_causal].  So ``J = B diag(tanh') C`` and the true causal directions are
    the rows of ``C``; every other atom is represented but causally inert.  With
    ``orthogonal_atoms`` (needs ``n_atoms ≤ d``) inert atoms are orthogonal to the causal
    subspace, so their AtP is exactly zero; otherwise random atoms overlap it (|cos| ~ 1/√d),
    which is what makes top-AtP recall hard even for a dictionary equal to the atoms.

    ``readout="rotated"``: the causal directions are instead ``n_causal`` orthonormal random
    mixtures of the first ``n_mix`` atoms (default ``min(4·n_causal, n_atoms)``), i.e. read-out
    directions not aligned with any atom (the paper's synthetic ground truth).  They still span
    a subspace of the atoms' span, so ``J`` has rank ``n_causal``, but an SAE that learns the
    atoms cannot recall them.
    """

    def __init__(
        self,
        d: int = 32,
        n_atoms: int = 256,
        n_causal: int = 8,
        vocab: int = 64,
        active: int = 4,
        seed: int = 0,
        orthogonal_atoms: bool = False,
        readout: str = "atoms",
        n_mix: int | None = None,
    ) -> None:
        if not 0 < n_causal <= n_atoms or active < 1 or d < 2:
            raise ValueError("need 0 < n_causal ≤ n_atoms, active ≥ 1 and d ≥ 2.")
        if readout not in ("atoms", "rotated"):
            raise ValueError(f"readout must be 'atoms' or 'rotated', got {readout!r}.")
        n_mix = min(4 * n_causal, n_atoms) if n_mix is None else n_mix
        if readout == "rotated" and not n_causal < n_mix <= n_atoms:
            raise ValueError(f"need n_causal < n_mix <= n_atoms; got n_mix = {n_mix}.")
        if orthogonal_atoms and n_atoms > d:
            raise ValueError(f"orthogonal_atoms needs n_atoms ≤ d, got {n_atoms} > {d}.")
        self.gen = torch.Generator().manual_seed(seed)
        atoms = torch.randn(n_atoms, d, generator=self.gen)
        if orthogonal_atoms:
            atoms = torch.linalg.qr(atoms.T)[0].T
        self.atoms = atoms / atoms.norm(dim=1, keepdim=True)
        if readout == "atoms":
            self.causal = self.atoms[:n_causal]
        else:
            mix = _random_frame(n_causal, n_mix, self.gen).float()  # orthonormal rows
            causal = mix @ self.atoms[:n_mix]
            self.causal = causal / causal.norm(dim=1, keepdim=True)
        self.readout_kind = readout
        self.readout = torch.randn(vocab, n_causal, generator=self.gen)
        self.active = active

    def sample(self, n: int) -> torch.Tensor:
        """``n`` residual vectors [n, d]."""
        idx = torch.rand(n, self.atoms.shape[0], generator=self.gen).argsort(1)[:, : self.active]
        coef = torch.rand(n, self.active, generator=self.gen) + 0.5
        return (coef[..., None] * self.atoms[idx]).sum(1)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """Logits [n, vocab] for residuals [n, d] (a batched callable)."""
        return torch.tanh(h @ self.causal.T) @ self.readout.T

    def metric_grads(self, h: torch.Tensor) -> torch.Tensor:
        """∇_h of the per-token metric ``logsumexp(logits)`` (one backward pass)."""
        h = h.detach().requires_grad_(True)
        with torch.enable_grad():
            (g,) = torch.autograd.grad(torch.logsumexp(self(h), -1).sum(), h)
        return g


@dataclasses.dataclass(frozen=True)
class RecallResult(Result):
    """Share of true causal directions matched (|cos| ≥ ``cos_threshold``) by the decoder rows
    of the ``top_k`` features by AtP, plus the same for features chosen at random (chance)."""

    recall: float
    chance_recall: float
    top_k: int
    cos_threshold: float
    matched: np.ndarray
    best_cos: np.ndarray


@torch.no_grad()
def atp_recall(
    sae: SparseAutoencoder,
    causal_directions: torch.Tensor,
    acts: torch.Tensor,
    grads: torch.Tensor,
    *,
    top_k: int | None = None,
    cos_threshold: float = 0.9,
    seed: int = 0,
) -> RecallResult:
    """Recall of ``causal_directions`` [k, d] among the decoder rows of top-AtP features.

    ``top_k`` defaults to ``⌈0.02·d_sae⌉`` (the N_causal calibration at the base width).
    """
    if causal_directions.ndim != 2 or causal_directions.shape[1] != sae.d_in:
        raise ValueError(f"causal_directions must be [k, {sae.d_in}].")
    stats = FeatureStats(sae.d_sae, n_blocks=1)
    stats.update(sae, acts, grads)
    scores, _ = stats.scores()
    k = top_k or int(np.ceil(0.02 * sae.d_sae))
    top = np.argsort(-scores, kind="stable")[:k]
    dec = sae.W_dec / sae.W_dec.norm(dim=1, keepdim=True)
    dirs = causal_directions / causal_directions.norm(dim=1, keepdim=True)
    cos = (dirs.double() @ dec.double().T).abs()  # [k_true, d_sae]
    best = cos[:, torch.as_tensor(top)].max(1).values.numpy()
    rand = np.random.default_rng(seed).choice(sae.d_sae, size=k, replace=False)
    chance = cos[:, torch.as_tensor(rand)].max(1).values.numpy()
    return RecallResult(
        recall=float(np.mean(best >= cos_threshold)),
        chance_recall=float(np.mean(chance >= cos_threshold)),
        top_k=k,
        cos_threshold=cos_threshold,
        matched=best >= cos_threshold,
        best_cos=best,
    )

"""The exponential's block-triangular gradient: the Fréchet derivative it computes agrees with a
known closed form, with finite differences and with PyTorch's own gradient, in float64 and (to
float32 rounding) in float32, for single and batched matrices of small and large norm; NDM's
default (float64) gradient is PyTorch's to round-off; and a training run with the float32
gradient recovers planted subspaces as one with PyTorch's does."""

import pytest
import torch

from structlens.ndm.expm import frechet_exp, matrix_exp
from structlens.ndm.ndm import _ADJOINT_DTYPES, NDM, NDMConfig, orthogonal_map
from structlens.ndm.toy import planted_partition, recovery_report


def _skew(n: int, scale: float, seed: int, batch: tuple[int, ...] = ()) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    A = scale * torch.randn(*batch, n, n, generator=g, dtype=torch.float64)
    return A - A.mT


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("scale", [0.0, 0.05, 1.0, 6.0])
def test_commuting_direction_has_the_closed_form(scale):
    """X commutes with itself, so L(X, X) = X exp(X)."""
    X = _skew(10, scale, 0) + torch.eye(10, dtype=torch.float64)
    assert _rel(frechet_exp(X, X), X @ torch.linalg.matrix_exp(X)) < 1e-13


@pytest.mark.parametrize("scale", [0.1, 2.0])
def test_agrees_with_central_differences(scale):
    X = _skew(7, scale, 1)
    E = torch.randn(7, 7, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    h = 1e-6
    fd = (torch.linalg.matrix_exp(X + h * E) - torch.linalg.matrix_exp(X - h * E)) / (2 * h)
    assert _rel(frechet_exp(X, E), fd) < 1e-8


@pytest.mark.parametrize(("n", "scale", "batch"), [(6, 0.0, ()), (12, 0.3, ()), (9, 4.0, (3,))])
def test_gradient_matches_pytorchs(n, scale, batch):
    W = _skew(n, scale, 3, batch).requires_grad_()
    G = torch.randn(*batch, n, n, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    torch.linalg.matrix_exp(W).backward(G)
    expected, W.grad = W.grad, None
    out = matrix_exp(W)
    out.backward(G)
    assert torch.equal(out, torch.linalg.matrix_exp(W))  # the forward pass is PyTorch's
    assert _rel(W.grad, expected) < 1e-12
    W.grad = None
    matrix_exp(W, torch.float32).backward(G)
    assert W.grad.dtype == torch.float64
    assert _rel(W.grad, expected) < 2e-6


def test_the_rotation_map_uses_it_and_stays_exact():
    W = _skew(16, 0.5, 5).requires_grad_()
    G = torch.randn(16, 16, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    torch.linalg.matrix_exp(W).backward(G)
    expected, W.grad = W.grad, None
    orthogonal_map(W, "exp", torch.float64).backward(G)
    assert _rel(W.grad, expected) < 1e-12


@pytest.mark.parametrize("norm", [5.0, 25.0])
def test_the_default_gradient_is_pytorchs_to_round_off(norm):
    """NDMConfig's default exponential gradient, through the rotation map a training step
    uses, equals autograd's on a d = 64 skew matrix of |W|_1 = norm (4 and 6 squarings of the
    block-triangular pair)."""
    W = _skew(64, 1.0, 7)
    W = (W * (norm / float(torch.linalg.matrix_norm(W, 1)))).requires_grad_()
    G = torch.randn(64, 64, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    torch.linalg.matrix_exp(W).backward(G)
    expected, W.grad = W.grad, None
    adjoint = _ADJOINT_DTYPES[NDMConfig().exp_gradient]
    assert adjoint is not None  # the default is the block-triangular gradient, not autograd's
    orthogonal_map(W, "exp", adjoint).backward(G)
    assert _rel(W.grad, expected) < 1e-10


def test_an_unknown_gradient_option_is_refused():
    with pytest.raises(ValueError, match="exp_gradient"):
        NDMConfig(exp_gradient="float16").validate()  # type: ignore[arg-type]


@pytest.mark.parametrize("gradient", ["pytorch", "float32"])
def test_training_with_either_gradient_recovers_planted_subspaces(gradient):
    """Two independent 2-D groups behind a random rotation, from a random start, no merges:
    the float32 block gradient aligns the subspaces as PyTorch's does."""
    planted = planted_partition([2, 2], 3000, seed=0)
    cfg = NDMConfig(
        unit_size=2, lr=2e-2, batch_size=64, max_steps=400, bank_size=768, refresh_interval=30,
        merge_start=10**6, mi_samples=600, init="random", seed=0, exp_gradient=gradient,
    )  # fmt: skip
    result = NDM(cfg).fit(planted.h)
    assert result.partition == [2, 2]
    assert recovery_report(result.bases(), planted.bases())["min_matched_overlap"] >= 0.95

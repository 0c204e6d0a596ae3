"""The exponential's block-triangular gradient: the Fréchet derivative it computes agrees with a
known closed form, with finite differences and with PyTorch's own gradient, in float64 and (to
float32 rounding) in float32, for single and batched matrices of small and large norm; NDM's
gradient options are PyTorch's to their precision; the products it takes are the ones the
step benchmark counts; and training with it follows PyTorch's trajectory."""

import pytest
import torch

from structlens.ndm.expm import adjoint_products, frechet_exp, matrix_exp, norm_bound, squarings
from structlens.ndm.ndm import _ADJOINT_DTYPES, NDM, NDMConfig, orthogonal_map
from structlens.ndm.toy import planted_partition


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


@pytest.mark.parametrize(("option", "tolerance"), [("float64", 1e-10), ("float32", 1e-6)])
@pytest.mark.parametrize("norm", [5.0, 25.0])
def test_each_gradient_option_is_pytorchs_to_its_precision(norm, option, tolerance):
    """The exponential gradient of each ``NDMConfig.exp_gradient`` option (the default is
    float32), through the rotation map a training step uses, equals autograd's on a d = 64
    skew matrix of |W|_1 = norm to that precision's round-off."""
    W = _skew(64, 1.0, 7)
    W = (W * (norm / float(torch.linalg.matrix_norm(W, 1)))).requires_grad_()
    G = torch.randn(64, 64, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    torch.linalg.matrix_exp(W).backward(G)
    expected, W.grad = W.grad, None
    assert NDMConfig().exp_gradient == "float32"
    orthogonal_map(W, "exp", _ADJOINT_DTYPES[option]).backward(G)
    assert _rel(W.grad, expected) < tolerance


def test_an_unknown_gradient_option_is_refused():
    with pytest.raises(ValueError, match="exp_gradient"):
        NDMConfig(exp_gradient="float16").validate()  # type: ignore[arg-type]


@pytest.mark.parametrize(("gradient", "tolerance"), [("float64", 1e-12), ("float32", 1e-3)])
def test_training_follows_pytorchs_trajectory(gradient, tolerance):
    """Twenty steps from one random start on planted 2-D groups: the rotation trained with the
    block-triangular gradient is the one trained with PyTorch's, to round-off in float64 and
    within float32 rounding amplified by Adam (which rescales near-zero gradient entries to
    full steps); over many steps such trajectories part, as any round-off difference does."""
    planted = planted_partition([2, 2], 3000, seed=0)
    rotations = []
    for option in ("pytorch", gradient):
        cfg = NDMConfig(
            unit_size=2, lr=2e-2, batch_size=64, max_steps=20, bank_size=768,
            refresh_interval=30, merge_start=10**6, mi_samples=600, init="random", seed=0,
            exp_gradient=option,
        )  # fmt: skip
        rotations.append(torch.as_tensor(NDM(cfg).fit(planted.h).rotation))
    assert float((rotations[1] - rotations[0]).abs().max()) < tolerance


class _CountProducts(torch.utils._python_dispatch.TorchDispatchMode):
    PRODUCTS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in self.PRODUCTS
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    ("scale", "dtype"),
    [(0.0, torch.float64), (0.01, torch.float64), (0.01, torch.float32), (1.0, torch.float64)],
)
def test_the_product_count_is_the_documented_one(scale, dtype):
    """frechet_exp takes adjoint_products(s) products, s from the skew bound: what the step
    benchmark counts for the FLOP bound."""
    X = _skew(48, scale, 9).to(dtype)
    X4 = torch.linalg.matrix_power(X, 4)
    s = squarings(norm_bound(X, X4), dtype)
    with _CountProducts() as counter:
        frechet_exp(X, torch.ones_like(X))
    assert counter.count == adjoint_products(s)


def test_the_skew_bound_is_a_bound_and_saves_squarings():
    """For a skew X the bound lies between |X|_2 and |X|_1, and for a random one is well below
    |X|_1 (fewer squarings); a matrix that is not skew keeps |X|_1."""
    X = _skew(200, 0.01, 10)
    X4 = torch.linalg.matrix_power(X, 4)
    norm1, norm2 = (float(torch.linalg.matrix_norm(X, o)) for o in (1, 2))
    bound = norm_bound(X, X4)
    assert norm2 <= bound < norm1 / 2
    assert squarings(bound, X.dtype) < squarings(norm1, X.dtype)
    Y = X + 1e-3 * torch.eye(200, dtype=X.dtype)
    assert norm_bound(Y, torch.linalg.matrix_power(Y, 4)) == float(torch.linalg.matrix_norm(Y, 1))

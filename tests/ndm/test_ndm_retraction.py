"""The rotation's two orthogonal maps: both orthogonal for any skew-symmetric argument, equal
to second order near the restart point, the training rotation's fused Cayley map equal to the
composed one with its gradient, and one validated option name."""

import pytest
import torch

from structlens.ndm.ndm import NDMConfig, _Rotation, orthogonal_map


@pytest.mark.parametrize("retraction", ["exp", "cayley"])
def test_the_map_is_orthogonal_with_determinant_one(retraction):
    g = torch.Generator().manual_seed(0)
    A = torch.randn(12, 12, generator=g, dtype=torch.float64)
    Q = orthogonal_map(A - A.T, retraction)
    torch.testing.assert_close(Q.T @ Q, torch.eye(12, dtype=torch.float64), atol=1e-12, rtol=0)
    assert torch.linalg.det(Q).item() == pytest.approx(1.0, abs=1e-10)


def test_cayley_agrees_with_the_exponential_to_second_order():
    """exp(W) − cayley(W) = W³/12 + O(W⁴): the gap shrinks as the cube of the step."""
    g = torch.Generator().manual_seed(1)
    A = torch.randn(8, 8, generator=g, dtype=torch.float64)
    W = A - A.T
    gaps = [
        (orthogonal_map(t * W, "exp") - orthogonal_map(t * W, "cayley")).norm().item()
        for t in (1e-2, 5e-3)
    ]
    assert gaps[0] / gaps[1] == pytest.approx(8.0, rel=0.01)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_the_fused_cayley_rotation_and_its_gradient_match_the_composed_map(dtype, tol):
    """``_Rotation`` computes ``B cayley(W)`` from one LU with a hand-written gradient; autograd
    through ``B @ solve(I - W/2, I + W/2)`` is the independent computation it must equal."""
    g = torch.Generator().manual_seed(2)
    d = 40
    base = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]
    G = torch.randn(d, d, generator=g, dtype=torch.float64)
    rot = _Rotation(base, "cayley")
    with torch.no_grad():
        rot.A.normal_(0.0, 0.3, generator=g)
    R = rot(dtype=dtype)
    (R * G).sum().backward()
    A = rot.A.detach().clone().requires_grad_()
    expected = base @ orthogonal_map(A - A.T, "cayley")
    (expected * G).sum().backward()
    assert R.dtype == torch.float64
    torch.testing.assert_close(R.detach(), expected.detach(), atol=tol, rtol=0)
    scale = A.grad.abs().max()
    torch.testing.assert_close(rot.A.grad / scale, A.grad / scale, atol=tol, rtol=0)
    torch.testing.assert_close(R.T @ R, torch.eye(d, dtype=torch.float64), atol=tol, rtol=0)


def test_an_unknown_retraction_is_refused():
    with pytest.raises(ValueError, match="retraction"):
        NDMConfig(retraction="qr").validate()  # type: ignore[arg-type]

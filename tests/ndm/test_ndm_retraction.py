"""The rotation's two orthogonal maps: both orthogonal for any skew-symmetric argument, equal
to second order near the restart point, and one validated option name."""

import pytest
import torch

from structlens.ndm.ndm import NDMConfig, orthogonal_map


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


def test_an_unknown_retraction_is_refused():
    with pytest.raises(ValueError, match="retraction"):
        NDMConfig(retraction="qr").validate()  # type: ignore[arg-type]

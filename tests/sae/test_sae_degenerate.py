"""Inputs on which SAE metrics are undefined get a user error or an explicit reason."""

import math

import pytest
import torch

from structlens.errors import DegenerateInputError, is_user_error
from structlens.sae import (
    SAETrainConfig,
    TopKSAE,
    ce_loss_recovered,
    evaluate_sae,
    train_sae,
)


@pytest.mark.parametrize("arch", ["relu", "topk", "batchtopk", "jumprelu"])
def test_training_on_constant_activations_is_a_user_error(arch):
    # every row identical; values that float sums do not reproduce exactly, so the batch
    # mean is off by rounding and the spread is tiny rather than 0
    rows = torch.tensor([0.1, -2 / 3, 0.7, 3.3]).expand(1000, 4).clone()
    cfg = SAETrainConfig(architecture=arch, d_sae=8, k=2)
    with pytest.raises(DegenerateInputError, match="constant") as err:
        train_sae(cfg, [rows, rows])
    assert is_user_error(err.value)
    assert "another site" in str(err.value)


def test_evaluating_on_constant_activations_is_a_user_error():
    sae = TopKSAE(4, 8, k=2)
    with pytest.raises(DegenerateInputError, match="zero variance") as err:
        evaluate_sae(sae, torch.ones(32, 4))
    assert is_user_error(err.value)
    with pytest.raises(DegenerateInputError, match="zero variance"):
        evaluate_sae(sae, torch.full((999, 4), 0.1).split(7))  # merged shards, rounding
    # one varied row makes FVU defined again
    x = torch.ones(32, 4)
    x[0] = 2.0
    assert math.isfinite(evaluate_sae(sae, x).fvu)


def _runner(clean, ablated):
    """Losses in ce_loss_recovered's documented call order: clean, SAE, ablated."""
    losses = iter([clean, clean + 0.5, ablated])

    def run(fn):
        return next(losses)

    return run


def test_ce_loss_recovered_is_nan_with_a_reason_when_ablation_changes_nothing():
    sae = TopKSAE(4, 8, k=2)
    tie = ce_loss_recovered(sae, _runner(2.0, 2.0))
    assert math.isnan(tie.ce_loss_recovered)
    assert "unchanged" in tie.undefined_reason
    assert tie.to_json()["undefined_reason"] == tie.undefined_reason
    # a difference far below float32 rounding of a mean loss is a tie too
    assert ce_loss_recovered(sae, _runner(2.0, 2.0 + 1e-9)).undefined_reason is not None
    ok = ce_loss_recovered(sae, _runner(2.0, 3.0))
    assert ok.undefined_reason is None
    assert ok.ce_loss_recovered == pytest.approx((3.0 - 2.5) / (3.0 - 2.0))

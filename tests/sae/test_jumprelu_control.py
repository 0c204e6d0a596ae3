"""Matched-L0 control of the penalised SAEs: JumpReLU thresholds held at the target during
training, and training that does not depend on the units of the activations."""

import functools

import pytest
import torch

from structlens.sae import SAETrainConfig, evaluate_sae
from structlens.sae.train import SAETrainer

D, ATOMS, ACTIVE, WIDTH = 32, 64, 3, 64


def _planted(n, seed, scale=1.0):
    """Rows that are sums of ACTIVE of ATOMS fixed unit directions (the same dictionary for
    every seed), with coefficients in [0.5, 2.5]."""
    g = torch.Generator().manual_seed(0)
    dictionary = torch.randn(ATOMS, D, generator=g)
    dictionary /= dictionary.norm(dim=1, keepdim=True)
    g = torch.Generator().manual_seed(seed + 1)
    idx = torch.rand(n, ATOMS, generator=g).argsort(1)[:, :ACTIVE]
    coef = 0.5 + 2.0 * torch.rand(n, ACTIVE, generator=g)
    return scale * (dictionary[idx] * coef[..., None]).sum(1)


def _train(cfg, x, epochs, seed=0):
    trainer = SAETrainer(cfg, x.shape[1], tail_tokens=2048)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for rows in torch.randperm(x.shape[0], generator=g).split(256):
            trainer.step(x[rows])
    return trainer.result()


@functools.cache
def _fits():
    x, heldout = _planted(4096, seed=0), _planted(2048, seed=7)
    out = {}
    for arch in ("topk", "jumprelu"):
        cfg = SAETrainConfig(architecture=arch, d_sae=WIDTH, k=ACTIVE, target_l0=float(ACTIVE))
        r = _train(cfg, x, epochs=10)
        out[arch] = (r, evaluate_sae(r.sae, heldout))
    return out


def test_jumprelu_matches_the_target_l0_without_a_large_post_hoc_shift():
    r, ev = _fits()["jumprelu"]
    target = float(ACTIVE)
    # the controller held L0 at the target during training: calibration had little to do
    assert abs(r.l0_before_calibration - target) <= 0.25 * target
    assert abs(r.fvu_before_calibration - r.final_fvu) < 0.05
    assert abs(ev.l0 - target) <= 0.25 * target
    assert ev.dead_fraction < 0.2 and r.tail_dead_fraction < 0.2


def test_jumprelu_reconstructs_planted_features_nearly_as_well_as_topk():
    top_ev, jump_ev = _fits()["topk"][1], _fits()["jumprelu"][1]
    assert top_ev.fvu < 0.35  # the data is fittable at this width and L0
    assert jump_ev.fvu < 0.5
    assert jump_ev.fvu < top_ev.fvu + 0.15


def test_jumprelu_thresholds_start_at_the_target_quantile():
    x = _planted(256, seed=3)
    cfg = SAETrainConfig(architecture="jumprelu", d_sae=WIDTH, target_l0=float(ACTIVE))
    trainer = SAETrainer(cfg, D)
    first = trainer.step(x)
    # every latent fires on round(256 * 3 / 64) = 12 rows of the first batch
    assert float(first["l0"]) == pytest.approx(WIDTH * round(256 * ACTIVE / WIDTH) / 256)
    off = SAETrainConfig(architecture="jumprelu", d_sae=WIDTH, target_l0=3.0, threshold_rate=0)
    trainer = SAETrainer(off, D)
    trainer.step(x)
    # without the controller the thresholds start at the floor, in units of the data's scale
    torch.testing.assert_close(
        trainer.sae.threshold.detach(),
        torch.full((WIDTH,), off.jumprelu_init_threshold * trainer.scale),
        rtol=0.05,  # one Adam step of log θ
        atol=0,
    )


@pytest.mark.parametrize("arch", ["relu", "jumprelu"])
def test_training_does_not_depend_on_the_units_of_the_activations(arch):
    x = _planted(2048, seed=0)
    cfg = SAETrainConfig(architecture=arch, d_sae=WIDTH, target_l0=float(ACTIVE))
    base = _train(cfg, x, epochs=2)
    for c in (10.0, 0.1):
        r = _train(cfg, c * x, epochs=2)
        assert r.scale == pytest.approx(c * base.scale, rel=1e-5)
        assert r.final_coefficient == pytest.approx(base.final_coefficient, rel=1e-2)
        assert r.final_fvu == pytest.approx(base.final_fvu, abs=1e-2)
        assert r.l0_before_calibration == pytest.approx(base.l0_before_calibration, rel=0.05)
        if arch == "relu":  # continuous in its parameters: the same function, rescaled
            with torch.no_grad():
                got, want = r.sae(c * x[:256]) / c, base.sae(x[:256])
            assert float((got - want).norm() / want.norm()) < 1e-3

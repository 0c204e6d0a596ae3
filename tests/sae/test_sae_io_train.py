"""SAELens-format round trips, training, matched L0, one-pass sweeps and evaluation."""

import functools
import json

import numpy as np
import pytest
import torch

from structlens.sae import (
    JumpReLUSAE,
    ReLUSAE,
    SAEEvalAccumulator,
    SAETrainConfig,
    TopKSAE,
    ce_loss_recovered,
    evaluate_sae,
    load_sae,
    save_sae,
    train_sae,
    train_sweep,
    width_sweep_configs,
)


def _sparse_data(n_batches, batch=128, d=16, atoms=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    dictionary = torch.randn(atoms, d, generator=g)
    for _ in range(n_batches):
        idx = torch.randint(0, atoms, (batch, 2), generator=g)
        coef = torch.rand(batch, 2, generator=g) + 0.5
        yield (dictionary[idx] * coef[..., None]).sum(1)


@functools.cache
def _trained(arch):
    cfg = SAETrainConfig(architecture=arch, d_sae=64, k=4, lr=3e-3, target_l0=None)
    return train_sae(cfg, _sparse_data(15)).sae


@pytest.mark.parametrize("arch", ["relu", "topk", "batchtopk", "jumprelu"])
def test_save_load_round_trip(tmp_path, arch):
    sae = _trained(arch)
    save_sae(sae, tmp_path / arch, hook_name="blocks.3.hook_resid_pre", model_name="tiny")
    cfg = json.loads((tmp_path / arch / "cfg.json").read_text())
    assert cfg["metadata"]["hook_name"] == "blocks.3.hook_resid_pre"
    assert cfg["d_in"] == 16 and cfg["d_sae"] == 64
    loaded = load_sae(tmp_path / arch)
    x = next(_sparse_data(1, seed=5))
    torch.testing.assert_close(loaded.encode(x), sae.encode(x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loaded(x), sae(x), rtol=1e-5, atol=1e-5)


def test_gemma_scope_npz_loads(tmp_path):
    rng = np.random.default_rng(0)
    params = {
        "W_enc": rng.normal(size=(6, 10)).astype(np.float32),
        "W_dec": rng.normal(size=(10, 6)).astype(np.float32),
        "b_enc": rng.normal(size=10).astype(np.float32),
        "b_dec": rng.normal(size=6).astype(np.float32),
        "threshold": rng.uniform(0.1, 1, size=10).astype(np.float32),
    }
    np.savez(tmp_path / "params.npz", **params)
    sae = load_sae(tmp_path)
    assert isinstance(sae, JumpReLUSAE) and not sae.apply_b_dec_to_input
    x = torch.from_numpy(rng.normal(size=(5, 6)).astype(np.float32))
    pre = x.numpy() @ params["W_enc"] + params["b_enc"]
    f = pre * (pre > params["threshold"])
    np.testing.assert_allclose(sae.encode(x).detach().numpy(), f, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["relu", "topk", "jumprelu"])
def test_our_sae_loads_in_saelens_and_back(tmp_path, arch):
    sae_lens = pytest.importorskip("sae_lens")
    ours = _trained(arch)
    save_sae(ours, tmp_path / "ours")
    theirs = sae_lens.SAE.load_from_disk(str(tmp_path / "ours"))
    x = next(_sparse_data(1, seed=7))
    with torch.no_grad():
        torch.testing.assert_close(theirs.encode(x), ours.encode(x), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(theirs.decode(theirs.encode(x)), ours(x), rtol=1e-5, atol=1e-5)
    theirs.save_model(str(tmp_path / "theirs"))
    back = load_sae(tmp_path / "theirs")
    torch.testing.assert_close(back(x), ours(x), rtol=1e-5, atol=1e-5)


def test_training_reduces_fvu_and_sweep_uses_one_pass():
    consumed = []

    def stream():
        for x in _sparse_data(60):
            consumed.append(x.shape[0])
            yield x

    base = SAETrainConfig(architecture="topk", k=4, lr=3e-3)
    results = train_sweep(width_sweep_configs(base, [32, 64, 128]), stream())
    assert len(consumed) == 60  # every SAE trained from the same single pass
    for r in results:
        assert r.tokens == sum(consumed)
        assert r.final_l0 == 4.0
        assert r.loss_history[-5:].mean() < 0.75 * r.loss_history[:5].mean()
    fresh = evaluate_sae(TopKSAE(16, 64, k=4), torch.cat(list(_sparse_data(4, seed=9))))
    trained = evaluate_sae(results[1].sae, torch.cat(list(_sparse_data(4, seed=9))))
    assert trained.fvu < fresh.fvu
    assert [r.sae.d_sae for r in results] == [32, 64, 128]
    # Width rule: lr ∝ 1/sqrt(width) unless lr is fixed.
    rule = width_sweep_configs(SAETrainConfig(), [4096, 16384])
    assert rule[0].learning_rate == pytest.approx(2 * rule[1].learning_rate)


@pytest.mark.parametrize("arch", ["relu", "jumprelu"])
def test_matched_l0_hits_target(arch):
    cfg = SAETrainConfig(
        architecture=arch,
        d_sae=64,
        lr=3e-3,
        target_l0=3.0,
        l0_tolerance=0.1,
        sparsity_coefficient=0.05 if arch == "relu" else 1e-2,
        jumprelu_init_threshold=0.1,
    )
    r = train_sae(cfg, _sparse_data(40), tail_tokens=1024)
    assert r.l0_matched is True
    assert abs(r.final_l0 - 3.0) <= 0.3


def test_dead_features_are_tracked():
    cfg = SAETrainConfig(architecture="topk", d_sae=64, k=2, lr=1e-3, dead_tokens=256)
    r = train_sae(cfg, _sparse_data(30))
    # A dead fraction is a fraction, and with 64 latents for 48 atoms at k = 2 some never fire.
    assert 0.0 <= r.dead_fraction < 1.0


def test_eval_accumulator_merges_exactly_and_perfect_sae_has_zero_fvu():
    d = 6
    sae = ReLUSAE(d, 2 * d, apply_b_dec_to_input=False, dtype=torch.float64)
    with torch.no_grad():  # f = (relu(x), relu(−x)), x̂ = relu(x) − relu(−x) = x exactly
        eye = torch.eye(d, dtype=torch.float64)
        sae.W_enc_t.copy_(torch.cat([eye, -eye]))
        sae.W_dec.copy_(torch.cat([eye, -eye]))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    x = torch.randn(40, d, dtype=torch.float64) + 3.0
    res = evaluate_sae(sae, x)
    assert res.fvu == pytest.approx(0.0, abs=1e-20)
    assert res.l0 == 6.0  # every nonzero coordinate activates exactly one of its two features
    noisy = TopKSAE(d, 12, k=2, dtype=torch.float64)
    a, b, whole = (SAEEvalAccumulator(noisy) for _ in range(3))
    a.update(x[:13])
    b.update(x[13:])
    whole.update(x)
    folded = a.merge(b)
    assert folded is a  # merge folds in place (structlens.estimator.Statistics)
    merged, one = folded.result(), whole.result()
    assert merged.fvu == pytest.approx(one.fvu, rel=1e-12)
    np.testing.assert_array_equal(merged.feature_counts, one.feature_counts)
    assert one.l0 == pytest.approx(2.0)


def test_ce_loss_recovered_uses_the_callable():
    sae = TopKSAE(4, 8, k=2)
    target = torch.randn(10, 4)

    def run_with_replacement(fn):
        a = target if fn is None else fn(target)
        return float((a - target).pow(2).mean())

    res = ce_loss_recovered(sae, run_with_replacement)
    with torch.no_grad():
        expected_sae = float((sae(target) - target).pow(2).mean())
    abl = float(target.pow(2).mean())
    assert res.ce_clean == 0.0
    assert res.ce_loss_recovered == pytest.approx((abl - expected_sae) / abl)


def test_training_bad_input():
    with pytest.raises(ValueError, match="unknown architecture"):
        SAETrainConfig(architecture="gated")
    with pytest.raises(ValueError, match="NaN"):
        train_sae(SAETrainConfig(d_sae=8, k=2), [torch.full((4, 3), float("nan"))])
    with pytest.raises(ValueError, match=r"\[batch, d_in\]"):
        train_sae(SAETrainConfig(d_sae=8, k=2), [torch.randn(2, 3, 4)])
    with pytest.raises(ValueError, match="empty"):
        train_sae(SAETrainConfig(d_sae=8, k=2), [])


def test_training_result_save_load(tmp_path):
    r = train_sae(SAETrainConfig(architecture="topk", d_sae=32, k=3, lr=1e-3), _sparse_data(5))
    r.save(tmp_path / "run")
    back = type(r).load(tmp_path / "run")
    assert back.tokens == r.tokens and back.config == r.config
    np.testing.assert_array_equal(back.loss_history, r.loss_history)
    x = next(_sparse_data(1, seed=3))
    torch.testing.assert_close(back.sae(x), r.sae(x))


def _synchronous_reference(cfg, batches):
    """The trainer's math as a plain loop that reads every value on the host each step (the
    trainer before it stopped synchronising): dead mask checked and losses read per step."""
    from structlens.sae.train import _adam, build_sae

    batches = list(batches)
    sae = build_sae(cfg, batches[0].shape[1])
    opt = _adam(list(sae.parameters()), cfg.learning_rate)
    since = torch.zeros(cfg.d_sae, dtype=torch.int64)
    with torch.no_grad():
        sae.b_dec.copy_(batches[0].mean(0))
    losses, l0s, n_aux = [], [], 0
    for x in batches:
        dead = since >= cfg.dead_tokens
        n_aux += bool(dead.any())
        out = sae.training_output(x, dead if bool(dead.any()) else None, cfg.aux_k_coefficient)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        sae.remove_parallel_decoder_grad()
        opt.step()
        sae.normalize_decoder()
        since += x.shape[0]
        since[out.fired > 0] = 0
        losses.append(float(out.loss.detach()))
        l0s.append(float(out.l0))
    return sae, np.array(losses), np.array(l0s), n_aux


@pytest.mark.parametrize("arch", ["topk", "batchtopk"])
def test_unsynchronised_trainer_equals_the_synchronous_loop_bit_for_bit(arch):
    # small dead_tokens: features die and revive, so the AuxK path and the exact bound on when
    # the dead mask must be read are both exercised
    cfg = SAETrainConfig(architecture=arch, d_sae=64, k=2, lr=3e-3, dead_tokens=300, seed=3)
    batches = list(_sparse_data(40))
    got = train_sae(cfg, batches)
    sae, losses, l0s, n_aux = _synchronous_reference(cfg, batches)
    assert 0 < n_aux < len(batches)
    np.testing.assert_array_equal(got.loss_history, losses)
    np.testing.assert_array_equal(got.l0_history, l0s)
    for name, p in sae.state_dict().items():
        torch.testing.assert_close(got.sae.state_dict()[name], p, rtol=0, atol=0)


def test_trainer_finds_a_nan_batch_at_the_next_check():
    cfg = SAETrainConfig(d_sae=8, k=2)
    from structlens.sae.train import SAETrainer

    trainer = SAETrainer(cfg, d_in=3, check_every=3)
    batches = [torch.randn(4, 3), torch.full((4, 3), float("nan")), torch.randn(4, 3)]
    trainer.step(batches[0])
    trainer.step(batches[1])  # no host read yet
    with pytest.raises(ValueError, match="NaN or inf"):
        trainer.step(batches[2])

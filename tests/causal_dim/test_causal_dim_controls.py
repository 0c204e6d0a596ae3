"""Synthetic AtP-recall ground truth with rotated read-outs, and the four-cell control on
threshold SAEs with L0 per cell."""

import math

import numpy as np
import torch

from structlens.causal_dim import CausalDimension
from structlens.causal_dim.controls import (
    SyntheticCausalModel,
    atp_recall,
    four_cell_ablation,
    random_orthonormal_encoder,
)
from structlens.sae import JumpReLUSAE, TopKSAE


def _dictionary_sae(rows: torch.Tensor, k: int) -> TopKSAE:
    sae = TopKSAE(rows.shape[1], rows.shape[0], k=k, dtype=torch.float32)
    with torch.no_grad():
        sae.W_dec.copy_(rows)
        sae.W_enc_t.copy_(rows)
        sae.b_dec.zero_()
    return sae


def test_rotated_readout_is_not_recalled_by_an_sae_that_learned_the_atoms():
    kw = dict(d=64, n_atoms=48, n_causal=6, vocab=32, active=3, seed=2, orthogonal_atoms=True)
    model = SyntheticCausalModel(readout="rotated", **kw)
    # the causal directions are orthonormal mixtures of 24 atoms, aligned with none of them
    cos_atoms = (model.causal @ model.atoms.T).abs()
    assert cos_atoms.max() < 0.9
    torch.testing.assert_close(model.causal @ model.causal.T, torch.eye(6), atol=1e-5, rtol=0)
    # still a rank-6 causal subspace: κ's numerical rank is the number of read-outs
    assert CausalDimension().fit(model, model.sample(32)).numerical_rank == 6
    acts = model.sample(600)
    grads = model.metric_grads(acts)
    atoms_sae = _dictionary_sae(model.atoms, k=3)
    assert atp_recall(atoms_sae, model.causal, acts, grads, top_k=6).recall == 0.0
    # a dictionary holding the read-out directions (plus the inert atoms) recalls them all
    truth = torch.cat([model.causal, model.atoms[24:]])
    assert atp_recall(_dictionary_sae(truth, k=8), model.causal, acts, grads, top_k=6).recall == 1
    # the aligned toy (causal = first atoms) is recalled by the atom dictionary
    aligned = SyntheticCausalModel(**kw)
    a_acts = aligned.sample(600)
    a_sae = _dictionary_sae(aligned.atoms, k=3)
    r = atp_recall(a_sae, aligned.causal, a_acts, aligned.metric_grads(a_acts), top_k=6)
    assert r.recall == 1.0


def test_four_cell_on_jumprelu_keeps_thresholds_and_logs_l0():
    torch.manual_seed(0)
    sae = JumpReLUSAE(12, 40, init_threshold=0.3, dtype=torch.float64)
    with torch.no_grad():
        sae.b_enc.copy_(0.1 * torch.randn(40, dtype=torch.float64))
    enc = random_orthonormal_encoder(sae, seed=0)
    torch.testing.assert_close(enc.threshold, sae.threshold)
    torch.testing.assert_close(enc.b_enc, sae.b_enc)
    acts = torch.randn(300, 12, dtype=torch.float64)
    grads = torch.randn(300, 12, dtype=torch.float64)
    res = four_cell_ablation(sae, [(acts[:150], grads[:150]), (acts[150:], grads[150:])])
    assert res.architecture == "JumpReLUSAE"
    with torch.no_grad():
        l0 = float((sae.encode(acts) > 0).double().sum(1).mean())
        l0_enc = float((enc.encode(acts) > 0).double().sum(1).mean())
    assert math.isclose(res.l0["learned_enc/learned_dec"], l0, rel_tol=1e-12)
    assert math.isclose(res.l0["random_enc/learned_dec"], l0_enc, rel_tol=1e-12)
    # the decoder does not change which features fire
    assert res.l0["learned_enc/random_dec"] == res.l0["learned_enc/learned_dec"]
    assert np.isfinite(list(res.l0.values())).all()

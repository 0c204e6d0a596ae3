import numpy as np
import pytest
import torch

from structlens.ndm.baselines import (
    identity_rotation,
    pca_rotation,
    random_rotation,
    sae_cluster_rotation,
)
from structlens.ndm.preimage import SubspaceIndex


def _orthogonal(R):
    return np.allclose(R.T @ R, np.eye(R.shape[0]), atol=1e-10)


def test_baselines_are_orthogonal(rng):
    h = rng.standard_normal((300, 6)) * np.arange(1, 7)
    for R in (identity_rotation(6), random_rotation(6, 1), pca_rotation(h)):
        assert _orthogonal(R)
    variances = (h @ pca_rotation(h)).var(0)
    assert np.all(np.diff(variances) > 0)  # ascending: smallest variance first


def test_sae_clustering_recovers_planted_subspaces(rng):
    q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    spans = [q[:, :3], q[:, 3:5], q[:, 5:]]
    decoder = np.vstack([rng.standard_normal((30, s.shape[1])) @ s.T for s in spans])
    R = sae_cluster_rotation(decoder, [3, 2, 1], seed=0)
    assert _orthogonal(R)
    bounds = [0, 3, 5, 6]
    for s, span in enumerate(spans):
        block = R[:, bounds[s] : bounds[s + 1]]
        assert np.allclose(block @ block.T, span @ span.T, atol=1e-8)


def test_preimage_index_matches_brute_force(rng):
    d = 8
    R = random_rotation(d, 3)
    h = rng.standard_normal((1000, d)).astype(np.float32)
    index = SubspaceIndex(R, [5, 3], chunk_size=128)
    index.add(iter([h[:400], h[400:]]))
    assert len(index) == 1000
    queries = h[:7]
    idx, sims = index.query(queries, subspace=1, k=5, exclude=range(7))
    z = h @ R[:, 5:]
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    ref = z[:7] @ z.T
    ref[np.arange(7), np.arange(7)] = -np.inf
    assert np.array_equal(idx, np.argsort(-ref, axis=1)[:, :5])
    assert np.allclose(sims, np.sort(ref, axis=1)[:, ::-1][:, :5], atol=1e-5)
    idx_thr, sims_thr = index.query(queries, subspace=1, k=5, min_similarity=0.999)
    assert (idx_thr[:, 0] == np.arange(7)).all()  # only the query itself is that close
    with pytest.raises(ValueError, match="subspace"):
        index.query(queries, subspace=2)


def _planted_sae(rng, spans):
    from structlens.sae import SAETrainConfig
    from structlens.sae.train import build_sae

    decoder = np.vstack([rng.standard_normal((30, s.shape[1])) @ s.T for s in spans])
    sae = build_sae(SAETrainConfig(architecture="topk", d_sae=decoder.shape[0], k=4), d_in=6)
    with torch.no_grad():
        sae.W_dec.copy_(torch.as_tensor(decoder, dtype=sae.W_dec.dtype))
    return sae, decoder


def test_sae_baseline_uses_the_given_sae(rng):
    from structlens.ndm.pipeline import baseline_rotations

    q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    spans = [q[:, :3], q[:, 3:5], q[:, 5:]]
    sae, decoder = _planted_sae(rng, spans)
    h = rng.standard_normal((50, 6))  # not used to train anything when the SAE is given
    rot, info = baseline_rotations(h, [3, 2, 1], ["sae"], sae=sae)
    assert info["sae"] == {"given": True, "source": type(sae).__name__, "d_sae": 90}
    assert np.array_equal(rot["sae"], sae_cluster_rotation(sae, [3, 2, 1]))
    bounds = [0, 3, 5, 6]
    for s, span in enumerate(spans):  # the planted spans of this SAE's decoder, not others
        block = rot["sae"][:, bounds[s] : bounds[s + 1]]
        assert np.allclose(block @ block.T, span @ span.T, atol=1e-5)
    other, _ = _planted_sae(rng, [q[:, 2:5], q[:, [0, 5]], q[:, 1:2]])
    R_other = baseline_rotations(h, [3, 2, 1], ["sae"], sae=other)[0]["sae"]
    assert np.abs(R_other[:, :3] @ R_other[:, :3].T - spans[0] @ spans[0].T).max() > 0.1


def test_sae_baseline_records_where_a_pretrained_sae_came_from(rng, tmp_path):
    from structlens.ndm.pipeline import baseline_rotations
    from structlens.sae.formats import read_dictionary
    from structlens.sae.io import save_sae

    q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    sae, _ = _planted_sae(rng, [q[:, :3], q[:, 3:5], q[:, 5:]])
    folder = save_sae(sae, tmp_path / "sae")
    meta = {"registry": "demo/L1", "repo": "org/saes", "hook_name": "blocks.1.hook_resid_post"}
    given = read_dictionary(folder, metadata=meta)
    h = rng.standard_normal((50, 6))
    _, info = baseline_rotations(h, [3, 2, 1], ["sae"], sae=given)
    assert info["sae"]["source"] == str(given.path) and info["sae"]["format"] == given.format
    assert {k: info["sae"][k] for k in meta} == meta
    _, by_path = baseline_rotations(h, [3, 2, 1], ["sae"], sae=str(folder))
    assert by_path["sae"]["source"] == str(folder)


def test_baseline_sae_trains_until_fvu_plateaus(rng):
    from structlens.ndm.pipeline import SAEBaselineConfig, train_baseline_sae

    q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    h = (rng.standard_normal((512, 2)) * [3, 1]) @ q[:, :2].T  # rank-2 data: easy to fit
    cfg = SAEBaselineConfig(width=16, k=2, epochs=200, batch_size=64, tol=0.05)
    fit = train_baseline_sae(h, cfg)
    fvu = fit["fvu_history"]
    assert fit["converged"] and fit["epochs"] == len(fvu) < 200
    assert fvu[-2] - fvu[-1] < 0.05 * fvu[-2] and fvu[-1] < fvu[0]
    capped = train_baseline_sae(h, SAEBaselineConfig(width=16, k=2, epochs=1, batch_size=64))
    assert capped["epochs"] == 1 and not capped["converged"]

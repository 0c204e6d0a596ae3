"""NDM's SAE-clustering baseline from published SAEs and transcoders: the decoder that
:func:`structlens.ndm.baselines.decoder_directions` reads from a folder, a registry name or a
read dictionary is the loaded module's, and the clustering of a folder equals the clustering
of that decoder given as an array."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from structlens.ndm.baselines import decoder_directions, sae_cluster_rotation
from structlens.sae.formats import read_dictionary
from structlens.sae.registry import LOCAL_DIR_ENV, resolve

D, M = 8, 32
RNG = np.random.default_rng(7)


def _gemma2(folder, *, skip=False):
    folder.mkdir(parents=True)
    p = {"w_enc": RNG.standard_normal((D, M)), "b_enc": RNG.standard_normal(M),
         "w_dec": RNG.standard_normal((M, D)), "b_dec": RNG.standard_normal(D),
         "threshold": np.abs(RNG.standard_normal(M))}  # fmt: skip
    if skip:
        p["affine_skip_connection"] = RNG.standard_normal((D, D))
    save_file({k: v.astype(np.float32) for k, v in p.items()}, str(folder / "params.safetensors"))
    return p["w_dec"].astype(np.float32).astype(np.float64)


def _sparsify(folder):
    folder.mkdir(parents=True)
    cfg = {"activation": "topk", "num_latents": M, "k": 4, "d_in": D}
    (folder / "cfg.json").write_text(json.dumps(cfg))
    t = {"encoder.weight": RNG.standard_normal((M, D)), "encoder.bias": RNG.standard_normal(M),
         "W_dec": RNG.standard_normal((M, D)), "b_dec": RNG.standard_normal(D)}  # fmt: skip
    save_file({k: v.astype(np.float32) for k, v in t.items()}, str(folder / "sae.safetensors"))
    return t["W_dec"].astype(np.float32).astype(np.float64)


@pytest.mark.parametrize("layout", ["gemma-scope-2", "transcoder", "sparsify"])
def test_decoder_of_a_folder_is_the_modules(tmp_path, layout):
    if layout == "sparsify":
        folder = tmp_path / "layers.3"
        w_dec = _sparsify(folder)
    else:
        folder = tmp_path / f"{'transcoder' if layout == 'transcoder' else 'resid_post'}/layer_3_w"
        w_dec = _gemma2(folder, skip=layout == "transcoder")
    np.testing.assert_array_equal(decoder_directions(folder), w_dec)
    np.testing.assert_array_equal(decoder_directions(str(folder)), w_dec)
    d = read_dictionary(folder)
    assert d.is_transcoder == (layout == "transcoder")
    np.testing.assert_array_equal(decoder_directions(d), w_dec)
    partition = [4, 4]
    np.testing.assert_array_equal(
        sae_cluster_rotation(folder, partition, seed=1),
        sae_cluster_rotation(w_dec, partition, seed=1),
    )


def test_registry_name_offline_from_a_local_directory(tmp_path, monkeypatch):
    name = "gemma-scope-2-270m-pt-res/layer_9_width_16k_l0_medium"
    e = resolve(name)
    w_dec = _gemma2(tmp_path / e.repo / e.path)
    monkeypatch.setenv(LOCAL_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    np.testing.assert_array_equal(decoder_directions(name), w_dec)

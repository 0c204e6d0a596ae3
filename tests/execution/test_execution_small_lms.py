"""The equivalence scenario models trained as executor items: Ray == local, byte for byte."""

import pytest

from structlens.equivalence.train_small import SmallLMConfig, train_small_lms

CONFIGS = [
    SmallLMConfig(
        n_layers=1, d_model=16, n_heads=2, d_mlp=32, seq_len=16, batch_size=2, steps=3, seed=s
    )
    for s in (0, 1)
]


def _weights(paths):
    return [(p / "model.safetensors").read_bytes() for p in paths]


def test_ray_trained_small_lms_equal_local(ray_cluster, tmp_path):
    dist = train_small_lms(CONFIGS, [tmp_path / "ray" / str(i) for i in range(2)], executor="ray")
    local = train_small_lms(CONFIGS[1:], [tmp_path / "local"])
    assert [p.parent.name for p in dist] == ["ray", "ray"]
    assert _weights(dist[1:]) == _weights(local)
    assert _weights(dist)[0] != _weights(dist)[1]  # the seeds matter


def test_train_small_lms_checks_lengths(tmp_path):
    with pytest.raises(ValueError, match="2 configs but 1 output"):
        train_small_lms(CONFIGS, [tmp_path])

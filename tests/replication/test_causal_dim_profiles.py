"""The causal-dimension profiles follow the protocol by construction: checked on the
settings alone (the cpu/gpu profiles take hours, so they are not run here)."""

from __future__ import annotations

import pytest

from structlens.causal_dim.protocol import PROFILES as PROTOCOLS
from structlens.causal_dim.stages import sae_jobs
from structlens.replication.causal_dim.run import LAYOUT, PROFILES, SMOKE, TINY_TEST_SIZES

D_MODEL = {"smollm2-135m": 576, "tiny-llama": 64}


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_base_width_is_at_least_four_d_and_every_sae_job_is_valid(profile):
    s = PROFILES[profile]
    d = D_MODEL[s["model"]]
    protocol = s["protocol"]
    assert protocol is PROTOCOLS[{"cpu": "paper"}.get(profile, profile)]
    widths = list(protocol.sweep_widths)
    assert widths == sorted(widths) and widths[0] >= 4 * d
    protocol.check_widths(d)  # the check the sweep stage applies before training
    if profile == "gpu":
        assert widths[-1] >= 64 * widths[0]  # up to ≥ 64× the base, the paper's span
    if profile == "cpu":
        assert widths[-1] >= 8 * widths[0]  # the span one CPU core trains to convergence
    assert s["ablation_width"] in widths and s["depth_width"] in widths
    jobs = sae_jobs(protocol.replace(seed=s["seed"]), **{k: s[k] for k in LAYOUT})
    assert all(cfg.lr is None for _, cfg, _ in jobs)  # the width rule
    assert all(cfg.k == protocol.sae_k and cfg.seed == s["seed"] for _, cfg, _ in jobs)
    rates = [cfg.learning_rate for n, cfg, _ in jobs if n.startswith("topk-")]
    ratio = [a / b for a, b in zip(rates, rates[1:])]
    assert all(abs(r - 2**0.5) < 1e-9 for r in ratio)  # each doubling divides lr by √2
    assert {"jumprelu", "relu"} <= set(s["arch_controls"])


def test_tiny_test_sizes_cover_every_sized_setting():
    # only the profile name survives from the gpu profile in the tests
    assert set(TINY_TEST_SIZES) == set(SMOKE) - {"profile"}
    assert PROFILES["gpu"] | TINY_TEST_SIZES == SMOKE | {"profile": "gpu"}


def test_massive_activation_rows_are_dropped_from_sae_training():
    import torch

    from structlens.causal_dim.training import MASSIVE_NORM_FACTOR, drop_massive

    x = torch.randn(1000, 8)
    x[[3, 500]] *= 20 * MASSIVE_NORM_FACTOR  # far above the median norm
    kept, n = drop_massive(x)
    assert n == 2 and kept.shape == (998, 8)
    assert torch.equal(kept, torch.cat([x[:3], x[4:500], x[501:]]))

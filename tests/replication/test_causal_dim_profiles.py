"""The causal-dimension profiles follow the protocol by construction: checked on the
settings alone (the cpu/gpu profiles take hours, so they are not run here)."""

from __future__ import annotations

import pytest

from structlens.causal_dim.protocol import PROFILES as PROTOCOLS
from structlens.causal_dim.stages import sae_jobs
from structlens.errors import InputError
from structlens.replication.causal_dim.run import PROFILES

D_MODEL = {"smollm2-135m": 576, "tiny-llama": 64}


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_base_width_is_at_least_four_d_and_every_sae_job_is_valid(profile):
    s = PROFILES[profile]
    d = D_MODEL[s.model]
    protocol = s.protocol
    assert protocol is PROTOCOLS[{"cpu": "paper"}.get(profile, profile)]
    widths = list(protocol.sweep_widths)
    assert widths == sorted(widths) and widths[0] >= 4 * d
    protocol.check_widths(d)  # the check the sweep stage applies before training
    if profile == "gpu":
        assert widths[-1] >= 64 * widths[0]  # up to ≥ 64× the base, the paper's span
    if profile == "cpu":
        assert widths[-1] >= 8 * widths[0]  # the span one CPU core trains to convergence
    jobs = sae_jobs(protocol.replace(seed=s.seed), **s.sae_layout())
    assert all(cfg.lr is None for _, cfg, _ in jobs)  # the width rule
    assert all(cfg.k == protocol.sae_k and cfg.seed == s.seed for _, cfg, _ in jobs)
    rates = [cfg.learning_rate for n, cfg, _ in jobs if n.startswith("topk-")]
    ratio = [a / b for a, b in zip(rates, rates[1:])]
    assert all(abs(r - 2**0.5) < 1e-9 for r in ratio)  # each doubling divides lr by √2
    assert {"jumprelu", "relu"} <= set(s.arch_controls)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"ablation_width": 300}, "ablation_width must be one of the protocol's sweep_widths"),
        ({"depth_width": 100}, "depth_width must be one of"),
        ({"arch_controls": ("jumprelu", "topkk")}, "['topkk'] are not SAE architectures"),
        ({"jacobian_layers": ()}, "jacobian_layers non-empty"),
        ({"depth_layers": (0, -1)}, "layers must be >= 0"),
        ({"ioi_prompts": -1}, "ioi_prompts must be >= 0"),
    ],
)
def test_a_profile_that_breaks_the_protocol_is_refused_at_construction(change, message):
    PROFILES["smoke"].replace(ablation_width=512)  # another sweep width is fine
    with pytest.raises(InputError) as e:
        PROFILES["smoke"].replace(**change)
    assert message in str(e.value)


def test_settings_json_nests_the_protocol_and_lists_the_tuples():
    js = PROFILES["cpu"].to_json()
    assert js["protocol"] == PROTOCOLS["paper"].to_json()
    assert js["jacobian_layers"] == [15, 5, 25] and js["arch_sweep_widths"] == []


def test_massive_activation_rows_are_dropped_from_sae_training():
    import torch

    from structlens.causal_dim.training import MASSIVE_NORM_FACTOR, drop_massive

    x = torch.randn(1000, 8)
    x[[3, 500]] *= 20 * MASSIVE_NORM_FACTOR  # far above the median norm
    kept, n = drop_massive(x)
    assert n == 2 and kept.shape == (998, 8)
    assert torch.equal(kept, torch.cat([x[:3], x[4:500], x[501:]]))

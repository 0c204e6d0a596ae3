"""The NDM protocol rejects bad values at construction and adapts to small layers by one
rule; ``run`` records its restarts and protocol."""

from __future__ import annotations

import pytest

from structlens.errors import InputError
from structlens.models import load_model
from structlens.ndm.experiment import chosen_layers, run
from structlens.ndm.protocol import PROFILES, NDMProtocol

SMALL = PROFILES["smoke"].replace(
    corpus_prompts=6, task_prompts=0, unit_size=16, steps=12, bank_size=256, batch_size=16,
    refresh_interval=4, merge_start=6, merge_interval=6, mi_samples=200,
)  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(unit_size=0), "unit_size must be an integer >= 1"),
        (dict(mi_samples=1), "mi_samples"),
        (dict(corpus_prompts=-1), "corpus_prompts"),
        (dict(restarts=0), "restarts"),
        (dict(min_share=1.5), "min_share"),
        (dict(sae_epochs=0), "sae_epochs"),
        (dict(baselines=("ica",)), "baselines: unknown 'ica'"),
        (dict(training_tasks=("nope",)), "training_tasks: unknown"),
        (dict(patch_prompts=1), "patch_prompts must be an integer >= 2"),
        (dict(steps="10"), "steps must be int"),
        (dict(layer_rule="best"), "layer_rule must be one of 'depth', 'share_sweep'; got 'best'"),
        (dict(sweep_window=-1), "sweep_window must be an integer >= 0"),
        (dict(sweep_window=1.5), "sweep_window must be int"),
        (dict(sweep_prompts=1), "sweep_prompts must be an integer >= 2"),
    ],
)
def test_protocol_rejects_bad_values_at_construction(kwargs, message):
    with pytest.raises(InputError, match=message):
        NDMProtocol(**kwargs)


def test_layers_are_checked_against_the_model():
    with pytest.raises(InputError, match=r"must lie in \[0, 3\)"):
        chosen_layers((7,), 3)


def test_protocol_adapts_its_sizes_to_small_layers_by_one_rule():
    big = NDMProtocol().ndm_config(n_rows=100_000, d=576)
    sizes = (big.unit_size, big.bank_size, big.mi_samples, big.refresh_interval)
    assert sizes == (48, 8192, 2048, 20)  # the protocol's own, unchanged
    small = NDMProtocol().ndm_config(n_rows=1000, d=64)
    assert small.unit_size == 16  # gcd(48, 64)
    assert small.bank_size == small.mi_samples == 500
    assert small.refresh_interval == 500 // 128


def test_restarts_are_run_and_the_kept_one_recorded(tmp_path):
    model = load_model("tiny-llama")
    cfg = SMALL.replace(restarts=2)
    report = run(cfg, model, layers=(1,), out=tmp_path / "out", activations=tmp_path / "acts")
    table = report.results["1"]["restarts"]
    assert [r["restart"] for r in table] == [0, 1] and sum(r["chosen"] for r in table) == 1
    kept = next(r for r in table if r["chosen"])
    assert kept["partition"] == report.results["1"]["partition"]
    assert report.results["1"]["config"]["restarts"] == 2
    assert report.meta["protocol"] == cfg.to_json()

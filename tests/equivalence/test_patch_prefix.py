"""Patched validation forwards reuse the unpatched forward's layers below the patched one:
the records equal those of forwards that recompute every layer, and only the layers from the
patched one on are computed."""

import contextlib

import pytest

from structlens.equivalence.patching import validate
from structlens.equivalence.prefix import LayerOutputs, first_layer
from structlens.equivalence.probes import corpus_probe
from structlens.models import load_model


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama", seed=3)


def _writers(model):
    last = model.n_layers - 1

    def ablate(act, src):
        out = act.clone()
        out[:, 1:, 0] = 0.0
        return out

    def shift(act, src):
        out = act.clone()
        out[:, 1:] += 0.5
        return out

    return [
        ("blocks.0.attn.hook_z", ablate),
        (f"blocks.{last}.attn.hook_z", ablate),
        ("blocks.1.hook_resid_post", shift),
        ("blocks.1.hook_resid_pre", shift),
        (f"blocks.{last}.hook_resid_post", shift),
    ]


def test_first_layer_of_sites(tiny):
    assert first_layer(tiny, "blocks.1.attn.hook_z") == 1
    assert first_layer(tiny, "blocks.0.hook_resid_pre") == 0
    assert first_layer(tiny, "hook_embed") == 0


def test_reused_layers_give_the_recomputed_records_and_skip_the_prefix(tiny, monkeypatch):
    assert tiny.n_layers >= 3 and LayerOutputs(tiny).enabled
    probe = corpus_probe(tiny, tiny, n=12, max_chars=60)
    heldout, writers = [0, 1, 4, 6, 9], _writers(tiny)
    sites = ["blocks.0.attn.hook_z"]
    cls = type(tiny.layers[0])
    calls = {"n": 0}
    own = cls.forward

    def counted(self, *args, **kwargs):
        calls["n"] += 1
        return own(self, *args, **kwargs)

    monkeypatch.setattr(cls, "forward", counted)
    reused = validate(tiny, tiny, probe.tokens_b, heldout, None, 1, writers, sites, 2)
    batches, n = 3, tiny.n_layers
    computed = sum(n - first_layer(tiny, s) for s, _ in writers)
    # per batch: A's forward, B's unpatched forward, then each patch from its layer on
    assert calls["n"] == batches * (2 * n + computed)
    assert not any("forward" in layer.__dict__ for layer in tiny.layers)  # restored

    monkeypatch.setattr(LayerOutputs, "below", lambda self, layer: contextlib.nullcontext())
    recomputed = validate(tiny, tiny, probe.tokens_b, heldout, None, 1, writers, sites, 2)
    assert reused == recomputed
    assert all(r["kl"] > 0 for r in reused)  # every patch changed B's predictions

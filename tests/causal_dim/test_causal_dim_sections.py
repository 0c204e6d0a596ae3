"""Which sections a set of trained SAEs gets, and what each reads (its cache inputs): from the
profile's layout alone, without training anything."""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from structlens.causal_dim.protocol import REPLICATION_PROFILES
from structlens.causal_dim.sections import Trained, sections
from structlens.causal_dim.stages import KMatch, LayerRows, sae_jobs


def _trained(profile):
    layers = sorted({profile.sweep_layer, *profile.depth_layers})
    rows = np.zeros((len(layers), 4, 8), np.float32)
    ev = LayerRows(layers=layers, acts=rows, grads=rows, batch_sizes=[4])
    names = [name for name, _, _ in sae_jobs(profile.protocol, **profile.sae_layout())]
    w = profile.depth_width
    # the k each depth layer's search chose (here: k = layer + 1), and one other trial
    depth_k = {
        y: KMatch(layer=y, width=w, target_fvu=0.2, tolerance=0.02, ks=[4, y + 1],
                  fvus=[0.3, 0.21], k=y + 1, fvu=0.21, matched=True, stop="matched")
        for y in profile.depth_search_layers()
    }  # fmt: skip
    names += [f"depth-L{y}-topk-{w}-k{k}" for y, m in depth_k.items() for k in m.ks]
    prompts = SimpleNamespace(ce=[[1, 2, 3]], sae_eval=[[1, 2, 3, 4, 5]])
    model = SimpleNamespace(d_model=8)
    return Trained(profile, profile.protocol, model, dict.fromkeys(names), ev, prompts, [],
                   depth_k=depth_k)  # fmt: skip


def test_each_section_reads_the_saes_of_its_layout():
    smoke = REPLICATION_PROFILES["smoke"]  # growth over (256, 512), no IOI
    by_name = {s.name: s for s in sections(_trained(smoke))}
    assert list(by_name) == ["sweep", "ce", "arch", "arch-growth", "depth", "fourcell"]
    widths = smoke.protocol.sweep_widths
    assert by_name["sweep"].saes == tuple(f"topk-{w}" for w in widths)
    assert by_name["sweep"].after == (f"kappa-L{smoke.sweep_layer}",)
    w = smoke.ablation_width
    assert by_name["arch"].saes == by_name["fourcell"].saes == ("topk-256", "jumprelu-256",
                                                                "relu-256")  # fmt: skip
    assert by_name["arch"].after == ("sweep",)  # counts at the sweep's ε
    assert set(by_name["arch-growth"].saes) == {f"{a}-{v}" for a in ("topk", "jumprelu", "relu")
                                                for v in (256, 512)}  # fmt: skip
    # the sweep layer's depth point is the sweep's own SAE; the others the k their search chose
    assert by_name["depth"].saes == ("depth-L0-topk-256-k1", f"topk-{w}", "depth-L2-topk-256-k3")
    assert not any(n.startswith("depth") for n in by_name["ce"].saes)
    # another search outcome is another depth section (its cache key moves)
    t = _trained(smoke)
    before = next(s for s in sections(t) if s.name == "depth").config
    t.depth_k = {y: replace(m, stop="budget", matched=False) for y, m in t.depth_k.items()}
    assert next(s for s in sections(t) if s.name == "depth").config != before


def test_sections_whose_saes_are_not_trained_are_left_out():
    cpu = REPLICATION_PROFILES["cpu"]  # no growth widths; IOI prompts
    names = [s.name for s in sections(_trained(cpu))]
    assert "arch-growth" not in names and names[-1] == "ioi"
    t = _trained(cpu)
    t.saes = {n: None for n in t.saes if not n.startswith("topk-") or n == "topk-2304"}
    assert "sweep" not in [s.name for s in sections(t)]  # one TopK width is no sweep

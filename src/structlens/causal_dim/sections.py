"""The causal-dimension sections on one set of trained SAEs: the width sweep, CE recovered,
the architecture controls and their growth, ε by depth, the four cells and IOI.

:func:`sections` lists them for a :class:`Trained` set (the SAEs named by
:func:`~structlens.causal_dim.stages.sae_jobs` for a
:class:`~structlens.causal_dim.protocol.ReplicationProfile` and those
:func:`~structlens.causal_dim.stages.match_k` chose for ε by depth, and one capture of
evaluation rows), each a :class:`Section`: the SAEs it reads, its config and its compute.  Those are
what a driver needs to cache one (the SAEs' and the earlier sections' stage keys are its
inputs); a section whose SAEs this profile does not train is left out.  The computes are the
typed stages of :mod:`structlens.causal_dim.stages` and :mod:`structlens.causal_dim.experiment`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from structlens.causal_dim import experiment as ex
from structlens.causal_dim.protocol import CausalProtocol, ReplicationProfile
from structlens.causal_dim.stages import KappaFit, KMatch, LayerRows, PromptSets, SweepFit
from structlens.results import Result, content_key, to_jsonable

__all__ = ["Section", "Trained", "sections"]

#: What a section's compute reads of the sections before it, by name.
Done = Mapping[str, Result]


@dataclasses.dataclass(frozen=True)
class Section:
    """One section: its ``name`` (its stage's), the ``field`` of the run's record it fills,
    its Result type, its ``config``, the SAEs it reads (by name), the earlier sections it
    reads (``after``) and ``compute(done)``, given the Results of the sections done so far."""

    name: str
    field: str
    kind: type[Result]
    config: dict[str, Any]
    saes: tuple[str, ...]
    compute: Callable[[Done], Result]
    after: tuple[str, ...] = ()


@dataclasses.dataclass
class Trained:
    """What the sections read: the profile and its protocol (seeded), the model, the trained
    SAEs by name, the evaluation rows with their gradients, the prompt sets and exact κ;
    ``training`` holds each SAE's :class:`~structlens.causal_dim.stages.SAETraining` by name
    (its training FVU diagnoses the sweep gate) and ``depth_k`` the
    :class:`~structlens.causal_dim.stages.KMatch` of every searched ε-by-depth layer."""

    profile: ReplicationProfile
    protocol: CausalProtocol
    model: Any
    saes: Mapping[str, Any]
    ev: LayerRows
    prompts: PromptSets
    kappa: Sequence[KappaFit]
    training: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    depth_k: Mapping[int, KMatch] = dataclasses.field(default_factory=dict)

    def at(self, archs: Sequence[str], width: int) -> dict[str, Any]:
        """The trained SAEs of ``archs`` at ``width`` by architecture."""
        return {a: self.saes[f"{a}-{width}"] for a in archs if f"{a}-{width}" in self.saes}


def _sweep(t: Trained) -> Section | None:
    from structlens.causal_dim.stages import sweep
    from structlens.causal_dim.sweep import FVU_RISE_Z, HALF_SAMPLES, POWER_LAW_ALPHA

    p, L = t.protocol, t.profile.sweep_layer
    topk = {w: t.saes[f"topk-{w}"] for w in p.sweep_widths if f"topk-{w}" in t.saes}
    if len(topk) < 2:
        return None
    exact = next((f.erank for f in t.kappa if f.layer == L), None)
    d = t.model.d_model
    names = {w: f"topk-{w}" for w in topk}
    train_fvu = ({w: t.training[n].final_fvu for w, n in names.items()}
                 if all(n in t.training for n in names.values()) else None)  # fmt: skip
    # the gate's bound, the wedge's interval and κ̂'s power-law test are in the key: a sweep
    # judged under another bound, with the delete-one jackknife's wedge interval or without
    # the test, is analysed again
    config = {"layer": L, "fvu_rise_z": FVU_RISE_Z, "wedge_half_samples": HALF_SAMPLES,
              "power_law_alpha": POWER_LAW_ALPHA}  # fmt: skip
    return Section("sweep", "sweep", SweepFit, config, tuple(names.values()),
                   lambda _: sweep(p, topk, t.ev, L, t.prompts, exact_kappa=exact, d_model=d,
                                   train_fvu=train_fvu),
                   (f"kappa-L{L}",))  # fmt: skip


def _ce(t: Trained) -> Section:
    saes = {n: sae for n, sae in t.saes.items() if not n.startswith("depth")}
    L, prompts = t.profile.sweep_layer, t.prompts.ce
    return Section("ce", "ce", ex.CERecovered, {"ce": content_key([prompts])}, tuple(saes),
                   lambda _: ex.ce_recovered(t.model, L, saes, prompts))  # fmt: skip


def _arch(t: Trained) -> Section:
    s, L, w = t.profile, t.profile.sweep_layer, t.profile.ablation_width
    saes = t.at(["topk", *s.arch_controls], w)

    def compute(done: Done) -> Result:
        sweep = done.get("sweep")
        eps = sweep.epsilon if isinstance(sweep, SweepFit) else None
        return ex.architecture_counts(saes, t.ev.pairs(L), t.ev.of(L), width=w, layer=L,
                                      sweep_epsilon=eps)  # fmt: skip

    return Section("arch", "arch", ex.ArchitectureCounts, {"width": w},
                   tuple(f"{a}-{w}" for a in saes), compute, ("sweep",))  # fmt: skip


def _growth(t: Trained) -> Section | None:
    from structlens.causal_dim.model import token_prompt_ids

    s, L, widths = t.profile, t.profile.sweep_layer, list(t.profile.arch_sweep_widths)
    have = [a for a in s.arch_controls if all(f"{a}-{w}" in t.saes for w in widths)]
    names = tuple(f"{a}-{w}" for a in ["topk", *have] for w in widths)
    if len(widths) < 2 or not have or any(n not in t.saes for n in names):
        return None  # no growth sweep in this profile
    saes = {a: {w: t.saes[f"{a}-{w}"] for w in widths} for a in ["topk", *have]}
    # row r of batch j is prompt prompt_ids[j][r]: the resampling unit of the intervals
    ids = token_prompt_ids(t.prompts.sae_eval)
    return Section("arch-growth", "growth", ex.ArchitectureGrowth, {"widths": widths}, names,
                   lambda _: ex.architecture_growth(
                       t.protocol, saes, t.ev.pairs(L), t.ev.of(L), prompt_ids=ids, layer=L,
                       d_model=t.model.d_model))  # fmt: skip


def _depth(t: Trained) -> Section:
    # every layer's SAE at the k its search chose; the sweep layer's is the sweep's own
    L, w = t.profile.sweep_layer, t.profile.depth_width
    name = {L: f"topk-{w}"} | {y: m.name for y, m in t.depth_k.items()}
    saes = {y: t.saes[name[y]] for y in sorted(name) if name[y] in t.saes}
    pairs, acts = {y: t.ev.pairs(y) for y in saes}, {y: t.ev.of(y) for y in saes}
    search = {y: to_jsonable(m) for y, m in t.depth_k.items()}
    return Section("depth", "depth", ex.DepthEpsilon,
                   {"width": w, "k_search": content_key(search)}, tuple(name[y] for y in saes),
                   lambda _: ex.epsilon_by_depth(saes, pairs, acts, width=w,
                                                 k_search=search))  # fmt: skip


def _fourcell(t: Trained) -> Section:
    # The encoder-as-sparsity-filter mechanism can only be removed where the sparsity comes
    # from learned thresholds/biases (JumpReLU, ReLU), not TopK's k: the control runs on
    # every architecture at the ablation width, L0 per cell.
    s, L, w = t.profile, t.profile.sweep_layer, t.profile.ablation_width
    saes = t.at(["topk", *s.arch_controls], w)
    return Section("fourcell", "fourcell", ex.FourCell, {"seed": s.seed, "width": w},
                   tuple(f"{a}-{w}" for a in saes),
                   lambda _: ex.four_cells(saes, t.ev.pairs(L), width=w, layer=L,
                                           seed=s.seed))  # fmt: skip


def _ioi(t: Trained) -> Section | None:
    s, L, name = t.profile, t.profile.sweep_layer, f"topk-{t.profile.ablation_width}"
    if not s.ioi_prompts:
        return None
    config = {"n_prompts": s.ioi_prompts, "layer": L, "seed": s.seed}
    return Section("ioi", "ioi", ex.IOIRecovery, config, (name,), lambda _: ex.ioi(
        t.model, L, t.saes[name], n_prompts=s.ioi_prompts, seed=s.seed))  # fmt: skip


def sections(t: Trained) -> list[Section]:
    """The sections of ``t`` in the order they run (the sweep first: the architecture counts
    read its ε)."""
    found = (f(t) for f in (_sweep, _ce, _arch, _growth, _depth, _fourcell, _ioi))
    return [sec for sec in found if sec is not None]

"""Patching for the equivalence comparison: validation of matched components by replacing
them in model B with their mapped partners from model A (or a mean ablation), and the
CONGRUITY implementations (clean run plus top-KL head patches).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from structlens.interventions import hooked
from structlens.models.loading import Model

from .collect import _batches, forward
from .congruity import (
    LogitReference,
    PointTestResult,
    SelectivityResult,
    accumulated_representation,
    bootstrap_point_test,
    kl_from_logits,
    rank_heads,
    selectivity_test,
)
from .encoding import MULTIOUTPUTS, EncodingConfig, encoding_r2, fit_linear_map
from .layer_map import fit_layer_map
from .prefix import LayerOutputs, first_layer

if TYPE_CHECKING:
    from .compare import CompareConfig
    from .probes import Probe

__all__ = ["Writers", "validate", "validation_writers", "null_kl", "congruity"]

Writer = Callable[[torch.Tensor, dict], torch.Tensor]


def _eval_rows(logits: torch.Tensor, task: Any) -> torch.Tensor:
    """The rows validation scores, ``[rows, vocab]``: a task's metric positions, else every
    real token from ``start`` on (``logits`` already holds only them: :func:`_metric_positions`
    and :func:`_rows_from`)."""
    return logits.reshape(-1, logits.shape[-1]) if task is not None else logits


def rows_within(model: Model, max_logits: int | None) -> int | None:
    """Most output rows a budget of ``max_logits`` logits (rows x the model's output width,
    its vocabulary for a language model) allows, at least one; ``None``: no budget."""
    if max_logits is None:
        return None
    head = model.hf.get_output_embeddings() if model.causal else None
    width = int(head.weight.shape[0]) if head is not None else int(model.d_model)
    return max(1, max_logits // width)


def _rows_from(task: Any, start: int) -> int | None:
    """``forward``'s ``rows_from`` for validation: without a task, every real token from
    ``start`` on is scored, and only those rows are unembedded."""
    return start if task is None else None


def _metric_positions(task: Any, idx: list[int]) -> list[list[int]] | None:
    """The positions a task's metric reads in prompts ``idx`` (``None`` without a task)."""
    return None if task is None else task.metric_position_index(idx).tolist()


def _metric_input(logits: torch.Tensor) -> torch.Tensor:
    """Logits at the metric positions as the task's metric takes them (one position: its
    ``[b, vocab]`` row, as :meth:`~structlens.data.tasks.base.TaskDataset.gather_logits`
    gives it)."""
    return logits[:, 0] if logits.shape[1] == 1 else logits


def validate(
    model_a: Model,
    model_b: Model,
    tokens: list[list[int]],
    heldout: list[int],
    task_b: Any,
    start: int,
    writers: list[tuple[str, Writer]],
    a_sites: list[str],
    batch_size: int,
    *,
    context_a: list[list[int]] | None = None,
    context_b: list[list[int]] | None = None,
    max_logits: int | None = None,
) -> list[dict[str, float]]:
    """Patch each (site, fn) into B on the prompts ``heldout``; KL, top-1 and metric ratio.

    ``fn(act_b, cache_a)`` returns B's replacement activation given A's cache of the batch
    (A is not run when ``a_sites`` is empty).  ``context_*``: each model's encoder input per
    prompt (:func:`~structlens.equivalence.collect.forward`).
    Each batch is reduced to per-row KL (:class:`~structlens.equivalence.congruity.LogitReference`)
    and top-1 agreement before the next: holding every patch's logits (rows x vocabulary)
    would take gigabytes for a 262k vocabulary.
    A patched forward takes the unpatched forward's outputs of the layers below its site's
    layer (:class:`~structlens.equivalence.prefix.LayerOutputs`), which it would recompute
    unchanged.  Without a task, only the scored rows are unembedded; ``max_logits`` (rows x
    vocabulary) thins them to evenly spaced ones where a batch has more
    (:attr:`~structlens.equivalence.compare.CompareConfig.max_scored_logits`).
    """
    kl: list[list[np.ndarray]] = [[] for _ in writers]
    agree: list[list[torch.Tensor]] = [[] for _ in writers]
    orig_metric: list[torch.Tensor] = []
    patched_metric: list[list[torch.Tensor]] = [[] for _ in writers]
    prefix, first = LayerOutputs(model_b), [first_layer(model_b, site) for site, _ in writers]
    rows_from = _rows_from(task_b, start)
    max_rows = rows_within(model_b, max_logits)
    rows = {"rows_from": rows_from, "max_rows": max_rows}
    for chunk in _batches(len(heldout), batch_size):
        idx = [heldout[i] for i in chunk]
        toks = [tokens[i] for i in idx]
        ctx_b = None if context_b is None else [context_b[i] for i in idx]
        cache_a: dict = {}
        if a_sites:
            ctx_a = None if context_a is None else [context_a[i] for i in idx]
            with torch.no_grad(), hooked(model_a, a_sites) as cache_a:
                forward(model_a, toks, ctx_a)
        positions = _metric_positions(task_b, idx)
        with torch.no_grad(), prefix.record():
            base, _ = forward(model_b, toks, ctx_b, positions, **rows)
        ref = _eval_rows(base, task_b).float()
        reference, ref_top = LogitReference(ref.cpu().numpy()), ref.argmax(-1)
        del ref
        if task_b is not None:
            orig_metric.append(task_b.metric(_metric_input(base), idx).double())
        del base
        for k, (site_b, fn) in enumerate(writers):

            def write(act: torch.Tensor, fn=fn, src=cache_a) -> torch.Tensor:
                return fn(act, src)

            with (
                torch.no_grad(),
                prefix.below(first[k]),
                hooked(model_b, writes={site_b: write}),
            ):
                out, _ = forward(model_b, toks, ctx_b, positions, **rows)
            p = _eval_rows(out, task_b)
            kl[k].append(reference.kl(p.float().cpu().numpy()))
            agree[k].append(p.argmax(-1) == ref_top)
            if task_b is not None:
                patched_metric[k].append(task_b.metric(_metric_input(out), idx).double())
            del out, p
    records = []
    for k in range(len(writers)):
        rec = {
            "kl": float(np.mean(np.concatenate(kl[k]))),
            "top1": float(torch.cat(agree[k]).double().mean()),
        }
        if task_b is not None:
            m0 = float(torch.cat(orig_metric).mean())
            m1 = float(torch.cat(patched_metric[k]).mean())
            rec["metric_ratio"] = m1 / m0 if m0 != 0 else float("nan")
        records.append(rec)
    return records


def null_kl(
    model_b: Model,
    tokens: list[list[int]],
    prompts: list[int],
    task_b: Any,
    start: int,
    heads: list[tuple[int, int]],
    raw_zb: list,
    batch_size: int,
    context_b: list[list[int]] | None = None,
    max_logits: int | None = None,
) -> list[float]:
    """Mean KL (nats) of B's predictions with each head ``(layer, head)`` of B mean-ablated
    (to its mean over the fit rows ``raw_zb``, the null's own intervention), on the prompts
    ``prompts`` only, at the positions validation scores.  Given the fit prompts, it ranks
    heads without reading a held-out prompt."""
    stack = model_b.output_stack
    writers = [
        (f"{stack}.{lb}.attn.hook_z", _mean_heads(raw_zb, lb, [hb], start, model_b.dtype))
        for lb, hb in heads
    ]
    records = validate(
        model_b, model_b, tokens, prompts, task_b, start, writers, [], batch_size,
        context_b=context_b, max_logits=max_logits,
    )  # fmt: skip
    return [r["kl"] for r in records]


def _effect(model: Model, reference: np.ndarray, patched: np.ndarray) -> float:
    """Head importance: KL of the next-token distributions (nats) for models that output
    logits (causal LMs, encoder–decoders); for encoders, whose output is a hidden state, the
    relative squared change of that state."""
    if model.causal or model.is_encoder_decoder:
        return kl_from_logits(reference, patched)
    return float(np.sum((patched - reference) ** 2) / np.sum(reference**2))


def _congruity_group(
    model: Model,
    tokens: list[list[int]],
    corrupted: list[list[int]] | None,
    task: Any,
    position: str,
    config: CompareConfig,
    context: list[list[int]] | None = None,
) -> dict[str, Any]:
    """Accumulated representations of the clean run and of the top-KL head patches
    (``context``: the encoder's input per prompt, for an encoder–decoder language model)."""
    n_layers, stack = model.n_output_layers, model.output_stack
    resid = [f"{stack}.{l}.hook_resid_post" for l in range(n_layers)]
    resid = [f"{stack}.0.hook_resid_pre", *resid]
    layers = list(range(n_layers))
    if config.congruity_max_layers is not None and config.congruity_max_layers < n_layers:
        layers = sorted(
            {round(x) for x in np.linspace(0, n_layers - 1, config.congruity_max_layers)}
        )
    batches = _batches(len(tokens), config.batch_size)
    z_sites = [f"{stack}.{l}.attn.hook_z" for l in layers]

    def ctx(idx: list[int]) -> list[list[int]] | None:
        return None if context is None else [context[i] for i in idx]

    def last_scored(idx: list[int]) -> list[list[int]]:
        # the position whose prediction ranks the heads: the task's last metric position,
        # else the prompt's last token
        if task is not None:
            return task.metric_position_index(idx)[:, -1:].tolist()
        return [[len(tokens[i]) - 1] for i in idx]

    def run(
        idx: list[int], writes: dict | None, reads: list[str]
    ) -> tuple[torch.Tensor, dict, torch.Tensor]:
        """Outputs at :func:`last_scored` ``[b, 1, ...]``, the cache of ``reads``, the mask."""
        with torch.no_grad(), hooked(model, reads, writes) as cache:
            out, mask = forward(model, [tokens[i] for i in idx], ctx(idx), last_scored(idx))
        return out, dict(cache), mask

    clean: list[tuple[torch.Tensor, dict, torch.Tensor]] = []
    sources: list[dict[str, torch.Tensor]] = []
    for idx in batches:
        clean.append(run(idx, None, [*resid, *z_sites]))
        if corrupted is not None:
            with torch.no_grad(), hooked(model, z_sites) as cache:
                forward(model, [corrupted[i] for i in idx], ctx(idx))
            sources.append(dict(cache))
    if corrupted is None:
        # mean ablation: each head's mean over all real tokens of the probe set
        means = {}
        for s in z_sites:
            tot = sum((c[1][s] * c[2][..., None, None]).sum((0, 1)) for c in clean)
            cnt = sum(c[2].sum() for c in clean)
            means[s] = tot / cnt
        sources = [{s: means[s].expand_as(c[1][s]) for s in z_sites} for c in clean]

    def rep(caches: list[dict], masks: list[torch.Tensor]) -> np.ndarray:
        parts = []
        for c, m in zip(caches, masks, strict=True):
            parts.append(accumulated_representation([c[s] for s in resid], position, mask=m))
        return np.concatenate(parts)

    ref_logits = np.concatenate([o[:, -1].double().cpu().numpy() for o, _, _ in clean])
    base = rep([c[1] for c in clean], [c[2] for c in clean])
    kl = np.full((n_layers, model.n_heads), -np.inf)
    reps: dict[tuple[int, int], np.ndarray] = {}
    for l, s in zip(layers, z_sites, strict=True):
        for h in range(model.n_heads):
            outs, caches, masks = [], [], []
            for bi, idx in enumerate(batches):
                src = sources[bi][s]

                def write(act: torch.Tensor, src=src, h=h) -> torch.Tensor:
                    out = act.clone()
                    out[:, :, h] = src[:, :, h]
                    return out

                o, c, m = run(idx, {s: write}, resid)
                outs.append(o[:, -1].double().cpu().numpy())
                caches.append(c)
                masks.append(m)
            kl[l, h] = _effect(model, ref_logits, np.concatenate(outs))
            reps[(l, h)] = rep(caches, masks)
    grid = np.where(np.isfinite(kl), kl, -1.0)
    top = rank_heads(grid, top_k=min(config.congruity_top_k, len(reps)))
    return {
        "base": base,
        "intervened": [reps[(int(l), int(h))] for l, h in top],
        "top_heads": [[int(l), int(h)] for l, h in top],
        "top_kl": [float(kl[l, h]) for l, h in top],
        "kl_grid": grid,
    }


def _congruity_statistics(
    group_a: list[np.ndarray],
    group_b: list[np.ndarray],
    inter_a: list[np.ndarray],
    inter_b: list[np.ndarray],
    config: CompareConfig,
    encoding: EncodingConfig,
) -> tuple[dict[str, Any], list[PointTestResult | SelectivityResult]]:
    """Point tests, selectivity and the clean-run encodings in both directions under one
    ``encoding`` configuration (its ``multioutput`` is what differs between the estimates),
    and the tests' results (which record any reduction of too-wide predictors)."""
    out: dict[str, Any] = {}
    tests: list[PointTestResult | SelectivityResult] = []
    pairs = (("ab", group_a, group_b, inter_a), ("ba", group_b, group_a, inter_b))
    for tag, g1, g2, intervened in pairs:
        pt = bootstrap_point_test(
            g1, g2, n=config.point_n, straps=config.straps, seed=config.seed, config=encoding
        )
        sel = selectivity_test(
            [g1[0]] * len(intervened), intervened, g2, seed=config.seed, config=encoding
        )
        out[f"point_test_{tag}"] = {
            "decision_rate": pt.decision_rate,
            "p_values": pt.p_values.tolist(),
            "mean_p": float(pt.p_values.mean()),
        }
        out[f"selectivity_{tag}"] = sel.score
        # held-out R^2 of the clean run of one model encoding the clean run of the other
        out[f"base_r2_{tag}"] = encoding_r2(g1[0], g2[0], encoding)[0]
        tests += [pt, sel]
    rate = max(out["point_test_ab"]["decision_rate"], out["point_test_ba"]["decision_rate"])
    out["different"] = bool(rate > 0.5)
    return out, tests


def congruity(model_a: Model, model_b: Model, probe: Probe, config: CompareConfig) -> dict:
    """CONGRUITY: both models' implementation groups, point tests and selectivity.

    The statistics are computed twice on the same implementations, triples and seeds: with
    the reference's uniform average of per-coordinate ``R^2`` (top-level keys, the ones the
    decision ``different`` uses) and with variance-weighted ``R^2`` (under
    ``"variance_weighted"``), which, unlike the uniform average, does not change when the
    encoded representation's basis is rotated.  ``base_r2_ab`` / ``base_r2_ba``: held-out
    ``R^2`` of A's clean accumulated residual encoding B's (and back).
    """
    position = "last" if probe.task_a is not None else "mean"
    ga = _congruity_group(
        model_a, probe.tokens_a, probe.corrupted_a, probe.task_a, position, config,
        probe.context_a,
    )  # fmt: skip
    gb = _congruity_group(
        model_b, probe.tokens_b, probe.corrupted_b, probe.task_b, position, config,
        probe.context_b,
    )  # fmt: skip
    group_a = [ga["base"], *ga["intervened"]]
    group_b = [gb["base"], *gb["intervened"]]
    out: dict[str, Any] = {
        "representation": f"accumulated residual stream, {position} token(s)",
        "intervention": "head hook_z from corrupted run"
        if probe.corrupted_a
        else "head mean ablation",
        "top_heads_a": ga["top_heads"],
        "top_kl_a": ga["top_kl"],
        "top_heads_b": gb["top_heads"],
        "top_kl_b": gb["top_kl"],
        "kl_grid_a": ga["kl_grid"].tolist(),
        "kl_grid_b": gb["kl_grid"].tolist(),
    }
    estimates = {
        m: _congruity_statistics(
            group_a, group_b, ga["intervened"], gb["intervened"], config,
            EncodingConfig(multioutput=m),
        )
        for m in MULTIOUTPUTS
    }  # fmt: skip
    reduced: list[int] = []
    caveats: list[str] = []
    for res in estimates["uniform_average"][1]:  # the reduction is the same for both
        if res.reduced_to is not None:
            reduced.append(res.reduced_to)
        if res.caveat and res.caveat not in caveats:
            caveats.append(res.caveat)
    out |= estimates["uniform_average"][0]
    out["variance_weighted"] = estimates["variance_weighted"][0]
    # the encoding scores behind every statistic above, if their predictors were too wide
    out["reduced_to"] = max(reduced) if reduced else None
    out["caveat"] = "CONGRUITY encodings: " + " ".join(caveats) if caveats else None
    return out


class _HeadMaps:
    """Linear maps from A's head ``(la, ha)`` to B's head ``(lb, hb)``, fitted on the fit set
    once each and cast to B's dtype."""

    def __init__(self, raw_za: list, raw_zb: list, method: str, dtype: torch.dtype) -> None:
        self.raw_za, self.raw_zb, self.method, self.dtype = raw_za, raw_zb, method, dtype
        self.maps: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, la: int, ha: int, lb: int, hb: int) -> tuple[torch.Tensor, torch.Tensor]:
        if (la, ha, lb, hb) not in self.maps:
            lmap = fit_linear_map(self.raw_za[la][:, ha], self.raw_zb[lb][:, hb], self.method)
            self.maps[(la, ha, lb, hb)] = (
                torch.as_tensor(lmap.weight, dtype=self.dtype),
                torch.as_tensor(lmap.bias, dtype=self.dtype),
            )
        return self.maps[(la, ha, lb, hb)]


def _replace_heads(parts: list[tuple], start: int, stack_a: str) -> Writer:
    """Writer setting B's heads ``hb`` to A's mapped heads, for (la, ha, hb, w, b); A's
    layers are ``{stack_a}.{la}``."""

    def fn(act: torch.Tensor, src: dict) -> torch.Tensor:
        out = act.clone()
        for la, ha, hb, w, b in parts:
            mapped = src[f"{stack_a}.{la}.attn.hook_z"][:, :, ha].to(act.dtype) @ w + b
            out[:, start:, hb] = mapped[:, start:]
        return out

    return fn


def _mean_heads(raw_zb: list, lb: int, hbs: list[int], start: int, dtype: torch.dtype) -> Writer:
    """Writer mean-ablating B's heads ``hbs`` of layer ``lb`` (their fit-set means)."""
    means = torch.as_tensor(np.asarray(raw_zb[lb][:, hbs], np.float64).mean(0), dtype=dtype)

    def fn(act: torch.Tensor, src: dict) -> torch.Tensor:
        out = act.clone()
        out[:, start:, hbs] = means
        return out

    return fn


def _replace_layer(la: int, w: torch.Tensor, b: torch.Tensor, start: int, stack_a: str) -> Writer:
    """Writer setting B's residual stream to A's mapped ``resid_post`` of layer ``la``."""

    def fn(act: torch.Tensor, src: dict) -> torch.Tensor:
        out = act.clone()
        mapped = src[f"{stack_a}.{la}.hook_resid_post"].to(act.dtype) @ w + b
        out[:, start:] = mapped[:, start:]
        return out

    return fn


@dataclasses.dataclass
class Writers:
    """Every patch of a validation run, in groups (each a list of ``(site of B, writer)``),
    the sites of A they read, and the head groups (B layer -> its (la, ha, hb))."""

    heads: list[tuple[str, Writer]]
    layers: list[tuple[str, Writer]]
    nulls: list[tuple[str, Writer]]
    groups: list[tuple[str, Writer]]
    group_nulls: list[tuple[str, Writer]]
    a_sites: list[str]
    by_layer: dict[int, list[tuple[int, int, int]]]

    def all(self) -> list[tuple[str, Writer]]:
        return self.heads + self.layers + self.nulls + self.groups + self.group_nulls


def validation_writers(
    config: CompareConfig,
    head_pairs: list,
    all_head_pairs: list,
    layer_pairs: list,
    raw: tuple[list, list, list, list],
    start: int,
    dtype: torch.dtype,
    stacks: tuple[str, str] = ("blocks", "blocks"),
    layer_map: str | None = None,
) -> Writers:
    """The patches validating ``head_pairs`` and ``layer_pairs`` (maps fitted on the fit-set
    rows ``raw = (resid A, resid B, z A, z B)``), their mean-ablation nulls and, with
    ``validate_head_groups``, whole layers of B's heads matched in ``all_head_pairs``.
    ``stacks``: the site prefixes of A's and B's layers (:attr:`Model.output_stack`);
    ``layer_map``: the whole-layer map (:func:`~structlens.equivalence.choose_layer_map`'s
    method; ``None``: no layer is validated)."""
    raw_a, raw_b, raw_za, raw_zb = raw
    sa, sb = stacks
    head_map = _HeadMaps(raw_za, raw_zb, config.map_method, dtype)
    heads = [
        (
            f"{sb}.{lb}.attn.hook_z",
            _replace_heads([(la, ha, hb, *head_map(la, ha, lb, hb))], start, sa),
        )
        for (la, ha), (lb, hb) in head_pairs
    ]
    by_layer: dict[int, list[tuple[int, int, int]]] = {}
    if config.validate_head_groups:
        for (la, ha), (lb, hb) in all_head_pairs:
            by_layer.setdefault(lb, []).append((la, ha, hb))
    group_pairs = sorted(by_layer)
    groups = [
        (
            f"{sb}.{lb}.attn.hook_z",
            _replace_heads(
                [(la, ha, hb, *head_map(la, ha, lb, hb)) for la, ha, hb in by_layer[lb]],
                start,
                sa,
            ),
        )
        for lb in group_pairs
    ]
    group_nulls = [
        (
            f"{sb}.{lb}.attn.hook_z",
            _mean_heads(raw_zb, lb, [hb for _, _, hb in by_layer[lb]], start, dtype),
        )
        for lb in group_pairs
    ]
    layers = []
    if config.validate_layers and layer_map is not None:
        for la, lb in layer_pairs:
            lmap = fit_layer_map(raw_a[la], raw_b[lb], layer_map)
            w = torch.as_tensor(lmap.weight, dtype=dtype)
            bias = torch.as_tensor(lmap.bias, dtype=dtype)
            layers.append((f"{sb}.{lb}.hook_resid_post", _replace_layer(la, w, bias, start, sa)))
    a_sites = sorted(
        {f"{sa}.{a[0]}.attn.hook_z" for a, _ in head_pairs}
        | {f"{sa}.{la}.attn.hook_z" for lb in group_pairs for la, _, _ in by_layer[lb]}
        | {f"{sa}.{la}.hook_resid_post" for la, _ in layer_pairs if layers}
    )
    nulls = []
    if config.null_baseline:
        nulls = [
            (f"{sb}.{lb}.attn.hook_z", _mean_heads(raw_zb, lb, [hb], start, dtype))
            for _, (lb, hb) in head_pairs
        ]
    return Writers(heads, layers, nulls, groups, group_nulls, a_sites, by_layer)

"""Model-level interpretive equivalence: run two models on a probe set and compare them.

:func:`compare` runs both estimators of docs/equivalence.md on two loaded models:

1. **Matched-component equivalence** (an extension of the reference code, which has no
   matching step). On the *fit* half of the probe set it collects ``blocks.{l}.hook_resid_post``
   (layers) and ``blocks.{l}.attn.hook_z`` (heads) of both models, builds the layer and head
   similarity matrices, and matches layers (monotone depth-preserving DP, or Hungarian) and
   heads (global Hungarian, or Hungarian within matched layers). On the *held-out* half it
   validates every matched pair: component ``b`` of model B is overwritten with the
   activations of its partner ``a`` in model A, mapped into B's space by
   :func:`~structlens.equivalence.fit_linear_map` fitted on the fit half, and B's predictions
   are compared with its own (KL in nats, top-1 agreement, task-metric ratio). The score is
   the share of matched heads passing :class:`~structlens.equivalence.ValidationCriterion`
   (the layer score is reported beside it), with a Wilson interval. A null baseline
   mean-ablates the same heads; the score over the heads whose null fails (``informative``)
   and, optionally, whole layers of heads replaced at once (``head_groups``) are reported
   beside it, since single heads of a large model are often redundant.
2. **CONGRUITY** (as the reference code does it). Representations are the accumulated
   residual stream (``resid_pre`` of block 0, then every ``resid_post``) at the last token
   (task probes) or averaged over positions (corpus probes); implementations of a model are
   its clean run and runs with one of its top-KL heads patched (from the task's corrupted
   prompts, or mean-ablated for corpus probes, which have no corrupted counterpart). The
   selectivity test and the bootstrapped point test compare the two models' groups.

Token-level validation needs the same token sequences in both models (a shared tokenizer)
and a causal model B (KL is over next-token distributions). Otherwise, e.g. an encoder
against a decoder, representations are *sentence-level* (mean over positions of each
prompt), no patching is possible, and the score is the share of matched heads whose
similarity reaches ``similarity_threshold`` (``validation_method = "similarity"``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from structlens.interventions import hooked
from structlens.models.loading import Model
from structlens.results import Result

from .congruity import (
    accumulated_representation,
    bootstrap_point_test,
    kl_from_logits,
    rank_heads,
    selectivity_test,
)
from .encoding import fit_linear_map
from .layer_map import fit_layer_map
from .matching import (
    MatchingResult,
    head_similarity_matrix,
    layer_similarity_matrix,
    match_heads,
    match_hungarian,
    match_monotone,
)
from .preprocess import Preprocess, prepare
from .score import (
    ValidationCriterion,
    bootstrap_interval,
    decide_with_null,
    equivalence_score,
    informative_heads,
    wilson_interval,
)

__all__ = [
    "Probe",
    "task_probe",
    "corpus_probe",
    "CompareConfig",
    "ComparisonResult",
    "compare",
]

MIN_PROMPTS = 12


@dataclasses.dataclass
class Probe:
    """The same probe inputs, tokenized for each model.

    ``tokens_a[i]`` and ``tokens_b[i]`` encode ``texts[i]``; ``corrupted_*`` (task probes) are
    same-length corrupted prompts; ``task_*`` the task datasets (metric positions and metric).
    """

    name: str
    texts: list[str]
    tokens_a: list[list[int]]
    tokens_b: list[list[int]]
    corrupted_a: list[list[int]] | None = None
    corrupted_b: list[list[int]] | None = None
    task_a: Any = None
    task_b: Any = None

    def __post_init__(self) -> None:
        n = len(self.texts)
        for name in ("tokens_a", "tokens_b", "corrupted_a", "corrupted_b"):
            v = getattr(self, name)
            if v is not None and len(v) != n:
                raise ValueError(
                    f"mismatched probe sets: {name} has {len(v)} prompts, texts has {n}; both "
                    "models must see the same probe inputs."
                )
        if n < MIN_PROMPTS:
            raise ValueError(
                f"too few probe prompts ({n}); compare needs at least {MIN_PROMPTS} (half fit "
                "the similarities and maps, half validate)."
            )

    @property
    def shared_tokens(self) -> bool:
        """Whether both models see identical token sequences (token-level comparison)."""
        return self.tokens_a == self.tokens_b


def task_probe(model_a: Model, model_b: Model, task: str, n: int = 64, seed: int = 0) -> Probe:
    """A probe from a circuit task (``structlens.data.tasks``); both tokenizers must yield the
    same prompts. Corrupted prompts are the task's first corruption (IOI: ``abc``)."""
    from structlens.data.tasks import make_task

    ta = make_task(task, model_a.tokenizer, n=n, seed=seed)
    tb = make_task(task, model_b.tokenizer, n=n, seed=seed)
    if ta.texts != tb.texts:
        raise ValueError(
            f"the two tokenizers yield different {task!r} prompts (token filters differ); use a "
            "corpus probe for models with different tokenizers."
        )
    corruption = next(iter(ta.corrupted))
    return Probe(
        name=task,
        texts=list(ta.texts),
        tokens_a=[list(t) for t in ta.clean],
        tokens_b=[list(t) for t in tb.clean],
        corrupted_a=[list(t) for t in ta.corrupted[corruption]],
        corrupted_b=[list(t) for t in tb.corrupted[corruption]],
        task_a=ta,
        task_b=tb,
    )


def corpus_sentences(
    n: int, min_chars: int = 40, max_chars: int = 160, source: str | None = None
) -> list[str]:
    """``n`` sentences of the bundled corpus (or ``source``), evenly spaced through it."""
    from structlens.data.corpus import load_texts

    if n < 2:
        raise ValueError(f"a probe needs at least 2 sentences (-n), got {n}.")
    sentences = []
    for doc in load_texts(source):
        for s in re.split(r"(?<=[.!?])\s+", " ".join(doc.text.split())):
            if min_chars <= len(s) <= max_chars:
                sentences.append(s)
    if len(sentences) < n:
        raise ValueError(f"the corpus has {len(sentences)} usable sentences, {n} requested.")
    step = len(sentences) / n
    return [sentences[int(i * step)] for i in range(n)]


def corpus_probe(
    model_a: Model, model_b: Model, n: int = 64, source: str | None = None, max_chars: int = 160
) -> Probe:
    """A probe of ``n`` corpus sentences, tokenized by each model's tokenizer (its default
    special tokens: BERT's ``[CLS]``/``[SEP]``, none for SmolLM2 or the byte tokenizer)."""
    texts = corpus_sentences(n, max_chars=max_chars, source=source)
    return Probe(
        name="corpus",
        texts=texts,
        tokens_a=[list(model_a.tokenizer(t)["input_ids"]) for t in texts],
        tokens_b=[list(model_b.tokenizer(t)["input_ids"]) for t in texts],
    )


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    """Settings of :func:`compare`.

    Attributes
    ----------
    metric : str
        Similarity for both matrices (see :func:`layer_similarity_matrix`).
    preprocess : Preprocess
        Applied to fit-set rows before similarities (``exclude_bos`` drops position 0, which
        is then also excluded from map fitting and left unpatched in validation).
    representation : {"auto", "tokens", "sentence"}
        Rows are tokens, or prompts (mean over positions); ``"auto"`` picks tokens when the
        tokenizers agree.
    layer_matching : {"monotone", "hungarian"}
    head_matching : {"global", "per_layer"}
    map_method : {"ridge", "procrustes"}
        Linear map from A's head to B's for validation (layers: :func:`fit_layer_map`).
    criterion : ValidationCriterion
        The sufficient condition (default: KL <= 0.1 nats and top-1 >= 0.9).
    similarity_threshold : float
        Pass threshold of the similarity-only score (no patching possible).
    heldout_fraction : float
        Share of probe prompts held out for validation.
    validate : bool
        Validate by patching (when possible); ``False`` gives the similarity-only score.
    max_validate_heads : int or None
        Validate a seeded random subset of matched heads (all when None).
    validate_layers : bool
        Also validate matched layers (``resid_post`` replacement).
    max_validate_layers : int or None
        Validate a seeded random subset of matched layers (all when None).
    validate_head_groups : bool
        Also validate every layer of B as a group: all its heads replaced at once by their
        matched partners (each through its own map), against a null that mean-ablates all of
        them. Demanding where single heads are redundant (large models), at one forward per
        layer of B for each of the two.
    null_baseline : bool
        Also score a null: each validated head of B mean-ablated (its fit-set mean) instead
        of replaced by its partner. A null score near the real one means the criterion
        cannot tell a matched partner from no information (e.g. heads with little effect).
    congruity : bool
    congruity_top_k : int
        Intervened implementations per model (its top-KL heads).
    congruity_max_layers : int or None
        Rank heads of at most this many evenly spaced layers (all layers when None).
    point_n, straps : int
        Point-test triples and bootstrap repetitions (reference: 20 and 40).
    equivalent_at : float
        Matched-component verdict: "equivalent" when ``score >= equivalent_at`` and the
        score's interval lies above the null's (:func:`decide_with_null`), else "undecided".
    batch_size, seed, ci
    """

    metric: str = "linear_cka_debiased"
    preprocess: Preprocess = Preprocess(exclude_bos=True)
    representation: str = "auto"
    layer_matching: str = "monotone"
    head_matching: str = "global"
    map_method: str = "ridge"
    criterion: ValidationCriterion = ValidationCriterion()
    similarity_threshold: float = 0.5
    heldout_fraction: float = 0.5
    validate: bool = True
    max_validate_heads: int | None = None
    validate_layers: bool = True
    max_validate_layers: int | None = None
    validate_head_groups: bool = False
    null_baseline: bool = True
    congruity: bool = True
    congruity_top_k: int = 4
    congruity_max_layers: int | None = None
    point_n: int = 20
    straps: int = 40
    equivalent_at: float = 0.5
    batch_size: int = 8
    seed: int = 0
    ci: str = "wilson"

    def __post_init__(self) -> None:
        choices = {
            "representation": ("auto", "tokens", "sentence"),
            "layer_matching": ("monotone", "hungarian"),
            "head_matching": ("global", "per_layer"),
            "map_method": ("ridge", "procrustes"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}.")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must lie in (0, 1), got {self.heldout_fraction}.")
        if self.congruity_top_k < 1 or self.batch_size < 1:
            raise ValueError("congruity_top_k and batch_size must be positive.")


@dataclasses.dataclass(frozen=True)
class ComparisonResult(Result):
    """Both estimators on one model pair.

    ``score``/``score_ci``: matched-head equivalence score and its interval;
    ``layer_score``/``layer_score_ci``: the same over matched layers (NaN when not validated);
    ``matching``: layer and head pairs with their similarities; ``validation``: one record per
    validated head pair (``pair``, ``passed``, ``kl`` nats, ``top1``, ``metric_ratio``,
    ``similarity``), ``layer_validation`` likewise; ``null_score``: the share of the same heads
    passing when mean-ablated instead (NaN without patching), ``null_validation`` its
    per-head records; ``informative``: the score restricted to the *informative* heads, those
    whose mean ablation fails the criterion (``n_heads``, ``n_passed``, ``score``,
    ``score_ci``; score NaN when there are none, i.e. the criterion cannot tell a partner
    from no information on any validated head); ``congruity``: point-test decision rates and
    p-values in both directions, selectivity scores, the top heads; ``verdicts``: each
    estimator's verdict and whether they agree; ``head_groups`` (with
    ``validate_head_groups``): per layer of B, all heads replaced at once (``pairs`` are B's
    layers; ``score``, ``score_ci``, ``validation``, and the same for the all-heads mean
    ablation as ``null_*``, plus ``informative``), empty otherwise.
    """

    model_a: str
    model_b: str
    probe: str
    n_fit: int
    n_heldout: int
    representation: str
    validation_method: str
    score: float
    score_ci: list
    layer_score: float
    layer_score_ci: list
    null_score: float
    null_score_ci: list
    matching: dict
    validation: list
    layer_validation: list
    congruity: dict
    verdicts: dict
    config: dict
    layer_similarity: np.ndarray
    head_similarity: np.ndarray
    null_validation: list = dataclasses.field(default_factory=list)
    informative: dict = dataclasses.field(default_factory=dict)
    head_groups: dict = dataclasses.field(default_factory=dict)

    def summary(self) -> dict:
        """The JSON payload of the CLI: scalar fields plus the layer similarity matrix (the
        4-D head similarity array stays in ``arrays.safetensors``)."""
        d = self.to_json()
        d["layer_similarity"] = self.layer_similarity.tolist()
        return d


def _batches(n: int, size: int) -> list[list[int]]:
    return [list(range(i, min(n, i + size))) for i in range(0, n, size)]


def _pad(tokens: Sequence[Sequence[int]], model: Model) -> tuple[torch.Tensor, torch.Tensor]:
    from structlens.data.tasks import pad_batch

    ids, mask = pad_batch(tokens, int(model.tokenizer.pad_token_id))
    return ids.to(model.device), mask.to(model.device)


def _sites(model: Model) -> tuple[list[str], list[str]]:
    return (
        [f"blocks.{l}.hook_resid_post" for l in range(model.n_layers)],
        [f"blocks.{l}.attn.hook_z" for l in range(model.n_layers)],
    )


def _collect_rows(
    model: Model, tokens: Sequence[Sequence[int]], start: int, sentence: bool, batch_size: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per layer, resid_post rows ``[n, d]`` and hook_z rows ``[n, H, dh]`` (float64):
    real tokens from position ``start`` on, or one mean row per prompt."""
    resid_sites, z_sites = _sites(model)
    res: list[list[np.ndarray]] = [[] for _ in resid_sites]
    zs: list[list[np.ndarray]] = [[] for _ in z_sites]
    for idx in _batches(len(tokens), batch_size):
        ids, mask = _pad([tokens[i] for i in idx], model)
        with torch.no_grad(), hooked(model, [*resid_sites, *z_sites]) as cache:
            model.forward(ids, mask)
        keep = mask.bool().clone()
        keep[:, :start] = False
        if not bool(keep.any(1).all()):
            raise ValueError("a probe prompt has no token left after excluding position 0.")
        w = keep.double()
        for out, sites in ((res, resid_sites), (zs, z_sites)):
            for l, s in enumerate(sites):
                a = cache[s].double()
                if sentence:
                    flat = a.reshape(*a.shape[:2], -1)
                    m = (flat * w[..., None]).sum(1) / w.sum(1)[:, None]
                    out[l].append(m.reshape(len(idx), *a.shape[2:]).cpu().numpy())
                else:
                    out[l].append(a[keep].cpu().numpy())
    return [np.concatenate(r) for r in res], [np.concatenate(z) for z in zs]


def _prep_layers(acts: list[np.ndarray], options: Preprocess) -> list[np.ndarray]:
    opts = dataclasses.replace(options, exclude_bos=False)
    out = []
    for a in acts:
        flat = a.reshape(a.shape[0], -1)
        out.append(prepare(flat, opts).reshape(a.shape))
    return out


def _eval_rows(
    logits: torch.Tensor, mask: torch.Tensor, task: Any, idx: list[int], start: int
) -> torch.Tensor:
    if task is not None:
        g = task.gather_logits(logits, idx)
        return g.reshape(-1, g.shape[-1])
    keep = mask.bool().clone()
    keep[:, :start] = False
    return logits[keep]


def _validate(
    model_a: Model,
    model_b: Model,
    tokens: list[list[int]],
    heldout: list[int],
    task_b: Any,
    start: int,
    writers: list[tuple[str, Callable[[torch.Tensor, dict], torch.Tensor]]],
    a_sites: list[str],
    batch_size: int,
) -> list[dict[str, float]]:
    """Patch each (site, fn) into B on the held-out prompts; KL, top-1 and metric ratio.

    ``fn(act_b, cache_a)`` returns B's replacement activation given A's cache of the batch.
    """
    orig_rows, patched_rows = [], [[] for _ in writers]
    orig_metric, patched_metric = [], [[] for _ in writers]
    for chunk in _batches(len(heldout), batch_size):
        idx = [heldout[i] for i in chunk]
        toks = [tokens[i] for i in idx]
        ids_a, mask_a = _pad(toks, model_a)
        with torch.no_grad(), hooked(model_a, a_sites) as cache_a:
            model_a.forward(ids_a, mask_a)
        ids, mask = _pad(toks, model_b)
        with torch.no_grad():
            base = model_b.forward(ids, mask)
        orig_rows.append(_eval_rows(base, mask, task_b, idx, start).double())
        if task_b is not None:
            orig_metric.append(task_b.metric(task_b.gather_logits(base, idx), idx).double())
        for k, (site_b, fn) in enumerate(writers):

            def write(act: torch.Tensor, fn=fn, src=cache_a) -> torch.Tensor:
                return fn(act, src)

            with torch.no_grad(), hooked(model_b, writes={site_b: write}):
                out = model_b.forward(ids, mask)
            patched_rows[k].append(_eval_rows(out, mask, task_b, idx, start).double())
            if task_b is not None:
                patched_metric[k].append(
                    task_b.metric(task_b.gather_logits(out, idx), idx).double()
                )
    ref = torch.cat(orig_rows)
    ref_top = ref.argmax(-1)
    records = []
    for k in range(len(writers)):
        p = torch.cat(patched_rows[k])
        rec = {
            "kl": kl_from_logits(ref.numpy(), p.numpy()),
            "top1": float((p.argmax(-1) == ref_top).double().mean()),
        }
        if task_b is not None:
            m0 = float(torch.cat(orig_metric).mean())
            m1 = float(torch.cat(patched_metric[k]).mean())
            rec["metric_ratio"] = m1 / m0 if m0 != 0 else float("nan")
        records.append(rec)
    return records


def _score(
    pairs: list,
    sims: list[float],
    records: list[dict] | None,
    config: CompareConfig,
) -> tuple[Any, str]:
    if records is None:
        crit = ValidationCriterion(
            max_kl=None, min_top1=None, min_similarity=config.similarity_threshold
        )
        return equivalence_score(pairs, crit, similarity=sims, ci=config.ci), "similarity"
    crit = config.criterion
    kw: dict[str, Any] = {
        "kl": [r["kl"] for r in records],
        "top1": [r["top1"] for r in records],
        "similarity": sims,
    }
    if all("metric_ratio" in r for r in records):
        kw["metric_ratio"] = [r["metric_ratio"] for r in records]
    elif crit.min_metric_ratio is not None:
        raise ValueError("criterion.min_metric_ratio needs a task probe (a task metric).")
    return equivalence_score(pairs, crit, ci=config.ci, **kw), "patching"


def _informative(partner: list[dict], null: list[dict], ci: str) -> dict[str, Any]:
    """Pass rate of the partner replacement over the heads whose mean ablation fails.

    A head whose mean ablation already passes says nothing about its partner (any input
    would pass), so only the others can show that a matched partner carries the information
    B needs there.
    """
    keep = [p["passed"] for p, q in zip(partner, null, strict=True) if not q["passed"]]
    if not keep:
        return {"n_heads": 0, "n_passed": 0, "score": float("nan"), "score_ci": [float("nan")] * 2}
    k, n = int(sum(keep)), len(keep)
    lo, hi = (
        wilson_interval(k, n)
        if ci == "wilson"
        else bootstrap_interval(np.array(keep, dtype=float), 0.95, 2000, 0)
    )
    return {"n_heads": n, "n_passed": k, "score": k / n, "score_ci": [lo, hi]}


def _effect(model: Model, reference: np.ndarray, patched: np.ndarray) -> float:
    """Head importance: KL of the next-token distributions (nats) for causal LMs; for
    encoders, whose output is a hidden state, the relative squared change of that state."""
    if model.causal:
        return kl_from_logits(reference, patched)
    return float(np.sum((patched - reference) ** 2) / np.sum(reference**2))


def _congruity_group(
    model: Model,
    tokens: list[list[int]],
    corrupted: list[list[int]] | None,
    task: Any,
    position: str,
    config: CompareConfig,
) -> dict[str, Any]:
    """Accumulated representations of the clean run and of the top-KL head patches."""
    n_layers = model.n_layers
    resid = ["blocks.0.hook_resid_pre", *[f"blocks.{l}.hook_resid_post" for l in range(n_layers)]]
    layers = list(range(n_layers))
    if config.congruity_max_layers is not None and config.congruity_max_layers < n_layers:
        layers = sorted(
            {round(x) for x in np.linspace(0, n_layers - 1, config.congruity_max_layers)}
        )
    batches = _batches(len(tokens), config.batch_size)
    z_sites = [f"blocks.{l}.attn.hook_z" for l in layers]

    def run(
        idx: list[int], writes: dict | None, reads: list[str]
    ) -> tuple[torch.Tensor, dict, torch.Tensor]:
        ids, mask = _pad([tokens[i] for i in idx], model)
        with torch.no_grad(), hooked(model, reads, writes) as cache:
            out = model.forward(ids, mask)
        return out, dict(cache), mask

    clean: list[tuple[torch.Tensor, dict, torch.Tensor]] = []
    sources: list[dict[str, torch.Tensor]] = []
    for idx in batches:
        clean.append(run(idx, None, [*resid, *z_sites]))
        if corrupted is not None:
            ids, mask = _pad([corrupted[i] for i in idx], model)
            with torch.no_grad(), hooked(model, z_sites) as cache:
                model.forward(ids, mask)
            sources.append(dict(cache))
    if corrupted is None:
        # mean ablation: each head's mean over all real tokens of the probe set
        means = {}
        for s in z_sites:
            tot = sum((c[1][s] * c[2][..., None, None]).sum((0, 1)) for c in clean)
            cnt = sum(c[2].sum() for c in clean)
            means[s] = tot / cnt
        sources = [{s: means[s].expand_as(c[1][s]) for s in z_sites} for c in clean]

    def rows(out: torch.Tensor, mask: torch.Tensor, idx: list[int]) -> np.ndarray:
        if task is not None:
            return task.gather_logits(out, idx).reshape(len(idx), -1, out.shape[-1])[:, -1]
        last = mask.sum(1) - 1
        return out[torch.arange(out.shape[0]), last]

    def rep(caches: list[dict], masks: list[torch.Tensor]) -> np.ndarray:
        parts = []
        for c, m in zip(caches, masks, strict=True):
            parts.append(accumulated_representation([c[s] for s in resid], position, mask=m))
        return np.concatenate(parts)

    ref_logits = np.concatenate(
        [
            rows(o, m, idx).double().cpu().numpy()
            for (o, _, m), idx in zip(clean, batches, strict=True)
        ]
    )
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
                outs.append(rows(o, m, idx).double().cpu().numpy())
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


def _congruity(model_a: Model, model_b: Model, probe: Probe, config: CompareConfig) -> dict:
    position = "last" if probe.task_a is not None else "mean"
    ga = _congruity_group(
        model_a, probe.tokens_a, probe.corrupted_a, probe.task_a, position, config
    )
    gb = _congruity_group(
        model_b, probe.tokens_b, probe.corrupted_b, probe.task_b, position, config
    )
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
    for tag, g1, g2, grp in (("ab", group_a, group_b, ga), ("ba", group_b, group_a, gb)):
        pt = bootstrap_point_test(g1, g2, n=config.point_n, straps=config.straps, seed=config.seed)
        sel = selectivity_test(
            [grp["base"]] * len(grp["intervened"]), grp["intervened"], g2, seed=config.seed
        )
        out[f"point_test_{tag}"] = {
            "decision_rate": pt.decision_rate,
            "p_values": pt.p_values.tolist(),
            "mean_p": float(pt.p_values.mean()),
        }
        out[f"selectivity_{tag}"] = sel.score
    rate = max(out["point_test_ab"]["decision_rate"], out["point_test_ba"]["decision_rate"])
    out["different"] = bool(rate > 0.5)
    return out


def compare(
    model_a: Model, model_b: Model, probe: Probe, config: CompareConfig | None = None
) -> ComparisonResult:
    """Compare two models on a probe set with both estimators (module docstring).

    Parameters
    ----------
    model_a, model_b : Model
        Loaded models; B is the model whose components get replaced in validation.
    probe : Probe
        From :func:`task_probe` or :func:`corpus_probe` (same inputs for both models).
    config : CompareConfig, optional
    """
    cfg = config or CompareConfig()
    n = len(probe.texts)
    rep = cfg.representation
    if rep == "auto":
        rep = "tokens" if probe.shared_tokens else "sentence"
    if rep == "tokens" and not probe.shared_tokens:
        raise ValueError(
            "token-level comparison needs identical token sequences in both models; the "
            "tokenizers differ, so use representation='sentence'."
        )
    rng = np.random.default_rng(cfg.seed)
    order = rng.permutation(n)
    n_held = int(round(cfg.heldout_fraction * n))
    if n_held < 2 or n - n_held < 2:
        raise ValueError(f"{n} probe prompts cannot be split into fit and held-out halves.")
    heldout, fit = sorted(order[:n_held].tolist()), sorted(order[n_held:].tolist())
    start = 1 if cfg.preprocess.exclude_bos else 0
    sentence = rep == "sentence"
    raw_a, raw_za = _collect_rows(
        model_a, [probe.tokens_a[i] for i in fit], start, sentence, cfg.batch_size
    )
    raw_b, raw_zb = _collect_rows(
        model_b, [probe.tokens_b[i] for i in fit], start, sentence, cfg.batch_size
    )
    acts_a, acts_b = _prep_layers(raw_a, cfg.preprocess), _prep_layers(raw_b, cfg.preprocess)
    z_a, z_b = _prep_layers(raw_za, cfg.preprocess), _prep_layers(raw_zb, cfg.preprocess)
    s_layers = layer_similarity_matrix(acts_a, acts_b, cfg.metric)
    s_heads = head_similarity_matrix(z_a, z_b, cfg.metric)
    layer_match: MatchingResult = (
        match_monotone(s_layers) if cfg.layer_matching == "monotone" else match_hungarian(s_layers)
    )
    head_match = match_heads(
        s_heads,
        cfg.head_matching,
        layer_pairs=layer_match.pairs if cfg.head_matching == "per_layer" else None,
    )
    head_pairs, head_sims = head_match.pairs, head_match.similarities
    congruity = _congruity(model_a, model_b, probe, cfg) if cfg.congruity else {}
    if cfg.max_validate_heads is not None and cfg.max_validate_heads < len(head_pairs):
        # validate the heads whose mean ablation fails (top-KL in B), else a random subset
        max_kl = cfg.criterion.max_kl if cfg.criterion.max_kl is not None else 0.1
        pick = (
            informative_heads(congruity["kl_grid_b"], head_pairs, cfg.max_validate_heads, max_kl)
            if congruity
            else []
        )
        pick = pick or sorted(rng.choice(len(head_pairs), cfg.max_validate_heads, replace=False))
        head_pairs = [head_pairs[i] for i in pick]
        head_sims = [head_sims[i] for i in pick]
    layer_pairs, layer_sims = layer_match.pairs, layer_match.similarities
    if cfg.max_validate_layers is not None and cfg.max_validate_layers < len(layer_pairs):
        pick = sorted(rng.choice(len(layer_pairs), cfg.max_validate_layers, replace=False).tolist())
        layer_pairs = [layer_pairs[i] for i in pick]
        layer_sims = [layer_sims[i] for i in pick]
    can_patch = cfg.validate and not sentence and model_b.causal
    head_records = layer_records = null_records = None
    head_groups: dict[str, Any] = {}
    if can_patch:
        maps: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

        def head_map(la: int, ha: int, lb: int, hb: int) -> tuple[torch.Tensor, torch.Tensor]:
            if (la, ha, lb, hb) not in maps:
                lmap = fit_linear_map(raw_za[la][:, ha], raw_zb[lb][:, hb], cfg.map_method)
                maps[(la, ha, lb, hb)] = (
                    torch.as_tensor(lmap.weight, dtype=model_b.dtype),
                    torch.as_tensor(lmap.bias, dtype=model_b.dtype),
                )
            return maps[(la, ha, lb, hb)]

        def replace_heads(parts: list[tuple]) -> Callable:
            """Writer setting B's heads ``hb`` to A's mapped heads, for (la, ha, hb, w, b)."""

            def fn(act: torch.Tensor, src: dict) -> torch.Tensor:
                out = act.clone()
                for la, ha, hb, w, b in parts:
                    mapped = src[f"blocks.{la}.attn.hook_z"][:, :, ha].to(act.dtype) @ w + b
                    out[:, start:, hb] = mapped[:, start:]
                return out

            return fn

        def mean_heads(lb: int, hbs: list[int]) -> Callable:
            means = torch.as_tensor(raw_zb[lb][:, hbs].mean(0), dtype=model_b.dtype)

            def fn(act: torch.Tensor, src: dict) -> torch.Tensor:
                out = act.clone()
                out[:, start:, hbs] = means
                return out

            return fn

        head_writers = [
            (f"blocks.{lb}.attn.hook_z", replace_heads([(la, ha, hb, *head_map(la, ha, lb, hb))]))
            for (la, ha), (lb, hb) in head_pairs
        ]
        by_layer: dict[int, list[tuple[int, int, int]]] = {}
        if cfg.validate_head_groups:
            for (la, ha), (lb, hb) in head_match.pairs:
                by_layer.setdefault(lb, []).append((la, ha, hb))
        group_pairs = sorted(by_layer)
        group_writers = [
            (
                f"blocks.{lb}.attn.hook_z",
                replace_heads(
                    [(la, ha, hb, *head_map(la, ha, lb, hb)) for la, ha, hb in by_layer[lb]]
                ),
            )
            for lb in group_pairs
        ]
        group_null_writers = [
            (f"blocks.{lb}.attn.hook_z", mean_heads(lb, [hb for _, _, hb in by_layer[lb]]))
            for lb in group_pairs
        ]
        layer_writers = []
        if cfg.validate_layers:
            for la, lb in layer_pairs:
                lmap = fit_layer_map(raw_a[la], raw_b[lb])
                w = torch.as_tensor(lmap.weight, dtype=model_b.dtype)
                bias = torch.as_tensor(lmap.bias, dtype=model_b.dtype)

                def fn(act, src, la=la, w=w, b=bias):
                    out = act.clone()
                    mapped = src[f"blocks.{la}.hook_resid_post"].to(act.dtype) @ w + b
                    out[:, start:] = mapped[:, start:]
                    return out

                layer_writers.append((f"blocks.{lb}.hook_resid_post", fn))
        a_sites = sorted(
            {f"blocks.{a[0]}.attn.hook_z" for a, _ in head_pairs}
            | {f"blocks.{la}.attn.hook_z" for lb in group_pairs for la, _, _ in by_layer[lb]}
            | {f"blocks.{la}.hook_resid_post" for la, _ in layer_pairs}
        )
        null_writers = []
        if cfg.null_baseline:
            null_writers = [
                (f"blocks.{lb}.attn.hook_z", mean_heads(lb, [hb])) for _, (lb, hb) in head_pairs
            ]
        writers = head_writers + layer_writers + null_writers + group_writers + group_null_writers
        records = _validate(
            model_a,
            model_b,
            probe.tokens_b,
            heldout,
            probe.task_b,
            start,
            writers,
            a_sites,
            cfg.batch_size,
        )
        nh, nl, nn, ng = len(head_writers), len(layer_writers), len(null_writers), len(group_pairs)
        head_records = records[:nh]
        layer_records = records[nh : nh + nl] if cfg.validate_layers else None
        null_records = records[nh + nl : nh + nl + nn] if cfg.null_baseline else None
        if group_pairs:
            sims = [
                float(np.mean([s_heads[la, ha, lb, hb] for la, ha, hb in by_layer[lb]]))
                for lb in group_pairs
            ]
            rest = records[nh + nl + nn :]
            group, _ = _score(group_pairs, sims, rest[:ng], cfg)
            group_null, _ = _score(group_pairs, sims, rest[ng:], cfg)
            head_groups = {
                "pairs": group_pairs,
                "score": group.score,
                "score_ci": group.score_ci,
                "validation": group.validation,
                "null_score": group_null.score,
                "null_score_ci": group_null.score_ci,
                "null_validation": group_null.validation,
                "informative": _informative(group.validation, group_null.validation, cfg.ci),
            }
    head_score, method = _score(head_pairs, head_sims, head_records, cfg)
    informative: dict[str, Any] = {}
    if null_records is not None:
        null = _score(head_pairs, head_sims, null_records, cfg)[0]
        n_score, n_ci, n_val = null.score, null.score_ci, null.validation
        informative = _informative(head_score.validation, n_val, cfg.ci)
    else:
        n_score, n_ci, n_val = float("nan"), [float("nan"), float("nan")], []
    if layer_records is not None or not can_patch:
        layer_score, _ = _score(layer_pairs, layer_sims, layer_records, cfg)
        l_score, l_ci, l_val = layer_score.score, layer_score.score_ci, layer_score.validation
    else:
        l_score, l_ci, l_val = float("nan"), [float("nan"), float("nan")], []
    matching_verdict, reason = decide_with_null(
        head_score.score, head_score.score_ci, n_ci, cfg.equivalent_at
    )
    verdicts: dict[str, Any] = {"matching": matching_verdict, "matching_reason": reason}
    if congruity:
        # no detected difference is not evidence of equivalence: the point test has no null
        verdicts["congruity"] = "different" if congruity["different"] else "undecided"
        verdicts["agree"] = verdicts["congruity"] == matching_verdict
    return ComparisonResult(
        model_a=model_a.name,
        model_b=model_b.name,
        probe=probe.name,
        n_fit=len(fit),
        n_heldout=len(heldout),
        representation=rep,
        validation_method=method,
        score=head_score.score,
        score_ci=head_score.score_ci,
        layer_score=l_score,
        layer_score_ci=l_ci,
        null_score=n_score,
        null_score_ci=n_ci,
        matching={
            "layers": {
                "method": layer_match.method,
                "pairs": layer_match.pairs,
                "similarities": layer_match.similarities,
            },
            "heads": {
                "method": head_match.method,
                "pairs": head_match.pairs,
                "similarities": head_match.similarities,
            },
        },
        validation=head_score.validation,
        layer_validation=l_val,
        congruity=congruity,
        verdicts=verdicts,
        config=dataclasses.asdict(cfg),
        layer_similarity=s_layers,
        head_similarity=s_heads,
        null_validation=n_val,
        informative=informative,
        head_groups=head_groups,
    )

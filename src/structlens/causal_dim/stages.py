"""The causal-dimensionality stages: the only code that turns a model into κ and width-sweep
numbers.

Each stage is a function ``(protocol, inputs, ...) -> Result`` of a frozen, typed result; the
``causal-dim`` CLI, ``structlens analyze`` and the replication call these and only render
what they return, so one :class:`~structlens.causal_dim.protocol.CausalProtocol` gives one
answer whichever driver runs it.

* :func:`prompt_sets` — the protocol's prompt sets (:class:`PromptSets`);
  :func:`generated_text` — texts sampled from the model for SAE training
  (:class:`GeneratedText`); :func:`training_prompts` — what the SAEs train on.
* :func:`exact_grams` and :func:`kappa` — exact per-vector Grams ``J(x)ᵀJ(x)`` and κ of one
  layer, vectors doubled until κ is identified (:class:`KappaFit`); :func:`blocked_grams`
  draws a caching driver's Grams in fixed blocks (:class:`GramBlock`).  κ is solved in one place,
  :meth:`structlens.causal_dim.kappa.KappaEstimator.fit_from_statistics` (through
  :func:`~structlens.causal_dim.kappa.kappa_from_grams`, its entry for per-vector Grams).
* :func:`training_rows`, :func:`eval_rows` — the residuals SAEs train on and the residuals
  with their LM-loss gradients the sweep evaluates on (:class:`LayerRows`).
* :func:`train_sae`, :func:`train_sweep` — SAEs trained to convergence
  (:class:`SAETraining`); :func:`sae_jobs` — every SAE of fixed settings the sections on
  trained SAEs read; :func:`match_k` — the ε-by-depth SAE of one layer, its k chosen to
  match the sweep layer's held-out FVU (:class:`KMatch`).
* :func:`sweep` — the width-sweep wedge, κ̂ and the base-width table (:class:`SweepFit`).
* :func:`analysis` — what ``structlens analyze`` runs: κ at :func:`kappa_layers` of the
  analysis layers and the width sweep at the middle one (:class:`CausalAnalysis`).

A driver that caches (the replication) may hand :func:`kappa` its own Gram source and
:func:`sweep` rows and SAEs read back from its cache; the numbers are the same.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from structlens.causal_dim.kappa import KappaCurve, KappaResult
from structlens.causal_dim.protocol import CausalProtocol
from structlens.causal_dim.sweep import WidthSweepResult
from structlens.errors import InputError
from structlens.results import Result

__all__ = [
    "PromptSets",
    "prompt_sets",
    "holdout_stride",
    "GeneratedText",
    "generated_text",
    "training_prompts",
    "exact_grams",
    "GramBlock",
    "blocked_grams",
    "KappaFit",
    "kappa",
    "matched_layer",
    "LayerRows",
    "training_rows",
    "eval_rows",
    "SAETraining",
    "TrainedSAE",
    "sae_jobs",
    "KMatch",
    "match_k",
    "depth_sae_name",
    "train_sae",
    "train_sweep",
    "SweepFit",
    "sweep",
    "CausalAnalysis",
    "kappa_layers",
    "analysis",
]


# ---------------------------------------------------------------- prompt sets
@dataclasses.dataclass(frozen=True)
class PromptSets(Result):
    """The protocol's prompts (token-id lists) and the corpus chunk of every Jacobian window.

    ``sae_train``, ``sae_eval`` and ``ce`` are disjoint sets of corpus chunks; the last
    ``n_train_extra`` of ``sae_train`` are the chunks after the evaluation ones
    (``sae_train_extra``).  ``kappa_windows`` are the Jacobian windows in the order vectors
    are drawn and ``kappa_chunks`` the chunk each was cut from (the jackknife's unit);
    ``kappa_train_chunks`` counts those windows (at most ``kappa_max_vectors``) that were
    cut from SAE training chunks: κ involves no SAE, so they serve once the held-out chunks
    are used up.  ``holdout_stride``: every how many chunks one was held out
    (:func:`holdout_stride`).
    """

    sae_train: list
    sae_eval: list
    ce: list
    kappa_windows: list
    kappa_chunks: list
    kappa_train_chunks: int
    n_chunks: int
    n_heldout: int
    n_train_extra: int = 0
    holdout_stride: int | None = None


def prompt_sets(protocol: CausalProtocol, tokenizer: Any, data: Path | None = None) -> PromptSets:
    """The prompt sets of ``protocol`` from the corpus (``data``: a text file; default the
    bundled corpus); see :mod:`structlens.causal_dim.protocol` for the split rule.

    Raises
    ------
    InputError
        When the corpus has too few chunks of ``chunk_tokens`` tokens for the protocol.
    """
    from structlens.data.corpus import chunk_documents, load_texts

    p = protocol
    chunks = chunk_documents(load_texts(data), tokenizer, max_tokens=p.chunk_tokens)
    full = [list(c.token_ids) for c in chunks if len(c.token_ids) == p.chunk_tokens]
    n_tr, n_ev = p.sae_train_prompts, p.sae_eval_prompts
    need_held = n_ev + p.ce_prompts
    stride = holdout_stride(len(full), p.holdout_every, need_held)
    index = list(range(len(full)))
    held = index[::stride]
    other = [i for i in index if i % stride]
    n_side = n_tr + p.sae_eval_extra  # training-side chunks of training and evaluation
    n_extra = len(other) - n_side if p.sae_train_extra is None else p.sae_train_extra
    need_other = n_side + max(n_extra, 0)
    if len(held) < need_held or len(other) < need_other:
        raise InputError(
            f"the corpus gives {len(full)} chunks of {p.chunk_tokens} tokens ({len(held)} "
            f"held out, {len(other)} others); the protocol needs {need_held} held-out and "
            f"{need_other} others: ask for fewer prompts or shorter chunks."
        )
    train = other[:n_tr] + other[n_side : n_side + n_extra]
    evaluation = held[:n_ev] + other[n_tr:n_side]
    ce = held[n_ev : n_ev + p.ce_prompts]
    # disjoint by construction; checked, since every claim about held-out data rests on it
    assert not (set(train) & set(evaluation)) and not (set(ce) & set(train + evaluation))
    n = p.jacobian_tokens
    starts = range(0, p.chunk_tokens - n + 1, n + p.jacobian_gap)
    # chunk-major within a window index: the first vectors all come from different chunks
    order = [(i, a) for pool in (held, other) for a in starts for i in pool]
    cap = min(len(order), p.kappa_max_vectors)
    order = order[:cap]
    in_train = set(train)
    return PromptSets(
        sae_train=[full[i] for i in train],
        sae_eval=[full[i] for i in evaluation],
        ce=[full[i] for i in ce],
        kappa_windows=[full[i][a : a + n] for i, a in order],
        kappa_chunks=[i for i, _ in order],
        kappa_train_chunks=sum(i in in_train for i, _ in order),
        n_chunks=len(full),
        n_heldout=len(held),
        n_train_extra=n_extra,
        holdout_stride=stride,
    )


def holdout_stride(n_chunks: int, holdout_every: int, need: int) -> int:
    """Every how many chunks one is held out: ``holdout_every``, or the largest shorter
    stride that holds out the ``need`` chunks the protocol evaluates on (a tokenizer with a
    larger vocabulary cuts the same corpus into fewer chunks); at least 2, so that chunks
    are left to train on.

    >>> holdout_stride(871, 20, 44), holdout_stride(843, 20, 44)
    (20, 19)
    """
    stride = holdout_every
    while stride > 2 and -(-n_chunks // stride) < need:
        stride -= 1
    return stride


@dataclasses.dataclass(frozen=True)
class GeneratedText(Result):
    """Texts sampled from the model for SAE training (:func:`generated_text`): ``texts[i]``
    continues the first ``prefix`` tokens of training chunk ``sources[i]`` (an index into
    :attr:`PromptSets.sae_train`) to ``chunk_tokens`` tokens at temperature 1, seeded by
    ``seed``."""

    texts: list
    sources: list
    prefix: int
    seed: int


def generated_text(protocol: CausalProtocol, model: Any, prompts: PromptSets) -> GeneratedText:
    """``protocol.sae_generated_prompts`` texts sampled from ``model`` itself
    (:func:`~structlens.causal_dim.model.sample_continuations`), text ``i`` continuing the
    first ``sae_generated_prefix`` tokens of training chunk ``i mod n_train``: only training
    text conditions them, so evaluation prompts stay out of SAE training."""
    from structlens.causal_dim.model import sample_continuations

    p, train = protocol, prompts.sae_train
    n = p.sae_generated_prompts
    if n and not train:
        raise InputError("generated texts continue training chunks; there are none.")
    sources = [i % len(train) for i in range(n)] if n else []
    prefixes = [train[i][: p.sae_generated_prefix] for i in sources]
    n_new = p.chunk_tokens - p.sae_generated_prefix
    texts = sample_continuations(model, prefixes, n_new, p.seed) if n else []
    return GeneratedText(texts=texts, sources=sources, prefix=p.sae_generated_prefix, seed=p.seed)


def training_prompts(prompts: PromptSets, generated: GeneratedText | None = None) -> list:
    """The token ids SAEs train on, in row order: every training chunk followed by the texts
    generated from it.  Interleaved so that the held-out tenth of :func:`train_sae`'s rows,
    and any token cap, take corpus and generated text in the proportion training sees."""
    texts, sources = (generated.texts, generated.sources) if generated else ([], [])
    by_source: dict[int, list] = {}
    for text, i in zip(texts, sources, strict=True):
        by_source.setdefault(i, []).append(text)
    return [t for i, chunk in enumerate(prompts.sae_train) for t in [chunk, *by_source.get(i, [])]]


# ---------------------------------------------------------------- exact κ
def exact_grams(
    protocol: CausalProtocol, model: Any, layer: int, windows: Sequence[Sequence[int]]
) -> np.ndarray:
    """Exact ``J(x)ᵀJ(x)`` [n, d, d] (float64) at ``blocks.{layer}.hook_resid_pre``, one per
    window (its last token), of the protocol's output and positions."""
    from structlens.causal_dim.jacobian import JacobianConfig
    from structlens.causal_dim.model import vector_grams

    output: Any = protocol.jacobian_output  # a Literal, checked by the protocol
    positions: Any = protocol.jacobian_positions
    cfg = JacobianConfig(output=output, max_rows=model.d_model)
    return np.stack(
        [g.numpy() for g in vector_grams(model, layer, windows, cfg, outputs=positions)]
    )


@dataclasses.dataclass(frozen=True)
class GramBlock(Result):
    """Exact ``JᵀJ`` [n, d, d] (float64) of consecutive windows of one layer
    (:func:`exact_grams`), as a driver caches them."""

    grams: np.ndarray


def blocked_grams(
    block: Callable[[int, int], np.ndarray], size: int
) -> Callable[[int, int], np.ndarray]:
    """A Gram source for :func:`kappa` that reads windows ``start:stop`` as blocks
    ``block(a, b)`` aligned to multiples of ``size`` (so a driver caches each block once,
    whichever doublings draw it)."""

    def grams(start: int, stop: int) -> np.ndarray:
        parts, a = [], start
        while a < stop:
            b = min(stop, (a // size + 1) * size)
            parts.append(block(a, b))
            a = b
        return np.concatenate(parts)

    return grams


@dataclasses.dataclass(frozen=True)
class KappaFit(KappaResult):
    """Exact κ of one layer: a :class:`~structlens.causal_dim.kappa.KappaResult` (``erank``
    and ``erank_ci`` are the bias-corrected jackknife estimate of κ(Σ) and its interval, the
    same estimand; ``erank_plugin`` the plug-in κ(Σ̂) beside it) plus how it was measured.

    ``identified`` says whether the vectors pinned κ within a factor ``tolerance`` before the
    cap ``max_vectors`` (:func:`~structlens.causal_dim.kappa.kappa_until_identified`: the
    interval, its upper end raised by the ``residual_bias`` left after the jackknife's
    correction, within ``±(tolerance − 1)·κ``); ``ratio_last_doubling`` is the paper's
    plug-in κ(n)/κ(n/2) over the last doubling, a diagnostic; ``doubling_*`` give n, the
    plug-in κ, the ratio and the residual bias after every doubling.
    ``unit`` is the jackknife unit (``chunk``: windows of one corpus chunk form one group);
    ``curve_*`` the few-vector bias curve (:meth:`curve`).
    """

    layer: int = 0
    unit: str = "chunk"
    output: str = "log_probs"
    positions: str = "same"
    window_tokens: int = 0
    identified: bool = False
    residual_bias: float = float("nan")
    tolerance: float = 1.05
    max_vectors: int = 0
    doubling_n: list = dataclasses.field(default_factory=list)
    doubling_erank: list = dataclasses.field(default_factory=list)
    doubling_ratios: list = dataclasses.field(default_factory=list)
    doubling_residual_bias: list = dataclasses.field(default_factory=list)
    curve_sizes: list = dataclasses.field(default_factory=list)
    curve_erank: list = dataclasses.field(default_factory=list)
    curve_erank_sd: list = dataclasses.field(default_factory=list)
    curve_pr: list = dataclasses.field(default_factory=list)
    curve_pr_sd: list = dataclasses.field(default_factory=list)

    def curve(self) -> KappaCurve:
        """The few-vector bias curve (:func:`~structlens.causal_dim.kappa.kappa_curve`)."""
        return KappaCurve(
            sizes=self.curve_sizes, erank=self.curve_erank, erank_sd=self.curve_erank_sd,
            pr=self.curve_pr, pr_sd=self.curve_pr_sd,
        )  # fmt: skip


def kappa(
    protocol: CausalProtocol,
    model: Any,
    layer: int,
    prompts: PromptSets,
    *,
    grams: Callable[[int, int], np.ndarray] | None = None,
) -> KappaFit:
    """Exact κ at ``layer``: vectors doubled from ``protocol.kappa_start`` until κ is
    identified within a factor ``protocol.kappa_tolerance`` or the cap
    (:func:`~structlens.causal_dim.kappa.kappa_until_identified`, the bias-corrected jackknife
    over ``protocol.kappa_unit``), then the few-vector curve.

    ``grams(start, stop)`` gives the Grams of windows ``start:stop`` of
    ``prompts.kappa_windows`` (default: :func:`exact_grams` on ``model``; a caching driver
    passes its own).
    """
    from structlens.causal_dim.kappa import kappa_curve, kappa_until_identified

    windows, chunks = prompts.kappa_windows, prompts.kappa_chunks
    cap = min(protocol.kappa_max_vectors, len(windows))
    if cap < 2:
        raise InputError(
            f"κ needs at least 2 Jacobian windows, the corpus gives {len(windows)}; use "
            "shorter windows (jacobian_tokens) or longer chunks."
        )
    source = grams or (lambda a, b: exact_grams(protocol, model, layer, windows[a:b]))
    drawn = [0]

    def draw(k: int) -> np.ndarray:
        a = drawn[0]
        drawn[0] = a + k
        return source(a, a + k)

    conv = kappa_until_identified(
        draw, min(protocol.kappa_start, cap), tolerance=protocol.kappa_tolerance,
        max_vectors=cap, groups=chunks if protocol.kappa_unit == "chunk" else None,
        ci=protocol.kappa_ci,
    )  # fmt: skip
    g, res = conv.grams, conv.fit
    n = len(g)
    sizes = sorted({s for s in (2**i for i in range(12)) if s < n} | {n})
    curve = kappa_curve(g, sizes, n_draws=protocol.kappa_curve_draws, seed=protocol.seed)
    fields = {f.name: getattr(res, f.name) for f in dataclasses.fields(KappaResult)}
    fields["ratio_last_doubling"] = conv.ratio_last_doubling
    return KappaFit(
        **fields,
        layer=int(layer),
        unit=protocol.kappa_unit,
        output=protocol.jacobian_output,
        positions=protocol.jacobian_positions,
        window_tokens=protocol.jacobian_tokens,
        identified=conv.identified,
        residual_bias=float(conv.residual_bias[-1]),
        tolerance=protocol.kappa_tolerance,
        max_vectors=cap,
        doubling_n=list(conv.n_vectors),
        doubling_erank=[float(v) for v in conv.erank],
        doubling_ratios=[float(v) for v in conv.ratios],
        doubling_residual_bias=[float(v) for v in conv.residual_bias],
        curve_sizes=curve.sizes,
        curve_erank=curve.erank,
        curve_erank_sd=curve.erank_sd,
        curve_pr=curve.pr,
        curve_pr_sd=curve.pr_sd,
    )


def matched_layer(layer: int, n_layers: int, other_n_layers: int) -> int:
    """The layer of a model with ``other_n_layers`` layers at the relative depth of
    ``layer`` in one with ``n_layers`` (``layer / n_layers``, halves rounded up).

    Raises
    ------
    InputError
        When ``layer`` is not in ``[0, n_layers)`` or a layer count is below 1.
    """
    if n_layers < 1 or other_n_layers < 1 or not 0 <= layer < n_layers:
        raise InputError(
            f"layer must be in [0, n_layers) and both layer counts >= 1; got layer {layer} "
            f"of {n_layers}, matched into {other_n_layers}."
        )
    return min(other_n_layers - 1, math.floor(layer * other_n_layers / n_layers + 0.5))


# ---------------------------------------------------------------- residual rows
@dataclasses.dataclass(frozen=True)
class LayerRows(Result):
    """Residuals ``acts`` [n_layers, n_tokens, d] at ``layers`` (position 0 and pads out)
    and, for evaluation, the gradient of the summed next-token loss at the same rows
    (``grads``), with the sizes of the batches they came in."""

    layers: list
    acts: np.ndarray
    grads: np.ndarray | None = None
    batch_sizes: list | None = None

    def of(self, layer: int) -> torch.Tensor:
        """The residuals of ``layer``, ``[n_tokens, d]``."""
        return torch.from_numpy(np.ascontiguousarray(self.acts[self.layers.index(layer)]))

    def pairs(self, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(acts, grads)`` per original batch, as the sweep consumes them."""
        if self.grads is None or self.batch_sizes is None:
            raise ValueError("these rows were captured without gradients (use eval_rows).")
        i = self.layers.index(layer)
        a = torch.from_numpy(np.ascontiguousarray(self.acts[i]))
        g = torch.from_numpy(np.ascontiguousarray(self.grads[i]))
        return list(zip(a.split(self.batch_sizes), g.split(self.batch_sizes), strict=True))


def training_rows(model: Any, layers: Sequence[int], prompts: Sequence[Sequence[int]]) -> LayerRows:
    """SAE training residuals at ``layers`` over ``prompts``, from one forward pass per batch;
    stored in float16 (the SAEs train on these values, whoever captured them)."""
    from structlens.capture.residuals import residual_batches_multi

    layers = sorted(int(v) for v in layers)
    parts: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    for batch in residual_batches_multi(model, layers, prompts):
        for layer, a in batch.items():
            parts[layer].append(a.half())
    acts = np.stack([torch.cat(parts[layer]).cpu().numpy() for layer in layers])
    return LayerRows(layers=layers, acts=acts)


def eval_rows(model: Any, layers: Sequence[int], prompts: Sequence[Sequence[int]]) -> LayerRows:
    """Evaluation residuals and their LM-loss gradients at ``layers`` over ``prompts``, from
    one forward and one backward pass per batch (float32)."""
    from structlens.causal_dim.model import residual_grads_multi

    layers = sorted(int(v) for v in layers)
    pairs: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {y: [] for y in layers}
    for batch in residual_grads_multi(model, layers, prompts):
        for layer, ag in batch.items():
            pairs[layer].append(ag)
    sizes = [a.shape[0] for a, _ in pairs[layers[0]]]
    acts = np.stack([torch.cat([a for a, _ in pairs[y]]).numpy() for y in layers])
    grads = np.stack([torch.cat([g for _, g in pairs[y]]).numpy() for y in layers])
    return LayerRows(layers=layers, acts=acts, grads=grads, batch_sizes=sizes)


# ---------------------------------------------------------------- SAE training
@dataclasses.dataclass(frozen=True)
class SAETraining(Result):
    """How one SAE of the protocol trained: rows used (``n_massive_dropped`` left out), the
    held-out FVU after every epoch, whether it levelled off before ``max_epochs``
    (``converged``), and the trainer's final numbers."""

    architecture: str
    width: int
    n_train_tokens: int
    n_massive_dropped: int
    tokens: int
    steps: int
    epochs: int
    val_fvu_by_epoch: list
    converged: bool
    final_fvu: float
    final_l0: float
    l0_before_calibration: float
    l0_matched: bool | None
    dead_fraction: float
    learning_rate: float


@dataclasses.dataclass(frozen=True)
class TrainedSAE(SAETraining):
    """An :class:`SAETraining` with where it ran: the ``layer`` of its rows, its wall-clock
    ``seconds`` and the torch ``device`` (what a driver's training log shows)."""

    layer: int = 0
    seconds: float = 0.0
    device: str = "cpu"


def sae_jobs(
    protocol: CausalProtocol,
    *,
    sweep_layer: int,
    ablation_width: int,
    arch_controls: Sequence[str],
    arch_sweep_widths: Sequence[int],
) -> list[tuple[str, Any, int]]:
    """``(name, SAETrainConfig, layer)`` of every SAE of fixed settings the sections on
    trained SAEs read, in training order: the width sweep at ``sweep_layer`` (smallest
    first), the architecture controls at ``ablation_width``, then their growth sweeps over
    ``arch_sweep_widths`` (matched L0); every config from ``protocol``.  The ε-by-depth SAEs
    come after these, from :func:`match_k` (their k depends on the sweep's FVU)."""
    p, w0, target = protocol, ablation_width, float(protocol.sae_k)
    sweep = [(f"topk-{w}", p.sae_config(w), sweep_layer) for w in p.sweep_widths]
    arch = [(f"{a}-{w0}", p.sae_config(w0, a, target), sweep_layer) for a in arch_controls]
    growth = [
        (f"{a}-{w}", p.sae_config(w, a, target), sweep_layer)
        for a in arch_controls
        for w in arch_sweep_widths
        if w != w0  # that one is the architecture control's
    ]
    return sweep + arch + growth


def depth_sae_name(layer: int, width: int, k: int) -> str:
    """The name of one ε-by-depth SAE (one per k the search tries)."""
    return f"depth-L{layer}-topk-{width}-k{k}"


@dataclasses.dataclass(frozen=True)
class KMatch(Result):
    """The ε-by-depth SAE of one ``layer`` (:func:`match_k`): the ``ks`` tried and their
    held-out FVU (``fvus``, on the held-out tenth of the training rows), the chosen ``k``
    and its ``fvu``, the ``target_fvu`` (the sweep layer's SAE of this ``width``),
    ``tolerance``, whether the chosen FVU lies within it (``matched``) and why the search
    stopped (``stop``, see :class:`~structlens.causal_dim.training.KSearch`)."""

    layer: int
    width: int
    target_fvu: float
    tolerance: float
    ks: list
    fvus: list
    k: int
    fvu: float
    matched: bool
    stop: str

    @property
    def name(self) -> str:
        """The chosen SAE's name (:func:`depth_sae_name`)."""
        return depth_sae_name(self.layer, self.width, self.k)


def match_k(
    protocol: CausalProtocol,
    train: Callable[[Any], SAETraining],
    *,
    layer: int,
    width: int,
    target_fvu: float,
) -> KMatch:
    """The k of the TopK SAE of ``width`` at ``layer`` whose held-out FVU comes closest to
    ``target_fvu`` (the sweep layer's SAE of that width, so ε is compared across depth at
    matched reconstruction quality): :func:`~structlens.causal_dim.training.search_k` from
    ``sae_k`` over ``depth_k_ladder`` (rungs above ``width`` skipped), at most
    ``depth_k_trials`` trainings, stopping within ``depth_fvu_tol``.

    ``train(config)`` trains one SAE of ``config`` at ``layer`` (a caller keeps or caches the
    SAE; :func:`depth_sae_name` names it) and returns its :class:`SAETraining`; the FVU
    compared is the last epoch's on the held-out tenth of the training rows, so the
    evaluation prompts play no part in the choice.
    """
    from structlens.causal_dim.training import search_k

    p = protocol

    def fvu_of(k: int) -> float:
        return float(train(p.sae_config(width, k=k)).val_fvu_by_epoch[-1])

    found = search_k(
        fvu_of, [k for k in p.depth_k_ladder if k <= width], start=p.sae_k, target=target_fvu,
        tol=p.depth_fvu_tol, max_trials=p.depth_k_trials,
    )  # fmt: skip
    return KMatch(
        layer=int(layer), width=int(width), target_fvu=float(target_fvu),
        tolerance=p.depth_fvu_tol, ks=found.ks, fvus=found.fvus, k=found.k, fvu=found.fvu,
        matched=found.matched, stop=found.stop,
    )  # fmt: skip


def train_sae(
    protocol: CausalProtocol, rows: torch.Tensor, config: Any, *, device: str = "cpu"
) -> tuple[Any, SAETraining]:
    """One SAE (``config``: e.g. :meth:`CausalProtocol.sae_config`) trained to convergence on
    training residuals ``rows`` [n, d] (capped at ``sae_train_tokens``, massive rows out).
    Returns the SAE (on the CPU) and its :class:`SAETraining`."""
    from structlens.causal_dim.training import drop_massive, train_to_convergence

    p = protocol
    x, n_massive = drop_massive(rows[: p.sae_train_tokens].float(), p.massive_norm_factor)
    res, curve = train_to_convergence(
        config, x.to(device), batch_size=p.sae_batch_size, max_epochs=p.sae_max_epochs,
        tol=p.sae_converge_tol, seed=p.seed, device=device,
    )  # fmt: skip
    info = SAETraining(
        architecture=config.architecture,
        width=int(config.d_sae),
        n_train_tokens=int(x.shape[0]),
        n_massive_dropped=n_massive,
        tokens=int(res.tokens),
        steps=int(res.steps),
        epochs=len(curve),
        val_fvu_by_epoch=curve,
        converged=len(curve) < p.sae_max_epochs,
        final_fvu=float(res.final_fvu),
        final_l0=float(res.final_l0),
        l0_before_calibration=float(res.l0_before_calibration),
        l0_matched=res.l0_matched,
        dead_fraction=float(res.dead_fraction),
        learning_rate=float(res.learning_rate),
    )
    return res.sae.cpu(), info


@dataclasses.dataclass
class _TrainWidth:
    """One width of :func:`train_sweep`; picklable so an executor can train widths apart."""

    protocol: CausalProtocol
    rows: torch.Tensor
    device: str

    def __call__(self, width: int) -> tuple[Any, SAETraining]:
        cfg = self.protocol.sae_config(width)
        return train_sae(self.protocol, self.rows, cfg, device=self.device)


def train_sweep(
    protocol: CausalProtocol,
    rows: torch.Tensor,
    *,
    d_model: int,
    executor: Any = None,
    device: str = "cpu",
) -> dict[int, tuple[Any, SAETraining]]:
    """The TopK SAEs of ``protocol.sweep_widths`` on one row stream (width → SAE and its
    training); ``executor`` may train the widths in parallel (the same SAEs)."""
    from structlens.execution import get_executor

    protocol.check_widths(d_model)
    widths = list(protocol.sweep_widths)
    job = _TrainWidth(protocol, rows, device)
    # training cost grows with the width: the widest start first on parallel executors
    out = get_executor(executor).map(job, widths, desc="SAE width sweep", cost=widths)
    return {int(w): r for w, r in zip(widths, out, strict=True)}


# ---------------------------------------------------------------- the width sweep
@dataclasses.dataclass(frozen=True)
class SweepFit(WidthSweepResult):
    """The width sweep of one layer: a
    :class:`~structlens.causal_dim.sweep.WidthSweepResult` (gated by the held-out FVU in
    ``heldout_fvu``) plus ``quality`` (width → held-out FVU, L0, dead fraction, tokens),
    ``atp_mass`` (width → total and largest |AtP|: does a wider SAE split the same causal
    mass?) and ``base_width_sensitivity`` (base width → N_causal, ε, its growth and κ̂ refitted
    from every base with three widths at least: how κ̂ moves with the base)."""

    layer: int = 0
    quality: dict = dataclasses.field(default_factory=dict)
    atp_mass: dict = dataclasses.field(default_factory=dict)
    base_width_sensitivity: dict = dataclasses.field(default_factory=dict)


def sweep(
    protocol: CausalProtocol,
    saes: Mapping[int, Any],
    rows: LayerRows,
    layer: int,
    prompts: PromptSets,
    *,
    exact_kappa: float | None,
    d_model: int,
    train_fvu: Mapping[int, float] | None = None,
) -> SweepFit:
    """N_repr, N_causal, the wedge and κ̂ of the SAEs ``saes`` (width → SAE) at ``layer`` over
    the evaluation ``rows`` of ``prompts.sae_eval`` (:func:`eval_rows`), with ``exact_kappa``
    (the exact κ at ``layer``) beside κ̂.  ``train_fvu`` (width → the SAE's FVU on its
    training tokens, :attr:`SAETraining.final_fvu`) lets the held-out FVU gate say why it
    fails (data-limited or under-trained); published SAEs have none."""
    from structlens.causal_dim.model import token_prompt_ids
    from structlens.causal_dim.sweep import (
        analyze_width_sweep,
        heldout_fvu_rise_se,
        sweep_analysis,
    )
    from structlens.sae.sweep import sae_quality

    protocol.check_widths(d_model)
    prompt_ids = token_prompt_ids(prompts.sae_eval)
    if [len(p) for p in prompt_ids] != list(rows.batch_sizes or []):
        raise InputError(
            "the evaluation rows' batches do not match the evaluation prompts' token counts; "
            "capture them with eval_rows(model, layers, prompts.sae_eval)."
        )
    pairs = rows.pairs(layer)
    eval_acts = rows.of(layer)
    cfg = protocol.width_sweep(d_model)
    # the gate: held-out FVU must fall with width (within its tolerance and sampling error),
    # else the sweep is not fitted
    quality = {int(w): sae_quality(sae, eval_acts) for w, sae in saes.items()}
    fvu = {w: q["fvu"] for w, q in quality.items()}
    acts = [a for a, _ in pairs]
    rise_se = heldout_fvu_rise_se(
        {int(w): sae for w, sae in saes.items()}, acts, prompt_ids, protocol.sweep_blocks
    )
    gate: dict[str, Any] = {"heldout_fvu": fvu, "train_fvu": train_fvu, "fvu_rise_se": rise_se}
    res, stats = sweep_analysis(
        dict(saes), pairs, cfg, prompt_ids=prompt_ids, n_blocks=protocol.sweep_blocks,
        exact_erank=exact_kappa, **gate,
    )  # fmt: skip
    mass = {}
    for w, st in stats.items():
        atp = st.scores()[0]
        mass[str(w)] = {"sum": float(atp.sum()), "max": float(atp.max())}
    bases = {}
    for b in sorted(stats)[:-2]:
        sub = {w: st for w, st in stats.items() if w >= b}
        r = analyze_width_sweep(sub, protocol.width_sweep(d_model, n_bootstrap=0), **gate)
        bases[str(b)] = {
            "widths": r.widths.tolist(),
            "n_causal": r.n_causal.tolist(),
            "epsilon": r.epsilon,
            "n_causal_growth": float(r.n_causal_growth[-1]),
            "kappa_hat": r.kappa_hat,
            "kappa_hat_status": r.kappa_hat_status,
            "kappa_hat_reason": r.kappa_hat_reason,
        }
    fields = {f.name: getattr(res, f.name) for f in dataclasses.fields(WidthSweepResult)}
    return SweepFit(
        **fields,
        layer=int(layer),
        quality={str(w): q for w, q in quality.items()},
        atp_mass=mass,
        base_width_sensitivity=bases,
    )


# ---------------------------------------------------------------- analyze's composition
@dataclasses.dataclass(frozen=True)
class CausalAnalysis(Result):
    """κ at several layers and the width sweep at one, as ``structlens analyze`` runs them.

    ``kappa_fits`` are the :class:`KappaFit` of the κ layers in order; ``sweep_fit`` the
    :class:`SweepFit` at ``sweep_layer`` (``None`` when the protocol's widths do not suit
    ``d_model``: ``sweep_not_run`` says why).  ``n_sae_train``, ``n_sae_eval`` count the SAE
    prompts (corpus chunks), ``n_sae_generated`` the generated texts the SAEs also trained on
    and ``kappa_windows_from_sae_training`` the Jacobian windows cut from SAE training chunks.
    """

    protocol: dict
    d_model: int
    kappa_fits: list
    sweep_layer: int
    sweep_fit: SweepFit | None
    sweep_not_run: str
    n_sae_train: int
    n_sae_eval: int
    kappa_windows_from_sae_training: int
    n_sae_generated: int = 0


def kappa_layers(layers: Sequence[int], count: int) -> list[int]:
    """``count`` evenly spaced entries of ``layers``, the middle one always among them."""
    n = len(layers)
    if count >= n:
        return list(layers)
    idx = {int(i) for i in np.linspace(0, n - 1, count).round()}
    if n // 2 not in idx:
        idx.remove(min(idx, key=lambda i: abs(i - n // 2)))
        idx.add(n // 2)
    return [layers[i] for i in sorted(idx)]


def analysis(
    protocol: CausalProtocol,
    model: Any,
    layers: Sequence[int],
    *,
    n_kappa_layers: int,
    executor: Any = None,
    step: Callable[[str], None] = lambda what: None,
) -> CausalAnalysis:
    """Exact κ at ``n_kappa_layers`` of ``layers`` (:func:`kappa_layers`) and the width
    sweep at the middle analysis layer (always a κ layer, so κ̂ sits beside its exact κ);
    ``step(what)`` is called before each part (a progress callback)."""
    d = model.d_model
    protocol = protocol.for_model(d)
    sets = prompt_sets(protocol, model.tokenizer)
    mid = layers[len(layers) // 2]
    fits = []
    for layer in kappa_layers(layers, n_kappa_layers):
        step(f"κ layer {layer}")
        fits.append(kappa(protocol, model, layer, sets))
    fit, not_run, n_generated = None, "", 0
    try:
        protocol.check_widths(d)
    except InputError as err:
        not_run = str(err)
    else:
        step(f"SAE widths (layer {mid})")
        generated = generated_text(protocol, model, sets)
        n_generated = len(generated.texts)
        rows = training_rows(model, [mid], training_prompts(sets, generated)).of(mid)
        trained = train_sweep(protocol, rows, d_model=d, executor=executor)
        step("AtP over widths")
        exact = next(f.erank for f in fits if f.layer == mid)
        saes = {w: sae for w, (sae, _) in trained.items()}
        train_fvu = {w: info.final_fvu for w, (_, info) in trained.items()}
        evaluation = eval_rows(model, [mid], sets.sae_eval)
        fit = sweep(protocol, saes, evaluation, mid, sets, exact_kappa=exact, d_model=d,
                    train_fvu=train_fvu)  # fmt: skip
    return CausalAnalysis(
        protocol=protocol.to_json(),
        d_model=int(d),
        kappa_fits=fits,
        sweep_layer=int(mid),
        sweep_fit=fit,
        sweep_not_run=not_run,
        n_sae_train=len(sets.sae_train),
        n_sae_eval=len(sets.sae_eval),
        kappa_windows_from_sae_training=sets.kappa_train_chunks,
        n_sae_generated=n_generated,
    )

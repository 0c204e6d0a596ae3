"""Model pairs with known answers for interpretive equivalence.

* :func:`rotate_and_permute` -- the sanity scenario: a copy of an RMSNorm model whose residual
  basis is rotated by a random orthogonal ``R`` (a random signed permutation for Gemma 2/3,
  see below) and whose attention heads are permuted within each layer, folded into the
  weights so the function (the logits) is unchanged. Matching must recover the permutation
  and the equivalence score must be 1. ``rotate=False`` keeps the basis and permutes the
  heads only (the unrotated copy).
* :func:`finetune_on_task` -- a copy of a causal LM fine-tuned on a task's answers (the
  before/after fine-tuning scenario).
* :data:`SCENARIOS` -- the scenario table of the replication: which model pairs are compared,
  under which protocol, and which of the paper's claims (``group``) each row tests; with the
  small byte-level LMs (:data:`SMALL`) and fine-tunes (:data:`FINETUNES`) its rows name.

Folding a rotation into a pre-norm transformer
----------------------------------------------
With row vectors, a residual stream ``x`` becomes ``x R``. Every matrix that *reads* the
residual (``W`` of ``nn.Linear``, ``y = x W^T``) becomes ``W R``; every matrix that *writes* it
(attention ``o_proj``, MLP ``down_proj``) becomes ``R^T W``; the token embedding becomes
``E R``. RMSNorm ``g * x / rms(x)`` commutes with ``R`` only when the gain ``g`` is 1
(``rms(x R) = rms(x)`` for orthogonal ``R``, but ``diag(g)`` does not commute with ``R``), so
the gains are first folded into the linear layers that read the normalised stream
(``W diag(g)``: q/k/v after ``input_layernorm``, gate/up after ``post_attention_layernorm``,
the unembedding after the final norm) and set to 1. A tied unembedding is untied first
because its copy absorbs the final gain. LayerNorm (GPT-2, BERT) also subtracts the mean,
which commutes only with rotations that fix the all-ones direction; it is not supported here.

Gemma 2 and 3 also normalise what each block *writes* (``post_attention_layernorm`` and
``post_feedforward_layernorm`` act on the block's output before it joins the residual), so
their gains sit between a write and the residual stream and cannot be folded into any linear
layer. A gain commutes with a *signed permutation* ``R`` (``diag(g) R = R diag(g')``, ``g'``
the permuted gain), and RMSNorm's ``rms`` is invariant under it, so for these families ``R``
is a random signed permutation and every residual-width gain is permuted with it (Gemma's
``1 + w`` gains too: a permutation keeps the ones). The copy is the same function in a
different basis, but a weaker test of basis dependence: per-coordinate statistics are
permuted, not mixed.
Heads are permuted by reordering the rows of ``q_proj`` (and of ``k_proj``/``v_proj`` by the
induced permutation of key/value groups, so grouped-query attention keeps each query head's
key/value head) and the matching columns of ``o_proj``.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch

from structlens.config import Settings
from structlens.equivalence.protocol import PROFILES as PROTOCOLS
from structlens.equivalence.protocol import EquivalenceProtocol
from structlens.equivalence.train_small import SmallLMConfig
from structlens.errors import InputError
from structlens.models.loading import Model

__all__ = [
    "rotate_and_permute",
    "BASIS_CHANGES",
    "basis_change",
    "random_signed_permutation",
    "finetune_on_task",
    "FineTuneRun",
    "random_orthogonal",
    "Scenario",
    "SCENARIOS",
    "SMALL",
    "FINETUNES",
    "FT_TARGET_KL",
    "FT_PROMPTS",
    "FT_TRAIN",
    "FT_SETTINGS",
    "FT_TRAINED_LAYERS",
    "finetune_settings",
    "finetune_scenario",
    "REPLICATION_PROFILES",
    "ReplicationProfile",
]

_RMS_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
#: Families whose blocks also normalise their writes (the gains stay; the basis change is a
#: signed permutation).
_SANDWICH_FAMILIES = ("gemma2", "gemma3_text")


def random_orthogonal(d: int, seed: int) -> torch.Tensor:
    """A Haar-random ``[d, d]`` orthogonal matrix (float64), deterministic under ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def random_signed_permutation(d: int, seed: int) -> torch.Tensor:
    """A random ``[d, d]`` signed permutation matrix (float64), deterministic under ``seed``:
    column ``j`` holds ``±1`` in row ``perm[j]``."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(d, generator=gen)
    signs = 1.0 - 2.0 * (torch.rand(d, generator=gen, dtype=torch.float64) < 0.5).double()
    out = torch.zeros(d, d, dtype=torch.float64)
    out[perm, torch.arange(d)] = signs
    return out


def _signed_columns(r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(src, sign)`` when ``r`` is a signed permutation matrix (the identity included):
    column ``j`` holds its one nonzero, ``sign[j] = ±1``, in row ``src[j]``; else ``None``."""
    nz = r != 0
    if not (bool((nz.sum(0) == 1).all()) and bool((nz.sum(1) == 1).all())):
        return None
    src = nz.to(torch.int8).argmax(0)
    sign = r[src, torch.arange(r.shape[1])]
    return (src, sign) if bool((sign.abs() == 1).all()) else None


def _basis_times(x: torch.Tensor, r: torch.Tensor, signed: tuple | None) -> torch.Tensor:
    """``x @ r`` (float64 for a dense ``r``).  For a signed permutation (``signed`` from
    :func:`_signed_columns`) it is the gather ``x[..., src] * sign`` in ``x``'s own dtype:
    each product of the matrix product is then one entry times ``±1`` plus zeros, so the
    gather gives the same values exactly (``+ 0.0`` gives a zero the product's sign), without
    a dense product that takes most of the copy's time for a 262k-token embedding."""
    if signed is None:
        return x.double() @ r
    src, sign = signed
    return x[..., src] * sign.to(x.dtype) + 0.0


def _basis_t_times(r: torch.Tensor, x: torch.Tensor, signed: tuple | None) -> torch.Tensor:
    """``r.T @ x`` (float64 for a dense ``r``), a row gather for a signed permutation
    (:func:`_basis_times`)."""
    if signed is None:
        return r.T @ x.double()
    src, sign = signed
    return x[src] * sign.to(x.dtype)[:, None] + 0.0


def _head_permutation(n_heads: int, n_kv: int, gen: torch.Generator) -> tuple[list[int], list[int]]:
    """Permutation of query heads that keeps key/value groups whole: new head ``j`` is old
    head ``perm[j]``; new kv head ``k`` is old kv head ``kv_perm[k]``."""
    group = n_heads // n_kv
    kv_perm = torch.randperm(n_kv, generator=gen).tolist()
    perm: list[int] = []
    for k in range(n_kv):
        inner = torch.randperm(group, generator=gen).tolist()
        perm.extend(kv_perm[k] * group + i for i in inner)
    return perm, kv_perm


def _rows(w: torch.Tensor, blocks: int, order: Sequence[int]) -> torch.Tensor:
    return w.reshape(blocks, -1, *w.shape[1:])[list(order)].reshape(w.shape)


#: How :func:`rotate_and_permute` changes the residual basis, by the tag its copy's name
#: carries (``+rot3``: rotated under seed 3).
BASIS_CHANGES = {"+rot": "rotated", "+sperm": "signed-permuted", "+perm": "basis kept"}
_TAG_OF = {change: tag for tag, change in BASIS_CHANGES.items()}


def _basis(sandwich: bool, rotate: bool) -> str:
    return "basis kept" if not rotate else "signed-permuted" if sandwich else "rotated"


def basis_change(name: str) -> str:
    """What :func:`rotate_and_permute` did to the residual basis of the copy named ``name``
    (one of :data:`BASIS_CHANGES`' values), read from the tag it appended to the name.

    Raises ``ValueError`` for a name without such a tag (not a copy made here).
    """
    m = re.search(r"(\+[a-z]+)\d+$", name)
    if m is None or m.group(1) not in BASIS_CHANGES:
        raise ValueError(
            f"{name!r} is not a copy made by rotate_and_permute (its name ends in one of "
            f"{sorted(BASIS_CHANGES)} and the seed)."
        )
    return BASIS_CHANGES[m.group(1)]


@torch.no_grad()
def rotate_and_permute(
    model: Model, seed: int = 0, *, rotate: bool = True
) -> tuple[Model, list[list[int]], torch.Tensor]:
    """A function-preserving copy of ``model`` with rotated residual basis and permuted heads.

    Parameters
    ----------
    model : Model
        A pre-RMSNorm decoder (Llama, Mistral, Qwen2/3 families: ``R`` a Haar rotation) or a
        Gemma 2/3 decoder (``R`` a signed permutation, see the module docstring).
    seed : int
        Seeds the rotation and the permutations.
    rotate : bool
        ``False`` keeps the residual basis (``R`` is the identity): the same folded norm
        gains and the same head permutation as ``rotate=True`` under ``seed``, so the two
        copies differ by the rotation only (the sanity check's unrotated copy, which isolates
        the effect of the basis on basis-dependent statistics).

    Returns
    -------
    (Model, head_map, R)
        The transformed model; ``head_map[l][h]`` is the head of the new model that computes
        what head ``h`` of layer ``l`` of the original computes (identical ``hook_z``); ``R``
        the ``[d, d]`` rotation, with ``resid_new = resid_old @ R`` at every residual site.
    """
    model_type = model.config.model_type
    sandwich = model.family.name == "gemma2" and model_type in _SANDWICH_FAMILIES
    if not sandwich and (model.family.name != "llama" or model_type not in _RMS_FAMILIES):
        raise ValueError(
            f"rotate_and_permute supports RMSNorm decoders {_RMS_FAMILIES + _SANDWICH_FAMILIES}"
            f", got {model_type!r}: LayerNorm's mean subtraction does not commute with an "
            "arbitrary rotation (see the module docstring)."
        )
    hf = copy.deepcopy(model.hf)
    dtype = next(hf.parameters()).dtype
    base = hf.base_model
    if not rotate:
        r = torch.eye(model.d_model, dtype=torch.float64)
    elif sandwich:
        r = random_signed_permutation(model.d_model, seed)
    else:
        r = random_orthogonal(model.d_model, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    signed, absolute = _signed_columns(r), _signed_columns(r.abs())

    def reads(lin: torch.nn.Linear, gain: torch.Tensor | None) -> None:
        w = lin.weight.double()
        if gain is not None:
            w = w * gain.double()
        lin.weight.copy_(_basis_times(w, r, signed).to(dtype))

    def writes(lin: torch.nn.Linear) -> None:
        lin.weight.copy_(_basis_t_times(r, lin.weight, signed).to(dtype))
        if lin.bias is not None:
            lin.bias.copy_(_basis_times(lin.bias, r, signed).to(dtype))

    def permuted(norm: Any) -> None:
        # a signed permutation moves each gain with its coordinate (|R| permutes, keeps sums)
        norm.weight.copy_(_basis_times(norm.weight, r.abs(), absolute).to(dtype))

    tied = hf.lm_head.weight is base.embed_tokens.weight
    if tied and not sandwich:  # the unembedding absorbs the final gain: untie it first
        hf.lm_head.weight = torch.nn.Parameter(base.embed_tokens.weight.detach().clone())
        hf.config.tie_word_embeddings = False
    emb = base.embed_tokens.weight
    emb.copy_(_basis_times(emb, r, signed).to(dtype))
    n_kv = int(getattr(hf.config, "num_key_value_heads", None) or model.n_heads)
    head_map = []
    for layer in base.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if sandwich:
            for lin in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
                reads(lin, None)
            for norm in (
                layer.input_layernorm,
                layer.post_attention_layernorm,
                layer.pre_feedforward_layernorm,
                layer.post_feedforward_layernorm,
            ):
                permuted(norm)  # fmt: skip
        else:
            g_attn, g_mlp = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
            for lin in (attn.q_proj, attn.k_proj, attn.v_proj):
                reads(lin, g_attn)
            for lin in (mlp.gate_proj, mlp.up_proj):
                reads(lin, g_mlp)
            g_attn.fill_(1.0)
            g_mlp.fill_(1.0)
        writes(attn.o_proj)
        writes(mlp.down_proj)
        perm, kv_perm = _head_permutation(model.n_heads, n_kv, gen)
        attn.q_proj.weight.copy_(_rows(attn.q_proj.weight, model.n_heads, perm))
        for lin in (attn.k_proj, attn.v_proj):
            lin.weight.copy_(_rows(lin.weight, n_kv, kv_perm))
        for lin, blocks, order in (
            (attn.q_proj, model.n_heads, perm),
            (attn.k_proj, n_kv, kv_perm),
            (attn.v_proj, n_kv, kv_perm),
        ):
            if lin.bias is not None:
                lin.bias.copy_(_rows(lin.bias, blocks, order))
        # per-head norms of Qwen3 act inside each head and need no change
        o = attn.o_proj.weight
        o.copy_(o.reshape(o.shape[0], model.n_heads, -1)[:, perm].reshape(o.shape))
        inverse = [0] * model.n_heads
        for new, old in enumerate(perm):
            inverse[old] = new
        head_map.append(inverse)
    if sandwich:
        permuted(base.norm)
        if not tied:  # a tied unembedding was rotated with the embedding
            reads(hf.lm_head, None)
    else:
        reads(hf.lm_head, base.norm.weight)
        base.norm.weight.fill_(1.0)
    tag = f"{_TAG_OF[_basis(sandwich, rotate)]}{seed}"
    out = Model(hf, model.tokenizer, f"{model.name}{tag}", source=f"{model.source}{tag}")
    return out, head_map, r.to(dtype)


class FineTuneRun(NamedTuple):
    """What :func:`finetune_on_task` returns.

    ``losses``: training loss of every step (nats); ``held_out_kl``: ``[[step, mean KL]]``
    of the base model's next-token distribution against the tuned one's at the end of the
    held-out prompts, from step 0; ``steps_run``; ``reached`` whether the KL reached the
    target (``None`` without a target).
    """

    model: Model
    losses: list[float]
    held_out_kl: list[tuple[int, float]]
    steps_run: int
    reached: bool | None


class _HeldOutKL:
    """Mean KL(base ‖ tuned) of the next-token distribution at the end of fixed held-out
    prompts, cheap enough to measure after every step.

    The layers below ``first`` (the lowest trained one) keep the base's weights, so their
    outputs on these prompts are the base's at every step: they are recorded once, in the
    forward that gives the base's distribution (``hf`` before its first step is the base), and
    reused (:class:`~structlens.equivalence.prefix.LayerOutputs`), so each check runs only the
    trained layers and the unembedding.
    """

    def __init__(
        self,
        hf: torch.nn.Module,
        layers: Sequence[torch.nn.Module],
        tokens: Sequence[Sequence[int]],
        pad: int,
        first: int,
    ) -> None:
        from structlens.data.tasks import pad_batch
        from structlens.equivalence.prefix import LayerOutputs

        self.hf, self.first = hf, first
        self.ids, self.mask = pad_batch(list(tokens), pad)
        self.prefix = LayerOutputs(layers)
        with self.prefix.record():
            self.base = self._log_probs()

    def _log_probs(self) -> torch.Tensor:
        was_training = self.hf.training
        self.hf.eval()
        with torch.no_grad():
            logits = self.hf(input_ids=self.ids, attention_mask=self.mask, use_cache=False).logits
        self.hf.train(was_training)
        end = logits[torch.arange(len(self.ids)), self.mask.sum(1) - 1]
        return end.float().log_softmax(-1)

    def __call__(self) -> float:
        with self.prefix.below(self.first):
            lp = self._log_probs()
        return float((self.base.exp() * (self.base - lp)).sum(-1).mean())


def finetune_on_task(
    model: Model,
    train_tokens: Sequence[Sequence[int]],
    answers: Sequence[int],
    *,
    steps: int = 20,
    lr: float = 1e-4,
    batch_size: int = 8,
    train_layers: Sequence[int] | None = None,
    held_out: Sequence[Sequence[int]] | None = None,
    target_kl: float | None = None,
    eval_every: int = 1,
    seed: int = 0,
) -> FineTuneRun:
    """A copy of a causal LM fine-tuned to predict ``answers[i]`` after ``train_tokens[i]``.

    Cross-entropy on the answer token at the last position of each prompt, AdamW at a constant
    ``lr``, batches drawn under ``seed``. ``train_layers`` restricts the update to those
    decoder layers (all parameters of each), which also stops back-propagation below the
    lowest one -- the CPU-affordable setting; ``None`` trains every parameter.

    With ``held_out`` prompts, every ``eval_every`` steps (default: every step) measures how
    far the behaviour has moved: the mean KL(base ‖ tuned) of the next-token distribution at
    their last position (:class:`_HeldOutKL`, which reuses the frozen layers' outputs).  With
    ``target_kl`` training stops at the first measured step whose KL reaches it (the
    behaviour has changed by a stated amount; checked every step it is not overshot by more
    than one step's change), or after ``steps``.
    """
    if not model.causal:
        raise ValueError("finetune_on_task needs a causal LM.")
    if len(train_tokens) != len(answers) or len(train_tokens) < batch_size:
        raise ValueError(
            f"need one answer per prompt and at least batch_size={batch_size} prompts, got "
            f"{len(train_tokens)} prompts and {len(answers)} answers."
        )
    if target_kl is not None and not held_out:
        raise ValueError("target_kl needs held_out prompts to measure the KL on.")
    if eval_every < 1:
        raise ValueError(f"eval_every must be >= 1, got {eval_every}.")
    from structlens.data.tasks import pad_batch

    hf = copy.deepcopy(model.hf)
    layers = hf.get_submodule(f"base_model.{model.family.layers}")
    if train_layers is not None and not all(0 <= i < len(layers) for i in train_layers):
        raise ValueError(f"train_layers must lie in [0, {len(layers)}), got {list(train_layers)}.")
    params = (
        [p for i in train_layers for p in layers[i].parameters()]
        if train_layers is not None
        else list(hf.parameters())
    )
    for p in hf.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    pad = int(model.tokenizer.pad_token_id)
    first = min(train_layers) if train_layers else 0
    held_out_kl = _HeldOutKL(hf, list(layers), held_out, pad, first) if held_out else None
    losses: list[float] = []
    curve: list[tuple[int, float]] = [(0, 0.0)] if held_out else []
    reached: bool | None = False if target_kl is not None else None
    hf.train()
    for step in range(1, steps + 1):
        idx = torch.randperm(len(train_tokens), generator=gen)[:batch_size].tolist()
        ids, mask = pad_batch([train_tokens[i] for i in idx], pad)
        last = mask.sum(1) - 1
        logits = hf(input_ids=ids, attention_mask=mask, use_cache=False).logits
        end = logits[torch.arange(len(idx)), last]
        loss = torch.nn.functional.cross_entropy(end, torch.tensor([answers[i] for i in idx]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if held_out_kl is not None and (step % eval_every == 0 or step == steps):
            kl = held_out_kl()
            curve.append((step, kl))
            if target_kl is not None and kl >= target_kl:
                reached = True
                break
    hf.eval()
    for p in hf.parameters():
        p.requires_grad_(False)
    tuned = Model(hf, model.tokenizer, f"{model.name}+ft", source=f"{model.source}+ft")
    return FineTuneRun(tuned, losses, curve, len(losses), reached)


# Trained to convergence: at most 2000 steps of 8 × 64 bytes (~2 passes over the training
# bytes), stopped once three held-out evaluations in a row (every 100 steps, on the corpus'
# last tenth) improved by < 0.5 % (SmallLMConfig's stopping rule).
_CONVERGED: dict[str, Any] = dict(steps=2000, eval_every=100, converge_tol=0.005, patience=3)
#: The small byte-level LMs of the seed, depth and encoder–decoder rows, by name.
SMALL = {
    "L4-s0": SmallLMConfig(n_layers=4, seed=0, **_CONVERGED),
    "L4-s1": SmallLMConfig(n_layers=4, seed=1, **_CONVERGED),
    "L4-s2": SmallLMConfig(n_layers=4, seed=2, **_CONVERGED),
    "L2-s0": SmallLMConfig(n_layers=2, seed=0, **_CONVERGED),
    "L8-s0": SmallLMConfig(n_layers=8, seed=0, **_CONVERGED),
    # an encoder–decoder on the same bytes: T5, 2 encoder + 4 decoder layers, an LM over its
    # decoder whose encoder reads the bytes before the decoder's (SmallLMConfig.encoder_layers)
    "ED-s0": SmallLMConfig(n_layers=4, encoder_layers=2, seed=0, **_CONVERGED),
}
#: The same models at smoke sizes: a few dozen steps of narrow models, enough to exercise every
#: stage in seconds.
SMALL_SMOKE = {
    n: replace(c, d_model=32, d_mlp=64, n_heads=2, steps=8, seq_len=32, eval_every=4)
    for n, c in SMALL.items()
}
#: The fine-tunes of SmolLM2-135M-Instruct, by name: (task, answer key), the probe's own task
#: (similar) and factual recall (dissimilar).
FINETUNES = {
    "smollm2-ft-ioi": ("ioi", "IO"),
    "smollm2-ft-facts": ("factual_recall", "answer"),
}
# Fine-tuned until the behaviour has changed: AdamW on layers 15-29 (FT_TRAINED_LAYERS) until
# the mean KL(base ‖ tuned) at the end of held-out prompts of the same task reaches
# FT_TARGET_KL nats, checked after every step (stopping at the first that reaches it), at most
# 300 steps.  The rate keeps one step's change of that KL well below the target (at 2e-4 the
# first step alone moved it by ~2.5 nats on SmolLM2; at 2e-5 by 0.05-0.25 nats a step).
# FT_PROMPTS task prompts (seed 1; the IOI probe uses seed 0): the first FT_TRAIN train, the
# rest are held out (factual recall has 85 facts).
FT_TARGET_KL = 0.5
FT_PROMPTS, FT_TRAIN = 80, 56
#: The decoder layers the fine-tunes train (SmolLM2 has 30): the top half, so the layers below
#: stay the base's and the comparison scores only these (Scenario.first_layer).
FT_TRAINED_LAYERS = range(15, 30)
FT_SETTINGS: dict[str, Any] = dict(
    steps=300, lr=2e-5, batch_size=8, train_layers=list(FT_TRAINED_LAYERS), eval_every=1, seed=0
)


def finetune_settings(name: str) -> dict[str, Any]:
    """Everything that decides the weights of the fine-tune ``name`` (besides the base)."""
    task, key = FINETUNES[name]
    return {"name": name, "task": task, "answer": key, "n": FT_PROMPTS, "n_train": FT_TRAIN,
            "seed": 1, "target_kl": FT_TARGET_KL, **FT_SETTINGS}  # fmt: skip


def finetune_scenario(base: Model, name: str) -> tuple[FineTuneRun, dict[str, Any]]:
    """The fine-tune ``name`` of :data:`FINETUNES` of ``base`` and its training record
    (settings, losses, held-out KL curve, steps, whether the target KL was reached, seconds)."""
    import time

    from structlens.data.tasks import make_task

    task_name, key = FINETUNES[name]
    task = make_task(task_name, base.tokenizer, n=FT_PROMPTS, seed=1)
    clean, answers = task.clean, task.answers[key]
    t0 = time.perf_counter()
    run = finetune_on_task(
        base, clean[:FT_TRAIN], answers[:FT_TRAIN], held_out=clean[FT_TRAIN:],
        target_kl=FT_TARGET_KL, **FT_SETTINGS,
    )  # fmt: skip
    info = dict(task=task_name, n_prompts=len(task), n_train=FT_TRAIN, **FT_SETTINGS)
    info |= dict(losses=run.losses, held_out_kl=run.held_out_kl, target_kl=FT_TARGET_KL,
                 steps_run=run.steps_run, reached=run.reached)  # fmt: skip
    info["seconds"] = time.perf_counter() - t0
    return run, info


@dataclass(frozen=True)
class Scenario:
    """One row of the scenario table: ``model_b`` (whose components get replaced) against
    ``model_a``, under the protocol named ``protocol``
    (:data:`structlens.equivalence.protocol.PROFILES`; ``None``: the driver's protocol of the
    small LMs).  A model is a loadable name, ``small:NAME`` (:data:`SMALL`) or
    ``finetune:NAME`` (:data:`FINETUNES`); ``model_b`` ``None`` is the rotated, head-permuted
    copy of ``model_a`` (the sanity stage, answer known: equivalent).  ``group`` is the
    paper's claim the row tests.

    Two protocol choices are stated per row (:meth:`protocol_for`): ``relation``, how B
    relates to A, which decides the whole-layer map (``"copy"``: the sanity copies and the
    fine-tunes, which keep A's residual basis, get Procrustes maps; ``"independent"``: models
    trained separately get ridge maps where the fit rows allow, see
    :func:`~structlens.equivalence.choose_layer_map`); and ``first_layer``, the first layer
    compared (a fine-tune's layers below it are A's own, frozen, and would only inflate the
    score)."""

    name: str
    group: str
    model_a: str
    model_b: str | None
    setting: str
    protocol: str | None = None
    relation: str = "independent"
    first_layer: int = 0

    def protocol_for(self, base: EquivalenceProtocol) -> EquivalenceProtocol:
        """The row's protocol: ``base`` (its named or the driver's) with the row's
        ``relation`` and ``first_layer``."""
        return base.replace(relation=self.relation, first_layer=self.first_layer)


# The SmolLM2 rows run "paper-subset": 96 IOI prompts, half fit, half held out; 48 fit prompts
# of ~16 tokens give ~700 token rows, more than d = 576, as the Procrustes map of a copy needs
# (equivalence.layer_map).  The small LMs' corpus probes give ~2,400 fit rows for d = 128,
# enough for the ridge map of independently trained models.  MiniLM against SmolLM2 has two
# tokenizers: "paper-sentence"; SmolLM2 against Gemma 3 too, on IOI: "paper-cross-family".
_SMOL, _SENT, _CROSS, _COPY = "paper-subset", "paper-sentence", "paper-cross-family", "copy"


def _finetune_row(name: str, model_b: str, setting: str) -> Scenario:
    """A fine-tune row: a copy of SmolLM2 (its basis kept), scored on the trained layers."""
    return Scenario(name, "finetune", "smollm2-135m", model_b, setting, _SMOL, relation=_COPY,
                    first_layer=FT_TRAINED_LAYERS.start)  # fmt: skip


SCENARIOS = (
    Scenario("sanity-tiny", "sanity", "tiny-llama-deep", None,
             "tiny-llama-deep vs rotated+permuted copy, corpus", relation=_COPY),
    Scenario("sanity-smollm2", "sanity", "smollm2-135m", None,
             "SmolLM2 vs rotated+permuted copy, IOI", _SMOL, relation=_COPY),
    Scenario("enc-dec-same-data", "encoder-decoder", "small:ED-s0", "small:L4-s0",
             "T5 enc–dec (2 + 4 layers; the encoder reads the preceding bytes) vs 4L decoder, "
             "same bytes"),
    Scenario("enc-dec", "encoder-other-data", "minilm-l6", "smollm2-135m",
             "MiniLM-L6 vs SmolLM2, sentences", _SENT),
    Scenario("cross-family", "cross-family", "smollm2-135m", "gemma3-270m",
             "SmolLM2 vs Gemma 3 270M, IOI (names single tokens in both), sentences", _CROSS),
    Scenario("seeds-s0-s1", "seeds", "small:L4-s0", "small:L4-s1", "4L seed 0 vs 1"),
    Scenario("seeds-s0-s2", "seeds", "small:L4-s0", "small:L4-s2", "4L seed 0 vs 2"),
    Scenario("seeds-s1-s2", "seeds", "small:L4-s1", "small:L4-s2", "4L seed 1 vs 2"),
    Scenario("depth-2-4", "depth", "small:L2-s0", "small:L4-s0", "2L vs 4L"),
    Scenario("depth-4-8", "depth", "small:L4-s0", "small:L8-s0", "4L vs 8L"),
    Scenario("depth-2-8", "depth", "small:L2-s0", "small:L8-s0", "2L vs 8L"),
    _finetune_row("ft-ioi", "finetune:smollm2-ft-ioi",
                  "SmolLM2 vs IOI fine-tune, trained layers 15–29"),
    _finetune_row("ft-facts", "finetune:smollm2-ft-facts",
                  "SmolLM2 vs facts fine-tune, trained layers 15–29"),
)  # fmt: skip


@dataclass(frozen=True)
class ReplicationProfile(Settings):
    """One profile of the equivalence replication: the scenarios it runs (rows of
    :data:`SCENARIOS`), the small LMs they train (by name, as :data:`SMALL`), the protocol of
    the small-LM rows (the SmolLM2 rows name their own) and whether the fold check runs."""

    profile: str
    small: dict[str, SmallLMConfig]
    small_protocol: EquivalenceProtocol
    scenarios: tuple[str, ...]
    fold_check: bool

    def __post_init__(self) -> None:
        known = {sc.name for sc in SCENARIOS}
        unknown = sorted(set(self.scenarios) - known)
        if unknown:
            raise InputError(f"unknown scenario(s) {unknown}; choose from {sorted(known)}.")
        needed = {
            spec.partition(":")[2]
            for sc in SCENARIOS if sc.name in self.scenarios
            for spec in (sc.model_a, sc.model_b) if spec and spec.startswith("small:")
        }  # fmt: skip
        if missing := sorted(needed - set(self.small)):
            raise InputError(f"the scenarios need the small LMs {missing}; add them to small.")

    def to_json(self) -> dict[str, Any]:
        return super().to_json() | {
            "small": {n: dataclasses.asdict(c) for n, c in self.small.items()}
        }


_REPLICATION_CPU = ReplicationProfile(
    profile="cpu", small=SMALL, small_protocol=PROTOCOLS["paper"],
    # MiniLM vs SmolLM2 (an encoder on other data, sentence similarity only) is superseded by
    # the same-data encoder–decoder row; `only=["enc-dec"]` still runs it
    scenarios=tuple(sc.name for sc in SCENARIOS if sc.name != "enc-dec"), fold_check=True,
)  # fmt: skip

#: The replication's profiles: ``cpu`` (also ``gpu``: nothing here needs an accelerator) runs
#: every scenario but the superseded ``enc-dec``; ``smoke`` one sanity row and one seed row
#: on the smoke-sized small LMs.
REPLICATION_PROFILES: dict[str, ReplicationProfile] = {
    "cpu": _REPLICATION_CPU,
    "gpu": _REPLICATION_CPU.replace(profile="gpu"),
    "smoke": _REPLICATION_CPU.replace(
        profile="smoke", small=SMALL_SMOKE, small_protocol=PROTOCOLS["smoke"],
        scenarios=("sanity-tiny", "seeds-s0-s1"), fold_check=False,
    ),
}  # fmt: skip

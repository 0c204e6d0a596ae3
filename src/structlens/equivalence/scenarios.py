"""Model pairs with known answers for interpretive equivalence.

* :func:`rotate_and_permute` -- the sanity scenario: a copy of an RMSNorm model whose residual
  basis is rotated by a random orthogonal ``R`` and whose attention heads are permuted within
  each layer, folded into the weights so the function (the logits) is unchanged. Matching
  must recover the permutation and the equivalence score must be 1.
* :func:`finetune_on_task` -- a copy of a causal LM fine-tuned on a task's answers (the
  before/after fine-tuning scenario).

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
Heads are permuted by reordering the rows of ``q_proj`` (and of ``k_proj``/``v_proj`` by the
induced permutation of key/value groups, so grouped-query attention keeps each query head's
key/value head) and the matching columns of ``o_proj``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import NamedTuple

import torch

from structlens.models.loading import Model

__all__ = ["rotate_and_permute", "finetune_on_task", "FineTuneRun", "random_orthogonal"]

_RMS_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def random_orthogonal(d: int, seed: int) -> torch.Tensor:
    """A Haar-random ``[d, d]`` orthogonal matrix (float64), deterministic under ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


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


@torch.no_grad()
def rotate_and_permute(model: Model, seed: int = 0) -> tuple[Model, list[list[int]], torch.Tensor]:
    """A function-preserving copy of ``model`` with rotated residual basis and permuted heads.

    Parameters
    ----------
    model : Model
        A pre-RMSNorm decoder (Llama, Mistral, Qwen2/3 families).
    seed : int
        Seeds the rotation and the permutations.

    Returns
    -------
    (Model, head_map, R)
        The transformed model; ``head_map[l][h]`` is the head of the new model that computes
        what head ``h`` of layer ``l`` of the original computes (identical ``hook_z``); ``R``
        the ``[d, d]`` rotation, with ``resid_new = resid_old @ R`` at every residual site.
    """
    if model.family.name != "llama" or model.config.model_type not in _RMS_FAMILIES:
        raise ValueError(
            f"rotate_and_permute supports RMSNorm decoders {_RMS_FAMILIES}, got "
            f"{model.config.model_type!r}: LayerNorm's mean subtraction does not commute with an "
            "arbitrary rotation (see the module docstring)."
        )
    hf = copy.deepcopy(model.hf)
    dtype = next(hf.parameters()).dtype
    base = hf.base_model
    r = random_orthogonal(model.d_model, seed)
    gen = torch.Generator().manual_seed(seed + 1)

    def reads(lin: torch.nn.Linear, gain: torch.Tensor | None) -> None:
        w = lin.weight.double()
        if gain is not None:
            w = w * gain.double()
        lin.weight.copy_((w @ r).to(dtype))

    def writes(lin: torch.nn.Linear) -> None:
        lin.weight.copy_((r.T @ lin.weight.double()).to(dtype))
        if lin.bias is not None:
            lin.bias.copy_((lin.bias.double() @ r).to(dtype))

    if hf.lm_head.weight is base.embed_tokens.weight:
        hf.lm_head.weight = torch.nn.Parameter(base.embed_tokens.weight.detach().clone())
        hf.config.tie_word_embeddings = False
    emb = base.embed_tokens.weight
    emb.copy_((emb.double() @ r).to(dtype))
    n_kv = int(getattr(hf.config, "num_key_value_heads", None) or model.n_heads)
    head_map = []
    for layer in base.layers:
        attn, mlp = layer.self_attn, layer.mlp
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
    reads(hf.lm_head, base.norm.weight)
    base.norm.weight.fill_(1.0)
    out = Model(hf, model.tokenizer, f"{model.name}+rot{seed}", source=f"{model.source}+rot{seed}")
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


def _end_log_probs(hf: torch.nn.Module, tokens: Sequence[Sequence[int]], pad: int) -> torch.Tensor:
    from structlens.data.tasks import pad_batch

    ids, mask = pad_batch(list(tokens), pad)
    with torch.no_grad():
        logits = hf(input_ids=ids, attention_mask=mask, use_cache=False).logits
    return logits[torch.arange(len(tokens)), mask.sum(1) - 1].float().log_softmax(-1)


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
    eval_every: int = 10,
    seed: int = 0,
) -> FineTuneRun:
    """A copy of a causal LM fine-tuned to predict ``answers[i]`` after ``train_tokens[i]``.

    Cross-entropy on the answer token at the last position of each prompt, AdamW at a constant
    ``lr``, batches drawn under ``seed``. ``train_layers`` restricts the update to those
    decoder layers (all parameters of each), which also stops back-propagation below the
    lowest one -- the CPU-affordable setting; ``None`` trains every parameter.

    With ``held_out`` prompts, every ``eval_every`` steps measures how far the behaviour has
    moved: the mean KL(base ‖ tuned) of the next-token distribution at their last position.
    With ``target_kl`` training stops once that KL reaches it (the behaviour has changed by a
    stated amount), or after ``steps``.
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
    base_lp = _end_log_probs(model.hf, held_out, pad) if held_out else None
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
        if base_lp is not None and held_out and (step % eval_every == 0 or step == steps):
            hf.eval()
            lp = _end_log_probs(hf, held_out, pad)
            hf.train()
            kl = float((base_lp.exp() * (base_lp - lp)).sum(-1).mean())
            curve.append((step, kl))
            if target_kl is not None and kl >= target_kl:
                reached = True
                break
    hf.eval()
    for p in hf.parameters():
        p.requires_grad_(False)
    tuned = Model(hf, model.tokenizer, f"{model.name}+ft", source=f"{model.source}+ft")
    return FineTuneRun(tuned, losses, curve, len(losses), reached)

"""Dense per-expert neurons of mixture-of-experts MLPs (Mixtral, Qwen3-MoE, gpt-oss).

Hugging Face stores the experts of one MoE layer as 3-D parameters (``gate_up_proj``
``[expert, 2 d_expert, d_model]``, ``down_proj`` ``[expert, d_model, d_expert]``) and runs each
expert only on the tokens routed to it.  To give ``mlp.hook_pre``/``hook_pre_linear``/
``hook_post`` a fixed ``[batch, pos, n_experts * d_expert]`` shape, :func:`experts_forward`
computes every expert on every token and zeroes the entries of tokens not routed to the expert:
features ``e * d_expert : (e + 1) * d_expert`` are expert ``e``'s.  Values are TransformerLens's
per-expert ``experts.{e}.hook_gate``/``hook_pre``/``hook_post`` (TL's ``hook_gate`` is our
``hook_pre`` and its ``hook_pre`` our ``hook_pre_linear``, as for dense gated MLPs), scattered to
their tokens; ``hook_post`` is *unweighted*: the routing weight ``g_e`` multiplies the expert's
output, so ``mlp_out = Σ_e g_e · post_e W_out^e``.  A write at an unrouted entry has no effect
(its routing weight is zero).

gpt-oss stores its experts transposed, gate and up interleaved, with biases, and activates them
with a clamped GLU: ``hook_pre`` and ``hook_pre_linear`` are its gate and up branches with their
biases, ``hook_post = (clamp(up) + 1) · clamp(gate) · σ(α · clamp(gate))``, and each expert's
output bias joins its weighted output, ``mlp_out = Σ_e g_e · (post_e W_out^e + b_out^e)``.

The forward is swapped in (:func:`dense_experts`) only while an MoE neuron site is read or
written; it reproduces the module's output up to float rounding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from structlens.models.placement import forward_replaced


def is_dense_experts(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an experts module :func:`experts_forward` can run: 3-D
    ``gate_up_proj``/``down_proj`` parameters with ``num_experts``, and either ``act_fn`` and no
    biases (Mixtral, Qwen3-MoE) or gpt-oss's layout (:func:`_is_gpt_oss`)."""
    gate_up = getattr(module, "gate_up_proj", None)
    down = getattr(module, "down_proj", None)
    stacked = (
        isinstance(gate_up, torch.Tensor)
        and isinstance(down, torch.Tensor)
        and gate_up.dim() == 3
        and down.dim() == 3
        and hasattr(module, "num_experts")
    )
    plain = hasattr(module, "act_fn") and not any("bias" in n for n, _ in module.named_parameters())
    return stacked and (plain or _is_gpt_oss(module))


def _is_gpt_oss(module: Any) -> bool:
    """gpt-oss's experts: ``gate_up_proj`` ``[expert, d_model, 2 d_expert]`` with gate and up
    interleaved, ``down_proj`` ``[expert, d_expert, d_model]``, both with biases, and a clamped
    GLU (``alpha``, ``limit``)."""
    return all(
        hasattr(module, a) for a in ("gate_up_proj_bias", "down_proj_bias", "alpha", "limit")
    )


# module: a Hugging Face experts module, whose attributes are known only at run time
def d_expert(module: Any) -> int:
    """One expert's MLP width."""
    return int(module.down_proj.shape[1 if _is_gpt_oss(module) else -1])


def _branches(self: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every expert's gate and up pre-activations ``[tokens, expert, d_expert]``."""
    if _is_gpt_oss(self):
        both = torch.einsum("td,edf->tef", x, self.gate_up_proj) + self.gate_up_proj_bias
        return both[..., ::2], both[..., 1::2]
    gate, up = torch.einsum("td,efd->tef", x, self.gate_up_proj).chunk(2, dim=-1)
    return gate, up


def _neurons(self: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if _is_gpt_oss(self):  # GptOssExperts._apply_gate on the split branches
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * gate * torch.sigmoid(gate * self.alpha)
    return self.act_fn(gate) * up


def _output(self: Any, post: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``Σ_e g_e · (post_e W_out^e + b_out^e)`` per token."""
    weighted = post * weights[..., None].to(post.dtype)
    if _is_gpt_oss(self):
        out = torch.einsum("tef,efd->td", weighted, self.down_proj)
        return out + weights.to(post.dtype) @ self.down_proj_bias
    return torch.einsum("tef,edf->td", weighted, self.down_proj)


def experts_forward(
    # self: a Hugging Face experts module, whose attributes are known only at run time
    self: Any,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """The experts' output ``[tokens, d_model]`` for ``hidden_states`` ``[tokens, d_model]``,
    computed densely with the neuron taps of ``self._structlens_taps`` (kinds ``mlp_pre``,
    ``mlp_pre_linear``, ``mlp_post``; each sees and returns ``[tokens, n_experts * d_expert]``).
    """
    taps: dict[str, Callable[[torch.Tensor], torch.Tensor]] = (
        getattr(self, "_structlens_taps", None) or {}
    )
    n = self.num_experts
    # index n (one past the last expert) marks "no expert" in HF's routing
    hit = torch.nn.functional.one_hot(top_k_index, num_classes=n + 1)[..., :n]
    weights = (hit * top_k_weights[..., None]).sum(1)  # [tokens, expert]
    routed = hit.sum(1)[..., None].to(hidden_states.dtype)  # [tokens, expert, 1]
    gate, up = _branches(self, hidden_states)

    def tap(kind: str, value: torch.Tensor) -> torch.Tensor:
        fn = taps.get(kind)
        return value if fn is None else fn(value.flatten(1)).unflatten(1, (n, -1))

    gate = tap("mlp_pre", gate * routed)
    up = tap("mlp_pre_linear", up * routed)
    post = tap("mlp_post", _neurons(self, gate, up))
    return _output(self, post, weights).to(hidden_states.dtype)


@contextlib.contextmanager
def dense_experts(
    # module: typed Any as torch types a Module's attributes as Tensor | Module
    module: Any,
    taps: dict[str, Callable[[torch.Tensor], torch.Tensor]],
) -> Iterator[None]:
    """Run ``module`` with :func:`experts_forward` and ``taps`` inside the block."""
    module._structlens_taps = taps
    try:
        with forward_replaced(module, experts_forward):
            yield
    finally:
        del module._structlens_taps

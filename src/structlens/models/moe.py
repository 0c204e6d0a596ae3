"""Dense per-expert neurons of mixture-of-experts MLPs (Mixtral, Qwen3-MoE).

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

The forward is swapped in (:func:`dense_experts`) only while an MoE neuron site is read or
written; it reproduces the module's output up to float rounding.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch


def is_dense_experts(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an experts module :func:`experts_forward` can run: 3-D
    ``gate_up_proj``/``down_proj`` parameters, no biases, ``num_experts`` and ``act_fn``."""
    gate_up = getattr(module, "gate_up_proj", None)
    down = getattr(module, "down_proj", None)
    return (
        isinstance(gate_up, torch.Tensor)
        and isinstance(down, torch.Tensor)
        and gate_up.dim() == 3
        and down.dim() == 3
        and hasattr(module, "num_experts")
        and hasattr(module, "act_fn")
        and not any("bias" in name for name, _ in module.named_parameters())
    )


# module: a Hugging Face experts module, whose attributes are known only at run time
def d_expert(module: Any) -> int:
    """One expert's MLP width."""
    return int(module.down_proj.shape[-1])


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
    gate, up = torch.einsum("td,efd->tef", hidden_states, self.gate_up_proj).chunk(2, dim=-1)

    def tap(kind: str, value: torch.Tensor) -> torch.Tensor:
        fn = taps.get(kind)
        return value if fn is None else fn(value.flatten(1)).unflatten(1, (n, -1))

    gate = tap("mlp_pre", gate * routed)
    up = tap("mlp_pre_linear", up * routed)
    post = tap("mlp_post", self.act_fn(gate) * up)
    out = torch.einsum("tef,edf->td", post * weights[..., None].to(post.dtype), self.down_proj)
    return out.to(hidden_states.dtype)


@contextlib.contextmanager
def dense_experts(
    # module: typed Any as torch types a Module's attributes as Tensor | Module
    module: Any,
    taps: dict[str, Callable[[torch.Tensor], torch.Tensor]],
) -> Iterator[None]:
    """Run ``module`` with :func:`experts_forward` and ``taps`` inside the block."""
    module._structlens_taps = taps
    module.forward = types.MethodType(experts_forward, module)
    try:
        yield
    finally:
        del module.forward
        del module._structlens_taps

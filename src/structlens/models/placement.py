"""Models dispatched over several devices by accelerate (a ``device_map``): where a module
computes, its offloaded weights brought in on demand, and the weights read for the fingerprint.

accelerate's ``AlignDevicesHook`` moves each module's inputs to its execution device and, for
weights offloaded to the CPU or disk, loads them in before the module runs and drops them after.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from structlens.models.digest import module_tensors


def execution_device(module: torch.nn.Module) -> torch.device | None:
    """The device ``module`` computes on: its accelerate hook's execution device when the
    model was dispatched over several devices (its weights may sit on ``meta`` between
    passes), else the device of its first parameter (None without parameters)."""
    dev = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
    if dev is not None:
        return torch.device(f"cuda:{dev}" if isinstance(dev, int) else dev)
    p = next(module.parameters(), None)
    return None if p is None or p.device.type == "meta" else p.device


@contextlib.contextmanager
def onloaded(module: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``module`` with its offloaded weights on its execution device inside the block (for
    code that reads weights or calls ``module`` outside a forward pass of the whole model);
    unchanged when nothing of it is offloaded."""
    hook = getattr(module, "_hf_hook", None)
    if hook is None or not getattr(hook, "offload", False):
        yield module
        return
    # accelerate's AlignDevicesHook: onload once, and keep calls of ``module`` inside the
    # block from offloading again after each call (as align_module_device would)
    hook.pre_forward(module)
    hook.offload = False
    try:
        yield module
    finally:
        hook.offload = True
        hook.post_forward(module, None)


class OnloadedTensors(Mapping[str, torch.Tensor]):
    """:func:`~structlens.models.digest.module_tensors` of a dispatched model, each tensor
    read on lookup from wherever accelerate keeps it (one offloaded tensor in memory at a
    time), so the digest equals that of the same weights held in place."""

    def __init__(self, hf: torch.nn.Module) -> None:
        self.hf = hf
        self.tensors = module_tensors(hf)
        # A tied weight held in place is one tensor under its first name; offloaded, the tie
        # is a separate meta placeholder, dropped here as module_tensors drops the alias.
        tied: Mapping[str, str] = getattr(hf, "all_tied_weights_keys", None) or {}
        for alias, source in tied.items():
            if source in self.tensors and alias in self.tensors:
                if self.tensors[alias].device.type == "meta":
                    del self.tensors[alias]

    def __getitem__(self, name: str) -> torch.Tensor:
        t = self.tensors[name]
        if t.device.type != "meta":
            return t
        path, _, leaf = name.rpartition(".")
        parts = path.split(".") if path else []
        for cut in range(len(parts), -1, -1):  # the nearest module whose hook holds it
            owner = self.hf.get_submodule(".".join(parts[:cut]))
            if getattr(getattr(owner, "_hf_hook", None), "offload", False):
                with onloaded(owner):
                    value = getattr(owner.get_submodule(".".join(parts[cut:])), leaf)
                if value.device.type != "meta":
                    return value
        raise RuntimeError(f"{name} is on the meta device and no accelerate hook holds it")

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


@contextlib.contextmanager
def forward_replaced(module: torch.nn.Module, forward: Callable[..., Any]) -> Iterator[None]:
    """``module`` running ``forward`` (a function of the module and its inputs) inside the
    block; its hooks, accelerate's included, still run around it.

    accelerate installs its hook as the instance attribute ``forward`` and keeps the module's
    own as ``_old_forward``, so that is the one replaced there.
    """
    name = (
        "_old_forward"
        if hasattr(module, "_hf_hook") and hasattr(module, "_old_forward")
        else "forward"
    )
    previous = module.__dict__.get(name)
    setattr(module, name, types.MethodType(forward, module))
    try:
        yield
    finally:
        if previous is None:
            delattr(module, name)
        else:
            setattr(module, name, previous)


def transform_safe_offload(hf: torch.nn.Module) -> None:
    """Let ``torch.func`` transforms (the exact Jacobian's ``jvp``/``vmap``) run through the
    offloaded modules of ``hf``: their weights are loaded in and dropped with the transforms
    switched off.

    Inside ``torch.func.jvp`` every tensor created, weights read from the offload included, is
    a wrapper without storage, which accelerate cannot place (it keys tied weights by data
    pointer); the weights are constants of the transformed function, so they are made outside
    it.  Idempotent.
    """
    for module in hf.modules():
        hook = getattr(module, "_hf_hook", None)
        if hook is None or not getattr(hook, "offload", False):
            continue
        for name in ("_onload_weights", "_offload_weights"):
            method = getattr(hook, name, None)  # what accelerate's pre_forward/post_forward call
            if method is not None and not getattr(method, "_structlens_plain", False):
                setattr(hook, name, _untransformed(method))


def _untransformed(method: Callable[[torch.nn.Module], None]) -> Callable[[torch.nn.Module], None]:
    @functools.wraps(method)
    def run(module: torch.nn.Module) -> None:
        # torch's own guard that excludes the functorch dispatch keys (private, but stable
        # since functorch joined torch)
        with torch._C._DisableFuncTorch():
            method(module)

    run._structlens_plain = True  # type: ignore[attr-defined]
    return run

"""Reading and writing sites during a forward pass.

:func:`hooked` is the one mechanism every capture, patch, ablation and gradient in structlens
goes through.  Inside the context, a forward pass of ``model.hf`` fills a dict with the
activations at the requested sites, after applying any writes::

    with hooked(model, reads=["blocks.2.hook_resid_pre"],
                writes={"blocks.1.hook_attn_out": lambda a: 0 * a}) as cache:
        model.forward(ids, mask)
    cache["blocks.2.hook_resid_pre"]          # [batch, seq, d_model]

Activations have shape ``[batch, seq, *site_shape]`` (``attn.hook_z``:
``[batch, seq, n_heads, d_head]``).  A writer receives that tensor and returns a replacement of
the same shape.  Sites that are sums or differences of real tensors (``resid_mid`` on parallel
GPT-NeoX; ``attn_out``/``mlp_out`` on post-LN BERT) are written by adjusting the module output
they are derived from, so the identities ``resid_mid = resid_pre + attn_out`` and
``resid_post = resid_mid + mlp_out`` keep holding after a write.

With ``grad=True`` the activations stay in the autograd graph (the embedding output becomes the
graph's leaf, since model parameters are frozen), and :func:`site_grads` returns
d(metric)/d(activation) for each read site.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from structlens.models.loading import Model
from structlens.sites import Site

Writer = Callable[[torch.Tensor], torch.Tensor]
Reader = Callable[[torch.Tensor], Any]


def _first(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def _replace_first(output: Any, value: torch.Tensor) -> Any:
    return (value, *output[1:]) if isinstance(output, tuple) else value


def _input_of(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _replace_input(args: tuple, kwargs: dict, value: torch.Tensor) -> tuple[tuple, dict]:
    if args:
        return (value, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": value}


class _Session:
    """Registers the hooks of one :func:`hooked` context and holds the per-forward state."""

    def __init__(
        self,
        model: Model,
        reads: Mapping[str, Reader | None],
        writes: Mapping[str, Writer],
        grad: bool,
    ) -> None:
        self.model = model
        self.fam = model.family
        self.grad = grad
        self.cache: dict[str, Any] = {}
        self.stash: dict[tuple[str, int], torch.Tensor] = {}
        self.handles: list[Any] = []
        self.reads = {model.site(k): (k, v) for k, v in reads.items()}
        self.writes = {model.site(k): v for k, v in writes.items()}
        if not model.causal and any(s.kind in ("logits", "ln_final") for s in self.reads):
            raise ValueError(f"{model.name} is an encoder: it has no logits or final norm site")

    # -- registration helpers -------------------------------------------------------------
    def _fwd(self, module: torch.nn.Module, fn: Callable[[Any], Any]) -> None:
        self.handles.append(module.register_forward_hook(lambda m, a, out: fn(out)))

    def _pre(self, module: torch.nn.Module, fn: Callable[[tuple, dict], Any]) -> None:
        self.handles.append(
            module.register_forward_pre_hook(lambda m, a, kw: fn(a, kw), with_kwargs=True)
        )

    def _out_map(self, module: torch.nn.Module, f: Callable[[torch.Tensor], torch.Tensor]):
        self._fwd(module, lambda out: _replace_first(out, f(_first(out))))

    def _in_map(self, module: torch.nn.Module, f: Callable[[torch.Tensor], torch.Tensor]):
        self._pre(module, lambda a, kw: _replace_input(a, kw, f(_input_of(a, kw))))

    def _z(self, t: torch.Tensor) -> torch.Tensor:
        return t.reshape(*t.shape[:-1], self.model.n_heads, self.model.d_head)

    def _record(self, site: Site, value: torch.Tensor) -> None:
        name, reader = self.reads[site]
        self.cache[name] = value if reader is None else reader(value)

    def _stash_fn(self, key: tuple[str, int]):
        def f(t: torch.Tensor) -> torch.Tensor:
            self.stash[key] = t
            return t

        return f

    # -- the hooks ------------------------------------------------------------------------
    def register(self) -> None:
        m, fam = self.model, self.fam
        if self.grad:
            for path in filter(None, (fam.embed, fam.pos_embed)):
                self._out_map(m.base_module(path), lambda t: t.detach().requires_grad_(True))
        for site, fn in self.writes.items():
            self._register_write(site, fn)
        for layer in sorted({s.layer for s in self._stash_sites()}):
            self._in_map(m.layer_module(layer), self._stash_fn(("pre", layer)))
            if fam.post_ln:
                self._out_map(m.layer_module(layer, fam.mid_writer), self._stash_fn(("mid", layer)))
        for site in self.reads:
            self._register_read(site)

    def _stash_sites(self) -> list[Site]:
        derived = [s for s in self.writes if s.kind in ("attn_out", "mlp_out", "resid_mid")]
        derived += [s for s in self.reads if s.kind in ("attn_out", "mlp_out", "resid_mid")]
        return derived

    def _attn_module(self, layer: int) -> torch.nn.Module:
        return self.model.layer_module(layer, self.fam.attn_write)

    def _register_write(self, site: Site, fn: Writer) -> None:
        m, fam, L = self.model, self.fam, site.layer
        if site.kind == "resid_pre":
            self._in_map(m.layer_module(L), fn)
        elif site.kind == "resid_post":
            self._out_map(m.layer_module(L), fn)
        elif site.kind == "z":
            zmod = m.layer_module(L, fam.z_reader)
            self._in_map(zmod, lambda t: fn(self._z(t)).reshape(t.shape))
        elif site.kind == "attn_out":
            if fam.post_ln:
                pre = ("pre", L)
                self._out_map(
                    m.layer_module(L, fam.mid_writer),
                    lambda mid: self.stash[pre] + fn(mid - self.stash[pre]),
                )
            else:
                self._out_map(self._attn_module(L), fn)
        elif site.kind == "resid_mid":
            if fam.post_ln:
                self._out_map(m.layer_module(L, fam.mid_writer), fn)
            else:
                pre = ("pre", L)
                self._out_map(
                    self._attn_module(L), lambda a: fn(self.stash[pre] + a) - self.stash[pre]
                )
        elif site.kind == "mlp_out":
            if fam.post_ln:
                mid = ("mid", L)
                self._out_map(
                    m.layer_module(L), lambda post: self.stash[mid] + fn(post - self.stash[mid])
                )
            else:
                self._out_map(m.layer_module(L, fam.mlp_write), fn)
        elif site.kind in ("embed", "pos_embed"):
            self._out_map(m.base_module(getattr(fam, site.kind)), fn)
        elif site.kind == "ln_final":
            self._out_map(m.base_module(fam.final_norm), fn)
        elif site.kind == "logits":
            self._out_map(m.hf.get_output_embeddings(), fn)
        else:  # pragma: no cover - parse_site admits no other kinds
            raise AssertionError(site)

    def _register_read(self, site: Site) -> None:
        m, fam, L = self.model, self.fam, site.layer
        rec = self._record

        def passthrough(f: Callable[[torch.Tensor], None]):
            def g(t: torch.Tensor) -> torch.Tensor:
                f(t)
                return t

            return g

        def derived(module: torch.nn.Module, base_key: tuple[str, int], sign: int):
            # value = out - base (sign=-1) or base + out (sign=+1).  In grad mode the module's
            # output is rebuilt from the derived tensor, which puts that tensor in the graph.
            def g(out: torch.Tensor) -> torch.Tensor:
                base = self.stash[base_key]
                value = base + out if sign > 0 else out - base
                rec(site, value)
                if not self.grad:
                    return out
                return value - base if sign > 0 else base + value

            self._out_map(module, g)

        if site.kind == "resid_pre":
            self._in_map(m.layer_module(L), passthrough(lambda t: rec(site, t)))
        elif site.kind == "resid_post":
            self._out_map(m.layer_module(L), passthrough(lambda t: rec(site, t)))
        elif site.kind == "z":
            self._in_map(
                m.layer_module(L, fam.z_reader), passthrough(lambda t: rec(site, self._z(t)))
            )
        elif site.kind == "attn_out":
            if fam.post_ln:
                derived(m.layer_module(L, fam.mid_writer), ("pre", L), -1)
            else:
                self._out_map(self._attn_module(L), passthrough(lambda t: rec(site, t)))
        elif site.kind == "resid_mid":
            if fam.post_ln:
                self._out_map(
                    m.layer_module(L, fam.mid_writer), passthrough(lambda t: rec(site, t))
                )
            elif m.parallel:
                derived(self._attn_module(L), ("pre", L), +1)
            else:
                self._in_map(m.layer_module(L, fam.mid_reader), passthrough(lambda t: rec(site, t)))
        elif site.kind == "mlp_out":
            if fam.post_ln:
                derived(m.layer_module(L), ("mid", L), -1)
            else:
                self._out_map(m.layer_module(L, fam.mlp_write), passthrough(lambda t: rec(site, t)))
        elif site.kind in ("embed", "pos_embed"):
            self._out_map(
                m.base_module(getattr(fam, site.kind)), passthrough(lambda t: rec(site, t))
            )
        elif site.kind == "ln_final":
            self._out_map(m.base_module(fam.final_norm), passthrough(lambda t: rec(site, t)))
        elif site.kind == "logits":
            self._out_map(m.hf.get_output_embeddings(), passthrough(lambda t: rec(site, t)))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self.stash.clear()


@contextmanager
def hooked(
    model: Model,
    reads: Iterable[str] | Mapping[str, Reader | None] = (),
    writes: Mapping[str, Writer] | None = None,
    *,
    grad: bool = False,
) -> Iterator[dict[str, Any]]:
    """Context in which forward passes of ``model`` read and write sites.

    Parameters
    ----------
    reads
        Site names to record, or a mapping from site name to a reader applied to the
        activation inside the hook (to select positions or move data off the device early).
    writes
        Mapping from site name to a function returning the replacement activation.
    grad
        Keep recorded activations in the autograd graph (see :func:`site_grads`).

    Yields
    ------
    dict
        Filled during the forward pass: site name -> activation (or the reader's result).
        Values are detached unless ``grad`` is true.
    """
    if not isinstance(reads, Mapping):
        reads = {name: None for name in reads}
    session = _Session(model, reads, writes or {}, grad)
    session.register()
    try:
        with torch.set_grad_enabled(grad):
            yield session.cache
    finally:
        session.remove()
        if not grad:
            for k, v in session.cache.items():
                if isinstance(v, torch.Tensor):
                    session.cache[k] = v.detach()


def site_grads(metric: torch.Tensor, cache: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """d(metric.sum())/d(activation) for every activation recorded with ``grad=True``.

    Sites the metric does not depend on (e.g. sites after the metric's read-out) get zeros.
    """
    names = list(cache)
    tensors = [cache[n] for n in names]
    grads = torch.autograd.grad(metric.sum(), tensors, allow_unused=True)
    return {n: (torch.zeros_like(t) if g is None else g) for n, t, g in zip(names, tensors, grads)}

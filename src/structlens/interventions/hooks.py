"""Reading and writing sites during a forward pass.

:func:`hooked` is the one mechanism every capture, patch, ablation and gradient in structlens
goes through.  Inside the context, a forward pass of ``model.hf`` fills a dict with the
activations at the requested sites, after applying any writes::

    with hooked(model, reads=["blocks.2.hook_resid_pre"],
                writes={"blocks.1.hook_attn_out": lambda a: 0 * a}) as cache:
        model.forward(ids, mask)
    cache["blocks.2.hook_resid_pre"]          # [batch, seq, d_model]

Activations have shape ``[batch, seq, *site_shape]`` (``attn.hook_z``:
``[batch, seq, n_heads, d_head]``), except ``attn.hook_attn_scores``/``attn.hook_pattern``,
which are ``[batch, head, query_pos, key_pos]`` as in TransformerLens.  A writer receives that
tensor and returns a replacement of the same shape.  Reading or writing ``hook_rot_q``,
``hook_rot_k``, ``hook_attn_scores`` or ``hook_pattern`` runs attention on structlens's eager
path for the session (:mod:`structlens.models.attention`; checked once per model to reproduce
the model's own output; likewise ``cross_attn.hook_attn_scores``/``hook_pattern`` of
encoder–decoders).  Mixture-of-experts neuron sites run the layer's experts densely for the
session (:mod:`structlens.models.moe`).  Norm sites (``ln*.hook_scale``/``hook_normalized``) are
computed from the norm's input; a write rebuilds the norm's output as
``normalized * gain + bias``.  ``hook_normalized`` is therefore TransformerLens's meaning, the
input over its scale *before* the gain and bias, not the norm module's output:

>>> import torch
>>> from structlens.models import load_model
>>> from structlens.models.adapters import norm_affine
>>> model = load_model("tiny-llama")
>>> norm = model.base_module(model.family.final_norm)
>>> with torch.no_grad():
...     _ = norm.weight.copy_(torch.linspace(0.5, 2.0, norm.weight.numel()))  # a gain, not 1
>>> sites = ["blocks.2.hook_resid_post", "ln_final.hook_scale", "ln_final.hook_normalized"]
>>> ids = torch.tensor([[1, 5, 9, 3]])
>>> with torch.no_grad(), hooked(model, sites) as cache:
...     _ = model.forward(ids, torch.ones_like(ids))
>>> x, normalized = cache["blocks.2.hook_resid_post"], cache["ln_final.hook_normalized"]
>>> torch.allclose(normalized, x / cache["ln_final.hook_scale"])  # input / scale
True
>>> gain, bias = norm_affine(norm)
>>> torch.allclose(normalized * gain + bias, norm(x), atol=1e-6)  # the output needs the gain
True
>>> torch.allclose(normalized, norm(x), atol=1e-3)
False

Sites that are sums or differences of real tensors (``resid_mid`` on parallel GPT-NeoX;
``attn_out``/``mlp_out`` on post-LN BERT) are written by adjusting the module output they are
derived from, so the identities ``resid_mid = resid_pre + attn_out`` and ``resid_post = resid_mid +
mlp_out`` keep holding after a write.

With ``grad=True`` the activations stay in the autograd graph (the embedding output becomes the
graph's leaf, since model parameters are frozen), and :func:`site_grads` returns
d(metric)/d(activation) for each read site.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, nullcontext
from functools import partial
from typing import Any

import torch

from structlens.models.adapters import norm_affine, norm_eps, norm_kind, norm_parts
from structlens.models.attention import check_eager_path, eager_path
from structlens.models.loading import Model
from structlens.models.moe import dense_experts
from structlens.models.placement import execution_device, onloaded
from structlens.sites import Site

#: Kinds served by taps (a value exposed at one place, written then recorded).
_TAP_KINDS = frozenset(
    {
        "q",
        "k",
        "v",
        "rot_q",
        "rot_k",
        "attn_scores",
        "pattern",
        "mlp_pre",
        "mlp_pre_linear",
        "mlp_post",
        "ln1_scale",
        "ln1_normalized",
        "ln2_scale",
        "ln2_normalized",
        "ln_final_scale",
        "ln_final",
        "cross_q",
        "cross_k",
        "cross_v",
        "cross_attn_scores",
        "cross_pattern",
    }
)
_EAGER_KINDS = frozenset({"rot_q", "rot_k", "attn_scores", "pattern"})
_CROSS_EAGER_KINDS = frozenset({"cross_attn_scores", "cross_pattern"})

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

    tokens: tuple[int, int] | None  # [batch, pos] at the first layer's input
    batch: int | None

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
        # A site may be read under several names (``logits`` and ``unembed.hook_out``).
        self.reads: dict[Site, list[tuple[str, Reader | None]]] = {}
        for k, v in reads.items():
            self.reads.setdefault(model.site(k), []).append((k, v))
        # A model split over several devices: reads are recorded, and writers see and return
        # activations, on its input device (as on one device); each layer computes on its own.
        devices = model.devices
        self.home = devices[0] if len(devices) > 1 else None
        self.writes = {model.site(k): self._at_home(v) for k, v in writes.items()}
        if len(self.writes) != len(writes):
            raise ValueError(f"writes name the same site twice (aliases?): {sorted(writes)}")
        tapped = [s for s in {**self.reads, **self.writes} if s.kind in _TAP_KINDS]
        self.taps = {s: self._tap_fn(s) for s in tapped}
        self.eager = any(s.kind in _EAGER_KINDS | _CROSS_EAGER_KINDS for s in tapped)
        self.attn_taps: list[torch.nn.Module] = []
        self.swapped = ExitStack()  # forwards replaced for the session (MoE experts)

    # -- registration helpers -------------------------------------------------------------
    def _fwd(self, module: torch.nn.Module, fn: Callable[[Any], Any]) -> None:
        self.handles.append(module.register_forward_hook(lambda m, a, out: fn(out)))

    def _pre(self, module: torch.nn.Module, fn: Callable[[tuple, dict], Any]) -> None:
        self.handles.append(
            module.register_forward_pre_hook(lambda m, a, kw: fn(a, kw), with_kwargs=True)
        )

    def _out_map(self, module: torch.nn.Module, f: Callable[[torch.Tensor], torch.Tensor]):
        f = self._per_token(f)
        self._fwd(module, lambda out: _replace_first(out, f(_first(out))))

    def _in_map(self, module: torch.nn.Module, f: Callable[[torch.Tensor], torch.Tensor]):
        f = self._per_token(f)
        # Pre-hooks run before accelerate's own hook moves the input onto the module's
        # execution device (a model split by a device_map), so the input is moved here: every
        # hook then sees, stashes and writes a site on the device its layer computes on.
        dev = execution_device(module) if hasattr(module, "_hf_hook") else None

        def g(t: torch.Tensor) -> torch.Tensor:
            return f(t if dev is None else t.to(dev))

        self._pre(module, lambda a, kw: _replace_input(a, kw, g(_input_of(a, kw))))

    def _batched(self, f: Callable[[torch.Tensor], torch.Tensor]):
        """``f`` on ``[batch, pos, d]`` also for position embeddings computed once for the
        batch (``[1, pos, d]``), as TransformerLens's ``hook_pos_embed`` is."""

        def g(t: torch.Tensor) -> torch.Tensor:
            if t.shape[0] == 1 and self.batch is not None and self.batch > 1:
                t = t.expand(self.batch, *t.shape[1:])
            return f(t)

        return g

    def _per_token(self, f: Callable[[torch.Tensor], torch.Tensor]):
        """``f`` on ``[batch, pos, ...]`` also for modules fed ``[batch * pos, ...]`` (OPT's
        MLP), using the batch shape recorded at the first layer's input."""

        def g(t: torch.Tensor) -> torch.Tensor:
            bp = self.tokens
            if t.ndim == 2 and bp is not None and t.shape[0] == bp[0] * bp[1]:
                return f(t.unflatten(0, bp)).flatten(0, 1)
            return f(t)

        return g

    def _z(self, t: torch.Tensor) -> torch.Tensor:
        return t.reshape(*t.shape[:-1], self.model.n_heads, self.model.d_head)

    def _at_home(self, writer: Writer) -> Writer:
        home = self.home
        if home is None:
            return writer
        return lambda value: writer(value.to(home)).to(value.device)

    def _record(self, site: Site, value: torch.Tensor) -> None:
        if self.home is not None and not self.grad:  # with grad: the tensor the graph uses
            value = value.to(self.home)
        for name, reader in self.reads[site]:
            self.cache[name] = value if reader is None else reader(value)

    def _tap_fn(self, site: Site) -> Callable[[torch.Tensor], torch.Tensor]:
        """Apply the site's writer (if any), then record the result (if read)."""
        writer = self.writes.get(site)

        def tap(value: torch.Tensor) -> torch.Tensor:
            if writer is not None:
                new = writer(value)
                if new.shape != value.shape:
                    raise ValueError(
                        f"writer for {site.name} returned shape {tuple(new.shape)}, expected "
                        f"{tuple(value.shape)}"
                    )
                value = new
            if site in self.reads:
                self._record(site, value)
            return value

        return tap

    def _rebuild(self, kinds: Iterable[Site]) -> bool:
        # Reads alone leave the module's output untouched (bit-exact); writes, and reads in
        # grad mode (so the recorded tensor is the one the rest of the graph uses), rebuild it.
        return self.grad or any(s in self.writes for s in kinds)

    def _stash_fn(self, key: tuple[str, int]):
        def f(t: torch.Tensor) -> torch.Tensor:
            self.stash[key] = t
            return t

        return f

    # -- the hooks ------------------------------------------------------------------------
    def register(self) -> None:
        m, fam = self.model, self.fam

        def tokens(t: torch.Tensor) -> torch.Tensor:
            self.tokens = (int(t.shape[0]), int(t.shape[1]))
            return t

        def batch(args: tuple, kwargs: dict) -> None:
            x = kwargs.get("input_ids", args[0] if args else None)
            x = kwargs.get("inputs_embeds") if x is None else x
            self.batch = None if x is None else int(x.shape[0])

        self.tokens = None
        self.batch = None
        self._in_map(m.layer_module(0), tokens)
        self._pre(m.base, batch)
        if self.grad:
            decoder_embed = fam.decoder.embed if fam.decoder else None
            for path in dict.fromkeys(filter(None, (fam.embed, fam.pos_embed, decoder_embed))):
                self._out_map(m.base_module(path), lambda t: t.detach().requires_grad_(True))
        for site, fn in self.writes.items():
            if site.kind not in _TAP_KINDS:
                self._register_write(site, fn)
        for layer in sorted({m.global_layer(s) for s in self._stash_sites()}):
            lfam = m.family_at(layer)
            self._in_map(m.layer_module(layer), self._stash_fn(("pre", layer)))
            if lfam.post_ln:
                mid = m.layer_module(layer, lfam.mid_writer)
                self._out_map(mid, self._stash_fn(("mid", layer)))
            elif lfam.cross:  # resid_mid_cross writes adjust the cross-attention output
                self._in_map(m.layer_module(layer, lfam.mid_reader), self._stash_fn(("mid", layer)))
            if lfam.cross_writer:
                midx = m.layer_module(layer, lfam.cross_writer)
                self._out_map(midx, self._stash_fn(("midx", layer)))
        for site in self.reads:
            if site.kind not in _TAP_KINDS:
                self._register_read(site)
        self._register_taps()

    def _stash_sites(self) -> list[Site]:
        kinds = ("attn_out", "mlp_out", "resid_mid", "cross_attn_out", "resid_mid_cross")
        return [s for s in (*self.writes, *self.reads) if s.kind in kinds]

    def _contribution(self, f: Callable[[torch.Tensor], torch.Tensor]):
        """``f`` on a sublayer's residual contribution, given the sublayer's output: the two
        differ by the model's residual multiplier (Granite), and are equal otherwise."""
        scale = self.model.residual_scale
        if scale == 1.0:
            return f
        return lambda t: f(t * scale) / scale

    def _attn_module(self, layer: int) -> torch.nn.Module:
        return self.model.layer_module(layer, self.model.family_at(layer).attn_write)

    def _layer_of(self, site: Site) -> tuple[Any, Any]:
        """The family of ``site``'s layer and its global index (None for model-level sites)."""
        m = self.model
        if site.layer is None:
            return self.fam, None
        L = m.global_layer(site)
        return m.family_at(L), L

    def _register_write(self, site: Site, fn: Writer) -> None:
        m = self.model
        fam, L = self._layer_of(site)
        if site.kind == "resid_pre":
            self._in_map(m.layer_module(L), fn)
        elif site.kind == "resid_post":
            self._out_map(m.layer_module(L), fn)
        elif site.kind in ("z", "cross_z"):
            zmod = m.layer_module(L, fam.z_reader if site.kind == "z" else fam.cross_z_reader)
            self._in_map(zmod, lambda t: fn(self._z(t)).reshape(t.shape))
        elif site.kind == "attn_out":
            if fam.post_ln:
                pre = ("pre", L)
                self._out_map(
                    m.layer_module(L, fam.mid_writer),
                    lambda mid: self.stash[pre] + fn(mid - self.stash[pre]),
                )
            else:
                self._out_map(self._attn_module(L), self._contribution(fn))
        elif site.kind == "resid_mid":
            if fam.post_ln:
                self._out_map(m.layer_module(L, fam.mid_writer), fn)
            else:
                pre = ("pre", L)
                self._out_map(
                    self._attn_module(L),
                    self._contribution(lambda a: fn(self.stash[pre] + a) - self.stash[pre]),
                )
        elif site.kind == "cross_attn_out":
            if fam.post_ln:
                mid = ("mid", L)
                self._out_map(
                    m.layer_module(L, fam.cross_writer),
                    lambda mc: self.stash[mid] + fn(mc - self.stash[mid]),
                )
            else:
                self._out_map(m.layer_module(L, fam.cross_write), fn)
        elif site.kind == "resid_mid_cross":
            if fam.post_ln:
                self._out_map(m.layer_module(L, fam.cross_writer), fn)
            else:
                mid = ("mid", L)
                self._out_map(
                    m.layer_module(L, fam.cross_write),
                    lambda a: fn(self.stash[mid] + a) - self.stash[mid],
                )
        elif site.kind == "mlp_out":
            if fam.post_ln:
                mid = ("midx" if fam.cross_writer else "mid", L)
                self._out_map(
                    m.layer_module(L), lambda post: self.stash[mid] + fn(post - self.stash[mid])
                )
            else:
                self._out_map(m.layer_module(L, fam.mlp_write), self._contribution(fn))
        elif site.kind in ("embed", "pos_embed"):
            self._out_map(m.base_module(getattr(fam, site.kind)), self._batched(fn))
        elif site.kind == "logits":
            self._out_map(m.hf.get_output_embeddings(), fn)
        else:  # pragma: no cover - parse_site admits no other kinds
            raise AssertionError(site)

    def _register_read(self, site: Site) -> None:
        m = self.model
        fam, L = self._layer_of(site)
        rec = self._record

        def passthrough(f: Callable[[torch.Tensor], None]):
            def g(t: torch.Tensor) -> torch.Tensor:
                f(t)
                return t

            return g

        def derived(module: torch.nn.Module, base_key: tuple[str, int], sign: int):
            # value = out - base (sign=-1) or base + out (sign=+1, out a sublayer's output).  In
            # grad mode the module's output is rebuilt from the derived tensor, which puts that
            # tensor in the graph.
            def g(out: torch.Tensor) -> torch.Tensor:
                base = self.stash[base_key]
                value = base + out if sign > 0 else out - base
                rec(site, value)
                if not self.grad:
                    return out
                return value - base if sign > 0 else base + value

            self._out_map(module, self._contribution(g) if sign > 0 else g)

        if site.kind == "resid_pre":
            self._in_map(m.layer_module(L), passthrough(lambda t: rec(site, t)))
        elif site.kind == "resid_post":
            self._out_map(m.layer_module(L), passthrough(lambda t: rec(site, t)))
        elif site.kind in ("z", "cross_z"):
            zmod = m.layer_module(L, fam.z_reader if site.kind == "z" else fam.cross_z_reader)
            self._in_map(zmod, passthrough(lambda t: rec(site, self._z(t))))
        elif site.kind == "attn_out":
            if fam.post_ln:
                derived(m.layer_module(L, fam.mid_writer), ("pre", L), -1)
            else:
                self._out_map(
                    self._attn_module(L), self._contribution(passthrough(lambda t: rec(site, t)))
                )
        elif site.kind == "resid_mid":
            if fam.post_ln:
                self._out_map(
                    m.layer_module(L, fam.mid_writer), passthrough(lambda t: rec(site, t))
                )
            elif m.parallel:
                derived(self._attn_module(L), ("pre", L), +1)
            else:
                self._in_map(m.layer_module(L, fam.mid_reader), passthrough(lambda t: rec(site, t)))
        elif site.kind == "cross_attn_out":
            if fam.post_ln:
                derived(m.layer_module(L, fam.cross_writer), ("mid", L), -1)
            else:
                mod = m.layer_module(L, fam.cross_write)
                self._out_map(mod, passthrough(lambda t: rec(site, t)))
        elif site.kind == "resid_mid_cross":
            if fam.post_ln:
                mod = m.layer_module(L, fam.cross_writer)
                self._out_map(mod, passthrough(lambda t: rec(site, t)))
            else:
                mod = m.layer_module(L, fam.cross_mid_reader)
                self._in_map(mod, passthrough(lambda t: rec(site, t)))
        elif site.kind == "mlp_out":
            if fam.post_ln:
                derived(m.layer_module(L), ("midx" if fam.cross_writer else "mid", L), -1)
            else:
                # copy_mlp_out: the layer adds into this tensor in place after the hook
                keep = (lambda t: t.clone()) if fam.copy_mlp_out else (lambda t: t)
                read = self._contribution(passthrough(lambda t: rec(site, t)))
                self._out_map(m.layer_module(L, fam.mlp_write), lambda t: keep(read(t)))
        elif site.kind in ("embed", "pos_embed"):
            self._out_map(
                m.base_module(getattr(fam, site.kind)),
                self._batched(passthrough(lambda t: rec(site, t))),
            )
        elif site.kind == "logits":
            self._out_map(m.hf.get_output_embeddings(), passthrough(lambda t: rec(site, t)))

    # -- tapped sites -----------------------------------------------------------------------
    def _register_taps(self) -> None:
        m = self.model
        by_layer: dict[int | None, dict[str, Site]] = {}
        for site in self.taps:
            by_layer.setdefault(self._layer_of(site)[1], {})[site.kind] = site
        for layer, sites in by_layer.items():
            if layer is None:
                assert self.fam.final_norm is not None  # ln_final exists only with a final norm
                self._norm_taps(partial(m.base_module, self.fam.final_norm), sites, "ln_final")
                continue
            fam = m.family_at(layer)
            self._norm_taps(partial(m.layer_module, layer, fam.ln1), sites, "ln1")
            self._norm_taps(partial(m.layer_module, layer, fam.ln2), sites, "ln2")
            self._qkv_taps(layer, sites)
            self._mlp_taps(layer, sites)
            attn = {k: self.taps[s] for k, s in sites.items() if k in _EAGER_KINDS}
            cross = {
                k.removeprefix("cross_"): self.taps[s]
                for k, s in sites.items()
                if k in _CROSS_EAGER_KINDS
            }
            for taps, path in ((attn, fam.attn_module), (cross, fam.cross_attn)):
                if taps:
                    # Any: torch types a Module's attributes as Tensor | Module
                    mod: Any = self.model.layer_module(layer, path)
                    mod._structlens_taps = taps
                    self.attn_taps.append(mod)

    def _norm_taps(
        self, module: Callable[[], torch.nn.Module], sites: dict[str, Site], prefix: str
    ) -> None:
        scale_site = sites.get(f"{prefix}_scale")
        norm_site = sites.get("ln_final" if prefix == "ln_final" else f"{prefix}_normalized")
        if scale_site is None and norm_site is None:
            return
        mod = module()
        with onloaded(mod):  # the probes run the norm: its weights must be in place
            kind, eps = norm_kind(mod), norm_eps(mod)
            gain, bias = norm_affine(mod)
        rebuild = self._rebuild(filter(None, (scale_site, norm_site)))

        def rebuilt(x: torch.Tensor) -> torch.Tensor:
            scale, normalized = norm_parts(x, kind, eps)
            if scale_site is not None:
                scale = self.taps[scale_site](scale)
                normalized = norm_parts(x, kind, eps, scale=scale)[1]
            if norm_site is not None:
                normalized = self.taps[norm_site](normalized)
            return (normalized * gain + bias).to(x.dtype)

        rebuilt = self._per_token(rebuilt)

        def hook(module, args, kwargs, out):
            # the input as passed, before a device_map's hook moved it to the norm's device
            y = rebuilt(_input_of(args, kwargs).to(_first(out).device))
            return _replace_first(out, y) if rebuild else out

        self.handles.append(mod.register_forward_hook(hook, with_kwargs=True))

    def _tap_output(
        self,
        site: Site,
        rebuild: bool,
        view: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """A module-output map that taps ``view(output)`` (a reshape) and returns the output,
        rebuilt from the tapped value when needed."""
        tap = self.taps[site]

        def f(t: torch.Tensor) -> torch.Tensor:
            value = tap(view(t))
            return value.reshape(t.shape) if rebuild else t

        return f

    def _qkv_taps(self, layer: int, sites: dict[str, Site]) -> None:
        m = self.model
        fam = m.family_at(layer)
        d, h, kv = m.d_head, m.n_heads, m.n_kv_heads
        cross = {k: sites[f"cross_{k}"] for k in ("q", "k", "v") if f"cross_{k}" in sites}
        for k, site in cross.items():  # cross-attention: separate projections
            path = {"q": fam.cross_q_proj, "k": fam.cross_k_proj, "v": fam.cross_v_proj}[k]
            self._out_map(
                m.layer_module(layer, path),
                self._tap_output(site, self._rebuild([site]), lambda t: t.unflatten(-1, (-1, d))),
            )
        wanted = {k: sites[k] for k in ("q", "k", "v") if k in sites}
        if not wanted:
            return
        rebuild = self._rebuild(wanted.values())
        if fam.qkv_proj is None:
            for k, site in wanted.items():
                path = {"q": fam.q_proj, "k": fam.k_proj, "v": fam.v_proj}[k]
                self._out_map(
                    m.layer_module(layer, path),
                    self._tap_output(site, rebuild, lambda t: t.unflatten(-1, (-1, d))),
                )
            return

        def split(t: torch.Tensor) -> torch.Tensor:
            if fam.qkv_layout == "per_head":
                parts = dict(zip("qkv", t.unflatten(-1, (h, 3, d)).unbind(-2)))
            else:
                q, k, v = t.split((h * d, kv * d, kv * d), dim=-1)
                parts = {n: x.unflatten(-1, (-1, d)) for n, x in zip("qkv", (q, k, v))}
            for name, site in wanted.items():
                parts[name] = self.taps[site](parts[name])
            if not rebuild:
                return t
            if fam.qkv_layout == "per_head":
                return torch.stack([parts[n] for n in "qkv"], dim=-2).flatten(-3)
            return torch.cat([parts[n].flatten(-2) for n in "qkv"], dim=-1)

        self._out_map(m.layer_module(layer, fam.qkv_proj), split)

    def _mlp_taps(self, layer: int, sites: dict[str, Site]) -> None:
        m = self.model
        fam = m.family_at(layer)
        pre, lin, post = (sites.get(k) for k in ("mlp_pre", "mlp_pre_linear", "mlp_post"))
        if fam.moe_experts is not None:
            # MoE: the experts run densely with the taps (structlens.models.moe)
            taps = {s.kind: self._per_token(self.taps[s]) for s in (pre, lin, post) if s}
            if taps:
                experts = m.layer_module(layer, fam.moe_experts)
                self.swapped.enter_context(dense_experts(experts, taps))
            return
        if post is not None:
            self._in_map(m.layer_module(layer, fam.mlp_post_reader), self.taps[post])
        if pre is None and lin is None:
            return
        rebuild = self._rebuild(filter(None, (pre, lin)))
        if fam.mlp_gate_up is not None:

            def gate_up(t: torch.Tensor) -> torch.Tensor:
                g, u = t.chunk(2, dim=-1)
                g = self.taps[pre](g) if pre is not None else g
                u = self.taps[lin](u) if lin is not None else u
                return torch.cat([g, u], dim=-1) if rebuild else t

            self._out_map(m.layer_module(layer, fam.mlp_gate_up), gate_up)
            return
        for site, path in ((pre, fam.mlp_pre), (lin, fam.mlp_pre_linear)):
            if site is not None:
                self._out_map(m.layer_module(layer, path), self._tap_output(site, rebuild))

    def remove(self) -> None:
        for mod in self.attn_taps:
            del mod._structlens_taps
        self.attn_taps.clear()
        self.swapped.close()
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
    if session.eager:
        check_eager_path(model)
    session.register()
    try:
        with torch.set_grad_enabled(grad), eager_path(model.hf) if session.eager else nullcontext():
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

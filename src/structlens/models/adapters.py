"""Model plumbing behind the site adapters: what a family provides, norms, discovery.

* :func:`available_kinds` - which layer site kinds a loaded model has (and why not the others).
* :func:`norm_parts` - TransformerLens's ``hook_scale``/``hook_normalized`` of a norm's input,
  and :func:`norm_affine` - the per-feature gain and bias that map ``hook_normalized`` to the
  norm's output (found by probing the module, so any gain convention, e.g. Gemma's ``1 + w``,
  is handled).
* :func:`discover_family` - a :class:`~structlens.models.families.Family` for an unregistered
  architecture, found from its module structure; :func:`residual_identity_errors` verifies a
  family on one forward pass.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from structlens.models.attention import uses_attention_interface
from structlens.models.families import Family
from structlens.models.moe import is_dense_experts
from structlens.sites import CORE_LAYER_KINDS, LAYER_KINDS

# ---------------------------------------------------------------------------------------------
# norms


@torch.no_grad()
def norm_kind(module: torch.nn.Module) -> str:
    """``"layer"`` (centres, then divides by the std) or ``"rms"`` (divides by the RMS).

    Told apart by behaviour, not class name: a LayerNorm ignores a constant added to every
    feature, an RMSNorm does not.
    """
    if isinstance(module, torch.nn.LayerNorm):
        return "layer"
    p = next(iter(module.parameters()), None)
    if p is None:
        raise ValueError(f"{type(module).__name__} has no parameters to read its width from")
    x = torch.randn(2, p.shape[-1], generator=torch.Generator().manual_seed(0))
    x = x.to(dtype=p.dtype, device=p.device)
    shifted = module(x + 3.0)
    return "layer" if torch.allclose(module(x), shifted, rtol=1e-3, atol=1e-3) else "rms"


def norm_eps(module: torch.nn.Module) -> float:
    for attr in ("eps", "variance_epsilon", "epsilon"):
        if isinstance(getattr(module, attr, None), float):
            return float(getattr(module, attr))
    raise ValueError(f"{type(module).__name__} has no eps attribute")


def norm_parts(
    x: torch.Tensor, kind: str, eps: float, scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale [.., 1], normalized [.., d])`` of a norm's input ``x`` in TL's convention
    (computed in float32 for half-precision inputs); ``scale`` may be given to override it."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if kind == "layer":
        xf = xf - xf.mean(-1, keepdim=True)
    if scale is None:
        scale = (xf.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    return scale, xf / scale


@torch.no_grad()
def norm_affine(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-feature ``(gain, bias)`` with ``module(x) = normalized(x) * gain + bias``.

    Norms are odd in their input up to the bias, so two probes ``p`` and ``-p`` give both;
    a third, random probe checks the decomposition (ValueError if it does not hold).
    """
    kind, eps = norm_kind(module), norm_eps(module)
    p = next(iter(module.parameters()), None)
    dtype = p.dtype if p is not None else torch.float32
    device = p.device if p is not None else torch.device("cpu")
    d = int(p.shape[-1]) if p is not None else None
    if d is None:
        raise ValueError(f"{type(module).__name__} has no parameters to read its width from")
    probe = torch.ones(d, dtype=torch.float64)
    probe[1::2] = -1
    probe = (probe - probe.mean()).to(dtype=dtype, device=device)[None]
    _, n = norm_parts(probe, kind, eps)
    plus, minus = module(probe).float(), module(-probe).float()
    gain = ((plus - minus) / (2 * n.float()))[0]
    bias = ((plus + minus) / 2)[0]
    x = torch.randn(4, d, generator=torch.Generator().manual_seed(0)).to(dtype=dtype, device=device)
    _, nx = norm_parts(x, kind, eps)
    err = (module(x).float() - (nx.float() * gain + bias)).abs().max()
    tol = 1e-4 if dtype in (torch.float32, torch.float64) else 5e-2
    if not float(err) <= tol * max(1.0, float(gain.abs().max())):
        raise ValueError(
            f"{type(module).__name__} is not a {kind} norm of the expected form "
            f"(normalized * gain + bias; error {float(err):.2e})"
        )
    return gain.to(dtype), bias.to(dtype)


# ---------------------------------------------------------------------------------------------
# what a model provides


def _has(layers: Any, path: str | None) -> bool:
    if not path:
        return False
    for layer in layers:
        try:
            layer.get_submodule(path)
        except AttributeError:
            return False
    return True


def out_features(module: Any) -> int:
    """Output width of a Linear (or GPT-2's transposed Conv1D)."""
    if hasattr(module, "out_features"):
        return int(module.out_features)
    if hasattr(module, "nf"):
        return int(module.nf)
    raise ValueError(f"cannot read the output width of {type(module).__name__}")


def layer_family(family: Family, layer: torch.nn.Module) -> Family:
    """The family of one layer: ``family``, or the first of its ``variants`` whose token mixer
    the layer has where it lacks ``family``'s (a hybrid model's linear-attention layers)."""
    for fam in (family, *family.variants):
        if _has([layer], fam.attn_module):
            return fam
    return family


#: Site kinds computed inside the attention heads (absent from layers without heads).
_HEAD_KINDS = ("q", "k", "v", "rot_q", "rot_k", "attn_scores", "pattern", "z")


def _kinds_of(family: Family, layers: Any) -> tuple[set[str], dict[str, str]]:
    """The layer site kinds every one of ``layers`` (all of ``family``) has, and why not the
    others."""
    have = set(CORE_LAYER_KINDS) - {"z"}
    missing: dict[str, str] = {}

    def offer(kinds: tuple[str, ...], ok: bool, reason: str) -> None:
        for k in kinds:
            if ok:
                have.add(k)
            else:
                missing[k] = reason

    offer(
        ("ln1_scale", "ln1_normalized"),
        _has(layers, family.ln1),
        f"family {family.name!r} has no norm before attention (docs/sites.md)",
    )
    offer(
        ("ln2_scale", "ln2_normalized"),
        _has(layers, family.ln2),
        f"family {family.name!r} has no separate norm before the MLP (docs/sites.md)",
    )
    if family.z_reader is None:
        what = family.layer_name or f"{family.name!r} layer"
        reason = f"it is a {what}, which has no softmax attention heads (docs/sites.md)"
        offer(_HEAD_KINDS, False, reason)
    else:
        _attention_kinds(family, layers, offer)
    experts = _has(layers, family.moe_experts) and all(
        is_dense_experts(layer.get_submodule(family.moe_experts)) for layer in layers
    )
    pre = experts or _has(layers, family.mlp_pre) or _has(layers, family.mlp_gate_up)
    post = experts or _has(layers, family.mlp_post_reader)
    moe = (
        f"family {family.name!r} has no MLP neuron paths (docs/sites.md)"
        if not (family.mlp_pre or family.mlp_gate_up)
        else f"the MLP has no {family.mlp_pre or family.mlp_gate_up!r} (a mixture of experts "
        f"with a shared expert has no mlp.hook_* sites; docs/sites.md)"
    )
    offer(("mlp_pre", "mlp_post"), pre and post, moe)
    linear = experts or _has(layers, family.mlp_pre_linear) or _has(layers, family.mlp_gate_up)
    offer(("mlp_pre_linear",), linear and post, "the MLP is not gated" if pre else moe)
    if family.cross:  # only decoder layers of encoder–decoders have these (not "missing" else)
        offer(("cross_attn_out", "resid_mid_cross"), True, "")
        paths = (family.cross_q_proj, family.cross_k_proj, family.cross_v_proj)
        no_paths = f"family {family.name!r} names no cross-attention paths"
        offer(("cross_q", "cross_k", "cross_v"), all(_has(layers, p) for p in paths), no_paths)
        offer(("cross_z",), _has(layers, family.cross_z_reader), no_paths)
        cross = _has(layers, family.cross_attn) and uses_attention_interface(
            layers[0].get_submodule(family.cross_attn or "")
        )
        offer(("cross_attn_scores", "cross_pattern"), cross, _no_eager(layers, family.cross_attn))
    for kind, reason in family.lacks:
        have.discard(kind)
        missing[kind] = reason
    return have, missing


def _no_eager(layers: Any, path: str | None) -> str:
    return (
        f"{type(layers[0].get_submodule(path or '')).__name__} does not use HF's "
        f"attention-function interface and structlens has no eager forward for it "
        f"(structlens.models.attention.OWN_ATTENTION)"
    )


def _attention_kinds(family: Family, layers: Any, offer: Any) -> None:
    offer(("z",), True, "")
    offer(("q",), _has(layers, family.qkv_proj) or _has(layers, family.q_proj), _no_qkv(family))
    kv = _has(layers, family.qkv_proj) or all(
        _has(layers, p) for p in (family.k_proj, family.v_proj)
    )
    offer(("k", "v"), kv, _no_qkv(family))
    interface = uses_attention_interface(layers[0].get_submodule(family.attn_module))
    no_eager = _no_eager(layers, family.attn_module)
    offer(("attn_scores", "pattern"), interface, no_eager)
    offer(
        ("rot_q", "rot_k"),
        interface and family.rotary,
        no_eager if not interface else "the model has no rotary embeddings",
    )


def _no_qkv(family: Family) -> str:
    return f"family {family.name!r} names no q/k/v projections"


def available_kinds(family: Family, layers: Any) -> tuple[tuple[str, ...], dict[str, str]]:
    """The layer site kinds at least one of ``layers`` has (each layer with its
    :func:`layer_family`), and a reason for each kind none has; :func:`layer_lacks` says which
    layers lack a kind the others have."""
    per_layer = [_kinds_of(layer_family(family, layer), [layer]) for layer in layers]
    have = set().union(*(kinds for kinds, _ in per_layer))
    missing: dict[str, str] = {}
    for _, why in per_layer:
        missing.update({k: r for k, r in why.items() if k not in have and k not in missing})
    for fam in {layer_family(family, layer) for layer in layers}:  # the family's own reasons
        missing.update({k: r for k, r in fam.lacks if k not in have})
    return tuple(k for k in LAYER_KINDS if k in have), missing


def layer_lacks(family: Family, layers: Any) -> list[dict[str, str]]:
    """Per layer, the kinds some other layer of a hybrid model has and this one does not, each
    with the reason; empty dicts for uniform models."""
    kinds = [_kinds_of(layer_family(family, layer), [layer]) for layer in layers]
    have = set().union(*(k for k, _ in kinds))
    return [{k: why[k] for k in LAYER_KINDS if k in have - own} for own, why in kinds]


def text_config(config: Any) -> Any:
    """The config of the text model: a multimodal config's ``text_config``, else ``config``."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def head_dim(family: Family, config: Any) -> int:
    """The per-head width of ``hook_z`` (and of q/k/v where they are offered)."""
    d = getattr(config, family.head_dim_attr, None) or getattr(config, "d_kv", None)
    return int(d or config.hidden_size // config.num_attention_heads)


# ---------------------------------------------------------------------------------------------
# discovery of unregistered architectures

_ATTN = re.compile(r"(self_?attn|self_attention|attention|attn)$")
_MLP = re.compile(r"(mlp|feed_forward|ffn|ff)$")
_OUT = ("o_proj", "out_proj", "dense", "c_proj", "wo")
_MLP_PATHS = (
    ("gate_proj", "up_proj", "down_proj"),
    ("w1", "w3", "w2"),
    ("fc1", None, "fc2"),
    ("fc_in", None, "fc_out"),
    ("c_fc", None, "c_proj"),
    ("dense_h_to_4h", None, "dense_4h_to_h"),
)


def _is_norm(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.LayerNorm) or "Norm" in type(module).__name__


def _path_of(root: torch.nn.Module, target: torch.nn.Module) -> str | None:
    for name, mod in root.named_modules():
        if mod is target:
            return name
    return None


def discover_family(hf: Any) -> Family:
    """A family for ``hf`` found from its module structure (pre-norm decoders).

    Finds the ``ModuleList`` of ``config.num_hidden_layers`` decoder layers, the input
    embedding, the final norm (a norm child of the base model), and in each layer the attention
    and MLP children and the norms before them.  Raises ValueError naming what is missing.
    """
    base = hf.base_model
    cfg = hf.config
    n = getattr(cfg, "num_hidden_layers", None)
    model_type = cfg.model_type
    lists = [
        (name, mod)
        for name, mod in base.named_modules()
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n and name
    ]
    if not lists:
        raise ValueError(f"{model_type}: no ModuleList of num_hidden_layers={n} decoder layers")
    layers_path, layers = lists[0]
    layer = layers[0]
    embed = _path_of(base, hf.get_input_embeddings())
    norms = [name for name, mod in base.named_children() if _is_norm(mod)]
    children = dict(layer.named_children())
    attn = next((k for k in children if _ATTN.search(k)), None)
    mlp = next((k for k in children if _MLP.search(k)), None)
    layer_norms = [k for k, mod in children.items() if _is_norm(mod)]
    problems = []
    if embed is None:
        problems.append("input embedding")
    if len(norms) != 1:
        problems.append(f"one final norm (found {norms})")
    if attn is None or mlp is None:
        problems.append(f"attention and MLP children (layer has {list(children)})")
    if len(layer_norms) not in (1, 2):
        problems.append(f"one or two pre-norms (found {layer_norms})")
    if problems:
        raise ValueError(f"{model_type}: could not find the " + "; ".join(problems))
    assert embed is not None and attn is not None and mlp is not None  # for the type checker
    attn_mod = layer.get_submodule(attn)
    attn_children = dict(attn_mod.named_children())
    out = next((o for o in _OUT if o in attn_children), None)
    if out is None:
        raise ValueError(f"{model_type}: no output projection among {list(attn_children)}")
    qkv: dict[str, Any] = {
        k: f"{attn}.{k}" for k in ("q_proj", "k_proj", "v_proj") if k in attn_children
    }
    mlp_children = dict(layer.get_submodule(mlp).named_children())
    mlp_paths: dict[str, Any] = {}
    for pre, lin, post in _MLP_PATHS:
        if pre in mlp_children and post in mlp_children and (lin is None or lin in mlp_children):
            mlp_paths = dict(
                mlp_pre=f"{mlp}.{pre}",
                mlp_pre_linear=f"{mlp}.{lin}" if lin else None,
                mlp_post_reader=f"{mlp}.{post}",
            )
            break
    parallel = len(layer_norms) == 1
    rotary = any("rotary" in k or "rope" in k for k, _ in hf.named_modules()) or hasattr(
        cfg, "rope_parameters"
    )
    return Family(
        name=f"generic:{model_type}",
        model_types=(model_type,),
        layers=layers_path,
        embed=embed,
        final_norm=norms[0],
        attn_write=attn,
        mlp_write=mlp,
        mid_reader=None if parallel else layer_norms[1],
        parallel=parallel,
        z_reader=f"{attn}.{out}",
        ln1=layer_norms[0],
        ln2=None if parallel else layer_norms[1],
        rotary=rotary,
        **(qkv if len(qkv) == 3 else {}),
        **mlp_paths,
    )


@torch.no_grad()
def residual_identity_errors(model: Any, input_ids: torch.Tensor) -> dict[str, float]:
    """Relative errors of ``resid_pre + attn_out = resid_mid`` and ``resid_mid + mlp_out =
    resid_post`` per layer (with ``resid_mid + cross_attn_out = resid_mid_cross`` in decoder
    layers of encoder–decoders), and of layer chaining within a stack, on one forward pass of
    ``model.hf``.

    Uses plain forward hooks on the family's modules (not the hook sessions), so it is an
    independent check of the adapter.
    """
    seen: dict[tuple[str, int], torch.Tensor] = {}
    handles = []

    def first(t: Any) -> torch.Tensor:
        return t[0] if isinstance(t, tuple) else t

    def grab(key, use_input, fam):
        def hook(mod, args, kwargs, out):
            t = (args[0] if args else kwargs["hidden_states"]) if use_input else first(out)
            # copy only where the family says the layer adds into the MLP's output in place, as
            # the hooks do: an adapter that does not know it (Falcon) must fail
            copy = key[0] == "mlp" and fam.copy_mlp_out
            seen[key] = t.detach().clone() if copy else t.detach()

        return hook

    for i, layer in enumerate(model.layers):
        fam = model.family_at(i)
        spec = [("pre", layer, True), ("post", layer, False)]
        spec.append(("attn", layer.get_submodule(fam.attn_write), False))
        spec.append(("mlp", layer.get_submodule(fam.mlp_write), False))
        if fam.mid_reader and not model.parallel:
            spec.append(("mid", layer.get_submodule(fam.mid_reader), True))
        if fam.cross_write:
            spec.append(("cross", layer.get_submodule(fam.cross_write), False))
            spec.append(("midx", layer.get_submodule(fam.cross_mid_reader), True))
        for key, mod, use_input in spec:
            hook = grab((key, i), use_input, fam)
            handles.append(mod.register_forward_hook(hook, with_kwargs=True))
    try:
        model.forward(input_ids, torch.ones_like(input_ids))
    finally:
        for h in handles:
            h.remove()
    errs = {}
    for i in range(model.n_layers):
        pre, post = seen[("pre", i)], seen[("post", i)]
        attn, mlp = (seen[(k, i)] * model.residual_scale for k in ("attn", "mlp"))
        mid = seen.get(("mid", i), pre + attn)
        scale = float(post.abs().max().clamp_min(1e-12))
        errs[f"mid{i}"] = float((pre + attn - mid).abs().max()) / scale
        if ("cross", i) in seen:  # encoder–decoder decoder layer
            midx = seen[("midx", i)]
            errs[f"cross{i}"] = float((mid + seen[("cross", i)] - midx).abs().max()) / scale
            mid = midx
        errs[f"post{i}"] = float((mid + mlp - post).abs().max()) / scale
        # an encoder–decoder's encoder output is not its decoder's input
        if i + 1 < model.n_layers and i + 1 != (model.stacks or {}).get("decoder", (0,))[0]:
            errs[f"chain{i}"] = float((post - seen[("pre", i + 1)]).abs().max()) / scale
    return errs


def family_of(hf: Any) -> Family:
    """The registered family of ``hf``'s model type, else one discovered from its modules
    (printing a note; :func:`verify_family` checks it once the model is built)."""
    from structlens.models.families import UNSUPPORTED, family_for, registered_families

    model_type = hf.config.model_type
    if model_type in UNSUPPORTED and all(
        model_type not in f.model_types for f in registered_families()
    ):
        raise ValueError(f"model_type {model_type!r}: {UNSUPPORTED[model_type]}.")
    try:
        return family_for(model_type)
    except ValueError as err:
        try:
            fam = discover_family(hf)
        except ValueError as why:
            raise ValueError(f"{err} Automatic discovery failed too: {why}.") from None
    print(
        f"structlens: no registered family for model_type {model_type!r}; using a generic "
        f"adapter discovered from the module structure (layers={fam.layers!r}, "
        f"attention={fam.attn_write!r}, mlp={fam.mlp_write!r}, "
        f"{'parallel' if fam.parallel else 'sequential'}), verified on one forward pass."
    )
    return fam


def verify_family(model: Any) -> None:
    """Refuse (ValueError) a family whose residual identities fail on one forward pass of
    ``model``: a discovered adapter that guessed wrong, or a registered one that does not fit
    this checkpoint's configuration.  Post-LN families are skipped (their ``attn_out`` and
    ``mlp_out`` are differences, so the identities hold by construction)."""
    if model.family.post_ln:
        return
    tol = 1e-4 if model.dtype in (torch.float32, torch.float64) else 5e-2
    ids = torch.arange(3, 11, device=model.device).reshape(1, 8) % model.config.vocab_size
    errs = residual_identity_errors(model, ids)
    bad = {k: f"{v:.1e}" for k, v in errs.items() if not v <= tol}
    if not bad:
        return
    fam = model.family
    what = (
        f"the adapter discovered for model_type {model.config.model_type!r}"
        if fam.name.startswith("generic:")
        else f"the registered {fam.name!r} family, with this checkpoint's configuration,"
    )
    raise ValueError(
        f"{what} fails the residual identities (relative errors {bad}); its sites would be "
        f"wrong. Register a matching Family with structlens.models.register_family "
        f"(replace=True to override a built-in one; docs/sites.md)."
    )

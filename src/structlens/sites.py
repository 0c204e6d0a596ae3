"""The site grammar: TransformerLens-style names for places in a transformer.

Valid names::

    hook_embed                       token embeddings (GPT-2 also has hook_pos_embed)
    blocks.{l}.hook_resid_pre        input of layer l
    blocks.{l}.hook_resid_mid        between attention and MLP (= resid_pre + attn_out)
    blocks.{l}.hook_resid_post       output of layer l (= resid_mid + mlp_out)
    blocks.{l}.hook_attn_out         attention's residual contribution
    blocks.{l}.hook_mlp_out          MLP's residual contribution
    blocks.{l}.attn.hook_z           per-head outputs before the output projection
    ln_final.hook_normalized         output of the final norm (causal LMs)
    logits                           the unembedding output (causal LMs)

Layer indices are zero-based; negative indices count from the end (``blocks.-1.hook_resid_post``)
and are normalised to non-negative ones.  ``docs/sites.md`` and
:mod:`structlens.models.families` say where each family's sites come from.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

LAYER_KINDS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "z")
MODEL_KINDS = ("embed", "pos_embed", "ln_final", "logits")

_BLOCK_RE = re.compile(
    r"^blocks\.(-?\d+)\.(hook_resid_pre|hook_resid_mid|hook_resid_post|"
    r"hook_attn_out|hook_mlp_out|attn\.hook_z)$"
)
_MODEL_NAMES = {
    "hook_embed": "embed",
    "hook_pos_embed": "pos_embed",
    "ln_final.hook_normalized": "ln_final",
    "logits": "logits",
}


class SiteError(ValueError):
    """An unknown or malformed site name."""


@dataclass(frozen=True, order=True)
class Site:
    """A parsed site: ``kind`` (one of LAYER_KINDS or MODEL_KINDS) and ``layer`` (or None)."""

    kind: str
    layer: int | None = None

    @property
    def name(self) -> str:
        if self.layer is None:
            return {v: k for k, v in _MODEL_NAMES.items()}[self.kind]
        if self.kind == "z":
            return f"blocks.{self.layer}.attn.hook_z"
        return f"blocks.{self.layer}.hook_{self.kind}"

    def __str__(self) -> str:
        return self.name


def site_name(kind: str, layer: int | None = None, *, n_layers: int | None = None) -> str:
    """The one way to build a site name from its parts.

    ``site_name("resid_pre", 3)`` is ``"blocks.3.hook_resid_pre"``; model-level kinds take no
    layer (``site_name("logits")``).  With ``n_layers`` the layer is checked and a negative one
    counts from the end.

    >>> site_name("resid_post", -1, n_layers=30)
    'blocks.29.hook_resid_post'
    """
    if kind in MODEL_KINDS:
        if layer is not None:
            raise SiteError(f"site kind {kind!r} has no layer, got layer={layer}.")
        return Site(kind).name
    if kind not in LAYER_KINDS:
        raise SiteError(f"unknown site kind {kind!r}; expected one of {LAYER_KINDS + MODEL_KINDS}.")
    if layer is None:
        raise SiteError(f"site kind {kind!r} needs a layer.")
    if n_layers is not None:
        if not -n_layers <= layer < n_layers:
            raise SiteError(
                f"layer {layer} is out of range for a model with {n_layers} layers "
                f"(valid: 0..{n_layers - 1}, or negative from the end)."
            )
        layer %= n_layers
    return Site(kind, layer).name


def all_site_names(n_layers: int, *, causal: bool = True, pos_embed: bool = False) -> list[str]:
    """Every valid site name for a model with ``n_layers`` layers, in forward order."""
    names = ["hook_embed"] + (["hook_pos_embed"] if pos_embed else [])
    for layer in range(n_layers):
        for kind in LAYER_KINDS:
            names.append(Site(kind, layer).name)
    if causal:
        names += ["ln_final.hook_normalized", "logits"]
    return names


def parse_site(
    name: str | Site, n_layers: int, *, causal: bool = True, pos_embed: bool = False
) -> Site:
    """Parse and validate a site name for a model with ``n_layers`` layers.

    Raises
    ------
    SiteError
        If the name is malformed, names a layer out of range, or a site the model lacks; the
        message lists the closest valid names.
    """
    if isinstance(name, Site):
        name = name.name
    if not isinstance(name, str):
        raise SiteError(f"site names are strings like 'blocks.3.hook_resid_pre', got {name!r}")
    valid = all_site_names(n_layers, causal=causal, pos_embed=pos_embed)
    m = _BLOCK_RE.match(name)
    if m:
        layer = int(m.group(1))
        if not -n_layers <= layer < n_layers:
            raise SiteError(
                f"site {name!r}: layer {layer} is out of range for a model with {n_layers} "
                f"layers (valid: 0..{n_layers - 1}, or negative from the end)."
            )
        kind = m.group(2).removeprefix("attn.").removeprefix("hook_")
        return Site(kind, layer % n_layers)
    if name in _MODEL_NAMES and name in valid:
        return Site(_MODEL_NAMES[name])
    close = difflib.get_close_matches(name, valid, n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise SiteError(
        f"unknown site {name!r}.{hint} Run `structlens sites MODEL` to list all sites; the "
        f"grammar is blocks.{{l}}.hook_resid_pre|hook_resid_mid|hook_resid_post|hook_attn_out|"
        f"hook_mlp_out, blocks.{{l}}.attn.hook_z, hook_embed, ln_final.hook_normalized, logits."
    )

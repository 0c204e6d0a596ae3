"""Options of the ``structlens causal-dim`` commands, declared once: ``--protocol`` and the
options that override one of its fields (each defaults to the protocol's value, its help is
the field's), as ``name: (Annotated type, default)`` blocks for
:func:`structlens.cli.common.shared_settings`."""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from structlens.causal_dim.protocol import CausalProtocol
from structlens.cli.checks import Calls, Holds, Parsed
from structlens.cli.options import AllowForeign, parse_ints
from structlens.cli.pretrained_options import unpublished_message, unpublished_saes
from structlens.cli.sae_options import SAEDir, parse_widths
from structlens.errors import InputError


def protocol_help(field: str) -> str:
    """The protocol field's help text (its metadata) and default: one place for the words."""
    return CausalProtocol.field_help(field)


def load_protocol(spec: str) -> CausalProtocol:
    """A protocol by profile name (:data:`structlens.causal_dim.protocol.PROFILES`) or from a
    JSON file of its fields (as the ``protocol`` of a command's JSON holds it)."""
    from structlens.causal_dim.protocol import PROFILES

    return CausalProtocol.load(spec, PROFILES, "causal-dimensionality")


#: Options that set a protocol field: option (parameter) name -> field name.
PROTOCOL_OPTIONS = {
    "jacobian_prompts": "kappa_max_vectors",
    "jacobian_tokens": "jacobian_tokens",
    "output": "jacobian_output",
    "positions": "jacobian_positions",
    "prompt_tokens": "chunk_tokens",
    "widths": "sweep_widths",
    "k": "sae_k",
    "prompts": "sae_train_prompts",
    "eval_prompts": "sae_eval_prompts",
    "epochs": "sae_max_epochs",
    "batch_size": "sae_batch_size",
    "lr_base": "sae_lr_base",
    "percentile": "percentile",
    "min_count": "min_count",
    "n_bootstrap": "sweep_bootstrap",
    "n_blocks": "sweep_blocks",
    "extra_prompts": "sae_train_extra",
    "generated_prompts": "sae_generated_prompts",
    "fvu_tolerance": "fvu_rise_tol",
}
#: The protocol fields as the options that set them, in the messages of its errors.
FLAGS = {field: f"--{option.replace('_', '-')}" for option, field in PROTOCOL_OPTIONS.items()}
FLAGS |= {"kappa_max_vectors": "--jacobian-prompts", "sweep_bootstrap": "--bootstrap"}
FLAGS |= {"sweep_blocks": "--blocks", "chunk_tokens": "--prompt-tokens", "widths": "--widths"}


def protocol_of(settings: dict[str, Any], seed: int) -> CausalProtocol:
    """The protocol a command runs: ``--protocol`` with the protocol options that were given
    (popped from ``settings``) and ``seed``.  A ``--jacobian-prompts`` below the protocol's
    first doubling size also starts the doubling there."""
    given = {PROTOCOL_OPTIONS[o]: settings.pop(o) for o in list(settings) if o in PROTOCOL_OPTIONS}
    given = {field: value for field, value in given.items() if value is not None}
    if "sweep_widths" in given:
        given["sweep_widths"] = parse_widths(given["sweep_widths"])
    protocol = load_protocol(settings.pop("protocol"))
    cap = given.get("kappa_max_vectors")
    if isinstance(cap, int) and cap < protocol.kappa_start:
        given["kappa_start"] = max(2, cap)
    return protocol.replace(seed=seed, **given)


def _known_protocol(spec: str) -> None:
    load_protocol(spec)


def check_layers(spec: str, n_layers: int) -> list[int]:
    """``--layers`` within the model's ``n_layers`` (a one-line error otherwise)."""
    layers = list(parse_ints(spec, "--layers"))
    if any(not 0 <= x < n_layers for x in layers):
        raise InputError(f"layers must lie in [0, {n_layers}); got {layers}.")
    return layers


Protocol = Annotated[
    str,
    typer.Option(
        "--protocol",
        help="The causal-dimensionality protocol: a name (paper, gpu, smoke) or a JSON file "
        "of its fields; the options below override its fields.",
    ),
    Calls(_known_protocol),
]
Layers = Annotated[
    str,
    typer.Option("--layers", help="Comma-separated layers."),
    Parsed(
        lambda spec: list(parse_ints(spec, "--layers")),
        lambda layers: min(layers) >= 0,
        "layers must name layers >= 0; got {parsed}.",
    ),
]
Layer = Annotated[
    int, typer.Option("--layer", help="Residual stream blocks.{layer}.hook_resid_pre.")
]
Widths = Annotated[
    str | None,
    typer.Option("--widths", help=protocol_help("sweep_widths") + " Comma-separated."),
    Parsed(
        lambda spec: None if spec is None else list(parse_widths(spec)),
        lambda ws: ws is None or (bool(ws) and min(ws) >= 1),
        "widths must be positive integers; got {parsed}.",
    ),
]


PretrainedSAEs = Annotated[
    list[str] | None,
    typer.Option(
        "--saes",
        help="A published SAE of the sweep: RELEASE/SAE_ID from the registry "
        "(structlens.sae.registry) or a folder in a published layout (SAELens, Gemma Scope, "
        "sparsify, Llama Scope); repeat once per width. Given, no SAE is trained.",
    ),
    Holds(
        lambda specs: not unpublished_saes(specs),
        lambda specs: unpublished_message("--saes", unpublished_saes(specs)[0]),
    ),
]


def _field(option: str, kind: Any, field: str) -> tuple[Any, None]:
    """An option overriding ``field`` (``None``: the protocol's value)."""
    return (Annotated[kind | None, typer.Option(option, help=protocol_help(field))], None)


JACOBIAN = {
    "protocol": (Protocol, "paper"),
    "jacobian_prompts": _field("--jacobian-prompts", int, "kappa_max_vectors"),
    "jacobian_tokens": _field("--jacobian-tokens", int, "jacobian_tokens"),
    "output": _field("--output", str, "jacobian_output"),
    "positions": _field("--positions", str, "jacobian_positions"),
    "prompt_tokens": _field("--prompt-tokens", int, "chunk_tokens"),
}
SWEEP = {
    "protocol": (Protocol, "paper"),
    "layer": (Layer, 0),
    "widths": (Widths, None),
    "k": _field("--k", int, "sae_k"),
    "prompts": _field("--prompts", int, "sae_train_prompts"),
    "eval_prompts": _field("--eval-prompts", int, "sae_eval_prompts"),
    "prompt_tokens": _field("--prompt-tokens", int, "chunk_tokens"),
    "epochs": _field("--epochs", int, "sae_max_epochs"),
    "batch_size": _field("--batch-size", int, "sae_batch_size"),
    "lr_base": _field("--lr-base", float, "sae_lr_base"),
    "percentile": _field("--percentile", float, "percentile"),
    "min_count": _field("--min-count", int, "min_count"),
    "n_bootstrap": _field("--bootstrap", int, "sweep_bootstrap"),
    "n_blocks": _field("--blocks", int, "sweep_blocks"),
    "extra_prompts": _field("--extra-prompts", int, "sae_train_extra"),
    "generated_prompts": _field("--generated-prompts", int, "sae_generated_prompts"),
    "fvu_tolerance": _field("--fvu-tolerance", float, "fvu_rise_tol"),
    "jacobian_prompts": _field("--jacobian-prompts", int, "kappa_max_vectors"),
    "jacobian_tokens": _field("--jacobian-tokens", int, "jacobian_tokens"),
    "saes": (PretrainedSAEs, None),
    "allow_foreign": (AllowForeign, False),
}
ABLATE = {
    "sae": (SAEDir, inspect.Parameter.empty),
    "layer": (Layer, 0),
    "protocol": (Protocol, "paper"),
    "eval_prompts": _field("--eval-prompts", int, "sae_eval_prompts"),
    "prompt_tokens": _field("--prompt-tokens", int, "chunk_tokens"),
    "allow_foreign": (AllowForeign, False),
}

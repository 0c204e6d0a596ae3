"""Options of the ``structlens equiv`` commands, declared once with their checks.

Every option but ``--protocol`` sets one field of the
:class:`~structlens.equivalence.protocol.EquivalenceProtocol` the command runs
(:data:`PROTOCOL_OPTIONS`); left out, it takes the protocol's value, so every default lives in
the protocol.  Help texts are the fields' own (:func:`protocol_help`).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from structlens.cli.checks import Calls, at_least, check_task, choice, one_of
from structlens.equivalence.protocol import METRIC_NAMES, MIN_PROBE_PROMPTS, EquivalenceProtocol


def protocol_help(field: str) -> str:
    """The protocol field's help text (its metadata) and default: one place for the words."""
    return EquivalenceProtocol.field_help(field)


def load_protocol(spec: str) -> EquivalenceProtocol:
    """A protocol by profile name (:data:`structlens.equivalence.protocol.PROFILES`) or from a
    JSON file of its fields (the ``protocol`` block of any ``equiv`` JSON document)."""
    from structlens.equivalence.protocol import PROFILES

    return EquivalenceProtocol.load(spec, PROFILES, "equivalence")


def protocol_of(settings: dict[str, Any], seed: int, **fixed: Any) -> EquivalenceProtocol:
    """The protocol a command runs: ``--protocol`` with the protocol options that were given
    (popped from ``settings``), ``seed`` and the fields a command ``fixed``."""
    given = {PROTOCOL_OPTIONS[o]: settings.pop(o) for o in list(settings) if o in PROTOCOL_OPTIONS}
    given = {field: value for field, value in given.items() if value is not None}
    return load_protocol(settings.pop("protocol")).replace(seed=seed, **given, **fixed)


#: Options that set a protocol field: option (parameter) name -> field name.
PROTOCOL_OPTIONS = {
    "task": "probe",
    "n": "probe_prompts",
    "metric": "metric",
    "layer_matching": "layer_matching",
    "head_matching": "head_matching",
    "representation": "representation",
    "map_method": "map_method",
    "relation": "relation",
    "first_layer": "first_layer",
    "max_kl": "max_kl",
    "min_top1": "min_top1",
    "max_validate_heads": "max_validate_heads",
    "head_subset": "head_subset",
    "head_groups": "validate_head_groups",
    "congruity": "congruity",
    "top_k": "congruity_top_k",
    "congruity_max_layers": "congruity_max_layers",
    "threshold": "similarity_threshold",
    "batch_size": "batch_size",
}
# protocol fields as the options that set them, in the messages of the protocol's errors
FLAGS = {
    "probe_prompts": "-n",
    "layer_matching": "--layer-matching",
    "head_matching": "--head-matching",
    "representation": "--representation",
    "map_method": "--map",
    "relation": "--relation",
    "first_layer": "--first-layer",
    "congruity_top_k": "--top-k",
    "similarity_threshold": "--threshold",
}
POSITIVE = "congruity_top_k and batch_size must be positive."

Protocol = Annotated[
    str,
    typer.Option(
        "--protocol",
        help="The equivalence protocol: a name (paper, paper-subset, paper-sentence, "
        "paper-cross-family, smoke) or "
        "a JSON file of its fields; the options below override its fields.",
    ),
    Calls(load_protocol),
]
Task = Annotated[
    str | None,
    typer.Option("--task", help=protocol_help("probe")),
    Calls(lambda t: check_task(t, also=("corpus",))),
]
N = Annotated[
    int | None,
    typer.Option("-n", help=protocol_help("probe_prompts")),
    at_least(
        MIN_PROBE_PROMPTS,
        f"too few probe prompts (-n {{value}}); compare needs at least {MIN_PROBE_PROMPTS} "
        "(half fit the similarities and maps, half validate).",
    ),
]
Metric = Annotated[
    str | None,
    typer.Option("--metric", help=protocol_help("metric") + f" One of {', '.join(METRIC_NAMES)}."),
    one_of(METRIC_NAMES, f"unknown metric {{value!r}}; choose one of {list(METRIC_NAMES)}."),
]
LayerMatching = Annotated[
    str | None,
    typer.Option("--layer-matching", help=protocol_help("layer_matching")),
    choice("layer_matching", ("monotone", "hungarian")),
]
HeadMatching = Annotated[
    str | None,
    typer.Option("--head-matching", help=protocol_help("head_matching")),
    choice("head_matching", ("global", "per_layer")),
]
Representation = Annotated[
    str | None,
    typer.Option("--representation", help=protocol_help("representation")),
    choice("representation", ("auto", "tokens", "sentence")),
]
BatchSize = Annotated[
    int | None,
    typer.Option("--batch-size", help=protocol_help("batch_size")),
    at_least(1, POSITIVE),
]
MapMethod = Annotated[
    str | None,
    typer.Option("--map", help=protocol_help("map_method")),
    choice("map_method", ("ridge", "procrustes")),
]
Relation = Annotated[
    str | None,
    typer.Option("--relation", help=protocol_help("relation")),
    choice("relation", ("independent", "copy")),
]
FirstLayer = Annotated[
    int | None,
    typer.Option("--first-layer", help=protocol_help("first_layer")),
    at_least(0, "first_layer must be an integer >= 0; got {value}."),
]
MaxKL = Annotated[float | None, typer.Option("--max-kl", help=protocol_help("max_kl"))]
MinTop1 = Annotated[float | None, typer.Option("--min-top1", help=protocol_help("min_top1"))]
MaxHeads = Annotated[
    int | None,
    typer.Option("--max-validate-heads", help=protocol_help("max_validate_heads")),
    at_least(1, "max_validate_heads must be >= 1 or null; got {value}."),
]
HeadSubset = Annotated[
    str | None,
    typer.Option("--head-subset", help=protocol_help("head_subset")),
    choice("head_subset", ("null_kl", "random")),
]
HeadGroups = Annotated[
    bool | None,
    typer.Option("--head-groups/--no-head-groups", help=protocol_help("validate_head_groups")),
]
Congruity = Annotated[
    bool | None, typer.Option("--congruity/--no-congruity", help=protocol_help("congruity"))
]
TopK = Annotated[
    int | None,
    typer.Option("--top-k", help=protocol_help("congruity_top_k")),
    at_least(1, POSITIVE),
]
CongruityLayers = Annotated[
    int | None,
    typer.Option("--congruity-max-layers", help=protocol_help("congruity_max_layers")),
    at_least(1, "congruity_max_layers must be >= 1 or null; got {value}."),
]
Threshold = Annotated[
    float | None, typer.Option("--threshold", help=protocol_help("similarity_threshold"))
]

# the probe, the matching and the protocol, shared by every command
PROBES = {
    "protocol": (Protocol, "paper"),
    "task": (Task, None),
    "n": (N, None),
    "metric": (Metric, None),
    "layer_matching": (LayerMatching, None),
    "head_matching": (HeadMatching, None),
    "representation": (Representation, None),
}
# the patching validation, the null and CONGRUITY (compare and sanity)
VALIDATION = {
    "map_method": (MapMethod, None),
    "relation": (Relation, None),
    "first_layer": (FirstLayer, None),
    "max_kl": (MaxKL, None),
    "min_top1": (MinTop1, None),
    "max_validate_heads": (MaxHeads, None),
    "head_subset": (HeadSubset, None),
    "head_groups": (HeadGroups, None),
    "congruity": (Congruity, None),
    "top_k": (TopK, None),
    "congruity_max_layers": (CongruityLayers, None),
    "batch_size": (BatchSize, None),
}

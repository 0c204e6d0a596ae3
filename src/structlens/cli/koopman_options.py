"""Options the ``structlens koopman`` commands share, declared once: the data and EDMDc
settings of every command (:data:`DATA`), the dictionary fits' options (:func:`streams`) and
those of ``reduce`` (:data:`REDUCE`), each as ``name: (Annotated type, default)`` for
:func:`structlens.cli.common.shared_settings`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from structlens.cli.checks import Calls, Holds, Parsed, at_least
from structlens.cli.options import AllowForeign, parse_ints, parse_names
from structlens.cli.pretrained_options import unpublished_message, unpublished_saes
from structlens.koopman.protocol import DICTIONARY_NAMES, KoopmanProtocol


def protocol_help(field: str) -> str:
    """The protocol field's help text (its metadata) and default: one place for the words."""
    return KoopmanProtocol.field_help(field)


def load_protocol(spec: str) -> KoopmanProtocol:
    """A protocol by profile name (:data:`structlens.koopman.protocol.PROFILES`) or from a
    JSON file of its fields (as ``settings.protocol`` of a replication or the ``protocol``
    of a command's JSON holds it)."""
    from structlens.koopman.protocol import PROFILES

    return KoopmanProtocol.load(spec, PROFILES, "Koopman")


def protocol_of(settings: dict[str, Any], analysis: str, seed: int) -> KoopmanProtocol:
    """The protocol a command runs: ``--protocol`` with the protocol options that were given
    (popped from ``settings``) and ``seed``."""
    given = {PROTOCOL_OPTIONS[o]: settings.pop(o) for o in list(settings) if o in PROTOCOL_OPTIONS}
    given = {field: value for field, value in given.items() if value is not None}
    if analysis == "convergence" and "control_rank" in given:
        # split-half fits are single-block fits: their control rank is the protocol's own
        given["split_half_control_rank"] = given.pop("control_rank")
    return load_protocol(settings.pop("protocol")).replace(seed=seed, **given)


def _known_protocol(spec: str) -> None:
    load_protocol(spec)


#: Options that set a protocol field: option (parameter) name -> field name.
PROTOCOL_OPTIONS = {
    "alpha": "alpha",
    "control_energy": "control_energy",
    "control_rank": "control_rank",
    "n_blocks": "split_half_blocks",
    "n_repeats": "split_half_repeats",
    "mom_blocks": "mom_blocks",
}


def _unknown_dictionary(spec: str) -> str:
    unknown = [d for d in parse_names(spec) if d not in DICTIONARY_NAMES]
    return f"unknown dictionary {unknown[0]!r}; choose from {', '.join(DICTIONARY_NAMES)}."


# the checks say what KoopmanExperimentConfig would (FLAGS turn its fields into options)
DATA_SIZES = "n_corpus and n_task must be >= 0 and not both 0."
ModelOpt = Annotated[str, typer.Argument(help="Model alias, HF name or local path.")]
Layers = Annotated[
    str,
    typer.Option("--layers", help="Layers: '8', '4,8,12' or a range '6-10' (inclusive)."),
    Parsed(
        lambda spec: parse_ints(spec, "--layers"),
        lambda layers: min(layers) >= 0,
        "layers must name at least one layer >= 0; got {parsed}.",
    ),
]
Pooled = Annotated[
    bool, typer.Option("--pooled", help="One operator pooled over all --layers (else per layer).")
]
Dicts = Annotated[
    str,
    typer.Option("--dictionary", help=f"Comma list of {', '.join(DICTIONARY_NAMES)}."),
    Holds(lambda s: all(d in DICTIONARY_NAMES for d in parse_names(s)), _unknown_dictionary),
    Holds(lambda s: bool(parse_names(s)), "dictionaries names no dictionary."),
]
Size = Annotated[
    int,
    typer.Option("--size", help="PCA k / RFF, ReLU D / spectral modes."),
    at_least(1, "dictionary size must be >= 1, got {value}."),
]
SAEPath = Annotated[
    Path | None,
    typer.Option(
        "--sae",
        help="SAE or transcoder for 'sae': a folder in a published layout (SAELens, Gemma "
        "Scope, sparsify, Llama Scope) or RELEASE/SAE_ID from structlens.sae.registry.",
    ),
    Holds(
        lambda p: not unpublished_saes([str(p)]),
        lambda p: unpublished_message("--sae", str(p)),
    ),
]
NCorpus = Annotated[
    int, typer.Option("--n-corpus", help="Corpus chunks (prompts)."), at_least(0, DATA_SIZES)
]
PromptTokens = Annotated[int, typer.Option("--prompt-tokens", help="Tokens per corpus chunk.")]
NTask = Annotated[
    int,
    typer.Option("--n-task", help="IOI prompts added to the data (0: none)."),
    Holds(lambda n, n_corpus: n >= 0 and n + n_corpus > 0, DATA_SIZES, uses=("n_corpus",)),
]
Protocol = Annotated[
    str,
    typer.Option(
        "--protocol",
        help="The Koopman protocol: a name (paper, smoke) or a JSON file of its fields; "
        "the options below override its fields.",
    ),
    Calls(_known_protocol),
]
Alpha = Annotated[float | None, typer.Option("--alpha", help=protocol_help("alpha"))]
Energy = Annotated[
    float | None,
    typer.Option("--control-energy", help=protocol_help("control_energy")),
]
Rank = Annotated[
    int | None,
    typer.Option(
        "--control-rank",
        help=protocol_help("control_rank") + " In convergence: the split-half fits' control rank.",
    ),
]
DATA = {
    "layers": (Layers, "8"),
    "n_corpus": (NCorpus, 200),
    "prompt_tokens": (PromptTokens, 64),
    "n_task": (NTask, 50),
    "protocol": (Protocol, "paper"),
    "alpha": (Alpha, None),
    "control_energy": (Energy, None),
    "control_rank": (Rank, None),
}


def streams(dictionary: str, size: int) -> dict[str, tuple[Any, Any]]:
    """The options of the dictionary fits (their defaults differ by command)."""
    return DATA | {
        "pooled": (Pooled, False),
        "dictionary": (Dicts, dictionary),
        "size": (Size, size),
        "sae": (SAEPath, None),
        "allow_foreign": (AllowForeign, False),
    }


# `reduce` fits one pooled operator, with one dictionary
REDUCE = DATA | {
    "layers": (Layers, "4-12"),
    "dictionary": (Annotated[str, typer.Option("--dictionary", help="One dictionary.")], "pca"),
    "size": (Size, 32),
    "sae": (SAEPath, None),
    "allow_foreign": (AllowForeign, False),
}

OUT = Path("koopman-out")
# config fields as the options that set them, in the messages of configs' errors
FLAGS = {
    "dictionaries": "--dictionary",
    "orders": "--order",
    "split_half_blocks": "--n-blocks",
    "split_half_repeats": "--n-repeats",
}

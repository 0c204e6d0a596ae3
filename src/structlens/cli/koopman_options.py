"""Options the ``structlens koopman`` commands share, declared once: the data and EDMDc
settings of every command (:data:`DATA`), the dictionary fits' options (:func:`streams`) and
those of ``reduce`` (:data:`REDUCE`), each as ``name: (Annotated type, default)`` for
:func:`structlens.cli.common.shared_settings`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from structlens.cli.checks import DICTIONARY_NAMES, Holds, Parsed, at_least
from structlens.cli.options import AllowForeign, parse_ints, parse_names


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
    typer.Option("--dictionary", help="Comma list of identity, pca, rff, relu, spectral, sae."),
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
    typer.Option("--sae", help="SAELens-format SAE directory (for 'sae')."),
    Holds(Path.exists, "SAE path {value} does not exist."),
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
Alpha = Annotated[float, typer.Option("--alpha", help="Relative ridge of the EDMDc solve.")]
Energy = Annotated[
    float, typer.Option("--control-energy", help="Fraction of Var(attn_out) kept in u.")
]
Rank = Annotated[
    int | None,
    typer.Option("--control-rank", help="Keep this many PCs of u (overrides --control-energy)."),
]
DATA = {
    "layers": (Layers, "8"),
    "n_corpus": (NCorpus, 200),
    "prompt_tokens": (PromptTokens, 64),
    "n_task": (NTask, 50),
    "alpha": (Alpha, 1e-6),
    "control_energy": (Energy, 0.99),
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
    "n_blocks": "--n-blocks",
    "n_repeats": "--n-repeats",
}

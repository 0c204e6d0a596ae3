"""Options the ``structlens koopman`` commands share, declared once: the data and EDMDc
settings of every command (:data:`DATA`), the dictionary fits' options (:func:`streams`) and
those of ``reduce`` (:data:`REDUCE`), each as ``name: (Annotated type, default)`` for
:func:`structlens.cli.common.shared_settings`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from structlens.cli.options import AllowForeign

ModelOpt = Annotated[str, typer.Argument(help="Model alias, HF name or local path.")]
Layers = Annotated[
    str, typer.Option("--layers", help="Layers: '8', '4,8,12' or a range '6-10' (inclusive).")
]
Pooled = Annotated[
    bool, typer.Option("--pooled", help="One operator pooled over all --layers (else per layer).")
]
Dicts = Annotated[
    str, typer.Option("--dictionary", help="Comma list of identity, pca, rff, relu, spectral, sae.")
]
Size = Annotated[int, typer.Option("--size", help="PCA k / RFF, ReLU D / spectral modes.")]
SAEPath = Annotated[
    Path | None, typer.Option("--sae", help="SAELens-format SAE directory (for 'sae').")
]
NCorpus = Annotated[int, typer.Option("--n-corpus", help="Corpus chunks (prompts).")]
PromptTokens = Annotated[int, typer.Option("--prompt-tokens", help="Tokens per corpus chunk.")]
NTask = Annotated[int, typer.Option("--n-task", help="IOI prompts added to the data (0: none).")]
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

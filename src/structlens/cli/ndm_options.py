"""Options several ``structlens ndm`` commands share, declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from structlens.cli.checks import Holds

TrainDir = Annotated[
    Path,
    typer.Option("--train", help="Output directory of `ndm train` (ndm_train.json)."),
    # the words of structlens.ndm.collect.load_train_meta
    Holds(
        lambda p: (p / "ndm_train.json").exists(),
        lambda p: (
            f"{p / 'ndm_train.json'} not found; run `structlens ndm train ... --out {p}` first"
        ),
    ),
]
Activations = Annotated[Path, typer.Option(help="Root of the activation store cache.")]
OUT = Path("results/ndm")
# config fields as the options that set them, in the messages of configs' errors
FLAGS = {"layers": "--layers", "capture_layers": "--capture-layers"}

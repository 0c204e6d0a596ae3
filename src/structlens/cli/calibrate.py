"""``structlens calibrate``: measure decision rules and intervals on planted structure and write
``calibration.md`` and ``calibration.json`` (the same as ``python -m structlens.calibration``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from structlens.cli.checks import checked

Profile = Literal["cpu", "smoke"]


@checked
def calibrate(
    profile: Annotated[
        Profile, typer.Option(help="cpu (200 instances per family) or smoke (20).")
    ] = "cpu",
    out: Annotated[Path, typer.Option(help="Where calibration.md and calibration.json go.")] = Path(
        "docs"
    ),
) -> None:
    """Run every calibration of the profile through the production stages."""
    from structlens.calibration.run import main

    main(["--profile", profile, "--doc-dir", str(out)])


def register(app: typer.Typer) -> None:
    app.command()(calibrate)

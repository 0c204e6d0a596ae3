"""``structlens report DIR``: re-render DIR/report.html from DIR/analysis.json."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from structlens.cli.output import console, fail


def report(
    directory: Annotated[
        Path, typer.Argument(help="Output directory of `structlens analyze` (holds analysis.json).")
    ],
) -> None:
    """Re-render the HTML report from the cached analysis, without recomputing anything."""
    from structlens.report.html import write_report

    try:
        path = write_report(directory)
    except FileNotFoundError as err:
        fail(str(err))
    console.print(f"report: {path}")


def register(app: typer.Typer) -> None:
    app.command("report")(report)

"""The ``structlens`` command."""

from __future__ import annotations

import typer

from structlens.cli import capture, demo, models, tasks

app = typer.Typer(
    name="structlens",
    help="Identifiable mechanistic interpretability: structure a transformer determines "
    "itself, with error bars.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
models.register(app)
capture.register(app)
app.add_typer(tasks.app, name="tasks")
demo.register(app)

if __name__ == "__main__":  # pragma: no cover
    app()

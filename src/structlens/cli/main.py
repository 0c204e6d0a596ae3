"""The ``structlens`` command."""

from __future__ import annotations

import typer

from structlens.cli import (
    analyze,
    capture,
    causal,
    demo,
    equiv,
    koopman,
    models,
    ndm,
    report,
    sae,
    tasks,
)

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
app.add_typer(ndm.app, name="ndm")
app.add_typer(equiv.app, name="equiv")
app.add_typer(koopman.app, name="koopman")
app.add_typer(sae.app, name="sae")
app.add_typer(causal.app, name="causal-dim")
demo.register(app)
analyze.register(app)
report.register(app)

if __name__ == "__main__":  # pragma: no cover
    app()

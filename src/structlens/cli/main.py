"""The ``structlens`` command, and its one top-level error handler.

Errors a user can cause and fix (:func:`structlens.errors.is_user_error`: a
:class:`~structlens.errors.UserError`, ``OSError``, a damaged file, a validation
``ValueError`` raised by structlens) end in one line ``error: ...`` and exit status 2;
``--debug`` or ``STRUCTLENS_DEBUG=1`` shows their traceback.  Anything else is a bug in
structlens: its traceback is shown with a request to report it, exit status 1.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence

import typer

from structlens.cli import (
    analyze,
    calibrate,
    capture,
    causal,
    demo,
    equiv,
    koopman,
    models,
    ndm,
    replicate,
    report,
    sae,
    tasks,
)
from structlens.errors import is_user_error

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
replicate.register(app)
calibrate.register(app)

_state = {"debug": False}


@app.callback()
def _root(
    debug: bool = typer.Option(
        False, "--debug", help="Show the full traceback of errors (or set STRUCTLENS_DEBUG=1)."
    ),
) -> None:
    if debug:
        _state["debug"] = True


def one_line_text(text: str) -> str:
    return " ".join(text.split())


def one_line(err: BaseException) -> str:
    """``err``'s message on one line (plain text: nothing in it is parsed as markup)."""
    text = one_line_text(str(err)) or type(err).__name__
    if isinstance(err, OSError) and err.filename is not None:
        text += " (check the path, its permissions and the free space)"
    return text


def main(argv: Sequence[str] | None = None) -> None:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); exits with its status."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("STRUCTLENS_DEBUG", "").lower() in ("1", "true", "yes", "on")
    _state["debug"] = debug
    try:
        status = app(args=args, prog_name="structlens", standalone_mode=False)
    except (KeyboardInterrupt, typer.Abort):
        sys.stderr.write("error: interrupted\n")
        sys.exit(130)
    except typer.TyperException as err:  # click's errors: bad option or argument
        if type(err).__name__ == "NoArgsIsHelpError":  # as typer itself tells it apart
            err.show()  # type: ignore[attr-defined]  # typer's (private) click errors have it
            sys.exit(err.exit_code)
        ctx = getattr(err, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        sys.stderr.write(f"error: {one_line_text(err.format_message())}{hint}\n")
        sys.exit(getattr(err, "exit_code", 2))
    except Exception as err:
        if is_user_error(err):
            if _state["debug"]:
                traceback.print_exc()
            sys.stderr.write(f"error: {one_line(err)}\n")
            sys.exit(2)
        traceback.print_exc()
        sys.stderr.write(
            "error: this is a bug in structlens, not in your input; please report it to the "
            "structlens maintainers with the traceback above and the command you ran\n"
        )
        sys.exit(1)
    sys.exit(status if isinstance(status, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()

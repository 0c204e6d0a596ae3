"""Options and output helpers shared by every ``structlens`` command."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from structlens import __version__
from structlens.results import SCHEMA_VERSION, atomic_write_json

console = Console(stderr=True)

Out = Annotated[Path, typer.Option("--out", help="Directory for results (JSON, figures).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars or summaries.")]
Device = Annotated[str, typer.Option("--device", help="torch device, e.g. cpu or cuda:0.")]
Dtype = Annotated[str, typer.Option("--dtype", help="Weight dtype: float32, bfloat16, ...")]
Seed = Annotated[int, typer.Option("--seed", help="Random seed (data sampling, tiny models).")]
ModelArg = Annotated[
    str,
    typer.Argument(
        help="Built-in alias (see `structlens models`), HF hub name, local directory or .gguf file."
    ),
]

ExecutorName = Annotated[
    str,
    typer.Option(
        "--executor",
        help="Where independent work (capture shards, sweep points) runs: 'local' (this "
        "process) or 'ray' (a Ray cluster; needs pip install \"structlens\\[ray]\").",
    ),
]
Address = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="Ray cluster to join with --executor ray ('auto', 'ray://HEAD:10001', "
        "'HOST:6379'); default: start Ray on this machine.",
    ),
]


def executor_or_fail(
    name: str, address: str | None = None, *, num_gpus_per_task: float | None = None
):
    """The executor called ``name`` with the command's ``--address``; exits 2 on bad input."""
    from structlens.execution import EXECUTORS, get_executor

    if name not in EXECUTORS:
        fail(f"--executor must be one of {', '.join(EXECUTORS)}; got {name!r}.")
    if name == "local":
        if address is not None:
            fail("--address names a Ray cluster; add --executor ray to use it.")
        return get_executor("local")
    try:
        return get_executor("ray", address=address, num_gpus_per_task=num_gpus_per_task)
    except ImportError as err:
        fail(str(err))


def write_results(out: Path, name: str, payload: dict[str, Any], *, command: str) -> Path:
    """Write ``payload`` to ``out/name.json`` with the schema version and provenance."""
    doc = {
        "schema_version": SCHEMA_VERSION,
        "structlens_version": __version__,
        "command": command,
        "argv": sys.argv[1:],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **payload,
    }
    path = Path(out) / f"{name}.json"
    atomic_write_json(path, doc)
    return path


def fail(message: str) -> None:
    """Print a clear error and exit with status 2 (bad input); ``message`` is plain text."""
    from rich.markup import escape

    console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(2)


def load_model_or_fail(name: str, device: str, dtype: str, seed: int):
    from structlens.models import ModelUnavailableError, load_model

    try:
        return load_model(name, device=device, dtype=dtype, seed=seed)
    except (ModelUnavailableError, ValueError, FileNotFoundError) as err:
        fail(str(err))

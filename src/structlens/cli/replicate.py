"""``structlens replicate <method>``: run one paper replication (cached stages) and write its
markdown and claims JSON (the same as ``python -m structlens.replication``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from structlens.cli.checks import at_least, checked
from structlens.cli.options import Device

Method = Literal["koopman", "ndm", "causal-dimension", "equivalence"]
Profile = Literal["cpu", "gpu", "smoke"]


@checked
def replicate(
    method: Annotated[Method, typer.Argument(help="Which paper to replicate.")],
    profile: Annotated[Profile, typer.Option(help="cpu, gpu or smoke (tiny models).")] = "cpu",
    out: Annotated[
        Path | None, typer.Option(help="Stage cache (default results/replication/METHOD/PROFILE).")
    ] = None,
    doc_dir: Annotated[
        Path | None,
        typer.Option(help="Where METHOD.md and METHOD.json go (default docs/replication)."),
    ] = None,
    device: Device = "cpu",
    threads: Annotated[
        int,
        typer.Option(help="Torch CPU threads (shared machine: 1)."),
        at_least(1, "--threads must be >= 1, got {value}."),
    ] = 1,
) -> None:
    """Run (or resume) a replication: every finished stage is reused, any changed input
    recomputes what depends on it."""
    from structlens.replication.__main__ import main

    argv = [method, "--profile", profile, "--device", device, "--threads", str(threads)]
    argv += ["--out", str(out)] if out is not None else []
    argv += ["--doc-dir", str(doc_dir)] if doc_dir is not None else []
    main(argv)


def register(app: typer.Typer) -> None:
    app.command()(replicate)

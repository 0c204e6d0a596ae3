"""The options and arguments several command groups share, declared once, and the parsers of
their list-valued strings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from structlens.cli.checks import DTYPES, OutputDirectory, one_of
from structlens.cli.output import fail

Out = Annotated[
    Path, typer.Option("--out", help="Directory for results (JSON, figures)."), OutputDirectory()
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars or summaries.")]
Device = Annotated[str, typer.Option("--device", help="torch device, e.g. cpu or cuda:0.")]
#: the words of :func:`structlens.models.loading.resolve_dtype`
KNOWN_DTYPE = one_of(DTYPES, f"unknown dtype {{value!r}}; use one of {', '.join(DTYPES)}")
Dtype = Annotated[
    str, typer.Option("--dtype", help="Weight dtype: float32, bfloat16, ..."), KNOWN_DTYPE
]
Seed = Annotated[int, typer.Option("--seed", help="Random seed (data sampling, tiny models).")]
DeviceMap = Annotated[
    str | None,
    typer.Option(
        "--device-map",
        help="Spread the layers over devices through accelerate instead of --device: auto, "
        "balanced, sequential, or MODULE=DEVICE,... (DEVICE: cpu, disk, a GPU index).",
    ),
]
MaxMemory = Annotated[
    str | None,
    typer.Option(
        "--max-memory", help="With --device-map: per-device caps, e.g. '0=70GiB,cpu=100GiB'."
    ),
]
Revision = Annotated[
    str | None,
    typer.Option(
        "--revision", help="Hub branch, tag or commit (training checkpoints: Pythia's step1000)."
    ),
]
AllowForeign = Annotated[
    bool,
    typer.Option(
        "--allow-foreign",
        help="Use saved results made from another model or site (warns, and records it).",
    ),
]
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


def parse_ints(spec: str, option: str, *, allow_empty: bool = False) -> tuple[int, ...]:
    """``'4,8,12'`` or an inclusive range ``'6-10'`` as a tuple of ints; exits 2 otherwise.

    With ``allow_empty`` a blank ``spec`` is ``()`` (the option's "not given")."""
    if allow_empty and not spec.strip():
        return ()
    try:
        if "-" in spec.strip().lstrip("-"):
            lo, hi = (int(s) for s in spec.split("-", 1))
            return tuple(range(lo, hi + 1))
        values = tuple(int(s) for s in spec.split(",") if s.strip())
    except ValueError:
        fail(f"{option} {spec!r} is not '8', '4,8,12' or '6-10'.")
    if not values:
        fail(f"{option} names no value.")
    return values


def parse_names(spec: str) -> tuple[str, ...]:
    """A comma list of names as a tuple (blank entries dropped)."""
    return tuple(s.strip() for s in spec.split(",") if s.strip())


def _device(value: str) -> str | int:
    return int(value) if value.isdigit() else value


def parse_device_map(spec: str) -> str | dict[str, str | int]:
    """``--device-map``: a strategy name as given (load_model checks it), a JSON object, or
    ``MODULE=DEVICE,...`` as module name -> device (GPU indices as ints); exits 2 otherwise."""
    spec = spec.strip()
    if spec.startswith("{"):
        try:
            parsed = json.loads(spec)
        except json.JSONDecodeError as err:
            fail(f"--device-map {spec!r} is not a JSON object ({err.msg}).")
        if not isinstance(parsed, dict):
            fail(f"--device-map {spec!r} must be a JSON object of module names to devices.")
        return parsed
    if "=" not in spec:
        return spec
    return {k: _device(v) for k, v in _pairs(spec, "--device-map", "model.layers.0=0").items()}


def parse_max_memory(spec: str) -> dict[str | int, str]:
    """``--max-memory`` ``DEVICE=SIZE,...`` (``0=70GiB,cpu=100GiB``); exits 2 otherwise."""
    return {_device(k): v for k, v in _pairs(spec, "--max-memory", "0=70GiB,cpu=100GiB").items()}


def _pairs(spec: str, option: str, example: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            fail(f"{option} {spec!r}: write KEY=VALUE pairs separated by commas, e.g. {example}.")
        out[key.strip()] = value.strip()
    if not out:
        fail(f"{option} names nothing; e.g. {example}.")
    return out

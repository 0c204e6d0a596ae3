"""``structlens capture``: activations at any sites over a corpus or a task's prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from structlens.cli.checks import Calls, Holds, above, at_least, check_task
from structlens.cli.common import Common, common_options
from structlens.cli.options import KNOWN_DTYPE, ModelArg
from structlens.cli.output import fail_user_error
from structlens.errors import InputError


def _check_data(data: str) -> None:
    """``--data`` names a task that exists, or a path that does (else the error of
    :func:`structlens.data.corpus.load_texts`)."""
    if data.startswith("task:"):
        check_task(data.removeprefix("task:"))
    elif data != "corpus" and not data.startswith("hf:") and not Path(data).exists():
        raise InputError(
            f"Corpus source {Path(data)} does not exist. Pass an existing .txt or .jsonl file, a "
            "directory of .txt files, 'hf:NAME[:CONFIG][:SPLIT]', or None for the bundled "
            "corpus."
        )


def _names(positions: str) -> list[str]:
    return [n.strip() for n in positions.split(",") if n.strip()]


# the words of structlens.capture.select_positions: without a task, no position has a name
_POSITIONS = Holds(
    lambda p, data: data.startswith("task:") or p in ("all", "last", "skip-first") or not _names(p),
    lambda p: (
        f"positions {p!r}: unknown name(s) {_names(p)}; use 'all', 'last', 'skip-first' "
        "or names among (none given)"
    ),
    uses=("data",),
)


SitesOption = Annotated[
    str,
    typer.Option(
        "--sites",
        help="Comma-separated sites or glob patterns, e.g. 'blocks.*.hook_resid_pre'.",
    ),
]
DataOption = Annotated[
    str,
    typer.Option(
        "--data",
        help="'corpus' (bundled), a .txt/.jsonl "
        "file or directory, 'hf:NAME[:CONFIG][:SPLIT]', or "
        "'task:ioi' / 'task:greater_than' / ...",
    ),
    Calls(_check_data),
]
PositionsOption = Annotated[
    str,
    typer.Option(help="all | last | skip-first | task position names such as 'IO,S2,END'."),
    _POSITIONS,
]
# the messages of structlens.data.corpus.chunk_documents and structlens.capture.capture
MaxPromptsOption = Annotated[
    int | None,
    typer.Option(help="Use at most this many prompts."),
    at_least(1, "max_prompts must be a positive integer or None, got {value}."),
]
PromptTokensOption = Annotated[
    int,
    typer.Option(help="Tokens per corpus prompt."),
    Holds(
        lambda t, data: data.startswith("task:") or t >= 2,  # a task's prompts: unused
        "max_tokens must be at least 2, got {value}.",
        uses=("data",),
    ),
]
BatchSizeOption = Annotated[
    int,
    typer.Option(help="Prompts per forward pass."),
    at_least(1, "batch_size must be >= 1, got {value}"),
]
StoreDtypeOption = Annotated[str, typer.Option(help="dtype of stored activations."), KNOWN_DTYPE]
ShardMbOption = Annotated[
    float,
    typer.Option(help="Activation megabytes per shard."),
    above(0, "shard_mb must be > 0, got {value}"),
]


@common_options(out=Path("results"), executor=True)
def capture_cmd(
    common: Common,
    model: ModelArg,
    sites: SitesOption,
    data: DataOption = "corpus",
    positions: PositionsOption = "all",
    max_prompts: MaxPromptsOption = None,
    prompt_tokens: PromptTokensOption = 128,
    batch_size: BatchSizeOption = 8,
    store_dtype: StoreDtypeOption = "float32",
    shard_mb: ShardMbOption = 256.0,
) -> None:
    """Capture activations into a content-addressed, resumable store under OUT/activations.

    With --executor ray, Ray actors holding the model write the shards (OUT: shared storage).
    """
    from structlens.capture import capture
    from structlens.capture.inputs import expand_sites, load_prompts

    on_gpu = common.device.startswith("cuda")
    runner = common.runner(num_gpus_per_task=1.0 if on_gpu else 0.0)
    m = common.load_model(model)
    site_list = expand_sites(m, sites)
    try:
        prompts, named, label = load_prompts(
            m, data, max_prompts=max_prompts, prompt_tokens=prompt_tokens, seed=common.seed
        )
    except FileNotFoundError as err:  # not a ValueError: common_options would pass it on
        fail_user_error(err)
    store = capture(
        m,
        prompts,
        site_list,
        root=Path(common.out) / "activations",
        positions=positions,
        named_positions=named,
        dtype=store_dtype,
        batch_size=batch_size,
        shard_mb=shard_mb,
        data_name=label,
        executor=runner,
        progress=not common.quiet,
    )
    record = {
        "store": str(store.path),
        "model": m.name,
        "sites": site_list,
        "n_prompts": len(prompts),
        "n_tokens": store.n_tokens,
        "data": label,
        "positions": positions,
        "executor": common.executor,
    }
    path = common.write("capture", record, command="capture")
    common.say(
        f"captured {len(site_list)} sites x {store.n_tokens} tokens from "
        f"{len(prompts)} prompts -> {store.path}\nwrote {path}"
    )


def register(app: typer.Typer) -> None:
    app.command("capture")(capture_cmd)

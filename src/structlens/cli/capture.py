"""``structlens capture``: activations at any sites over a corpus or a task's prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from structlens.cli.common import Common, common_options
from structlens.cli.options import ModelArg
from structlens.cli.output import fail_user_error


@common_options(out=Path("results"), executor=True)
def capture_cmd(
    common: Common,
    model: ModelArg,
    sites: Annotated[
        str,
        typer.Option(
            "--sites",
            help="Comma-separated sites or glob patterns, e.g. 'blocks.*.hook_resid_pre'.",
        ),
    ],
    data: Annotated[
        str,
        typer.Option(
            "--data",
            help="'corpus' (bundled), a .txt/.jsonl "
            "file or directory, 'hf:NAME[:CONFIG][:SPLIT]', or "
            "'task:ioi' / 'task:greater_than' / ...",
        ),
    ] = "corpus",
    positions: Annotated[
        str, typer.Option(help="all | last | skip-first | task position names such as 'IO,S2,END'.")
    ] = "all",
    max_prompts: Annotated[int | None, typer.Option(help="Use at most this many prompts.")] = None,
    prompt_tokens: Annotated[int, typer.Option(help="Tokens per corpus prompt.")] = 128,
    batch_size: Annotated[int, typer.Option(help="Prompts per forward pass.")] = 8,
    store_dtype: Annotated[str, typer.Option(help="dtype of stored activations.")] = "float32",
    shard_mb: Annotated[float, typer.Option(help="Activation megabytes per shard.")] = 256.0,
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

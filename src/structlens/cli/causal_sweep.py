"""The documents of ``structlens causal-dim`` and its sweep of published SAEs
(``sweep --saes``)."""

from __future__ import annotations

from typing import Any

from structlens.cli.causal_options import check_layers
from structlens.cli.common import Common
from structlens.errors import InputError


def kappa_doc(fits: list[Any], d: int) -> dict[str, Any]:
    """The κ part of a document: the first layer's numbers and every layer's ``KappaFit``."""
    from structlens.results import to_jsonable

    first = fits[0]
    return {
        "kappa": {
            "layer": first.layer,
            "erank": first.erank,
            "participation_ratio": first.participation_ratio,
        },
        "by_layer": {"d": d, "layers": [to_jsonable(f) for f in fits]},
    }


def pretrained_sweep(
    common: Common, model: str, layer: int, protocol: Any, specs: list[str], *, allow_foreign: bool
) -> None:
    """``causal-dim sweep --saes``: the sweep of the published SAEs ``specs`` (one per width,
    made from this model at ``blocks.{layer}.hook_resid_pre`` unless ``allow_foreign``), on
    the protocol's evaluation prompts; the protocol's widths become theirs."""
    from structlens.causal_dim.stages import eval_rows, kappa, prompt_sets
    from structlens.causal_dim.stages import sweep as sweep_stage
    from structlens.causal_dim.sweep import pretrained_sweep_saes
    from structlens.results import to_jsonable
    from structlens.sites import site_name

    m = common.load_model(model)
    check_layers(str(layer), m.n_layers)
    if not m.causal:
        raise InputError(f"{m.name} is an encoder; the sweep's AtP metric is the LM loss.")
    site = site_name("resid_pre", layer, n_layers=m.n_layers)
    with common.foreign_uses() as foreign:
        saes = pretrained_sweep_saes(
            specs, model=m, site=site, d_model=m.d_model, allow_foreign=allow_foreign
        )
    # the published SAEs' widths, whatever multiples of d the protocol names
    protocol = protocol.replace(sweep_widths=tuple(saes), sweep_width_ratios=None)
    protocol.check_widths(m.d_model)
    sets = prompt_sets(protocol, m.tokenizer)
    k = kappa(protocol, m, layer, sets)
    fit = sweep_stage(
        protocol, saes, eval_rows(m, [layer], sets.sae_eval), layer, sets, exact_kappa=k.erank,
        d_model=m.d_model,
    )  # fmt: skip
    doc = {"model": m.name, "protocol": protocol.to_json(), "layer": layer}
    doc |= kappa_doc([k], m.d_model) | {"sweep": to_jsonable(fit)}
    doc["pretrained"] = {"saes": list(specs), "foreign": foreign}
    write_sweep(common, doc, fit, k.erank)


def write_sweep(common: Common, doc: dict[str, Any], fit: Any, exact_kappa: float) -> None:
    """``causal_sweep.json``, the width-sweep figure and the one-line summary."""
    from structlens.report.causal import plot_width_sweep

    common.write("causal_sweep", doc, command="causal-dim sweep")
    plot_width_sweep(fit, common.out / "width_sweep.png")
    kappa_hat = (
        f"κ̂ {fit.kappa_hat:.0f} {fit.kappa_hat_ci}"
        if fit.kappa_hat_status == "identified"  # never print a fit pinned at a bound
        else f"κ̂ {fit.kappa_hat_status} ({fit.kappa_hat_reason or fit.sweep_reason})"
    )
    common.say(
        f"N_repr {fit.n_repr.tolist()}  N_causal {fit.n_causal.tolist()}  wedge "
        f"{fit.wedge:.2f}  {kappa_hat}  exact κ {exact_kappa:.1f}",
        markup=False,
    )

"""``structlens equiv compare|similarity|sanity``: interpretive equivalence of two models (or
of a model and its rotated copy); the numbers are the stages of
:mod:`structlens.equivalence.stages` under the ``--protocol`` the options override."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from structlens.cli.common import Common, common_options, shared_settings
from structlens.cli.equiv_options import (
    FLAGS,
    PROBES,
    VALIDATION,
    BatchSize,
    Threshold,
    protocol_of,
)
from structlens.cli.options import ModelArg
from structlens.cli.output import fail

app = typer.Typer(
    help="Interpretive equivalence: do two models implement the same mechanism?",
    no_args_is_help=True,
)
OUT = Path("results/equiv")


def _recorder(kept: list[Any]) -> Any:
    """The stages' model runs, keeping their records (the figure draws them)."""
    from structlens.equivalence.stages import measure

    def run(*args: Any) -> Any:
        kept.append(measure(*args))
        return kept[-1]

    return run


def _say(common: Common, res: Any, labels: tuple[str, str]) -> None:
    h = res.heads
    common.say(
        f"{labels[0]} vs {labels[1]} on {res.probe} ({res.representation} rows): score "
        f"{h.score:.3f} [{h.score_ci[0]:.3f}, {h.score_ci[1]:.3f}] ({h.method}), layers "
        + ("—" if res.layers is None else f"{res.layers.score:.3f}")
    )
    if h.null_score is not None and h.informative is not None:
        common.say(
            f"null (mean ablation) score {h.null_score:.3f}; partner passes on "
            f"{h.informative.n_passed} of the {h.informative.n} heads whose mean ablation fails"
        )
    if g := res.head_groups:
        common.say(f"whole-layer head groups: score {g.score:.3f}, null {g.null_score:.3f}")
    if c := res.congruity:
        _say_congruity(common, "congruity", c)
    common.say(f"decision: {res.decision} ({res.decision_reason})")
    for c in res.caveats:  # the encoding score's PCA reduction among them
        common.say(f"caveat ({c.kind}): {c.message}")


def _say_congruity(common: Common, label: str, c: Any) -> None:
    """CONGRUITY's point-test decision rates under uniform R² (the reference's, which
    decides) and variance-weighted R² (rotation-invariant) beside it."""
    w = c.variance_weighted
    common.say(
        f"{label}: point-test decision rate A->B {c.decision_rate_ab:.2f}, B->A "
        f"{c.decision_rate_ba:.2f} (uniform R²): {c.decision}"
        + (
            f"; variance-weighted R²: A->B {w.decision_rate_ab:.2f}, B->A "
            f"{w.decision_rate_ba:.2f} ({w.decision}, not deciding)"
            if w is not None
            else ""
        )
    )


def _write(common: Common, name: str, res: Any, raw: Any, labels: tuple[str, str], **extra: Any):
    """Write ``name.json`` (the stage result, its protocol and ``extra``), the records and
    the layer-matching figure; return the JSON's path."""
    from structlens.report.equivalence import plot_layer_matching
    from structlens.results import to_jsonable

    common.out.mkdir(parents=True, exist_ok=True)
    raw.save(common.out / f"{name}_result")
    plot_layer_matching(
        raw, common.out / f"{name}_layers.png", label_a=labels[0], label_b=labels[1],
        title=f"{raw.config['metric']}, {raw.matching['layers']['method']} matching",
    )  # fmt: skip
    payload = to_jsonable(res) | extra
    payload["layer_similarity"] = res.layer_similarity.tolist()
    return common.write(name, payload, command=f"equiv {name}")


def _compare(common: Common, model_a: str, model_b: str, name: str, **settings: Any) -> None:
    from structlens.equivalence.stages import compare_models

    protocol = protocol_of(settings, common.seed, **settings.pop("fixed", {}))
    a = common.load_model(model_a)
    b = common.load_model(model_b, seed=common.seed + 1 if model_a == model_b else common.seed)
    kept: list[Any] = []
    res = compare_models(protocol, a, b, measure=_recorder(kept))
    _say(common, res, (model_a, model_b))
    path = _write(common, name, res, kept[0], (model_a, model_b), protocol=protocol.to_json())
    common.say(f"wrote {path}")


@app.command("compare")
@common_options(out=OUT, flags=FLAGS)
@shared_settings(PROBES | VALIDATION, first=True)
def compare_cmd(common: Common, model_a: ModelArg, model_b: ModelArg, **settings: Any) -> None:
    """Match layers and heads of MODEL_A and MODEL_B, validate by patching, run CONGRUITY.

    Writes compare.json (the comparison: heads, layers and head groups with their nulls and
    paired decisions, CONGRUITY, caveats, the protocol), compare_result/ (every per-component
    record and the 4-D head similarity array) and compare_layers.png. The same alias twice
    compares two seeds of a tiny model (B gets seed + 1).
    """
    _compare(common, model_a, model_b, "compare", **settings)


@app.command("similarity")
@common_options(out=OUT, flags=FLAGS)
@shared_settings(PROBES, first=True)
def similarity_cmd(
    common: Common,
    model_a: ModelArg,
    model_b: ModelArg,
    threshold: Threshold = None,
    batch_size: BatchSize = None,
    **settings: Any,
) -> None:
    """Layer and head similarity matrices and matchings only (no patching, no CONGRUITY).

    Writes similarity.json (layer_similarity, the similarity-only score, the protocol) and
    similarity_layers.png.
    """
    fixed = {"validate": False, "congruity": False, "head_subset": "random"}
    _compare(
        common, model_a, model_b, "similarity", threshold=threshold, batch_size=batch_size,
        fixed=fixed, **settings,
    )  # fmt: skip


@app.command("sanity")
@common_options(out=OUT, flags=FLAGS)
@shared_settings(PROBES | VALIDATION, first=True)
def sanity_cmd(common: Common, model: ModelArg, **settings: Any) -> None:
    """MODEL against its rotated, head-permuted copy: the answer is known (equivalent), so a
    failure is the method's, not the model's. With CONGRUITY on, CONGRUITY also runs against
    the head-permuted copy whose basis is not rotated (also equivalent).

    Writes sanity.json (the comparison, whether the copy was recovered, its logit gap, the
    share of planted head partners recovered and the unrotated copy's CONGRUITY),
    sanity_result/ and sanity_layers.png.
    """
    from structlens.equivalence.stages import sanity
    from structlens.results import to_jsonable

    protocol = protocol_of(settings, common.seed)
    m = common.load_model(model)
    kept: list[Any] = []
    try:
        check = sanity(protocol, m, measure=_recorder(kept))
    except ValueError as err:  # a LayerNorm model: the rotation does not fold into it
        fail(str(err))
    labels = (model, f"{model} rotated")
    _say(common, check.comparison, labels)
    common.say(
        f"sanity: {'passed' if check.passed else 'FAILED'} ({check.reason}); max |Δlogit| "
        f"{check.max_abs_logit_diff:.2g}, planted head partners recovered "
        f"{check.heads_recovered:.2f}"
    )
    if check.unrotated is not None:
        _say_congruity(common, "unrotated copy, congruity", check.unrotated)
    extra = {k: getattr(check, k) for k in ("passed", "reason", "rotation_seed")}
    extra |= {"max_abs_logit_diff": check.max_abs_logit_diff}
    extra |= {"heads_recovered": check.heads_recovered, "protocol": protocol.to_json()}
    extra |= {
        "unrotated": to_jsonable(check.unrotated),
        "unrotated_max_abs_logit_diff": check.unrotated_max_abs_logit_diff,
    }
    path = _write(common, "sanity", check.comparison, kept[0], labels, sanity=extra)
    common.say(f"wrote {path}")

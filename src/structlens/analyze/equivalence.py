"""Stage 5: interpretive equivalence (the stages of :mod:`structlens.equivalence.stages` under
the profile's protocol) against a rotated copy and ``--compare``."""

from __future__ import annotations

from typing import Any

from structlens.analyze.common import caveat, number
from structlens.analyze.config import AnalyzeConfig
from structlens.analyze.runtime import StageProgress
from structlens.errors import InputError


def _row(res: Any, name: str) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """One row of the report table from a :class:`~structlens.equivalence.stages.
    ModelComparison`, and its caveats."""
    from structlens.results import to_jsonable

    nan = float("nan")
    layers = res.layers
    row = {
        "pair": name,
        "model_b": res.model_b,
        "probe": res.probe,
        "score": res.heads.score,
        "score_ci": list(res.heads.score_ci),
        "null_score": nan if res.heads.null_score is None else res.heads.null_score,
        "null_score_ci": list(res.heads.null_score_ci or (nan, nan)),
        "layer_score": nan if layers is None else layers.score,
        "layer_score_ci": [nan, nan] if layers is None else list(layers.score_ci),
        "decisions": {"matching": res.decision}
        | ({} if res.congruity is None else {"congruity": res.congruity.decision}),
        "comparison": to_jsonable(res),
        "layer_similarity": res.layer_similarity.tolist(),
    }
    caveats = [caveat(c.kind, f"{name}: {c.message}.") for c in res.caveats]
    return row, caveats


def run(model: Any, cfg: AnalyzeConfig, step: StageProgress) -> dict[str, Any]:
    """The model against a rotated, head-permuted copy of itself (the answer is known:
    equivalent) and against ``cfg.compare`` when given."""
    from structlens.equivalence.stages import compare_models, sanity
    from structlens.models import load_model

    protocol = cfg.settings.equivalence.replace(seed=cfg.seed)
    rows: list[dict[str, Any]] = []
    caveats: list[dict[str, str]] = []
    step("rotated copy")
    try:
        check = sanity(protocol, model)
    except (ValueError, InputError) as err:  # a LayerNorm model; too few probe tokens
        caveats.append(caveat("not_run", f"sanity row: {err}"))
    else:
        row, cav = _row(check.comparison, "rotated + head-permuted copy (known: equivalent)")
        row["sanity"] = {k: getattr(check, k) for k in ("passed", "reason", "heads_recovered")}
        rows.append(row)
        caveats += cav
        if not check.passed:
            caveats.append(caveat("failed_sanity", f"{check.reason}."))
    if cfg.compare:
        step(f"vs {cfg.compare}")
        other = load_model(cfg.compare, device=cfg.device, seed=cfg.seed)
        row, cav = _row(compare_models(protocol, model, other), f"vs {other.name}")
        rows.append(row)
        caveats += cav
    headline = {}
    for r in rows:
        key = "sanity" if "sanity" in r else "compare"
        headline[f"{key}_score"] = number(r["score"], r["score_ci"], "", f"score: {r['pair']}")
        headline[f"{key}_null"] = number(
            r["null_score"], r["null_score_ci"], "", f"null score: {r['pair']}"
        )
    details = {"rows": rows, "protocol": protocol.to_json()}
    return {"headline": headline, "caveats": caveats, "details": details}

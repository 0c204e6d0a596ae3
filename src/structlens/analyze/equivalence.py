"""Stage 5: interpretive equivalence against a rotated copy and ``--compare``."""

from __future__ import annotations

from typing import Any

import numpy as np

from structlens.analyze.common import caveat, number
from structlens.analyze.config import AnalyzeConfig
from structlens.analyze.runtime import StageProgress
from structlens.errors import InputError


def _paired_test(result: Any) -> Any:
    """The paired test of partner against null on the validated heads (None without a null)."""
    from structlens.equivalence.score import decide_paired_null

    if not result.null_validation:
        return None
    return decide_paired_null(
        [v["passed"] for v in result.validation],
        [v["passed"] for v in result.null_validation],
        alpha=result.config.get("null_alpha", 0.05),
    )


def _equivalence_row(result: Any, name: str) -> tuple[dict[str, Any], list[dict[str, str]]]:
    test = _paired_test(result)
    row = {
        "pair": name,
        "model_b": result.model_b,
        "probe": result.probe,
        "score": result.score,
        "score_ci": list(result.score_ci),
        "null_score": result.null_score,
        "null_score_ci": list(result.null_score_ci),
        "layer_score": result.layer_score,
        "layer_score_ci": list(result.layer_score_ci),
        "informative": result.informative,
        "verdicts": result.verdicts,
        "paired_test": test.to_json() if test is not None else None,
        "layer_similarity": np.asarray(result.layer_similarity).tolist(),
    }
    caveats = []
    # partner and null are measured on the same heads: only the paired test can tell them apart
    if test is not None and not (test.partner_only > test.null_only and test.p_value < test.alpha):
        caveats.append(
            caveat(
                "null_passes",
                f"{name}: mean-ablating B's heads passes the criterion about as often as the "
                f"matched partners (partner only on {test.partner_only} heads, null only on "
                f"{test.null_only}, McNemar exact p = {test.p_value:.3g}; null "
                f"{result.null_score:.2f} vs score {result.score:.2f}); the score does not "
                "show that the partners carry the mechanism.",
            )
        )
    return row, caveats


def run(model: Any, cfg: AnalyzeConfig, step: StageProgress) -> dict[str, Any]:
    """The model against a rotated, head-permuted copy of itself (the answer is known:
    equivalent) and against ``cfg.compare`` when given."""
    from structlens.equivalence.compare import CompareConfig, compare, corpus_probe
    from structlens.equivalence.scenarios import rotate_and_permute
    from structlens.models import load_model

    p = cfg.settings
    ccfg = CompareConfig(
        congruity=p.equiv_congruity,
        max_validate_heads=p.equiv_heads,
        max_validate_layers=min(model.n_layers, 6),
        seed=cfg.seed,
    )
    rows: list[dict[str, Any]] = []
    caveats: list[dict[str, str]] = []
    step("rotated copy")
    try:
        twin, _, _ = rotate_and_permute(model, seed=cfg.seed + 1)
    except ValueError as err:
        caveats.append(caveat("not_run", f"sanity row: {err}"))
    else:
        try:
            res = compare(model, twin, corpus_probe(model, twin, n=p.equiv_probe), ccfg)
        except InputError as err:  # e.g. too few probe tokens for a layer map at this width
            caveats.append(caveat("not_run", f"sanity row: {err}"))
            return {"headline": {}, "caveats": caveats, "details": {"rows": rows}}
        row, cav = _equivalence_row(res, "rotated + head-permuted copy (known: equivalent)")
        rows.append(row)
        caveats += cav
        if res.score_ci[0] < ccfg.equivalent_at:
            caveats.append(
                caveat(
                    "failed_sanity",
                    "the rotated copy is functionally identical, yet its score's CI falls below "
                    f"{ccfg.equivalent_at}; do not trust the comparisons below.",
                )
            )
        del twin
    if cfg.compare:
        step(f"vs {cfg.compare}")
        other = load_model(cfg.compare, device=cfg.device, seed=cfg.seed)
        res = compare(model, other, corpus_probe(model, other, n=p.equiv_probe), ccfg)
        row, cav = _equivalence_row(res, f"vs {other.name}")
        rows.append(row)
        caveats += cav
    headline = {}
    for i, r in enumerate(rows):
        key = "sanity" if i == 0 and "copy" in r["pair"] else "compare"
        headline[f"{key}_score"] = number(r["score"], r["score_ci"], "", f"score: {r['pair']}")
        headline[f"{key}_null"] = number(
            r["null_score"], r["null_score_ci"], "", f"null score: {r['pair']}"
        )
    return {"headline": headline, "caveats": caveats, "details": {"rows": rows}}

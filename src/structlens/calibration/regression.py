"""Has a rule's calibration moved? A small run against the committed document.

The smoke profile scores the first instances of the same planted families as the committed
``docs/calibration.json`` (same scoring seeds, fewer instances). For every family the two
share, each measured rate (a rule's acceptance, an interval's coverage) is compared with an
exact two-sided binomial test: the smoke count out of its instances against the committed
rate. A p-value below :data:`LEVEL` means the rule now behaves differently from what the
documents print beside its verdicts: either a code change moved it (a regression, or a fix
whose documents were not regenerated) or the documents are stale. Either way the committed
calibration no longer describes the code, and the test suite fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scipy.stats import binomtest

__all__ = ["LEVEL", "Shift", "shifts"]

#: p-value below which a rate counts as moved. The smoke instances are the committed run's
#: first instances, so unchanged code reproduces its counts exactly; the level only has to
#: absorb a few instances that flip with floating-point differences across machines.
LEVEL = 1e-3
#: The fields that name a planted family; everything else in a family's row is measured.
KEYS = (
    "family", "effect", "rho", "d", "m", "unit", "partner_pass", "n_heads", "shared", "system",
    "dictionary", "shift", "concentration", "ratio",
)  # fmt: skip
#: The measured rates of a family's row that the test compares.
RATES = (
    "rate", "all_rate", "raw_rate", "light_rate", "same_rate", "coverage", "accepted",
    "holds_rate", "false_stop_rate",
)  # fmt: skip


@dataclass(frozen=True)
class Shift:
    """One rate that differs from the committed one beyond :data:`LEVEL`."""

    method: str
    rule: str
    family: dict[str, Any]
    measure: str
    committed: float
    committed_n: int
    observed: int
    n: int
    p_value: float

    def __str__(self) -> str:
        name = ", ".join(f"{k}={v}" for k, v in self.family.items())
        return (
            f"{self.method}.{self.rule} [{name}] {self.measure}: {self.observed}/{self.n} "
            f"against the committed {self.committed:.3f} of {self.committed_n} "
            f"(binomial p = {self.p_value:.2g})"
        )


def _families(block: dict[str, Any]) -> list[dict[str, Any]]:
    return list(block.get("families", block.get("effects", [])))


def _key(row: dict[str, Any]) -> tuple:
    return tuple((k, row[k]) for k in KEYS if k in row)


def shifts(observed: dict[str, Any], committed: dict[str, Any]) -> list[Shift]:
    """Every rate of ``observed`` (a calibration document, e.g. of the smoke profile) that an
    exact binomial test at :data:`LEVEL` separates from the same family's rate in
    ``committed``.  Families present in only one document are skipped; a rule of ``observed``
    missing from ``committed`` raises ``KeyError`` (the committed document is out of date)."""
    out = []
    for method in ("koopman", "ndm", "causal_dim", "equivalence"):
        for rule, block in observed.get(method, {}).items():
            if not isinstance(block, dict) or not _families(block):
                continue
            if rule not in committed.get(method, {}):
                raise KeyError(
                    f"{method}.{rule} is not in the committed calibration: rerun `python -m "
                    "structlens.calibration --profile cpu --doc-dir docs`."
                )
            reference = {_key(r): r for r in _families(committed[method][rule])}
            for row in _families(block):
                ref = reference.get(_key(row))
                if ref is None:
                    continue
                for measure in (m for m in RATES if m in row):
                    n, n_ref = int(row["n"]), int(ref["n"])
                    k = round(float(row[measure]) * n)
                    # A committed 0 or 1 would make any other count impossible: keep the
                    # committed rate inside its own resolution.
                    p = min(max(float(ref[measure]), 0.5 / n_ref), 1 - 0.5 / n_ref)
                    pv = float(binomtest(k, n, p).pvalue)
                    if pv < LEVEL:
                        out.append(
                            Shift(method, rule, dict(_key(row)), measure,
                                  float(ref[measure]), n_ref, k, n, pv)
                        )  # fmt: skip
    return out

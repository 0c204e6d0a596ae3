"""Field-by-field comparison of two ``analysis.json`` files: the largest relative difference
of every numeric leaf per section, and every leaf that differs in kind or text.

A change that only reorders floating-point sums moves numbers by round-off; anything else
(a different pass/fail, a different matched pair) shows up as a non-numeric difference or a
large relative one.

    python benchmarks/analyze/compare_sections.py OLD/analysis.json NEW/analysis.json \
        [--sections equivalence] [--ignore seconds]
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def leaves(doc: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, value)`` of every scalar in a JSON document."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from leaves(v, f"{path}[{i}]")
    else:
        yield path, doc


def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def relative(a: float, b: float) -> float:
    """``|a - b| / max(|a|, |b|)``; 0 for two equal values (NaNs and infinities included)."""
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))


def compare(old: dict, new: dict, ignore: set[str]) -> dict[str, Any]:
    """Per-leaf comparison: ``max_relative`` (and where), ``numbers`` compared and
    ``mismatches`` (paths whose kind, text or presence differ)."""
    a = {p: v for p, v in leaves(old) if p.split(".")[-1] not in ignore}
    b = {p: v for p, v in leaves(new) if p.split(".")[-1] not in ignore}
    worst, where, count = 0.0, None, 0
    mismatches = sorted(set(a) ^ set(b))
    for p in sorted(set(a) & set(b)):
        x, y = a[p], b[p]
        if _numeric(x) and _numeric(y):
            count += 1
            r = relative(float(x), float(y))
            if r > worst:
                worst, where = r, p
        elif x != y:
            mismatches.append(p)
    return {"numbers": count, "max_relative": worst, "at": where, "mismatches": mismatches}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--sections", nargs="*", default=None, help="default: every shared section")
    ap.add_argument("--ignore", nargs="*", default=["seconds"], help="leaf names to skip")
    args = ap.parse_args()
    old, new = (json.loads(p.read_text()) for p in (args.old, args.new))
    names = args.sections or sorted((set(old) & set(new)) - {"run", "schema_version"})
    out = {s: compare(old.get(s, {}), new.get(s, {}), set(args.ignore)) for s in names}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

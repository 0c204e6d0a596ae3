"""Number formatting, intervals and verdict counting shared by every replication's render."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


def num(x: Any) -> float:
    """A float from a JSON number, including the strings "nan"/"inf" ``to_jsonable`` writes
    for non-finite values; anything else that is not a number is NaN."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def fmt(x: Any, nd: int = 2) -> str:
    """``x`` with ``nd`` decimals, or ``n/a`` when it is missing or not finite."""
    v = num(x)
    return f"{v:.{nd}f}" if math.isfinite(v) else "n/a"


def ci(pair: Sequence[Any], nd: int = 2) -> str:
    """An interval as ``[low, high]`` with ``nd`` decimals."""
    return f"[{fmt(pair[0], nd)}, {fmt(pair[1], nd)}]"


def value_ci(value: Any, pair: Sequence[Any], nd: int = 2) -> str:
    """``value [low, high]``."""
    return f"{fmt(value, nd)} {ci(pair, nd)}"


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` atomically (parents created)."""
    from structlens.results import atomic_write_bytes

    path = Path(path)
    atomic_write_bytes(path, text.encode())
    return path


def verdict_moves(
    previous: dict[str, tuple[str, str]], claims: Sequence[Any], commit: str
) -> list[str]:
    """Markdown lines of a table "claim | previous protocol | now": how each claim's verdict
    moved.  ``previous`` maps a claim id to ``(ours, verdict)`` as the previous protocol's
    claims JSON at ``commit`` had them; ``claims`` are this run's
    :class:`~structlens.replication.claims.Claim` objects.  Claims new to this run say so."""
    lines = [
        f"| claim | previous protocol (at {commit}): ours → verdict | now: ours → verdict |",
        "|---|---|---|",
    ]
    seen = set()
    for c in claims:
        seen.add(c.id)
        ours = (
            str(c.ours)
            if isinstance(c.ours, int) or not isinstance(c.ours, float)
            else fmt(c.ours, 3)
        )
        before = previous.get(c.id)
        old = f"{before[0]} → {before[1]}" if before else "— (new claim)"
        lines.append(f"| `{c.id}` | {old} | {ours} → {c.verdict} |")
    lines += [f"| `{k}` | {v[0]} → {v[1]} | — (not measured in this run) |"
              for k, v in previous.items() if k not in seen]  # fmt: skip
    return lines


def with_calibration(markdown: str, method: str) -> str:
    """``markdown`` followed by the measured calibration of ``method``'s decision rules
    (:func:`structlens.verdicts.calibration_notes`), so each document shows how often the
    rules behind its verdicts are wrong; unchanged when the method has none."""
    from structlens.verdicts import calibration_notes

    notes = calibration_notes(method)
    if not notes:
        return markdown
    return (
        markdown.rstrip("\n")
        + "\n\n## Calibration of the decision rules\n\nMeasured on planted structure through "
        "the production stages (docs/calibration.md):\n\n" + "".join(f"- {n}\n" for n in notes)
    )


class Template:
    """The blocks of a replication's ``template.md``: ``section NAME`` (a section) and ``row
    NAME`` (one table row of that section), filled with :meth:`str.format_map`; the file
    opens with a comment on its use, which is no block."""

    def __init__(self, path: Path) -> None:
        parts = (p.split(" -->\n", 1) for p in path.read_text().split("<!-- ")[2:])
        self.blocks = {name: text.strip() for name, text in parts}

    def rows(self, name: str, items: Iterable[Mapping[str, Any]]) -> str:
        return "\n".join(self.blocks[f"row {name}"].format_map(item) for item in items)

    def section(self, name: str, values: Mapping[str, Any], rows: Iterable[Any] = ()) -> str:
        return self.blocks[f"section {name}"].format_map({**values, "rows": self.rows(name, rows)})

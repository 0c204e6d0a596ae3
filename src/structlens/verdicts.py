"""The verdict vocabulary and the typed objects every method's verdicts are made of.

A :class:`Claim` is one claim of a paper against our measurement (the replications' unit); a
:class:`Caveat` qualifies a number; a :class:`Number` is a headline value with its interval;
a :class:`Section` is what one method contributes to ``analysis.json``.  Verdicts are
computed from typed stage Results into these objects (``<method>/verdicts.py``) and never
parsed back out of rendered text.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from structlens.results import atomic_write_json, read_json_object, to_jsonable

SECTION_FILE = "section.json"

#: The one verdict vocabulary (JSON, markdown, README, report).  "not tested" always comes
#: with its reason (the claim's ``note`` or ``ci_reason``).
VERDICTS = ("reproduced", "partly", "not reproduced", "unidentified", "not tested")
#: A ``replication`` tests a claim of the paper; a ``check`` holds by construction when the
#: code is right, so it is reported beside a positive control that must pass.
KINDS = ("replication", "check")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclasses.dataclass(frozen=True)
class Claim:
    """One claim of a paper against our measurement.

    ``ours`` is the measured value at the headline setting fixed in advance (a number, or a
    short text where the measurement is a set of numbers); ``ci`` a 95% interval
    ``(low, high)`` or ``None``, in which case ``ci_reason`` says why there is none.
    ``settings`` records how the number was obtained; ``per_setting`` the value at every other
    setting that was run (never the source of the headline).  ``kind`` is one of
    :data:`KINDS`; a ``check`` carries ``positive_control``, a dict with a boolean ``passed``.
    """

    id: str
    paper: str
    ours: float | int | str | None
    ci: tuple[float, float] | None
    verdict: str
    settings: dict[str, Any]
    ci_reason: str | None = None
    note: str | None = None
    kind: str = "replication"
    per_setting: dict[str, Any] = dataclasses.field(default_factory=dict)
    positive_control: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("a claim needs a non-empty id.")
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.id!r}: kind {self.kind!r} is not one of {KINDS}.")
        if self.kind == "check" and not isinstance(
            (self.positive_control or {}).get("passed"), bool
        ):
            raise ValueError(
                f"claim {self.id!r}: a check needs a positive_control with a boolean 'passed'."
            )
        if self.verdict not in VERDICTS:
            raise ValueError(
                f"claim {self.id!r}: verdict {self.verdict!r} is not one of {list(VERDICTS)}."
            )
        if self.ci is None:
            if not self.ci_reason:
                raise ValueError(f"claim {self.id!r}: ci is null, so give a ci_reason.")
        else:
            ci = tuple(self.ci)
            if len(ci) != 2 or not all(_finite(v) for v in ci) or ci[0] > ci[1]:
                raise ValueError(
                    f"claim {self.id!r}: ci must be two finite numbers low <= high, got "
                    f"{self.ci!r}; use ci=None with a ci_reason when there is no interval."
                )
            object.__setattr__(self, "ci", (float(ci[0]), float(ci[1])))
        if not isinstance(self.settings, dict):
            raise ValueError(f"claim {self.id!r}: settings must be a dict.")

    def to_json(self) -> dict[str, Any]:
        out = {
            "id": self.id,
            "paper": self.paper,
            "ours": self.ours,
            "ci": list(self.ci) if self.ci is not None else None,
            "verdict": self.verdict,
            "kind": self.kind,
            "settings": self.settings,
            "per_setting": self.per_setting,
        }
        if self.positive_control is not None:
            out["positive_control"] = self.positive_control
        if self.ci_reason is not None:
            out["ci_reason"] = self.ci_reason
        if self.note is not None:
            out["note"] = self.note
        return to_jsonable(out)


@dataclasses.dataclass(frozen=True)
class Caveat:
    """Why a number should not be read at face value: ``kind`` (a short tag such as
    ``not_converged``, ``not_run``, ``null_effect``) and a sentence that says what to do."""

    kind: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message}


@dataclasses.dataclass(frozen=True)
class Number:
    """A headline number: ``value`` (``None`` when not finite), a 95% interval ``ci`` (``None``
    when there is none or it is not finite), its unit and a human label."""

    value: float | int | None
    ci: tuple[float, float] | None = None
    unit: str = ""
    label: str = ""

    @classmethod
    def of(
        cls, value: Any, ci: Sequence[float] | None = None, unit: str = "", label: str = ""
    ) -> Number:
        """Build from raw values, mapping non-finite values and intervals to ``None``."""
        finite = value is not None and math.isfinite(float(value))
        ci_ok = ci is not None and all(math.isfinite(float(c)) for c in ci)
        v = (value if isinstance(value, int) else float(value)) if finite else None
        return cls(
            v, (float(ci[0]), float(ci[1])) if ci is not None and ci_ok else None, unit, label
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "ci": list(self.ci) if self.ci is not None else None,
            "unit": self.unit,
            "label": self.label,
        }


@dataclasses.dataclass(frozen=True)
class Section:
    """One method's part of ``analysis.json``: named headline numbers, caveats, the details
    the report's tables and figures are drawn from and, once run, the stage's wall time.

    ``save``/``load`` store it as ``section.json``, so the pipeline's stage cache can hold it.
    """

    headline: Mapping[str, Number]
    caveats: tuple[Caveat, ...]
    details: Mapping[str, Any]
    seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "headline": {k: v.to_json() for k, v in self.headline.items()},
            "caveats": [c.to_json() for c in self.caveats],
            "details": to_jsonable(dict(self.details)),
        }
        if self.seconds is not None:
            out["seconds"] = self.seconds
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Section:
        """The section written by :meth:`to_json`."""
        headline = {
            k: Number(
                h["value"], None if h["ci"] is None else tuple(h["ci"]), h["unit"], h["label"]
            )
            for k, h in doc["headline"].items()
        }
        caveats = tuple(Caveat(c["kind"], c["message"]) for c in doc["caveats"])
        return cls(headline, caveats, dict(doc["details"]), doc.get("seconds"))

    def save(self, directory: str | os.PathLike) -> Path:
        path = Path(directory) / SECTION_FILE
        atomic_write_json(path, self.to_json())
        return path

    @classmethod
    def load(cls, directory: str | os.PathLike) -> Section:
        path = Path(directory) / SECTION_FILE
        return cls.from_json(read_json_object(path, "structlens analysis section (JSON)"))


def finite_ci(pair: Sequence[Any] | None) -> tuple[float, float] | None:
    """``(low, high)`` when both ends are finite numbers in order, else ``None`` (a Claim's
    ``ci`` then needs its ``ci_reason``)."""
    if pair is None or len(pair) != 2:
        return None
    try:
        lo, hi = float(pair[0]), float(pair[1])
    except (TypeError, ValueError):
        return None
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) and lo <= hi else None


def count_verdict(n_hold: int, n: int) -> str:
    """``reproduced`` when a claim holds in all ``n`` settings, ``partly`` in some, else
    ``not reproduced``."""
    if n and n_hold == n:
        return "reproduced"
    return "partly" if n_hold else "not reproduced"


def contains(ci: Sequence[float] | None, value: float) -> bool:
    """Whether the finite interval ``ci`` holds ``value`` (``False`` without one)."""
    return ci is not None and all(map(math.isfinite, ci)) and ci[0] <= value <= ci[1]


#: The measured calibration of every decision rule (``structlens calibrate --profile cpu``),
#: shipped with the package so that reports can print it beside the verdicts.
CALIBRATION = "calibration.json"


@functools.cache
def _calibration() -> dict[str, Any]:
    """The committed calibration document (read once per process; empty if not shipped)."""
    from importlib import resources

    source = resources.files("structlens").joinpath(CALIBRATION)
    return json.loads(source.read_text("utf-8")) if source.is_file() else {}


def calibration_notes(method: str) -> tuple[str, ...]:
    """One line per calibrated rule of ``method`` (``koopman``, ``ndm``, ``causal_dim``,
    ``equivalence``): the rule and its measured error rates or coverage, from the committed
    calibration (docs/calibration.md), opening with "NOT CALIBRATED" and where the rule misses
    its targets when it does; empty when the method has none."""
    doc = _calibration()
    return tuple(
        (f"NOT CALIBRATED, {'; '.join(r['misses'])}. " if r.get("misses") else "")
        + f"{r['rule']}: {r['summary']} ({doc['profile']} profile; docs/calibration.md)"
        for r in doc.get(method, {}).values()
        if "summary" in r
    )

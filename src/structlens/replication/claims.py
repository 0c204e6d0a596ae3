"""Machine-readable replication claims: ``docs/replication/<method>.json``.

Every replication writes, beside its markdown, a :class:`ClaimsDocument`: a list of
:class:`Claim` (what the paper says, what we measured, an interval or the reason there is
none, and a verdict from :data:`VERDICTS`) plus method-specific blocks whose required keys are
listed in :data:`REQUIRED_BLOCKS`.  Both dataclasses validate themselves at construction, so
a document that does not follow the schema cannot be written or loaded.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

from structlens.results import atomic_write_json, to_jsonable

#: The one verdict vocabulary (JSON, markdown, README, report).  "not tested" always comes
#: with its reason (the claim's ``note`` or ``ci_reason``).
VERDICTS = ("reproduced", "partly", "not reproduced", "unidentified", "not tested")
#: A ``replication`` tests a claim of the paper; a ``check`` holds by construction when the
#: code is right, so it is reported beside a positive control that must pass.
KINDS = ("replication", "check")

# Method-specific blocks: dotted paths that must be present; "[]" marks
# a list whose every element must carry the key.
REQUIRED_BLOCKS: dict[str, tuple[str, ...]] = {
    "koopman": ("settings.exclude_position0", "settings.dictionary_fit_split"),
    "causal-dimension": (
        "sweep.base_width",
        "sweep.d_model",
        "sweep.fvu_monotone",
        "sweep.kappa_hat_status",
        "kappa.ratio_last_doubling",
    ),
    "ndm": ("tests[].whole_space_share", "tests[].screened"),
    "equivalence": (
        "sanity.head_score",
        "sanity.layer_score",
        "rows[].null_score",
        "rows[].score_ci",
    ),
}


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


def _has(obj: Any, path: str) -> bool:
    head, _, rest = path.partition(".")
    if head.endswith("[]"):
        items = obj.get(head[:-2]) if isinstance(obj, dict) else None
        return isinstance(items, list) and bool(items) and all(_has(i, rest) for i in items)
    if not isinstance(obj, dict) or head not in obj:
        return False
    return _has(obj[head], rest) if rest else True


@dataclasses.dataclass(frozen=True)
class ClaimsDocument:
    """All claims of one replication, with its method-specific blocks.

    ``source`` says where the numbers come from (the run that rendered them, or the
    committed markdown they were copied from); ``blocks`` holds the method-specific top-level
    entries (``sweep``, ``kappa``, ``settings``, ``tests``, ``sanity``, ``rows``).
    """

    method: str
    source: str
    claims: tuple[Claim, ...]
    blocks: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.method not in REQUIRED_BLOCKS:
            raise ValueError(f"unknown method {self.method!r}; one of {list(REQUIRED_BLOCKS)}.")
        object.__setattr__(self, "claims", tuple(self.claims))
        if not self.claims:
            raise ValueError(f"{self.method}: a claims document needs at least one claim.")
        ids = [c.id for c in self.claims]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{self.method}: claim ids repeat: {ids}.")
        clash = {"method", "source", "claims"} & set(self.blocks)
        if clash:
            raise ValueError(f"{self.method}: blocks may not be named {sorted(clash)}.")
        blocks = to_jsonable(self.blocks)
        missing = [p for p in REQUIRED_BLOCKS[self.method] if not _has(blocks, p)]
        if missing:
            raise ValueError(f"{self.method}: the claims document lacks {missing}.")

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "source": self.source,
            "claims": [c.to_json() for c in self.claims],
            **to_jsonable(self.blocks),
        }

    def write(self, path: str | os.PathLike) -> Path:
        """Write the document as indented JSON, atomically."""
        atomic_write_json(path, self.to_json())
        return Path(path)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ClaimsDocument:
        """Rebuild (and so validate) a document from its JSON form."""
        rest = {k: v for k, v in obj.items() if k not in ("method", "source", "claims")}
        claims = []
        for c in obj.get("claims", []):
            unknown = set(c) - {f.name for f in dataclasses.fields(Claim)}
            if unknown:
                raise ValueError(f"claim {c.get('id')!r} has unknown fields {sorted(unknown)}.")
            ci = c.get("ci")
            claims.append(Claim(**{**c, "ci": tuple(ci) if ci is not None else None}))
        return cls(obj["method"], obj["source"], tuple(claims), rest)

    @classmethod
    def load(cls, path: str | os.PathLike) -> ClaimsDocument:
        return cls.from_json(json.loads(Path(path).read_text()))

"""Machine-readable replication claims: ``docs/replication/<method>.json``.

Every replication writes, beside its markdown, a :class:`ClaimsDocument`: a list of
:class:`~structlens.verdicts.Claim` (what the paper says, what we measured, an interval or the
reason there is none, and a verdict from :data:`structlens.verdicts.VERDICTS`) plus
method-specific blocks whose required keys are listed in :data:`REQUIRED_BLOCKS`.  Both
dataclasses validate themselves at construction, so a document that does not follow the schema
cannot be written or loaded.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from structlens.results import atomic_write_json, to_jsonable
from structlens.verdicts import Claim

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

"""A replication stage's JSON record, stored by :class:`structlens.pipeline.cache.StageCache`
for the stages that do not return a typed Result yet."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from structlens.results import Result

__all__ = ["Record"]


@dataclasses.dataclass(frozen=True)
class Record(Result):
    """A stage result that is a JSON document (numbers, lists, dicts).

    Stored as JSON text so that non-finite floats round-trip as floats (``NaN``), exactly as
    ``json.dumps``/``json.loads`` give them back.
    """

    payload: str = "null"

    @classmethod
    def of(cls, data: Any) -> Record:
        """Wrap a JSON-able object (numpy scalars are converted to floats)."""
        return cls(payload=json.dumps(data, default=float))

    @property
    def data(self) -> Any:
        return json.loads(self.payload)

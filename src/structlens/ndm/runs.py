"""Typed Results of the ``ndm train``, ``ndm evaluate`` and ``ndm browse`` documents.

The commands write their reports as JSON documents (``ndm_train.json``, ``ndm_evaluate.json``,
``ndm_browse.json``); a driver that caches a command's run (the replication) keeps it as one
of these frozen Results instead, so its fields have types and its non-finite floats survive a
save and a load.  Each is built from the document's JSON form by :meth:`of` (keys that are
not fields, such as the provenance of the run, are left out).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from structlens.results import Result, to_jsonable

__all__ = ["TrainingRun", "EvaluationRun", "BrowseRun"]

T = TypeVar("T", bound=Result)


def _of(cls: type[T], doc: Mapping[str, Any]) -> T:
    # through the JSON form, so a fresh run and one read back from a cache are equal
    return cls.from_dict(to_jsonable(dict(doc)))


@dataclass(frozen=True)
class TrainingRun(Result):
    """An ``ndm train`` run, or a :mod:`structlens.ndm.device_train` one (``device`` and its
    ``note`` set).

    ``results[str(layer)]`` is each layer's training record (``partition``, ``steps``,
    ``converged``, ``merge_history``, ``config``, ``n_activations``, ``seconds``, and
    ``restarts`` when NDM ran several); ``data`` the training data (``n_prompts``,
    ``n_tokens_captured``, ``positions``).
    """

    layers: list[int]
    partition: dict[str, list[int]]
    protocol: dict[str, Any]
    results: dict[str, dict[str, Any]]
    model: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    command: str = "ndm train"
    device: str | None = None
    note: str | None = None

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> TrainingRun:
        """The run of an ``ndm_train.json`` document."""
        return _of(cls, doc)

    def layer(self, layer: int) -> dict[str, Any]:
        """The training record of ``layer``."""
        return self.results[str(layer)]


@dataclass(frozen=True)
class EvaluationRun(Result):
    """An ``ndm evaluate`` run.

    ``screen`` holds each test's screen row (``test``, ``layer``, ``whole_space_share``,
    ``screened``) and ``effects[test]`` its clean metric, whole-space effect and every
    method's subspace effects; ``gini[test]`` the three Gini variants per method (``"no
    signal"`` for a test below the screen), ``gini_mean`` and ``gini_mean_diff`` (NDM minus
    each baseline, with ``p_above``) their means over the screened tests, ``None`` when no
    test passes the screen (:meth:`structlens.ndm.stages.GiniSummary.to_json`).
    ``conflict`` is knowledge-conflict routing (:class:`structlens.ndm.stages.ConflictRouting`)
    and ``toy`` the toy recovery record, when run; ``layer_sweep`` how the tests' ``layers``
    were chosen (:class:`structlens.ndm.stages.LayerSweep` as JSON).
    """

    protocol: dict[str, Any]
    partition: dict[str, list[int]]
    layers: dict[str, int]
    methods: list[str]
    n_prompts: int
    n_boot: int
    screen: list[dict[str, Any]]
    min_share: float
    gini: dict[str, Any]
    effects: dict[str, dict[str, Any]]
    gini_mean: dict[str, Any] | None = None
    gini_mean_diff: dict[str, Any] | None = None
    tests: dict[str, Any] = field(default_factory=dict)
    skipped_tests: list[str] = field(default_factory=list)
    variances: dict[str, Any] = field(default_factory=dict)
    baselines: dict[str, Any] = field(default_factory=dict)
    conflict: dict[str, Any] | None = None
    toy: dict[str, Any] | None = None
    layer_sweep: dict[str, Any] | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    model: str = ""

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> EvaluationRun:
        """The run of an ``ndm_evaluate.json`` document (its ``"no signal"`` means: ``None``)."""
        none = {k: None for k in ("gini_mean", "gini_mean_diff") if doc.get(k) == "no signal"}
        return _of(cls, {**doc, **none})

    @property
    def screened(self) -> list[str]:
        """The tests that pass the screen, in order."""
        return [row["test"] for row in self.screen if row["screened"]]


@dataclass(frozen=True)
class BrowseRun(Result):
    """An ``ndm browse`` run of one query: its ``query`` (``prompt``, ``position``, ``token``,
    ``context``) and, per subspace, the nearest of the ``n_activations`` indexed contexts
    (``subspaces[i]``: ``subspace``, ``dim``, ``hits``) at ``layer``."""

    layer: int
    partition: list[int]
    n_activations: int
    query: dict[str, Any]
    subspaces: list[dict[str, Any]]
    model: str = ""
    index: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> BrowseRun:
        """The run of an ``ndm_browse.json`` document of one query."""
        return _of(cls, doc)

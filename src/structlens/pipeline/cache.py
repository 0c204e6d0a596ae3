"""The one content-keyed stage cache of every driver (``analyze``, the replications).

A :class:`Stage` names one step of a pipeline (train an SAE, fit a dictionary, run a
comparison, one method's section of the main job).  Its key is the SHA-256 of a canonical
JSON of the stage name, its config, the fingerprint of the model it runs, a digest of its
data and the keys of the stages whose results it consumes, so changing any input (or any
upstream stage) changes the key and the stage recomputes; unchanged inputs find the stored
result.

:class:`StageCache` stores a stage's result with its ``save`` under
``<root>/<name>/<key[:20]>/``, together with ``stage.json`` (the key, its inputs and the
SHA-256 of every file written).  The directory is built under a temporary name and renamed
into place, so an interrupted stage leaves nothing that looks finished.  A stored stage whose
files no longer match their digests, or whose result does not load, is recomputed with a
warning.  A result is any class with ``save(directory)`` and a class method
``load(directory)`` (:class:`~structlens.results.Result`, :class:`~structlens.verdicts.Section`).

>>> import dataclasses, tempfile
>>> from structlens.pipeline.cache import Stage, StageCache
>>> from structlens.results import Result
>>> @dataclasses.dataclass(frozen=True)
... class Square(Result):
...     y: int
>>> cache = StageCache(tempfile.mkdtemp())
>>> stage = Stage("square", {"x": 3})
>>> cache.run(stage, Square, lambda _: Square(9)).y
9
>>> cache.run(stage, Square, lambda _: Square(-1)).y  # a hit: not recomputed
9
>>> [(e.name, e.hit) for e in cache.events]
[('square', False), ('square', True)]
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from structlens.results import atomic_write_json, content_key, to_jsonable


class Storable(Protocol):
    """What a stage may return: written by ``save(directory)``, read back by ``load``."""

    def save(self, directory: str | os.PathLike) -> Any: ...

    @classmethod
    def load(cls, directory: str | os.PathLike) -> Any: ...


R = TypeVar("R", bound=Storable)

MANIFEST = "stage.json"


def data_digest(*parts: Any) -> str:
    """SHA-256 of a canonical JSON of ``parts`` (prompts, token ids, settings): a data key."""
    return content_key(list(parts))


@dataclasses.dataclass(frozen=True)
class Stage:
    """One replication step: what it computes (``name``, ``config``) and from what.

    ``model`` is the fingerprint of the model the stage runs (``None`` for arrays-only
    stages), ``data`` a digest of its inputs (:func:`data_digest`), and ``inputs`` the keys of
    the stages whose results it reads, so a change upstream reaches every consumer.
    """

    name: str
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    model: str | None = None
    data: str | None = None
    inputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"stage name {self.name!r} must be a plain, non-empty file name.")
        object.__setattr__(self, "inputs", tuple(self.inputs))

    def describe(self) -> dict[str, Any]:
        """The key's inputs as JSON (written to ``stage.json`` beside the result)."""
        return {
            "name": self.name,
            "config": to_jsonable(dict(self.config)),
            "model": self.model,
            "data": self.data,
            "inputs": list(self.inputs),
        }

    @property
    def key(self) -> str:
        """SHA-256 hex digest of :meth:`describe` as canonical JSON."""
        return content_key(self.describe())


@dataclasses.dataclass(frozen=True)
class StageEvent:
    """One :meth:`StageCache.run` call: which stage, its key and whether it was a hit."""

    name: str
    key: str
    hit: bool


def _file_digests(directory: Path) -> dict[str, str]:
    out = {}
    for p in sorted(directory.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            out[p.relative_to(directory).as_posix()] = h.hexdigest()
    return out


class StageCache:
    """Content-keyed store of stage results under ``root`` (see the module docstring).

    ``events`` lists every :meth:`run` call in order, so a caller (or a test) can see which
    stages were recomputed.
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.events: list[StageEvent] = []

    def path(self, stage: Stage) -> Path:
        """Directory that holds (or will hold) ``stage``'s result."""
        return self.root / stage.name / stage.key[:20]

    def has(self, stage: Stage) -> bool:
        """Whether ``stage`` has been stored (without checking its files)."""
        return (self.path(stage) / MANIFEST).exists()

    def _valid(self, stage: Stage, kind: type[R]) -> R | None:
        folder = self.path(stage)
        manifest = folder / MANIFEST
        if not manifest.exists():
            return None
        try:
            meta = json.loads(manifest.read_text())
            if meta.get("key") != stage.key:
                raise ValueError("its key does not match")
            if meta.get("files") != _file_digests(folder):
                raise ValueError("its files do not match their recorded digests")
            return kind.load(folder)
        except Exception as err:  # noqa: BLE001 - any unreadable stage is recomputed
            warnings.warn(
                f"cached stage {stage.name!r} at {folder} is corrupted ({err}); recomputing it.",
                RuntimeWarning,
                stacklevel=3,
            )
            return None

    def run(self, stage: Stage, kind: type[R], compute: Callable[[Path], R]) -> R:
        """Return ``stage``'s stored result, or compute, store and return it.

        ``compute(directory)`` gets an empty directory in which it may write files that belong
        with the result (model weights, figures); they are digested and moved into place with
        the result.  Its return value must be an instance of ``kind``.
        """
        found = self._valid(stage, kind)
        if found is not None:
            self.events.append(StageEvent(stage.name, stage.key, True))
            return found
        folder = self.path(stage)
        folder.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
        try:
            result = compute(work)
            if not isinstance(result, kind):
                raise TypeError(
                    f"stage {stage.name!r} returned a {type(result).__name__}, "
                    f"not a {kind.__name__}."
                )
            result.save(work)
            atomic_write_json(
                work / MANIFEST,
                {"key": stage.key, **stage.describe(), "files": _file_digests(work)},
            )
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(work, folder)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        self.events.append(StageEvent(stage.name, stage.key, False))
        return result

    def hits(self) -> list[bool]:
        """Whether each :meth:`run` call so far was a hit, in call order."""
        return [e.hit for e in self.events]


def keys(stages: Iterable[Stage]) -> tuple[str, ...]:
    """The keys of ``stages``, for a consumer's ``inputs``."""
    return tuple(s.key for s in stages)

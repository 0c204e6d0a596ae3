"""Saving and loading result dataclasses: JSON for scalars and metadata, safetensors for arrays.

Every estimator's ``fit`` returns a frozen dataclass.  :class:`Result` gives those dataclasses
``save(dir)`` / ``load(dir)`` and ``to_json()``: fields holding ``numpy`` arrays or ``torch``
tensors go to ``arrays.safetensors``; everything else (numbers, strings, lists, dicts, nested
results) goes to ``result.json`` together with the schema version and the class name.
Writes are atomic: a crash never leaves a half-written result behind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from structlens.errors import InputError, reading

SCHEMA_VERSION = 1

T = TypeVar("T", bound="Result")


def _umask() -> int:
    mask = os.umask(0o022)  # the only portable way to read it is to set it
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates 0600; give the file the mode open() would (shared storage, Ray)
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_json_object(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """The JSON object in the file ``path``, a ``what`` (e.g. ``"analysis (JSON)"``).

    Raises
    ------
    DamagedFileError
        The file is not UTF-8 JSON (truncated, garbage); the message names it and ``what``.
    InputError
        It holds JSON other than an object.
    OSError
        It cannot be read (``FileNotFoundError`` if it does not exist).
    """
    with reading(path, what):
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise InputError(
            f"{path} holds a JSON {type(doc).__name__}, not the JSON object a {what} is; it is "
            f"damaged or another file."
        )
    return doc


def content_key(obj: Any) -> str:
    """SHA-256 hex digest of ``obj`` as canonical JSON (:func:`to_jsonable`, sorted keys, no
    spaces): the one content key of protocols, stages, datasets and caches, so equal content
    gives equal keys across processes and machines."""
    blob = json.dumps(to_jsonable(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON (numpy scalars and arrays converted) atomically."""
    atomic_write_bytes(path, (json.dumps(to_jsonable(obj), indent=2) + "\n").encode())


def to_jsonable(obj: Any) -> Any:
    """Convert numpy/torch scalars and arrays, tuples, dataclasses and paths to JSON types.

    Complex numbers become ``[real, imag]`` pairs; non-finite floats become strings
    (``"nan"``, ``"inf"``) so the output stays strict JSON.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "detach") and hasattr(obj, "cpu"):  # torch tensor
        obj = obj.detach().cpu().numpy()
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, (complex, np.complexfloating)):
        return [to_jsonable(float(obj.real)), to_jsonable(float(obj.imag))]
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        if np.isfinite(x):
            return x
        return "nan" if np.isnan(x) else ("inf" if x > 0 else "-inf")
    return obj


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or (hasattr(value, "detach") and hasattr(value, "cpu"))


_NON_FINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def _restore_floats(obj: Any) -> Any:
    """Undo :func:`to_jsonable`'s strings for non-finite floats, in nested lists and dicts."""
    if isinstance(obj, str):
        return _NON_FINITE.get(obj, obj)
    if isinstance(obj, list):
        return [_restore_floats(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _restore_floats(v) for k, v in obj.items()}
    return obj


def _kinds(tp: Any) -> set[Any]:
    """A field's type and, for a union (``np.ndarray | None``), its members.

    Only a union is unpacked: the arguments of a generic (``dict[str, float]``) are not the
    field's kinds.
    """
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return {tp, *typing.get_args(tp)}
    return {tp}


def _result_items(tp: Any) -> type[Result] | None:
    """The Result class of a ``list[<Result>]`` field, which holds stage Results."""
    if typing.get_origin(tp) is not list:
        return None
    (kind, *_) = typing.get_args(tp) or (None,)
    return kind if isinstance(kind, type) and issubclass(kind, Result) else None


def _field_value(tp: Any, value: Any) -> Any:
    """A JSON-read field value as the field's type: a ``str`` field keeps its text, a list
    of stage Results is rebuilt, and elsewhere non-finite floats (which :func:`to_jsonable`
    writes as strings) become floats again."""
    if str in _kinds(tp):
        return value
    kind = _result_items(tp)
    if kind is not None and value is not None:
        return [kind.from_dict(x) for x in value]
    return _restore_floats(value)


@dataclasses.dataclass(frozen=True)
class Result:
    """Base class for frozen result dataclasses with ``save``/``load``.

    Array fields (numpy or torch) are stored in ``arrays.safetensors`` and come back as numpy
    arrays (complex arrays are stored as real/imaginary pairs); other fields must be JSON-able.
    """

    def to_json(self) -> dict[str, Any]:
        """The scalar part of the result as a JSON-able dict (arrays summarised by shape)."""
        out: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "kind": type(self).__name__}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if _is_array(value):
                out[f.name] = {"array": list(np.shape(value)), "dtype": str(value.dtype)}
            else:
                out[f.name] = to_jsonable(value)
        return out

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``result.json`` and, if the result has array fields, ``arrays.safetensors``."""
        from safetensors.numpy import save as save_arrays

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if _is_array(value):
                a = value.detach().cpu().numpy() if hasattr(value, "detach") else value
                if np.iscomplexobj(a):
                    arrays[f.name + ".real"] = np.ascontiguousarray(a.real)
                    arrays[f.name + ".imag"] = np.ascontiguousarray(a.imag)
                else:
                    arrays[f.name] = np.ascontiguousarray(a)
        if arrays:
            atomic_write_bytes(directory / "arrays.safetensors", save_arrays(arrays))
        atomic_write_json(directory / "result.json", self.to_json())
        return directory

    @classmethod
    def load(cls: type[T], directory: str | os.PathLike) -> T:
        """Read a result written by :meth:`save`; raises ``ValueError`` on a kind mismatch.

        Non-finite floats, which :meth:`to_json` writes as the strings ``"nan"``, ``"inf"``
        and ``"-inf"``, come back as floats in every field not annotated ``str`` (nested
        lists and dicts included), so a result with NaN fields survives a save and a load.  A
        field annotated ``list[R]``, ``R`` a Result, comes back as ``R`` instances (a section
        Result holding stage Results), each rebuilt by :meth:`from_dict`.
        """
        from safetensors.numpy import load_file

        directory = Path(directory)
        meta = read_json_object(directory / "result.json", "saved result (JSON)")
        if meta.get("kind") != cls.__name__:
            raise ValueError(
                f"{directory} holds a {meta.get('kind')!r} result, not {cls.__name__!r}; "
                f"load it with the matching class."
            )
        arrays = {}
        if (directory / "arrays.safetensors").exists():
            with reading(directory / "arrays.safetensors", "result's arrays (safetensors)"):
                arrays = load_file(str(directory / "arrays.safetensors"))
        hints = typing.get_type_hints(cls)
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in arrays:
                kwargs[f.name] = arrays[f.name]
            elif f.name + ".real" in arrays:
                kwargs[f.name] = arrays[f.name + ".real"] + 1j * arrays[f.name + ".imag"]
            elif f.name in meta:
                kwargs[f.name] = _field_value(hints[f.name], meta[f.name])
        return cls(**kwargs)

    @classmethod
    def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
        """Rebuild a result from its JSON form: what :func:`to_jsonable` makes of it, as held
        by a command's JSON document.

        Keys that are not fields of ``cls`` are ignored (documents keep context beside a
        result's fields); fields missing from ``data`` take their defaults.  The strings
        ``"nan"``, ``"inf"`` and ``"-inf"`` that :func:`to_jsonable` writes for non-finite
        floats become floats again (in every field not annotated ``str``), and fields
        annotated ``np.ndarray`` become numpy arrays.  Complex arrays, which
        :func:`to_jsonable` writes as ``[real, imag]`` pairs, are not restored: read those
        results with :meth:`load`.

        Raises
        ------
        InputError
            If ``data`` lacks a field that has no default, or holds only the shape of an
            array field (as :meth:`to_json` writes it).

        Examples
        --------
        >>> @dataclasses.dataclass(frozen=True)
        ... class Fit(Result):
        ...     slope: float
        ...     curve: np.ndarray
        >>> Fit.from_dict({"slope": "nan", "curve": [1.0, 2.0], "layer": 3})
        Fit(slope=nan, curve=array([1., 2.]))
        """
        hints = typing.get_type_hints(cls)  # each field's annotation in its own module
        fields = dataclasses.fields(cls)
        required = [
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        missing = [name for name in required if name not in data]
        if missing:
            raise InputError(
                f"{cls.__name__} needs the fields {missing}, which the dict lacks; pass the "
                f"JSON form of a whole {cls.__name__} (to_jsonable(result))."
            )
        kwargs: dict[str, Any] = {}
        for f in fields:
            if f.name not in data:
                continue
            value = data[f.name]
            if np.ndarray in _kinds(hints[f.name]) and value is not None:
                if isinstance(value, dict):
                    raise InputError(
                        f"{cls.__name__}.{f.name} holds no array, only {value} (to_json keeps "
                        f"just the shape of arrays); pass to_jsonable(result), or read the "
                        f"saved result with {cls.__name__}.load."
                    )
                kwargs[f.name] = np.asarray(_restore_floats(value))
            else:
                kwargs[f.name] = _field_value(hints[f.name], value)
        return cls(**kwargs)


def write_results(out: str | Path, name: str, payload: dict[str, Any], *, command: str) -> Path:
    """Write ``payload`` to ``out/name.json`` with the schema version and provenance (the
    command that made it, its argv and the time)."""
    import sys
    import time

    from structlens import __version__

    doc = {
        "schema_version": SCHEMA_VERSION,
        "structlens_version": __version__,
        "command": command,
        "argv": sys.argv[1:],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **payload,
    }
    path = Path(out) / f"{name}.json"
    atomic_write_json(path, doc)
    return path

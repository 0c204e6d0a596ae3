"""Package attributes that import their defining module on first use.

A method package's ``protocol`` module is read by the command line to build and check its
options; importing the package must not import the numerical modules (torch, SciPy) that
its other names live in, or every ``--help`` and every rejected option pays for them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, home: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that resolves each name of ``home`` (name ->
    its submodule, relative to ``package``, or an absolute module path containing a dot) on
    first access and keeps it in the package's namespace, so later lookups skip it.

    Examples
    --------
    In ``mypkg/__init__.py``: ``__getattr__ = lazy_attributes(__name__, {"fit": "core"})``.
    """

    def __getattr__(name: str) -> Any:
        where = home.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = where if "." in where else f"{package}.{where}"
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__

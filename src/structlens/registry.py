"""Name → object registries, so users can add a Koopman dictionary or an SAE architecture
without editing the package.

Examples
--------
>>> shapes = Registry("shape")
>>> @shapes.register("square")
... def square(side):
...     return side * side
>>> shapes.get("square")(3)
9
>>> shapes.get("circle")
Traceback (most recent call last):
...
ValueError: unknown shape 'circle'; choose from: square (or add one with .register('circle', ...)).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, overload

T = TypeVar("T")

__all__ = ["Registry"]


class Registry(Generic[T]):
    """An ordered mapping from names to objects (classes, factories, specs) of one kind.

    ``what`` names the kind in error messages.  Iterating yields the names in registration
    order; ``name in registry`` tests membership.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._items: dict[str, T] = {}

    @overload
    def register(
        self, name: str, obj: None = None, *, replace: bool = False
    ) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, obj: T, *, replace: bool = False) -> T: ...

    def register(
        self, name: str, obj: T | None = None, *, replace: bool = False
    ) -> T | Callable[[T], T]:
        """Register ``obj`` under ``name`` and return it; without ``obj``, a decorator.

        Re-registering a name raises unless ``replace=True`` (so two plugins cannot silently
        shadow each other).
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.what} name must be a non-empty string, got {name!r}.")

        def add(item: T) -> T:
            if name in self._items and not replace and self._items[name] is not item:
                raise ValueError(
                    f"{self.what} {name!r} is already registered; pass replace=True to override."
                )
            self._items[name] = item
            return item

        return add if obj is None else add(obj)

    def get(self, name: str) -> T:
        """The object registered as ``name``; a one-line ``ValueError`` listing names if none."""
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(
                f"unknown {self.what} {name!r}; choose from: {', '.join(self._items)} "
                f"(or add one with .register({name!r}, ...))."
            ) from None

    def unregister(self, name: str) -> None:
        """Remove ``name`` (e.g. a test's temporary entry)."""
        self.get(name)
        del self._items[name]

    def names(self) -> list[str]:
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(self._items)})"

"""A registry of named things (methods, backends, executors), filled on first use by an explicit
list of built-ins: no registration by import side effects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from ramstream.errors import ConfigError


class Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


class Registry(Generic[T]):
    def __init__(self, kind: str, builtins: Callable[[], list[T]]) -> None:
        self.kind = kind
        self._builtins = builtins
        self._items: dict[str, T] = {}
        self._loaded = False

    def _ensure_builtins(self) -> None:
        """Load the built-ins once, first: a plugin registered before any lookup adds to them
        (and a name clash with a built-in is refused) instead of hiding them."""
        if not self._loaded:
            builtins = self._builtins()
            self._loaded = True
            for item in builtins:
                self._add(item)

    def register(self, item: T) -> None:
        self._ensure_builtins()
        self._add(item)

    def _add(self, item: T) -> None:
        if item.name in self._items:
            raise ValueError(f"{self.kind} {item.name!r} registered twice")
        self._items[item.name] = item

    def names(self) -> list[str]:
        self._ensure_builtins()
        return list(self._items)

    def get(self, name: str) -> T:
        self._ensure_builtins()
        item = self._items.get(name)
        if item is None:
            raise ConfigError(f"unknown {self.kind} {name!r}; choose one of {', '.join(self._items)}")
        return item

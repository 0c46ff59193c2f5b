"""The one bounded cache: a dict that keeps at most ``limit`` entries.

Every remembered answer the proxy keeps (verified labels, options layouts, rendered
prompts, content-free answers, parsed ``semif`` objects) is keyed by something a
caller chooses, so each cache has a limit; the oldest entry (first put) goes first.
Nothing is ever refreshed by a hit: the caches hold values that do not change, and
most traffic repeats the same few keys from the start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["BoundedCache"]

K = TypeVar("K")
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """At most ``limit`` entries, the oldest forgotten first; ``on_evict(key, value)`` is
    told of each entry forgotten to make room (not of ``clear`` or ``pop``)."""

    __slots__ = ("_entries", "_limit", "_on_evict")

    def __init__(self, limit: int, on_evict: Callable[[K, V], None] | None = None):
        if limit < 1:
            raise ValueError("a bounded cache keeps at least one entry")
        self._entries: dict[K, V] = {}
        self._limit = limit
        self._on_evict = on_evict

    def get(self, key: K) -> V | None:
        return self._entries.get(key)

    def put(self, key: K, value: V) -> None:
        entries = self._entries
        if key not in entries and len(entries) >= self._limit:
            oldest = next(iter(entries))
            evicted = entries.pop(oldest)
            if self._on_evict is not None:
                self._on_evict(oldest, evicted)
        entries[key] = value

    def pop(self, key: K) -> V | None:
        return self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()

    def values(self) -> Iterator[V]:
        return iter(self._entries.values())

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

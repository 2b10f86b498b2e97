"""A bounded, insertion-ordered map: the newest `limit` entries are kept.

Why: redelivered events (a webhook retried, a resumed websocket replaying), facts
about recent messages (who wrote the one now deleted, which post has buttons) and
the dispatcher's arrival times all need "remember the last few thousand, forget the
rest". Each was a hand-written OrderedDict; this is the one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Recent(Generic[K, V]):
    """The newest `limit` entries; `put` of a known key makes it the newest again."""

    def __init__(self, limit: int = 2048) -> None:
        self.limit = limit
        self._items: OrderedDict[K, V] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def get(self, key: K, default: V | None = None) -> V | None:
        return self._items.get(key, default)

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def first_time(self, key: K, value: V) -> bool:
        """Record `key`; False when it was already there (a redelivery)."""
        if key in self._items:
            return False
        self.put(key, value)
        return True

    def pop(self, key: K, default: V | None = None) -> V | None:
        return self._items.pop(key, default)

    def clear(self) -> None:
        self._items.clear()

"""A bounded queue of encoded protocol records with the ``motrix.metrics/v1`` drop policy.

Items are ``(kind, line)``: the record's kind and its JSON text, encoded once
for every output. When the queue holds ``capacity`` records, the oldest
``scalars`` (or ``heartbeat``) record makes room. ``run`` and ``event``
records are lifecycle data: they are never dropped to make room for metrics,
and may exceed ``capacity`` up to ``lifecycle_capacity`` records and
``lifecycle_bytes`` bytes, past which new ones are dropped, counted and
warned about once. Every drop is counted in the shared :class:`otel_rl.base.drops.Drops`
under the queue's name.
"""

from __future__ import annotations

import threading
from collections import deque

from otel_rl.base.drops import Drops
from otel_rl.base.log import logger, once

_logger = logger(__name__)

DROPPABLE = frozenset(("scalars", "heartbeat"))
Item = tuple[str, str]


class RecordQueue:
    """Thread-safe; ``put`` never blocks."""

    def __init__(
        self,
        capacity: int,
        name: str,
        drops: Drops,
        lifecycle_capacity: int | None = None,
        lifecycle_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"{name} queue capacity must be a positive integer, got {capacity!r}")
        self.capacity = capacity
        self.name = name
        self._drops = drops
        self.lifecycle_capacity = lifecycle_capacity or 2 * capacity
        self.lifecycle_bytes = lifecycle_bytes
        self._items: deque[Item] = deque()
        self._lifecycle = 0  # lifecycle records held, and their characters
        self._lifecycle_size = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, kind: str, line: str) -> None:
        """Append a record; the drop policy decides what goes when full."""
        with self._lock:
            lifecycle = kind not in DROPPABLE
            if lifecycle and (
                self._lifecycle >= self.lifecycle_capacity or self._lifecycle_size + len(line) > self.lifecycle_bytes
            ):
                self._drops.add(self.name, kind)
                _logger.warning(
                    "otel-rl: %s queue holds %d lifecycle records (%d bytes); dropping new ones",
                    self.name,
                    self._lifecycle,
                    self._lifecycle_size,
                    extra=once(f"lifecycle-full:{self.name}"),
                )
                return
            if len(self._items) >= self.capacity and not self._drop_oldest_droppable():
                if not lifecycle:
                    self._drops.add(self.name, kind)
                    return
            self._items.append((kind, line))
            if lifecycle:
                self._lifecycle += 1
                self._lifecycle_size += len(line)

    def put_all(self, items: list[Item]) -> None:
        """Append several records, oldest first, as :meth:`put` would one by one."""
        with self._lock:
            if len(self._items) + len(items) <= self.capacity and all(kind in DROPPABLE for kind, _ in items):
                self._items.extend(items)  # the common case: room for scalars records, one lock and one extend
                return
        for kind, line in items:
            self.put(kind, line)

    def _drop_oldest_droppable(self) -> bool:
        items = self._items
        for index, (kind, _) in enumerate(items):
            if kind in DROPPABLE:
                del items[index]
                self._drops.add(self.name, kind)
                return True
        return False

    def take(self, limit: int | None = None) -> list[Item]:
        """Remove and return up to ``limit`` records, oldest first."""
        with self._lock:
            count = len(self._items) if limit is None else min(limit, len(self._items))
            taken = [self._items.popleft() for _ in range(count)]
            for kind, line in taken:
                if kind not in DROPPABLE:
                    self._lifecycle -= 1
                    self._lifecycle_size -= len(line)
            return taken

    def put_back(self, items: list[Item]) -> None:
        """Return records that could not be written to the front, in order (the drop policy still applies)."""
        with self._lock:
            self._items.extendleft(reversed(items))
            for kind, line in items:
                if kind not in DROPPABLE:
                    self._lifecycle += 1
                    self._lifecycle_size += len(line)
            while len(self._items) > self.capacity and self._drop_oldest_droppable():
                pass

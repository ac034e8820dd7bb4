"""A bounded queue of protocol records with the ``motrix.metrics/v1`` drop policy.

When full, the oldest ``scalars`` record is dropped to make room: run,
event and heartbeat records are lifecycle data and are never dropped to make
room for metrics. So that memory stays bounded even then, non-scalar records
beyond twice the capacity are dropped too, counted and warned about once.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from otel_rl.recorder import warn_once


class RecordQueue:
    def __init__(self, capacity: int, name: str) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"{name} queue capacity must be a positive integer, got {capacity!r}")
        self.capacity = capacity
        self.name = name
        self._items: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()
        self.not_empty = threading.Condition(self._lock)
        self.dropped: dict[str, int] = {}
        self._unreported: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    def put(self, record: dict[str, Any], wake_at: int = 1) -> None:
        """Append a record, never blocking; wake the consumer once ``wake_at`` records wait."""
        with self._lock:
            items = self._items
            if len(items) >= self.capacity:
                if not self._drop_oldest_scalars():
                    if len(items) >= 2 * self.capacity or record["kind"] == "scalars":
                        self._count(record["kind"])
                        if record["kind"] != "scalars":
                            warn_once(
                                f"queue-full:{self.name}",
                                "otel-rl: %s queue holds %d lifecycle records; dropping new ones",
                                self.name,
                                len(items),
                            )
                        return
            items.append(record)
            if len(items) >= wake_at:
                self.not_empty.notify()

    def _drop_oldest_scalars(self) -> bool:
        items = self._items
        for index, item in enumerate(items):
            if item["kind"] == "scalars":
                del items[index]
                self._count("scalars")
                return True
        return False

    def _count(self, kind: str) -> None:
        self.dropped[kind] = self.dropped.get(kind, 0) + 1
        self._unreported[kind] = self._unreported.get(kind, 0) + 1

    def take(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Remove and return up to ``limit`` records, oldest first."""
        with self._lock:
            count = len(self._items) if limit is None else min(limit, len(self._items))
            return [self._items.popleft() for _ in range(count)]

    def put_back(self, records: list[dict[str, Any]]) -> None:
        """Return records that could not be written to the front, in order (the drop policy still applies)."""
        with self._lock:
            self._items.extendleft(reversed(records))
            while len(self._items) > self.capacity and self._drop_oldest_scalars():
                pass

    def wait(self, timeout_s: float, min_items: int) -> None:
        """Block the consumer until ``min_items`` records wait or ``timeout_s`` passes."""
        with self._lock:
            if len(self._items) < min_items:
                self.not_empty.wait(timeout_s)

    def wake(self) -> None:
        with self._lock:
            self.not_empty.notify_all()

    def take_drop_report(self) -> dict[str, int]:
        """Drops since the last report (then reset)."""
        with self._lock:
            report, self._unreported = self._unreported, {}
            return report

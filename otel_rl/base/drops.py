"""Drop accounting shared by every bounded queue of one :class:`otel_rl.Telemetry`.

Each queue counts what it drops under its own name (``jsonl``, ``http``,
``perfetto``, ``cuda_pending``, ``device_intervals``, ``relay``,
``scalar_keys``...) and the kind of record. The totals feed the
``rl.telemetry.dropped`` counter (attribute ``rl.telemetry.queue``), and the
pipeline turns what is new since its last report into ``records_dropped``
events, at most one per queue every :data:`REPORT_EVERY_S`: a burst of drops
is one event, not a line per record.
"""

from __future__ import annotations

import threading
import time

REPORT_EVERY_S = 5.0


class Drops:
    """Thread-safe counters of dropped records by queue and kind."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, int]] = {}
        self._reported: dict[str, dict[str, int]] = {}
        self._last_report = 0.0

    def add(self, queue: str, kind: str = "records", count: int = 1) -> None:
        if count <= 0:
            return
        with self._lock:
            kinds = self._counts.get(queue)
            if kinds is None:
                kinds = self._counts[queue] = {}
            kinds[kind] = kinds.get(kind, 0) + count

    def set(self, queue: str, kind: str, total: int) -> None:
        """Mirror a counter that a queue keeps itself (lanes, the recorder's deques)."""
        with self._lock:
            self._counts.setdefault(queue, {})[kind] = total

    def totals(self) -> dict[str, int]:
        """Records dropped so far, per queue."""
        with self._lock:
            return {queue: sum(kinds.values()) for queue, kinds in self._counts.items()}

    def by_kind(self, queue: str) -> dict[str, int]:
        with self._lock:
            return dict(self._counts.get(queue, {}))

    def take_report(self, force: bool = False) -> dict[str, dict[str, int]]:
        """Per queue, the drops by kind since the last report; empty until :data:`REPORT_EVERY_S` passed (unless ``force``)."""
        now = time.monotonic()
        with self._lock:
            if not force and now - self._last_report < REPORT_EVERY_S:
                return {}
            report: dict[str, dict[str, int]] = {}
            for queue, kinds in self._counts.items():
                before = self._reported.get(queue, {})
                new = {kind: n - before.get(kind, 0) for kind, n in kinds.items() if n > before.get(kind, 0)}
                if new:
                    report[queue] = new
                    self._reported[queue] = dict(kinds)
            if report:
                self._last_report = now
            return report

"""``metrics.jsonl``: every protocol record, one JSON object per line, written off the training thread.

A daemon thread writes and flushes the pending records every ``interval_s``
(2 s by default), so a slow, stalled or failing disk only ever holds up that
thread. Records that could not be written stay queued (bounded, oldest
scalars dropped first) and are retried at the next interval; the first error
of each kind is logged once. The file can later backfill the ingest service
record for record (``otel-rl backfill``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from otel_rl.exporters.files import close_quietly
from otel_rl.exporters.record_queue import RecordQueue
from otel_rl.protocol import encode_line
from otel_rl.recorder import warn_once

_logger = logging.getLogger(__name__)

JSONL_FILE = "metrics.jsonl"
RETRY_AFTER_CLOSE_S = 60.0
"""How long a closed writer keeps retrying a failing disk before giving up."""


class JsonlWriter:
    """Appends records to ``path`` from its own thread.

    Args:
        path: the JSONL file (its folder is created on first write).
        capacity: records kept while the disk is behind (default 100,000).
        interval_s: write-and-flush period.
        drop_event: builds the event record that reports drops once writing recovers.
    """

    def __init__(
        self,
        path: Path,
        capacity: int = 100_000,
        interval_s: float = 2.0,
        drop_event: Callable[[str, dict[str, int]], dict[str, Any]] | None = None,
    ) -> None:
        self.path = Path(path)
        self.queue = RecordQueue(capacity, "jsonl")
        self._interval_s = interval_s
        self._drop_event = drop_event
        self._file: TextIO | None = None
        self._wake = threading.Event()
        self._closing_since: float | None = None
        self._idle = threading.Event()
        self._idle.set()
        self.written = 0
        self._thread = threading.Thread(target=self._run, name="otel-rl-jsonl", daemon=True)
        self._thread.start()

    def submit(self, record: dict[str, Any]) -> None:
        if self._idle.is_set():
            self._idle.clear()
        self.queue.put(record, wake_at=self.queue.capacity + 1)  # time-driven, not size-driven

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            self._write_pending()
            if not len(self.queue):
                self._idle.set()
            closing_since = self._closing_since
            if closing_since is not None and (
                not len(self.queue) or time.monotonic() - closing_since > RETRY_AFTER_CLOSE_S
            ):
                break
        self._close_file()

    def _write_pending(self) -> bool | None:
        """True if records were written, False on an error, None if there was nothing to write."""
        records = self.queue.take()
        if not records:
            return None
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open across writes
            self._file.write("".join(encode_line(r) + "\n" for r in records))
            self._file.flush()
        except (OSError, ValueError) as exc:
            warn_once(f"jsonl:{type(exc).__name__}", "otel-rl: cannot write %s (%s); will retry", self.path, exc)
            self._close_file()
            self.queue.put_back(records)
            return False
        self.written += len(records)
        report = self.queue.take_drop_report()
        if report and self._drop_event is not None:
            self.queue.put(self._drop_event("jsonl", report))
        return True

    def _close_file(self) -> None:
        close_quietly(self._file)
        self._file = None

    def flush(self, timeout_s: float) -> bool:
        """Write now and wait until everything queued is on disk; False on timeout."""
        if not self._thread.is_alive():
            return not len(self.queue)
        self._wake.set()
        return self._idle.wait(timeout_s)

    def close(self) -> None:
        """Ask for a final write and stop; returns at once (see :meth:`join`)."""
        if self._closing_since is None:
            self._closing_since = time.monotonic()
        self._wake.set()

    def join(self, timeout_s: float) -> bool:
        self._thread.join(max(timeout_s, 0.0))
        return not self._thread.is_alive()

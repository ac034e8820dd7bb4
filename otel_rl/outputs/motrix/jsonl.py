"""``metrics.jsonl``: every protocol record, one JSON object per line, written off the training thread.

A background worker writes the pending records every ``interval_s`` (2 s by
default), or at once when its queue is full. The file is the run's copy that
readers and the backfill trust, so it never drops what the pipeline took: a
full queue makes the pipeline's thread wait for the disk (back-pressure on
the agent, never on training: the segment fills, and what the training
thread cannot write there is dropped and counted at the source). Only a disk
that writes nothing for :data:`~otel_rl.base.loops.STALL_S`, or whose last
write failed (a full disk), is not waited for: then the queue's drop policy
applies (oldest scalars first, counted), and what is still queued when the
writer stops is counted too.
Lines are written with ``os.write`` on an append-only descriptor, so the
writer knows how many bytes reached the file: after a failed write (a full
disk, say) the file is cut back to the end of the last whole record and the
records that did not make it stay queued for the next round. A disk that frees up again leaves no duplicate and
no torn line; if even the cut fails, the next write starts on a new line so
only one line is torn, and readers skip it. The first error of each kind is
logged once. The file can later backfill the ingest service record for
record (``otel-rl backfill``). A file deleted or replaced under the run (or its
folder) is noticed at the next write (its identity changed), said once, and
written anew at its path.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from otel_rl.base.deadline import Deadline
from otel_rl.base.drops import Drops
from otel_rl.base.log import logger, once
from otel_rl.base.loops import BackgroundLoop
from otel_rl.outputs.motrix.record_queue import Item, RecordQueue

_logger = logger(__name__)

FINISH_S = 0.2
"""What a closing writer keeps of its deadline to count what it could not write."""
GIVE_UP_S = 1.0
"""How long a closing writer tries a failing disk again: the run's end is said in time (a full disk rarely frees up in seconds)."""


class JsonlWriter(BackgroundLoop):
    """Appends records to ``path`` from its own thread.

    Args:
        path: the JSONL file (its folder is created on first write).
        drops: where dropped records are counted (queue ``jsonl``).
        capacity: records kept while the disk is behind (default 100,000).
        interval_s: write period.
    """

    queue_only = True  # a failed write stays queued

    def __init__(self, path: Path, drops: Drops, capacity: int = 100_000, interval_s: float = 2.0) -> None:
        super().__init__("otel-rl-jsonl", interval_s)
        self.path = Path(path)
        self.queue = RecordQueue(capacity, "jsonl", drops)
        self._fd: int | None = None
        self._size = 0  # bytes of whole records in the file
        self._torn = False  # the file may end in a partial line we could not cut off
        self._drops = drops
        self.error: str | None = None
        """Why the last write failed (None once one succeeds): a full disk is not waited for."""
        self._closing_since: float | None = None
        self.written = 0
        self.start()

    def submit(self, items: list[Item]) -> None:
        """Queue ``items`` for the next write; while the queue is full, wait for the disk (see the module docstring)."""
        queue, capacity = self.queue, self.queue.capacity
        for first in range(0, len(items), capacity):
            part = items[first : first + capacity]
            self.wait_for_room(lambda part=part: len(queue) + len(part) <= capacity, lambda: self.written, lambda: self.error is not None)
            queue.put_all(part)

    def has_work(self) -> bool:
        """Records to write; a closing writer whose disk still fails after :data:`GIVE_UP_S` has none left to try."""
        if not len(self.queue):
            return False
        since = self._closing_since
        return self.error is None or since is None or time.monotonic() - since < GIVE_UP_S

    @property
    def size(self) -> int:
        """Bytes of whole records in the file (before the first write: what an earlier process left)."""
        if self._fd is not None:
            return self._size
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def run_once(self) -> None:
        items = self.queue.take()
        if items:
            self._write(items)

    def close(self, deadline: Deadline) -> None:
        """Write what is queued until :data:`FINISH_S` before ``deadline`` (a failing disk is tried till then): what is
        left is then counted within the deadline, where the end line can say it."""
        if self._closing_since is None:
            self._closing_since = time.monotonic()
        super().close(Deadline(deadline.left() - FINISH_S))

    def release(self) -> None:
        """The last round: what the disk never took is counted as dropped (``jsonl``), by kind."""
        for kind, _ in self.queue.take():
            self._drops.add(self.queue.name, kind)
        self._close()

    def _write(self, items: list[Item]) -> None:
        lines = [line.encode("utf-8") + b"\n" for _, line in items]
        written, prefix = 0, b""
        try:
            if self._fd is not None and not self._still_there():
                self._close()  # deleted or replaced under the run (the folder too, perhaps): a new file from here
            if self._fd is None:
                self._open()
            prefix = b"\n" if self._torn else b""
            data = prefix + b"".join(lines)
            view = memoryview(data)
            while written < len(data):
                written += os.write(self._fd, view[written:])  # type: ignore[arg-type]
        except OSError as exc:
            self.error = exc.strerror or str(exc)
            _logger.warning("otel-rl: cannot write %s (%s); will retry", self.path, exc, extra=once(f"jsonl:{exc.errno}"))
            done = self._recover(prefix, lines, written) if self._fd is not None else 0
            self.queue.put_back(items[done:])
            self.written += done
            return
        self._size += len(data)
        self._torn = False
        self.error = None
        self.written += len(items)

    def _still_there(self) -> bool:
        """Whether the file written is still the one at :attr:`path` (one deleted or replaced is said once)."""
        try:
            held, there = os.fstat(self._fd), os.stat(self.path)  # type: ignore[arg-type]
            if (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino):
                return True
        except OSError:
            pass
        _logger.warning("otel-rl: %s was deleted or replaced while the run wrote it; writing it anew from here "
                        "(the records before are only where the old file went)", self.path, extra=once(f"jsonl-gone:{self.path}"))  # fmt: skip
        return False

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size
        self._torn = False
        if self._size:
            # A file left by an earlier process may end mid-line (it was killed while writing).
            with open(self.path, "rb") as existing:
                existing.seek(self._size - 1)
                self._torn = existing.read(1) != b"\n"

    def _recover(self, prefix: bytes, lines: list[bytes], written: int) -> int:
        """After a write that stopped after ``written`` bytes, cut the file back to its last whole record.

        Returns how many of ``lines`` are in the file.
        """
        if written < len(prefix):
            return 0
        boundary, done = len(prefix), 0
        for line in lines:
            if boundary + len(line) > written:
                break
            boundary += len(line)
            done += 1
        if written > boundary:
            try:
                os.ftruncate(self._fd, self._size + boundary)  # type: ignore[arg-type]
            except OSError:
                # The partial line stays: reopen next time, which starts a new line.
                self._close()
                return done
        self._size += boundary
        self._torn = False
        return done

    def _close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

"""The deadline shutdown runs against.

Every step of :meth:`otel_rl.Telemetry.close` takes what is left of one
:class:`Deadline`, and a second SIGTERM may shorten it; an agent process
follows its producer's (see :class:`otel_rl.agent.serve.ProducerDeadline`).
"""

from __future__ import annotations

import threading
import time


class Deadline:
    """A point on the monotonic clock; thread-safe, and it can only move earlier."""

    __slots__ = ("_at",)

    def __init__(self, timeout_s: float) -> None:
        self._at = time.monotonic() + max(timeout_s, 0.0)

    @property
    def at(self) -> float:
        return self._at

    def left(self, cap_s: float | None = None) -> float:
        """Seconds left (never negative), at most ``cap_s``."""
        left = max(self._at - time.monotonic(), 0.0)
        return left if cap_s is None else min(left, cap_s)

    def shorten(self, timeout_s: float) -> None:
        """Bring the deadline to at most ``timeout_s`` from now."""
        self._at = min(self._at, time.monotonic() + max(timeout_s, 0.0))

    def join(self, thread: threading.Thread) -> bool:
        """Wait for ``thread`` until this deadline, in short steps (it may move earlier meanwhile); True if it ended."""
        while thread.is_alive():
            left = self.left()
            if left <= 0:
                return False
            thread.join(min(left, 0.1))
        return True

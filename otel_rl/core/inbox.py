"""The records made beside the outputs (the agent's system metrics, the cycles its workers relay), handed to the pipeline as they are.

They are made in the process that runs the pipeline, so nothing encodes them
for a segment and decodes them again: an :class:`Inbox` is a
:class:`~otel_rl.core.pipeline.RecordSource` of two bounded queues that the
pipeline empties each pass. A record past a queue's bound is dropped at
once and counted (queue ``scalars``, ``relay`` or ``events``), as a segment's ring would.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from otel_rl.core.pipeline import Batch

CAPACITY = 10_000
"""Records each queue holds: many seconds of system metrics and relayed cycles between two passes."""


class Inbox:
    """Takes ``scalars()``-shaped records and relayed cycles from any thread; a record source of the pipeline."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._scalars: deque[tuple] = deque()
        self._remote: deque[Any] = deque()
        self._events: deque[tuple] = deque()
        self._capacity = capacity
        self._dropped = {"scalars": 0, "relay": 0, "events": 0}
        self._lock = threading.Lock()
        self.closed = False

    def add_scalars(self, record: tuple) -> None:
        """``(time_ns, values, step, iteration, env_steps)``, as a ``scalars()`` call records it."""
        self._add(self._scalars, record, "scalars")

    def add_remote(self, cycle: Any) -> None:
        """A cycle relayed from a worker process (:class:`otel_rl.core.records.RemoteCycle`)."""
        self._add(self._remote, cycle, "relay")

    def add_event(self, record: tuple) -> None:
        """``(time_ns, name, attributes)``: a record made beside the outputs (a video written, one lost)."""
        self._add(self._events, record, "events")

    def _add(self, queue: deque, record: Any, name: str) -> None:
        with self._lock:
            if self.closed:
                return
            if len(queue) >= self._capacity:
                self._dropped[name] += 1
                return
            queue.append(record)

    # -- the record source ---------------------------------------------------

    def take(self, batch: Batch) -> None:
        with self._lock:
            scalars, self._scalars = self._scalars, deque()
            remote, self._remote = self._remote, deque()
            events, self._events = self._events, deque()
        batch.control.extend(events)
        batch.scalars.extend(scalars)
        batch.remote.extend(remote)

    def dropped(self) -> dict[str, int]:
        with self._lock:
            return dict(self._dropped)

    def pending(self) -> dict[str, int]:
        return {"messages": len(self._scalars) + len(self._remote) + len(self._events)}

    def close(self) -> None:
        """Take no more records (the outputs are closing)."""
        with self._lock:
            self.closed = True

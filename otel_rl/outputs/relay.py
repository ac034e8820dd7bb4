"""A worker's cycles, relayed to its learner's outputs (the learner's panel and live metrics show the collector)."""

from __future__ import annotations

import queue
from typing import Any

from otel_rl.core.pipeline import RecordSink
from otel_rl.core.records import IterationRecord, RemoteCycle


class RelaySink(RecordSink):
    """In the worker: sends each cycle's phase durations to the learner, never blocking (drops counted as ``relay``)."""

    def __init__(self, role: str, relay: Any, drops: Any = None) -> None:
        self._role = role
        self._relay = relay
        self._drops = drops
        self.dropped = 0

    def on_iterations(self, iterations: list[IterationRecord]) -> None:
        for iteration in iterations:
            top, nested = iteration.totals_ns()
            cycle = RemoteCycle(self._role, iteration.timeline, iteration.end_ns, iteration.wall_ns, top, nested)
            try:
                self._relay.put_nowait(cycle)
            except (queue.Full, ValueError, OSError):
                self.dropped += 1
                if self._drops is not None:
                    self._drops.add("relay", "cycles")

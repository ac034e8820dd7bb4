"""A worker's cycles, relayed to its learner's outputs (the learner's panel and live metrics show the collector)."""

from __future__ import annotations

import queue
from typing import Any

import numpy as np

from otel_rl.core.batches import IterationBatch
from otel_rl.core.pipeline import RecordSink
from otel_rl.core.records import RemoteCycle


class RelaySink(RecordSink):
    """In the worker: sends each cycle's phase durations to the learner, never blocking (drops counted as ``relay``)."""

    def __init__(self, role: str, relay: Any, drops: Any = None) -> None:
        self._role = role
        self._relay = relay
        self._drops = drops
        self.dropped = 0

    def on_iterations(self, batch: IterationBatch) -> None:
        bounds = np.concatenate(([0], np.cumsum(batch.counts))).tolist()
        phases = batch.phases
        walls, ends = batch.walls().tolist(), batch.ends.tolist()
        for i in range(len(batch)):
            part = np.zeros(len(phases), dtype=bool)
            part[bounds[i] : bounds[i + 1]] = True
            top = part & (phases.depths == 0)
            cycle = RemoteCycle(self._role, batch.timeline, ends[i], walls[i], phases.totals(top), phases.totals(part & ~top))
            try:
                self._relay.put_nowait(cycle)
            except (queue.Full, ValueError, OSError):
                self.dropped += 1
                if self._drops is not None:
                    self._drops.add("relay", "cycles")

"""One timebase for a process's records: ``perf_counter_ns()`` readings as epoch nanoseconds."""

from __future__ import annotations

import time
from time import perf_counter_ns


class Clock:
    """Converts ``perf_counter_ns()`` readings to epoch nanoseconds.

    Calibrated once: the offset is taken from the tightest of a few
    (monotonic, wall, monotonic) samples, so all records share one timebase
    and wall-clock steps during the run do not reorder them.
    """

    def __init__(self, samples: int = 7) -> None:
        best: tuple[int, int] = (2**63, 0)
        for _ in range(samples):
            before = perf_counter_ns()
            wall = time.time_ns()
            after = perf_counter_ns()
            width = after - before
            if width < best[0]:
                best = (width, wall - (before + after) // 2)
        self.offset_ns = best[1]

    def to_epoch_ns(self, monotonic_ns: int) -> int:
        return monotonic_ns + self.offset_ns

    def now_ns(self) -> int:
        return perf_counter_ns() + self.offset_ns

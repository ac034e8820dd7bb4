"""``Perf/*`` timings for outputs that show phase time as scalars (live metrics, TensorBoard).

:class:`PerfWindows` adds up what each pipeline pass measured per timeline
(:class:`otel_rl.core.pipeline.PassTotals`) and, at most once per
``interval_s``, turns the window into ``Perf/*`` values: the mean per cycle
(per occurrence for timelines without cycles), in each key's unit, with the
learner iterations they are over (``Perf/window_iterations``): an iteration
longer than the window is its own record, faster ones are averaged, aligned on
the learner's latest iteration and env steps; the learner's Iter Wall is
``Perf/iteration_time``, the collector's cycle (a rollout) ``Perf/collection_time``,
and a learner ``gradient_sync`` phase is also ``Perf/dp_gradient_sync_ms_per_rank``,
its occurrences per iteration ``Perf/dp_gradient_sync_calls_per_rank`` (each rank's
own, rank 0's in its outputs). With ``derive_fps`` (a run of
one rank), a loop that does not log ``Perf/total_fps`` gets it derived: the
learner's env steps over the window's time. A ``Perf/*`` key the loop (or its
library: RSL-RL's ``Perf/collection_time``) logs itself is its own: the window
leaves it out.

One instance, the pipeline's (:class:`otel_rl.core.pipeline.Pipeline`), makes
the windows for every output (:meth:`otel_rl.core.pipeline.RecordSink.on_perf`):
``metrics.jsonl``, the live service, TensorBoard and W&B get the same values at
the same steps.
"""

from __future__ import annotations

import time

from otel_rl.core.totals import CycleTotals, PassTotals
from otel_rl.formats import schema


class _Window:
    """Phase durations of one timeline since the last Perf record."""

    __slots__ = ("cycles", "wall_ns", "phase_ns", "phase_count", "sync_calls")

    def __init__(self) -> None:
        self.cycles = 0
        self.wall_ns = 0
        self.phase_ns: dict[str, int] = {}
        self.phase_count: dict[str, int] = {}
        self.sync_calls = 0

    def add(self, totals: CycleTotals) -> None:
        self.cycles += totals.cycles
        self.wall_ns += totals.wall_ns
        self.sync_calls += totals.sync_calls
        phase_ns, phase_count = self.phase_ns, self.phase_count
        for part in (totals.top, totals.nested, totals.loose):
            for name, ns in part.items():
                if part is totals.nested and name in totals.top:
                    continue  # a phase inside one of its own name: its time is the outer one's
                phase_ns[name] = phase_ns.get(name, 0) + ns
        for name, n in totals.counts.items():
            phase_count[name] = phase_count.get(name, 0) + n

    def values(self, timeline: str) -> dict[str, float]:
        """Mean per cycle (per occurrence for timelines without cycles), in each key's unit."""
        out: dict[str, float] = {}
        if self.cycles:  # the learner's Iter Wall; the collector's rollout (its cycle) wall
            out["Perf/iteration_time" if timeline == schema.LEARNER else "Perf/collection_time"] = self.wall_ns / self.cycles / 1e9
            if timeline == schema.LEARNER:
                out[schema.WINDOW_ITERATIONS] = self.cycles  # what the means are over: 1 where an iteration outlasts the window
        for name, total_ns in self.phase_ns.items():
            per = self.cycles or self.phase_count.get(name, 0)
            if per:
                out[schema.phase_key(timeline, name)] = total_ns / per / 1e6 * schema.phase_key_scale(timeline, name)
        if timeline == schema.LEARNER and schema.DP_SYNC_KEY_FROM in out:  # the ranks' gradient all-reduce, per rank
            out[schema.DP_SYNC_KEY] = out[schema.DP_SYNC_KEY_FROM]
            if self.cycles and self.sync_calls:
                out[schema.DP_SYNC_CALLS_KEY] = self.sync_calls / self.cycles
        return out



class PerfWindows:
    """Phase time per timeline since the last :meth:`take`; not thread-safe (the pipeline thread owns it)."""

    def __init__(self, interval_s: float = 1.0, derive_fps: bool = False) -> None:
        self.interval_s = interval_s
        self._derive_at_start = derive_fps
        self.reset()

    def reset(self) -> None:
        """A new run: nothing measured yet, no key its own."""
        self._windows: dict[str, _Window] = {}
        self._last = time.monotonic()
        self.axes: dict[str, int | None] = {"env_steps": None, "iteration": None}
        """The learner's latest ``env_steps`` and ``iteration``."""
        self._derive_fps = self._derive_at_start
        self._steps: tuple[int, int] | None = None  # (pass end, the learner's env steps) of the latest pass that had them
        self._steps_mark: tuple[int, int] | None = None  # the same at the last take
        self._own: set[str] = set()  # Perf/* keys the loop logs itself
        self._seen: set[tuple[str, ...]] = set()  # key sets looked at (a loop logs the same ones call after call)

    def note_scalars(self, names: tuple[str, ...]) -> None:
        """Keys the loop logs: a ``Perf/*`` key it logs (``Perf/total_fps`` too) is left to it."""
        if names in self._seen:
            return
        if len(self._seen) >= 256:
            self._seen.clear()
        self._seen.add(names)
        self._own.update(name for name in names if name.startswith("Perf/"))
        if self._derive_fps and schema.TOTAL_FPS in names:
            self._derive_fps = False

    def add(self, totals: PassTotals) -> None:
        learner = totals.timelines.get(schema.LEARNER)
        if learner is not None and learner.index is not None:
            self.axes = {"env_steps": learner.env_steps, "iteration": learner.index}
            if learner.env_steps is not None:
                self._steps = (totals.time_ns, learner.env_steps)
        for timeline, cycles in totals.timelines.items():
            if not (cycles.cycles or cycles.counts):
                continue  # only an iteration still open: nothing measured yet
            window = self._windows.get(timeline)
            if window is None:
                window = self._windows[timeline] = _Window()
            window.add(cycles)

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.interval_s

    def take(self) -> dict[str, float]:
        """The window's ``Perf/*`` values (empty when nothing was measured), and a new window."""
        self._last = time.monotonic()
        values: dict[str, float] = {}
        for timeline, window in self._windows.items():
            values.update(window.values(timeline))
        self._windows = {}
        for key in self._own.intersection(values):
            del values[key]
        mark, now = self._steps_mark, self._steps
        if self._derive_fps and values and mark is not None and now is not None and now[0] > mark[0] and now[1] >= mark[1]:
            values[schema.TOTAL_FPS] = (now[1] - mark[1]) / ((now[0] - mark[0]) / 1e9)
        self._steps_mark = now
        return values

"""Synthetic traces written by the real Perfetto writer, from records with chosen durations."""

from __future__ import annotations

from pathlib import Path

from otel_rl.base.deadline import Deadline
from otel_rl.core.batches import IterationBatch, PhaseBatch
from otel_rl.core.records import DeviceIntervalRecord, IterationRecord, PhaseRecord
from otel_rl.formats import schema
from otel_rl.outputs.perfetto.trace import PerfettoTraceSink

MS = 1_000_000
T0 = 1_767_225_600 * 10**9


def cycle(timeline: str, index: int, start: int, phases: list[tuple[str, float, list[tuple[str, float]]]], tid: int, thread: str, other_ms: float = 0.0):
    """An iteration of ``phases`` = [(name, ms, [(nested name, ms), ...]), ...] back to back."""
    t = start
    records = []
    for name, ms, nested in phases:
        spec = schema.phase_spec(timeline, name)
        children = []
        child_t = t
        for child_name, child_ms in nested:
            child_end = child_t + int(child_ms * MS)
            children.append(PhaseRecord(schema.phase_spec(timeline, child_name), child_t, child_end, 1, tid, thread))
            child_t = child_end
        end = t + int(ms * MS)
        records.append(PhaseRecord(spec, t, end, 0, tid, thread, children=tuple(children), iteration=index))
        t = end
    t += int(other_ms * MS)
    accounted = sum(p.end_ns - p.start_ns for p in records)
    return IterationRecord(timeline, index, index * 8, start, t, tid, thread, tuple(records), accounted), t


def write_trace(
    path: Path,
    learner: list[tuple[str, float, list]],
    collector: list[tuple[str, float, list]] | None = None,
    cycles: int = 50,
    learner_other_ms: float = 0.1,
    collector_other_ms: float = 0.0,
    background: tuple[str, float] | None = None,
    gpu: list[tuple[int, float, float]] | None = None,
) -> Path:
    """Learner and collector cycles starting together; returns the trace file."""
    sink = PerfettoTraceSink(path, "learner")
    t_learner = t_collector = T0
    for i in range(cycles):
        it, t_learner = cycle("learner", i, t_learner, learner, 1, "MainThread", learner_other_ms)
        sink.on_iterations(IterationBatch.of([it]))
        if background:
            name, ms = background
            spec = schema.phase_spec("learner", name)
            sink.on_phases(PhaseBatch.of([PhaseRecord(spec, it.start_ns, it.start_ns + int(ms * MS), 0, 3, "replay-daemon")]))
        if gpu:
            for stream, offset_ms, ms in gpu:
                start = it.start_ns + int(offset_ms * MS)
                sink.on_device_interval(
                    DeviceIntervalRecord(schema.phase_spec("learner", "learning"), 0, stream, start, start + int(ms * MS), i)
                )
        if collector:
            while t_collector < t_learner:
                c, t_collector = cycle("collector", i, t_collector, collector, 2, "collector", collector_other_ms)
                sink.on_iterations(IterationBatch.of([c]))
    sink.flush(Deadline(10))
    sink.shutdown(Deadline(10))
    return path

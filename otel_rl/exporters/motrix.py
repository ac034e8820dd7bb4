"""The ``motrix.metrics/v1`` exporter: run lifecycle, scalars, events and phase timings as protocol records.

Sits on the pipeline beside the OpenTelemetry sink. Each record gets its seq
when it is made (scalars and events on the training thread, at the call) and
the same record goes to every output: ``metrics.jsonl`` and the ingest
service, each with its own thread and bounded queue. Phase timings leave as
``Perf/*`` scalars, one record per ``perf_interval_s`` at most (averaged over
the window when iterations are faster), aligned on ``axes.env_steps``.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import platform
import sys
import time
import weakref
from typing import Any

from otel_rl import schema
from otel_rl.pipeline import CycleTotals, PassTotals, RecordSink
from otel_rl.protocol import record
from otel_rl.records import EventRecord, RunRecord, ScalarsRecord

_logger = logging.getLogger(__name__)

EXIT_WAIT_S = 5.0
"""At exit, how long the process waits for the final records (the terminal status among them)."""

_RUN_METADATA = ("family", "total_steps", "num_envs", "config")


def package_versions() -> dict[str, str]:
    """Versions worth knowing when reading a run: Python, otel-rl, and the ML stack if loaded."""
    from otel_rl import __version__

    versions = {"python": platform.python_version(), "otel_rl": __version__}
    for name in ("torch", "numpy", "gymnasium"):
        module = sys.modules.get(name)
        if module is not None and isinstance(getattr(module, "__version__", None), str):
            versions[name] = module.__version__
    return versions


class _PerfWindow:
    """Phase durations of one timeline since the last Perf record."""

    __slots__ = ("cycles", "wall_ns", "phase_ns", "phase_count")

    def __init__(self) -> None:
        self.cycles = 0
        self.wall_ns = 0
        self.phase_ns: dict[str, int] = {}
        self.phase_count: dict[str, int] = {}

    def add(self, totals: CycleTotals) -> None:
        self.cycles += totals.cycles
        self.wall_ns += totals.wall_ns
        phase_ns, phase_count = self.phase_ns, self.phase_count
        for part in (totals.top, totals.nested, totals.loose):
            for name, ns in part.items():
                phase_ns[name] = phase_ns.get(name, 0) + ns
        for name, n in totals.counts.items():
            phase_count[name] = phase_count.get(name, 0) + n

    def values(self, timeline: str) -> dict[str, float]:
        """Mean per cycle (per occurrence for timelines without cycles), in each key's unit."""
        out: dict[str, float] = {}
        if self.cycles and timeline == schema.LEARNER:
            out["Perf/iteration_time"] = self.wall_ns / self.cycles / 1e9
        for name, total_ns in self.phase_ns.items():
            per = self.cycles or self.phase_count.get(name, 0)
            if per:
                out[schema.phase_key(timeline, name)] = total_ns / per / 1e6 * schema.phase_key_scale(timeline, name)
        return out


class MotrixSink(RecordSink):
    """Turns pipeline records into protocol records for every output.

    Args:
        outputs: writers with ``submit(record)``, ``flush(timeout_s)``,
            ``close()`` and ``join(timeout_s)`` (:class:`JsonlWriter`, :class:`HttpSender`).
        seq: the writer's sequence counter (shared with the training thread).
        project, group, meta: sent on every run record.
        perf_interval_s: at most one ``Perf/*`` record per this many seconds.
    """

    def __init__(
        self,
        run_id: str,
        writer: str,
        seq: itertools.count,
        outputs: list,
        project: str | None = None,
        group: str | None = None,
        meta: dict[str, Any] | None = None,
        perf_interval_s: float = 1.0,
    ) -> None:
        self.run_id = run_id
        self.writer = writer
        self._seq = seq
        self.outputs = outputs
        self._run_fields = {"project": project, "group": group, "meta": meta or {}}
        self._perf_interval_s = perf_interval_s
        self._windows: dict[str, _PerfWindow] = {}
        self._last_perf = time.monotonic()
        self._axes: dict[str, int | None] = {"env_steps": None, "iteration": None}
        self._closed = False
        _sinks.add(self)

    # -- records built here ---------------------------------------------

    def make(self, kind: str, ts: float | None = None, seq: int | None = None, **fields: Any) -> dict[str, Any]:
        return record(
            self.run_id,
            self.writer,
            next(self._seq) if seq is None else seq,
            time.time() if ts is None else ts,
            kind,
            **fields,
        )

    def heartbeat(self) -> dict[str, Any]:
        return self.make("heartbeat")

    def drop_event(self, output: str, counts: dict[str, int]) -> dict[str, Any]:
        return self.make("event", name="records_dropped", attributes={"output": output, **counts})

    def pending(self) -> None:
        """The run exists but has not started training (sent from :func:`otel_rl.init`)."""
        self._emit(self.make("run", status="pending", **self._run_fields))

    def _emit(self, rec: dict[str, Any]) -> None:
        for output in self.outputs:
            output.submit(rec)

    # -- pipeline records -----------------------------------------------

    def on_run(self, run: RunRecord) -> None:
        fields: dict[str, Any] = dict(self._run_fields)
        if run.end_ns is None:
            for key in _RUN_METADATA:
                if key in run.attributes:
                    fields[key] = run.attributes[key]
            fields["versions"] = package_versions()
            ts = run.start_ns / 1e9
        else:
            self._emit_perf()
            ts = run.end_ns / 1e9
            if run.reason is not None:
                fields["reason"] = run.reason
            if run.status == "failed":
                fields["error_logs"] = list(run.attributes.get("error_logs", []))
        self._emit(self.make("run", ts=ts, seq=run.seq, status=run.status, **fields))

    def on_scalars(self, rec: ScalarsRecord) -> None:
        axes = {"env_steps": rec.env_steps, "iteration": rec.iteration}
        step = rec.step if rec.step is not None else rec.env_steps
        self._emit(self.make("scalars", ts=rec.time_ns / 1e9, seq=rec.seq, step=step, axes=axes, values=rec.values))

    def on_event(self, event: EventRecord) -> None:
        attributes = {k: _json_safe(v) for k, v in event.attributes.items()}
        self._emit(self.make("event", ts=event.time_ns / 1e9, seq=event.seq, name=event.name, attributes=attributes))

    def on_cycles(self, totals: PassTotals) -> None:
        learner = totals.timelines.get(schema.LEARNER)
        if learner is not None and learner.index is not None:
            self._axes = {"env_steps": learner.env_steps, "iteration": learner.index}
        for timeline, cycles in totals.timelines.items():
            window = self._windows.get(timeline)
            if window is None:
                window = self._windows[timeline] = _PerfWindow()
            window.add(cycles)

    def on_drain(self, now_ns: int) -> None:
        if time.monotonic() - self._last_perf >= self._perf_interval_s:
            self._emit_perf()

    def _emit_perf(self) -> None:
        self._last_perf = time.monotonic()
        values: dict[str, float] = {}
        for timeline, window in self._windows.items():
            values.update(window.values(timeline))
        self._windows = {}
        if values:
            self._emit(self.make("scalars", step=self._axes["env_steps"], axes=dict(self._axes), values=values))

    # -- lifecycle ------------------------------------------------------

    def flush(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        return all([o.flush(max(deadline - time.monotonic(), 0.0)) for o in self.outputs])

    def shutdown(self, timeout_s: float) -> None:
        """Hand the final records to the outputs and return at once.

        The outputs finish on their own threads; an exit hook gives them at
        most :data:`EXIT_WAIT_S` so the terminal status goes out even when the
        script exits right after training.
        """
        if self._closed:
            return
        self._closed = True
        self._emit_perf()
        for output in self.outputs:
            output.close()

    def join(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        return all([o.join(max(deadline - time.monotonic(), 0.0)) for o in self.outputs])


_sinks: weakref.WeakSet[MotrixSink] = weakref.WeakSet()


def _wait_at_exit() -> None:
    """One exit hook for every sink, sharing one deadline: exit never waits more than EXIT_WAIT_S."""
    deadline = time.monotonic() + EXIT_WAIT_S
    for sink in list(_sinks):
        if sink._closed:
            sink.join(max(deadline - time.monotonic(), 0.0))


# Registered at import, before any Telemetry registers its close: exit hooks run
# last-in first-out, so telemetry closes first and this then waits.
atexit.register(_wait_at_exit)


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    return str(value)

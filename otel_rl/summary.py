"""``run_summary.json``: the run's final status and per-phase timing, schema-stamped.

Written once at shutdown into the run folder (atomically: a temporary file
renamed into place), so a reader sees either the complete summary or none.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from dataclasses import dataclass, field
from statistics import quantiles
from typing import Any

from otel_rl import schema
from otel_rl.config import TelemetryConfig
from otel_rl.pipeline import RecordSink
from otel_rl.records import IterationRecord, PhaseRecord, RunRecord, ScalarsRecord

_logger = logging.getLogger(__name__)

SUMMARY_FILE = "run_summary.json"
SAMPLES_KEPT = 10_000
"""Most recent durations kept per phase for percentiles (bounded memory)."""


@dataclass
class _Stat:
    count: int = 0
    total_ms: float = 0.0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES_KEPT))

    def add(self, value_ms: float) -> None:
        self.count += 1
        self.total_ms += value_ms
        self.recent.append(value_ms)

    def as_dict(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {"count": self.count, "mean_ms": self.total_ms / self.count if self.count else 0.0}
        if len(self.recent) >= 2:
            cuts = quantiles(self.recent, n=100, method="inclusive")
            out["p50_ms"], out["p95_ms"] = cuts[49], cuts[94]
        elif self.recent:
            out["p50_ms"] = out["p95_ms"] = self.recent[0]
        return out


class SummarySink(RecordSink):
    def __init__(self, config: TelemetryConfig) -> None:
        self._config = config
        self._iterations: dict[str, _Stat] = {}
        self._phases: dict[tuple[str, str], _Stat] = {}
        self._accounted_ms: dict[str, float] = {}
        self._status: str | None = None
        self._reason: str | None = None
        self._start_ns: int | None = None
        self._end_ns: int | None = None
        self._last_scalars: dict[str, Any] = {}
        self._env_steps: int | None = None

    def on_run(self, run: RunRecord) -> None:
        if run.end_ns is None:
            self._start_ns, self._status = run.start_ns, run.status
        else:
            self._status, self._reason, self._end_ns = run.status, run.reason, run.end_ns

    def on_iteration(self, iteration: IterationRecord) -> None:
        self._iterations.setdefault(iteration.timeline, _Stat()).add(iteration.wall_ns / 1e6)
        self._accounted_ms[iteration.timeline] = (
            self._accounted_ms.get(iteration.timeline, 0.0) + iteration.accounted_ns / 1e6
        )
        if iteration.env_steps is not None:
            self._env_steps = iteration.env_steps
        for phase in iteration.phases:
            self.on_phase(phase)

    def on_phase(self, phase: PhaseRecord) -> None:
        for node in phase.walk():
            self._phases.setdefault((node.spec.timeline, node.spec.name), _Stat()).add(node.duration_ns / 1e6)

    def on_scalars(self, record: ScalarsRecord) -> None:
        self._last_scalars.update(record.values)

    def summary(self) -> dict[str, Any]:
        timelines: dict[str, Any] = {}
        for timeline in schema.TIMELINES:
            phases = {name: stat.as_dict() for (t, name), stat in self._phases.items() if t == timeline}
            iterations = self._iterations.get(timeline)
            if not phases and iterations is None:
                continue
            entry: dict[str, Any] = {"phases": phases}
            if iterations is not None:
                wall = iterations.total_ms
                accounted = self._accounted_ms.get(timeline, 0.0)
                entry["iterations"] = iterations.as_dict()
                entry["accounted_share"] = accounted / wall if wall else 0.0
                entry["other_share"] = max(wall - accounted, 0.0) / wall if wall else 0.0
            timelines[timeline] = entry
        return {
            "metric_schema_version": schema.SCHEMA_VERSION,
            "run_id": self._config.run_id,
            "algorithm": self._config.algorithm,
            "status": self._status,
            "reason": self._reason,
            "start_time_unix_nano": self._start_ns,
            "end_time_unix_nano": self._end_ns,
            "env_steps": self._env_steps,
            "timelines": timelines,
            "last_scalars": self._last_scalars,
        }

    def shutdown(self, timeout_s: float) -> None:
        run_dir = self._config.run_dir
        assert run_dir is not None
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            path = run_dir / SUMMARY_FILE
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(self.summary(), indent=2, sort_keys=True))
            os.replace(tmp, path)
        except OSError as exc:
            _logger.warning("otel-rl: could not write %s: %s", run_dir / SUMMARY_FILE, exc)

"""``run_summary.json``: the run's final status and per-phase timing, schema-stamped.

Written once at shutdown into the run folder (atomically: a temporary file
renamed into place), so a reader sees either the complete summary or none.
"""

from __future__ import annotations

import json
import os
from typing import Any

from otel_rl._logging import logger
from otel_rl import schema
from otel_rl.aggregation import Aggregates
from otel_rl.config import TelemetryConfig
from otel_rl.pipeline import RecordSink
from otel_rl.records import RunRecord, ScalarsRecord

_logger = logger(__name__)

SUMMARY_FILE = "run_summary.json"
class SummarySink(RecordSink):
    """Writes ``run_summary.json`` at shutdown from the shared aggregates."""

    def __init__(self, config: TelemetryConfig, aggregates: Aggregates) -> None:
        self._config = config
        self._aggregates = aggregates
        self._status: str | None = None
        self._reason: str | None = None
        self._start_ns: int | None = None
        self._end_ns: int | None = None
        self._last_scalars: dict[str, Any] = {}

    def on_run(self, run: RunRecord) -> None:
        if run.end_ns is None:
            self._start_ns, self._status = run.start_ns, run.status
        else:
            self._status, self._reason, self._end_ns = run.status, run.reason, run.end_ns

    def on_scalars(self, record: ScalarsRecord) -> None:
        self._last_scalars.update(record.values)

    def summary(self) -> dict[str, Any]:
        timelines = self._aggregates.phase_summary()
        return {
            "metric_schema_version": schema.SCHEMA_VERSION,
            "run_id": self._config.run_id,
            "algorithm": self._config.algorithm,
            "status": self._status,
            "reason": self._reason,
            "start_time_unix_nano": self._start_ns,
            "end_time_unix_nano": self._end_ns,
            "env_steps": self._aggregates.env_steps(),
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

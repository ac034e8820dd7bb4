"""The run folder's JSON files: ``run_config.json`` when the run starts, ``run_summary.json`` at shutdown.

``run_config.json`` holds the run id, its trace id and how many times it was
resumed, its metadata (family, total steps,
environments), the resolved configuration (secrets redacted) and its
provenance (git commit and dirty flag, command line, host, package
versions). ``run_summary.json`` holds the final status and per-phase timing,
schema-stamped, and the loop's own fields (``tel.add_summary(...)``: a
``backend_diagnostics`` block, say). Both are written off the training thread, atomically (a
temporary file renamed into place): a reader sees a whole file or none.
"""

from __future__ import annotations

import json
from typing import Any

from otel_rl.base.deadline import Deadline
from otel_rl.base.files import write_atomically
from otel_rl.base.log import logger
from otel_rl.config import TelemetryConfig
from otel_rl.core.batches import ScalarBatch
from otel_rl.core.pipeline import RecordSink
from otel_rl.core.records import EventRecord, RunEnd, RunStart
from otel_rl.formats import schema
from otel_rl.outputs.aggregates import Aggregates
from otel_rl.run.files import CONFIG_FILE, SUMMARY_FILE

_logger = logger(__name__)


class SummarySink(RecordSink):
    """Writes ``run_config.json`` when the run starts and ``run_summary.json`` at shutdown."""

    def __init__(self, config: TelemetryConfig, aggregates: Aggregates, trace_id: int, resumes: int = 0) -> None:
        self._config = config
        self._trace_id = trace_id
        self._resumes = resumes
        self._aggregates = aggregates
        self._status: str | None = None
        self._reason: str | None = None
        self._start_ns: int | None = None
        self._end_ns: int | None = None
        self._last_scalars: dict[str, Any] = {}
        self._algorithm = config.algorithm  # else the one an integration names (a framework event)
        self._fields: dict[str, Any] = {}  # the loop's own (tel.add_summary), beside otel-rl's
        self.unwritten: dict[str, str] = {}
        """Files that could not be written, and why (the end line says so)."""

    def on_run_start(self, run: RunStart) -> None:
        self._start_ns, self._status = run.start_ns, run.status
        document = {
            "run_id": self._config.run_id,
            "algorithm": self._algorithm,
            "trace_id": f"{self._trace_id:032x}",
            "resumes": self._resumes,
            "family": run.family,
            "total_steps": run.total_steps,
            "num_envs": run.num_envs,
            "config": run.config,
            **run.provenance,
        }
        self._write(CONFIG_FILE, document)

    def on_run_end(self, run: RunEnd) -> None:
        self._status, self._reason, self._end_ns = run.status, run.reason, run.end_ns

    def on_event(self, event: EventRecord) -> None:
        if event.name == schema.EVENT_FRAMEWORK and not self._config.algorithm and event.attributes.get("algorithm"):
            self._algorithm = event.attributes["algorithm"]
        elif event.name == schema.EVENT_SUMMARY_FIELDS:
            self._fields.update((k, v) for k, v in event.attributes.items() if k not in schema.SUMMARY_KEYS)

    def on_scalars(self, batch: ScalarBatch) -> None:
        self._last_scalars.update(batch.latest_values())

    _STATE = ("_status", "_reason", "_start_ns", "_end_ns", "_last_scalars", "_algorithm", "_fields")

    def state(self) -> dict[str, Any]:
        """What the summary holds besides the aggregates, for an agent that takes over (:meth:`restore`)."""
        return {name: getattr(self, name) for name in self._STATE}

    def restore(self, state: dict[str, Any]) -> None:
        for name in self._STATE:
            if name in state:
                setattr(self, name, state[name])

    def summary(self) -> dict[str, Any]:
        timelines = self._aggregates.phase_summary()
        return {
            **self._fields,
            "metric_schema_version": schema.SCHEMA_VERSION,
            "run_id": self._config.run_id,
            "algorithm": self._algorithm,
            "status": self._status,
            "reason": self._reason,
            "start_time_unix_nano": self._start_ns,
            "end_time_unix_nano": self._end_ns,
            "env_steps": self._aggregates.env_steps(),
            "rank": self._config.rank,
            "world_size": self._config.world_size,
            "timelines": timelines,
            "last_scalars": self._last_scalars,
        }

    def shutdown(self, deadline: Deadline) -> None:
        self._write(SUMMARY_FILE, self.summary())

    def _write(self, name: str, document: dict[str, Any]) -> None:
        run_dir = self._config.run_dir
        if run_dir is None:
            return
        path = run_dir / name
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            write_atomically(path, json.dumps(document, indent=2, sort_keys=True))
            self.unwritten.pop(name, None)
        except OSError as exc:
            self.unwritten[name] = exc.strerror or str(exc)
            _logger.warning("otel-rl: could not write %s: %s", path, exc)

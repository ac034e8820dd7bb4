"""The ``motrix.metrics/v1`` exporter: run lifecycle, scalars, events and phase timings as protocol records.

Sits on the pipeline beside the OpenTelemetry sink. Records come with the
seq the pipeline gave them (those made here take the next of the same
counter), and the same record goes to every output: ``metrics.jsonl`` and
the ingest service, each with its own thread and bounded queue. A record is
encoded to JSON once, here, for every output; one that cannot be encoded is
dropped alone (counted, one warning naming the field). Phase timings leave as
the pipeline's ``Perf/*`` windows (:meth:`~otel_rl.core.pipeline.RecordSink.on_perf`,
one record per ``perf_interval_s`` at most), aligned on ``axes.env_steps``: the
values every other output gets.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from otel_rl.formats import lifecycle
from otel_rl.base.deadline import Deadline
from otel_rl.base.drops import Drops
from otel_rl.base.log import logger, once
from otel_rl.core.batches import ScalarBatch
from otel_rl.core.pipeline import RecordSink
from otel_rl.core.records import EventRecord, RunEnd, RunStart, ScalarsRecord
from otel_rl.formats import schema
from otel_rl.formats.protocol import ProtocolError, encode_record, media_fields, record
from otel_rl.outputs.motrix.record_queue import Item
from otel_rl.outputs.motrix.scalar_lines import batch_lines

_logger = logger(__name__)

_RUN_METADATA = ("family", "total_steps", "num_envs", "config")
_PROVENANCE = ("versions", "git", "command", "host")


class MotrixSink(RecordSink):
    """Turns pipeline records into protocol records for every output.

    Args:
        writers: background loops with ``submit(items)`` (``(kind, line)`` pairs), ``flush(deadline)``,
            ``close(deadline)`` and ``join(deadline)`` (:class:`JsonlWriter`, :class:`HttpSender`).
        seq: the writer's sequence counter (shared with the training thread).
        drops: where records that cannot be encoded are counted (queue ``encode``).
        project, group, meta: sent on every run record (``meta`` already JSON-safe).
        trace_id: the run's trace id (32 hex digits), sent on every run record.
    """

    def __init__(
        self,
        run_id: str,
        writer: str,
        seq: itertools.count,
        drops: Drops,
        writers: list | None = None,
        project: str | None = None,
        group: str | None = None,
        meta: dict[str, Any] | None = None,
        trace_id: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.writer = writer
        self._seq = seq
        self._drops = drops
        self.writers = writers if writers is not None else []
        self._run_fields = {"project": project, "group": group, "meta": meta or {}}
        if trace_id is not None:  # the run's identity beyond its id: a second run with the same id is told apart (a resumed one keeps it)
            self._run_fields["trace_id"] = trace_id
        self._closed = False

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

    def encode(self, rec: dict[str, Any]) -> Item | None:
        """``(kind, line)`` of a record, or None (counted, warned once) when it cannot be encoded."""
        try:
            return rec["kind"], encode_record(rec)
        except ProtocolError as exc:
            self._drops.add("encode", rec["kind"])
            _logger.warning(
                "otel-rl: a %s record cannot be encoded (%s at %s); dropped it alone",
                rec["kind"],
                exc.message,
                exc.field,
                extra=once(f"encode:{exc.field}"),
            )
            return None

    def heartbeat(self) -> Item:
        return "heartbeat", encode_record(self.make("heartbeat"))

    def pending(self, ts: float | None = None) -> None:
        """The run exists but has not started training (sent from :func:`otel_rl.init`, at ``ts``: default now)."""
        self._emit(self.make("run", ts=ts, status=lifecycle.PENDING.value, **self._run_fields))

    def _emit(self, rec: dict[str, Any]) -> None:
        item = self.encode(rec)
        if item is not None:
            for writer in self.writers:
                writer.submit([item])

    # -- pipeline records -----------------------------------------------

    def on_run_start(self, run: RunStart) -> None:
        fields: dict[str, Any] = dict(self._run_fields)
        for key in _RUN_METADATA:
            if getattr(run, key) is not None:
                fields[key] = getattr(run, key)
        for key in _PROVENANCE:
            if run.provenance.get(key) is not None:
                fields[key] = run.provenance[key]
        self._emit(self.make("run", ts=run.start_ns / 1e9, seq=run.seq, status=run.status, **fields))

    def on_run_end(self, run: RunEnd) -> None:
        fields: dict[str, Any] = dict(self._run_fields)
        seq = run.seq
        if run.reason is not None:
            fields["reason"] = run.reason
        if run.status == lifecycle.FAILED:
            fields["error_logs"] = list(run.error_logs)
        self._emit(self.make("run", ts=run.end_ns / 1e9, seq=seq, status=run.status, **fields))

    def on_scalars(self, batch: ScalarBatch) -> None:
        items = batch_lines(self.run_id, self.writer, batch, self.encode)
        for writer in self.writers:
            writer.submit(items)

    def on_event(self, event: EventRecord) -> None:
        if event.name == schema.EVENT_MEDIA:  # a video or image: a record of its own kind, naming the file in the run folder
            self._emit(self.make("media", ts=event.time_ns / 1e9, seq=event.seq, **media_fields(event.attributes)))
            return
        self._emit(self.make("event", ts=event.time_ns / 1e9, seq=event.seq, name=event.name, attributes=event.attributes))
        if event.name == schema.EVENT_BOTTLENECK:  # a change of verdict is sent now, not at the next round (rare: it must hold)
            for writer in self.writers:
                wake = getattr(writer, "wake", None)
                if wake is not None:
                    wake()

    def on_perf(self, record: ScalarsRecord) -> None:
        axes = {"env_steps": record.env_steps, "iteration": record.iteration}
        self._emit(self.make("scalars", ts=record.time_ns / 1e9, seq=record.seq, step=record.step, axes=axes, values=dict(record.values)))

    # -- lifecycle ------------------------------------------------------

    def flush(self, deadline: Deadline) -> bool:
        return all([writer.flush(deadline) for writer in self.writers])

    def shutdown(self, deadline: Deadline) -> None:
        """Hand the final records to the writers and wait for them, all by ``deadline``."""
        if self._closed:
            return
        self._closed = True
        for writer in self.writers:
            writer.close(deadline)
        for writer in self.writers:
            writer.join(deadline)

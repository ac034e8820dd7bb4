"""The outputs factory: every output of one producer, built from plain data, and the pipeline feeding them.

Both hosts build a producer's outputs here: the training process itself
(``agent="thread"``: the pipeline on a thread of it, reading its in-memory
lanes) and the agent process (reading the producer's shared-memory segment).
What they need is a :class:`~otel_rl.core.identity.RunIdentity`: plain data
that travels to an agent inside the segment.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from time import perf_counter_ns
from typing import Any

from otel_rl.base.clock import Clock
from otel_rl.base.deadline import Deadline
from otel_rl.base.drops import Drops
from otel_rl.base.log import logger
from otel_rl.config import TelemetryConfig
from otel_rl.core.identity import RunIdentity
from otel_rl.core.pipeline import Pipeline, RecordSink, RecordSource
from otel_rl.core.records import RunRecord
from otel_rl.core.step_check import StepCheck
from otel_rl.formats import protocol, schema
from otel_rl.run import files
from otel_rl.training.recorder import Recorder

_logger = logger(__name__)

FLUSH_DRIVEN_S = 3600.0
"""The writers' own period when the caller flushes them after every pass (see :class:`Outputs`)."""


def resource(config: TelemetryConfig, service: str):
    """The OpenTelemetry resource of a producer's run."""
    from opentelemetry.sdk.resources import Resource

    attributes: dict[str, Any] = {
        schema.ATTR_RUN_ID: config.run_id,
        "rl.role": config.role,
        schema.ATTR_RANK: config.rank,
        schema.ATTR_WORLD_SIZE: config.world_size,
        **config.resource_attributes,
    }
    if config.algorithm:
        attributes[schema.ATTR_ALGORITHM] = config.algorithm
    attributes["service.name"] = service
    return Resource.create(attributes)


class Outputs:
    """Every output of one producer and the :class:`Pipeline` that feeds them from ``sources``.

    The caller drives the pipeline (:class:`otel_rl.core.pipeline.PipelineLoop`
    or the agent's server); :attr:`inbox` takes records made on the outputs'
    side (system metrics, a worker's relayed cycles, the end of a run whose
    producer died). ``takeover``: how many agents served this producer before
    (their outputs are continued: no second ``pending`` record, a trace part of
    this agent's own). ``flush_driven``: the files are written when the caller
    asks (:meth:`flush_files`, after every pass), not on their writers' own
    clocks, so the caller knows what they hold. ``committed``: the lengths of
    ``metrics.jsonl`` and of the previous agent's trace part when it last
    committed; what it wrote after that is cut off here, since this host reads
    those records again. ``announced``: the run's ``pending`` record is out
    (default: when another agent served the producer before).

    An optional output that cannot start (the trace, TensorBoard, W&B, the
    panel, the live stream) costs only itself: one warning, its name in
    :attr:`failed` and in :meth:`counts`. Anything else that fails raises
    here, with whatever was started stopped again.
    """

    def __init__(
        self,
        identity: RunIdentity,
        sources: Sequence[RecordSource],
        sinks: Sequence[RecordSink] = (),
        takeover: int = 0,
        flush_driven: bool = False,
        committed: tuple[int, int] | None = None,
        announced: bool | None = None,
    ) -> None:
        config = self.config = identity.config
        self.identity = identity
        self.clock = Clock()
        self.clock.offset_ns = identity.clock_offset_ns
        self.drops = Drops()
        self.seq = protocol.seq_counter()
        self.inbox = Recorder(1024, config.scalars_capacity)
        self.otel = None
        self.pipeline: Pipeline | None = None
        self.system = None
        self.panel = None
        self._takeover = takeover
        self._committed = committed
        self._announced = bool(takeover) if announced is None else announced
        self._file_interval_s = FLUSH_DRIVEN_S if flush_driven else None
        self._jsonl_writer = None  # the writers of the run folder's records, flushed by flush_files()
        self._trace_sink = None
        self._sinks: list[RecordSink] = []
        self.failed: list[str] = []  # outputs that could not start
        self._live = None  # the live stream's sender
        self._sources = [*sources, self.inbox]
        try:
            self._build(list(sinks))
        except BaseException:
            self.abort()
            raise

    def _build(self, extra_sinks: list[RecordSink]) -> None:
        from otel_rl.outputs.aggregates import Aggregates, AggregatorSink
        from otel_rl.outputs.otel.sink import OpenTelemetrySink

        config, identity = self.config, self.identity
        base_attributes = {schema.ATTR_RANK: config.rank, schema.ATTR_WORLD_SIZE: config.world_size}
        self.aggregates = Aggregates(self.clock.now_ns(), base_attributes)
        self.otel = OpenTelemetrySink(
            resource(config, identity.service_name),
            self.clock,
            identity.trace_id,
            config.span_budget_per_s,
            self.aggregates,
            pending=self.pending,
            span_exporters=config.span_exporters,
            metric_exporters=config.metric_exporters,
            log_exporters=config.log_exporters,
            metric_export_interval_ms=config.metric_export_interval_ms,
            parent_span_id=identity.parent_span_id,
        )
        # Order matters: the span sink assigns span ids that the aggregator keeps as exemplars.
        self._sinks += [self.otel, AggregatorSink(self.aggregates, self.dropped)]
        previous = identity.previous
        if config.run_dir is not None:
            from otel_rl.outputs.summary import SummarySink

            resumes = 0 if previous is None else previous.resumes + 1
            self._sinks.append(SummarySink(config, self.aggregates, identity.trace_id, resumes))
        self._add_motrix()
        if config.trace_enabled:
            self._trace_sink = self._optional("the Perfetto trace", self._perfetto, self._sinks)
        if config.tensorboard:
            self._optional("TensorBoard", self._tensorboard, self._sinks)
        if config.wandb:
            from otel_rl.outputs.wandb import wandb_sink

            self._optional("W&B", lambda: wandb_sink(config, self.drops, identity.pid), self._sinks)
        if config.panel:
            from otel_rl.outputs.panel import PanelSink

            self.panel = self._optional("the panel", lambda: PanelSink(config.run_id), self._sinks)
        self._sinks.extend(extra_sinks)
        self.pipeline = Pipeline(
            self._sources,
            self._sinks,
            self.clock,
            self.seq,
            drops=self.drops,
            step_check=StepCheck(None if previous is None else previous.last_steps),
        )
        if config.system_metrics_interval_s:
            self._start_system_metrics()

    def _optional(self, name: str, build: Callable[[], Any], into: list) -> Any:
        """Add to ``into`` the output ``build`` makes and return it; one that cannot start costs only itself (one warning naming it, None)."""
        try:
            output = build()
        except Exception as exc:
            self.failed.append(name)
            _logger.warning("otel-rl: %s could not start (%s: %s); the run's other outputs go on", name, type(exc).__name__, exc)
            return None
        into.append(output)
        return output

    def _tensorboard(self) -> RecordSink:
        from otel_rl.outputs.tensorboard import tensorboard_sink

        return tensorboard_sink(self.config.run_dir / files.TENSORBOARD_DIR, self.drops, self.config.perf_interval_s)

    def _add_motrix(self) -> None:
        """The ``motrix.metrics/v1`` exporter, when live streaming or the JSONL file is on."""
        config = self.config
        if not config.motrix_url and not config.jsonl:
            return
        from otel_rl.outputs.motrix.exporter import MotrixSink
        from otel_rl.outputs.motrix.jsonl import JsonlWriter

        sink = MotrixSink(
            config.run_id,
            protocol.writer_id(config.run_id, self.identity.pid, self.identity.started_ns),
            self.seq,
            self.drops,
            project=config.project,
            group=config.group,
            meta=config.meta,
            perf_interval_s=config.perf_interval_s,
        )
        self._sinks.append(sink)  # stopped by abort() if an output fails to start
        if config.jsonl:
            if self._committed is not None:
                _cut(config.run_dir / files.JSONL_FILE, self._committed[0])
            writer = JsonlWriter(config.run_dir / files.JSONL_FILE, self.drops, interval_s=self._file_interval_s or 2.0)
            sink.outputs.append(writer)
            self._jsonl_writer = writer
        if config.motrix_url:
            from otel_rl.outputs.motrix.http_sender import HttpSender

            sender = functools.partial(HttpSender, config.motrix_url, config.motrix_token, sink.heartbeat, self.drops)
            self._live = self._optional("the live stream", sender, sink.outputs)
        if not self._announced:  # an agent taking over continues a run whose pending record is out
            sink.pending(self.identity.started_ns / 1e9)

    def _perfetto(self) -> RecordSink:
        from otel_rl.outputs.perfetto.trace import PerfettoTraceSink, merge_fragments

        config, previous = self.config, self.identity.previous
        # The learner's rank 0 writes the trace; workers and the ranks an agent joins to it write fragments it merges.
        learner = config.role == "learner" and (config.rank == 0 or config.outputs_on_every_rank)
        directory = config.trace_output_dir or config.run_dir
        path = directory / (files.TRACE_FILE if learner else files.fragment_name(config.role, config.rank))
        if previous is not None:
            last = files.trace_part(directory, previous.resumes) if previous.resumes else path
            if last.exists() and not self._takeover:
                merge_fragments(last)  # what the previous part's workers left, before new ones reuse the names
            path = files.trace_part(directory, previous.resumes + 1)
        if self._takeover:  # the previous agent's part stays as it was committed
            if self._committed is not None:
                previous_part = files.agent_part(path, self._takeover - 1)
                _cut(previous_part if learner else files.partial(previous_part), self._committed[1])
            path = files.agent_part(path, self._takeover)
        return PerfettoTraceSink(
            path,
            config.role if config.rank == 0 else f"{config.role} rank {config.rank}",
            self.drops,
            merge_fragments=learner,
            thread_time=config.trace_thread_time,
            cuda_events=config.trace_cuda_events,
            max_bytes=config.trace_max_bytes,
            pid=self.identity.pid,
            profile=config.profile if config.role == "learner" else None,  # learner iterations open the window
            clock_offset_ns=self.identity.clock_offset_ns,
        )

    def _start_system_metrics(self) -> None:
        from otel_rl.core.system_metrics import SystemSampler

        self.system = SystemSampler(self._system_scalars, self.config.system_metrics_interval_s, self.identity.pid)
        if self.otel.meter_provider is not None:
            self.system.register_gauges(self.otel.meter_provider.get_meter("otel_rl.system"))

    def _system_scalars(self, values: dict[str, float]) -> None:
        # perf_counter_ns() is CLOCK_MONOTONIC, one clock for every process of the machine: the producer's timebase.
        # They carry the run's latest iteration and env steps, so that they plot against the run's axes.
        iteration, env_steps = self.pipeline.latest_axes if self.pipeline is not None else (None, None)
        self.inbox.add_scalars((perf_counter_ns(), values, None, iteration, env_steps))

    def continue_run(self, run: RunRecord) -> None:
        """A run another agent started (its start record is out): what the spans and the panel need of it."""
        self.otel.on_run(run)  # type: ignore[union-attr]
        if self.panel is not None:
            self.panel.on_run(run)

    # -- what hosts read and call -----------------------------------------

    def add_sink(self, sink: RecordSink) -> None:
        self.pipeline.add_sink(sink)  # type: ignore[union-attr]

    def pending(self) -> dict[str, int]:
        """Records waiting in the sources, per queue (the ``rl.telemetry.pending`` gauge)."""
        out: dict[str, int] = {}
        for source in self._sources:
            for queue, count in source.pending().items():
                out[queue] = out.get(queue, 0) + count
        return out

    def dropped(self) -> dict[str, int]:
        """Records dropped per queue, the sources' and the outputs' own (spans left out by the budget apart)."""
        totals = self.pipeline.dropped() if self.pipeline is not None else self.drops.totals()
        if self.otel is not None:
            totals["span_budget"] = self.otel.budget.sampled_out
        return totals

    def counts(self) -> dict[str, Any]:
        """What a producer reports without the outputs: totals for ``window_timings()``, drops for ``stats()``."""
        dropped = self.dropped()
        return {
            "totals": self.aggregates.totals(),
            "dropped": {k: v for k, v in dropped.items() if k != "span_budget"},
            "spans_sampled_out": dropped.get("span_budget", 0),
            "failed_outputs": list(self.failed),
            "live_undelivered": 0 if self._live is None else self._live.undelivered,
        }

    def flush(self, timeout_s: float) -> bool:
        return self.pipeline.flush(timeout_s)  # type: ignore[union-attr]

    def file_sizes(self) -> tuple[int, int]:
        """The lengths of ``metrics.jsonl`` and of the trace file as written so far (0 for one that is off)."""
        return tuple(0 if writer is None else writer.size for writer in (self._jsonl_writer, self._trace_sink))  # type: ignore[return-value]

    def flush_files(self, timeout_s: float) -> bool:
        """Write what the pipeline handed ``metrics.jsonl`` and the trace; True when they hold all of it."""
        deadline = Deadline(timeout_s)
        writers = [w for w in (self._jsonl_writer, self._trace_sink) if w is not None]
        return all([writer.flush(deadline.left()) for writer in writers])

    def close(self, deadline: Deadline) -> None:
        """The system sampler, then the final pass and every sink, within ``deadline`` (the caller's loop has stopped)."""
        if self.system is not None:
            self.system.shutdown(deadline.left(cap_s=1.0))
        self.pipeline.shutdown(deadline)  # type: ignore[union-attr]

    def abort(self) -> None:
        """Stop whatever a failed construction started (quietly: nothing was recorded yet)."""
        deadline = Deadline(2.0)
        if self.system is not None:
            self.system.shutdown(deadline.left())
        for sink in self._sinks:
            try:
                sink.shutdown(deadline.left())
            except Exception:
                _logger.warning("otel-rl: %s did not stop cleanly", type(sink).__name__, exc_info=True)


def _cut(path: Path, length: int) -> None:
    """Cut ``path`` back to ``length`` bytes (what was committed); quietly nothing when it is not longer."""
    try:
        if path.stat().st_size > length:
            os.truncate(path, length)
    except OSError:
        pass

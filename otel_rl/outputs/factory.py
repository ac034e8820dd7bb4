"""The outputs factory: every output of one producer, built from plain data.

Both hosts build a producer's outputs here (:mod:`otel_rl.agent.producer`):
the agent process from the :class:`~otel_rl.core.identity.RunIdentity` the
producer wrote into its segment, the thread host from the same object. An
optional output that cannot start (the trace, TensorBoard, W&B, the panel,
the live stream) costs only itself: one warning, its name in
:attr:`OutputSet.failed`. Anything else that fails raises, with whatever was
started stopped again.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from otel_rl.base.deadline import Deadline
from otel_rl.base.drops import Drops
from otel_rl.base.log import logger
from otel_rl.config import TelemetryConfig
from otel_rl.core.identity import RunIdentity
from otel_rl.core.pipeline import RecordSink
from otel_rl.formats import protocol, schema, trace
from otel_rl.outputs.aggregates import Aggregates, AggregatorSink
from otel_rl.outputs.summary import SummarySink
from otel_rl.run import files

_logger = logger(__name__)

FLUSH_DRIVEN_S = 3600.0
"""The file writers' own period where the serving loop flushes them after every pass and commits what they hold."""
OWN_PERIOD_S = 2.0
"""The file writers' own period where nothing waits for them (an in-process segment dies with its producer)."""


def resource(config: TelemetryConfig, service: str, host: str = ""):
    """The OpenTelemetry resource of a producer's run (``host``: the producer's ``host.name``)."""
    from opentelemetry.sdk.resources import Resource

    attributes: dict[str, Any] = {
        **({"host.name": host} if host else {}),
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


@dataclass(frozen=True)
class Context:
    """What the outputs share with the pipeline that feeds them.

    ``takeover``: how many agents served this producer before (their outputs
    are continued: no second ``pending`` record, a trace part of this agent's
    own). ``announced``: the run's ``pending`` record is out. ``pending``:
    queue depths for the ``rl.telemetry.pending`` gauge; ``dropped``: the
    drops every queue counted, for ``rl.telemetry.dropped``.
    ``file_interval_s``: how often the file writers write on their own.
    """

    drops: Drops
    seq: Iterator[int]
    clock: Any
    takeover: int = 0
    announced: bool = False
    pending: Callable[[], dict[str, int]] = dict
    dropped: Callable[[], dict[str, int]] = dict
    file_interval_s: float = FLUSH_DRIVEN_S


@dataclass(frozen=True)
class OutputSet:
    """Every output of one producer: its sinks, in the order the pipeline calls them, and what the agent asks of them.

    The agent feeds ``sinks`` to its pipeline and otherwise uses the verbs
    below; the other fields are the factory's (``jsonl`` and ``trace`` write
    the run folder's streamed files, None when off: what a commit waits for).
    """

    sinks: tuple[RecordSink, ...]
    aggregates: Aggregates
    otel: Any
    panel: Any
    live: Any
    jsonl: Any
    trace: Any
    failed: tuple[str, ...]

    # -- what the agent asks of its outputs -----------------------------------

    @property
    def exports_spans(self) -> bool:
        """Whether a span exporter is configured (the span budget applies only then)."""
        return bool(self.otel.exports_spans)

    @property
    def tracer_provider(self) -> Any:
        """The SDK tracer provider for the user's own spans (None without a span exporter)."""
        return self.otel.tracer_provider

    @property
    def meter_provider(self) -> Any:
        """The SDK meter provider for the user's own instruments (None without a metric exporter)."""
        return self.otel.meter_provider

    def continue_run(self, run: Any) -> None:
        """A run another agent started (its start record is already out): what the spans and the panel need of it."""
        self.otel.on_run_start(run)
        if self.panel is not None:
            self.panel.on_run_start(run)

    def state(self) -> bytes:
        """What the outputs counted so far (the aggregates, the summary's fields), for an agent that takes over."""
        state: dict[str, Any] = {"aggregates": self.aggregates.state()}
        summary = self._summary()
        if summary is not None:
            state["summary"] = summary.state()
        return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)

    def restore(self, payload: bytes) -> bool:
        """Go on from what the previous agent counted up to its last commit (:meth:`state`); False where it cannot be read."""
        try:
            state = pickle.loads(payload)
            self.aggregates.restore(state["aggregates"])
        except Exception as exc:  # another version's state, say: the counts start from here, as before
            _logger.warning("otel-rl: the previous agent's counts could not be read (%s); run_summary.json counts from here on", exc)
            return False
        summary = self._summary()
        if summary is not None and "summary" in state:
            summary.restore(state["summary"])
        return True

    def _summary(self) -> SummarySink | None:
        return next((sink for sink in self.sinks if isinstance(sink, SummarySink)), None)

    def flush_files(self, deadline: Deadline) -> bool:
        """Write out the run folder's streamed files (``metrics.jsonl``, the trace part); True when both hold everything."""
        return all([writer.flush(deadline) for writer in (self.jsonl, self.trace) if writer is not None])

    def file_sizes(self) -> tuple[int, int]:
        """The bytes ``metrics.jsonl`` and the trace part hold (0 for one that is off)."""
        return (0 if self.jsonl is None else self.jsonl.size), (0 if self.trace is None else self.trace.size)

    def totals(self) -> Any:
        """The run's aggregates so far (:meth:`otel_rl.outputs.aggregates.Aggregates.totals`)."""
        return self.aggregates.totals()

    @property
    def live_undelivered(self) -> int:
        """Records the live stream was handed and the service never took (0 without one)."""
        return 0 if self.live is None else self.live.undelivered

    def unwritten(self, drops: Drops) -> tuple[str, ...]:
        """What the run folder's files could not keep, as the end line says it (``metrics.jsonl lost 2,550 records
        (No space left on device), the run's end among them``); empty when they hold everything."""
        out = []
        lost = drops.by_kind("jsonl")
        if self.jsonl is not None and lost:
            why = f" ({self.jsonl.error})" if self.jsonl.error else ""
            out.append(f"{files.JSONL_FILE} lost {sum(lost.values()):,} records{why}" + (", the run's end among them" if "run" in lost else ""))
        if self.trace is not None and self.trace.lost:
            out.append(f"{self.trace.path.name} lost {self.trace.lost:,} records" + (f" ({self.trace.error})" if self.trace.error else ""))
        for sink in self.sinks:
            for name, why in getattr(sink, "unwritten", {}).items():
                out.append(f"{name} was not written ({why})")
        return tuple(out)

    @property
    def trackers(self) -> list[Any]:
        """The experiment trackers' sinks (:class:`otel_rl.outputs.tracker.TrackerSink`)."""
        from otel_rl.outputs.tracker import TrackerSink

        return [sink for sink in self.sinks if isinstance(sink, TrackerSink)]

    def trackers_go_on(self, seconds: float) -> None:
        """Let the trackers go on for up to ``seconds`` after the close deadline (this process outlives the producer)."""
        for sink in self.trackers:
            sink.go_on_after(seconds)

    def trackers_behind(self) -> tuple[tuple[str, int, int, float], ...]:
        """Each tracker that had records yet to get when it closed: its title, how many, how many of them it never gets,
        and how long it goes on after the deadline."""
        return tuple((sink.writer.title, sink.behind, sink.lost, sink.background_s) for sink in self.trackers if sink.behind)

    def finish_trackers(self) -> None:
        """After the close, in the background: wait for the trackers that go on; one warning for what one never got."""
        for sink in self.trackers:
            lost = sink.finish_in_background()
            if lost:
                _logger.warning("otel-rl: %s did not get %d of the run's records in the time it had after the close; metrics.jsonl holds them",
                                sink.writer.title, lost)

    def shutdown(self, deadline: Deadline) -> None:
        """Stop every sink (quietly: for an output set whose pipeline never ran)."""
        for sink in self.sinks:
            try:
                sink.shutdown(deadline)
            except Exception:
                _logger.warning("otel-rl: %s did not stop cleanly", type(sink).__name__, exc_info=True)


def build_outputs(identity: RunIdentity, context: Context, extra: Sequence[RecordSink] = ()) -> OutputSet:
    """Every output of ``identity``'s producer, and ``extra`` sinks after them."""
    builder = _Builder(identity, context)
    try:
        return builder.build(list(extra))
    except BaseException:
        OutputSet(tuple(builder.sinks), None, None, None, None, None, None, ()).shutdown(Deadline(2.0))  # type: ignore[arg-type]
        raise


def trace_path(identity: RunIdentity, takeover: int):
    """Where this producer's part of the trace goes (see :mod:`otel_rl.run.files`)."""
    config, previous = identity.config, identity.previous
    directory = config.trace_output_dir or config.run_dir
    if merges_fragments(config):
        path = files.trace_part(directory, 0 if previous is None else previous.resumes + 1, config.machine)
    else:
        path = directory / files.fragment_name(config.role, config.rank, config.machine)
    return files.agent_part(path, takeover)


def merges_fragments(config: TelemetryConfig) -> bool:
    """A machine's first learner rank writes its part of the trace; its workers and other ranks write fragments it takes in."""
    return config.role == schema.LEARNER and (config.first_on_node or config.outputs_on_every_rank)


def speaks_for_job(config: TelemetryConfig) -> bool:
    """Rank 0's learner writes the run's one-writer files (the summary and configuration, ``metrics.jsonl``)."""
    return config.role == schema.LEARNER and (config.rank == 0 or config.outputs_on_every_rank)


class _Builder:
    """Builds one :class:`OutputSet`, keeping what it started so far for a failed build to stop."""

    def __init__(self, identity: RunIdentity, context: Context) -> None:
        self.identity, self.config, self.context = identity, identity.config, context
        self.sinks: list[RecordSink] = []
        self.failed: list[str] = []
        self.jsonl: Any = None

    def build(self, extra: list[RecordSink]) -> OutputSet:
        from otel_rl.outputs.otel.sink import OpenTelemetrySink

        config, identity, context = self.config, self.identity, self.context
        aggregates = Aggregates(context.clock.now_ns(), {schema.ATTR_RANK: config.rank, schema.ATTR_WORLD_SIZE: config.world_size})
        otel = OpenTelemetrySink(
            resource(config, identity.service_name, identity.host), context.clock, identity.trace_id, aggregates,
            pending=context.pending, span_exporters=config.span_exporters, metric_exporters=config.metric_exporters,
            log_exporters=config.log_exporters, metric_export_interval_ms=config.metric_export_interval_ms,
            parent_span_id=identity.parent_span_id,
        )  # fmt: skip
        self.sinks += [otel, AggregatorSink(aggregates, context.dropped)]
        if config.run_dir is not None and speaks_for_job(config):
            previous = identity.previous
            self.sinks.append(SummarySink(config, aggregates, identity.trace_id, 0 if previous is None else previous.resumes + 1))
        live = self._motrix()
        trace = self.optional("the Perfetto trace", self._perfetto) if config.trace_enabled else None
        if config.tensorboard:
            self.optional("TensorBoard", self._tensorboard)
        if config.wandb:
            from otel_rl.outputs.wandb import wandb_sink

            self.optional("W&B", lambda: wandb_sink(config, context.drops, identity.pid, self.resumed_after))
        if config.trackio:
            from otel_rl.outputs.trackio import trackio_sink

            self.optional("Trackio", lambda: trackio_sink(config, context.drops, self.resumed_after))
        if config.swanlab:
            from otel_rl.outputs.swanlab import swanlab_sink

            self.optional("SwanLab", lambda: swanlab_sink(config, context.drops, self.resumed_after))
        if config.relay is not None:
            from otel_rl.outputs.relay import RelaySink

            self.sinks.append(RelaySink(config.role, config.relay, context.drops))
        panel = None
        if config.panel:
            from otel_rl.outputs.panel import PanelSink

            panel = self.optional("the panel", lambda: PanelSink(config.run_id, derive_fps=config.world_size == 1, machines=config.nodes))
        elif config.role == schema.LEARNER and speaks_for_job(config) and not config.quiet:
            from otel_rl.outputs.panel import CommitTable

            self.sinks.append(CommitTable())  # committed stats as tables where no panel shows them (a job's log)
        self.sinks.extend(extra)
        return OutputSet(tuple(self.sinks), aggregates, otel, panel, live, self.jsonl, trace, tuple(self.failed))

    def optional(self, name: str, build: Callable[[], Any], into: list | None = None) -> Any:
        """Add the output ``build`` makes to ``into`` (the sinks) and return it; one that cannot start costs only itself."""
        try:
            output = build()
        except Exception as exc:
            self.failed.append(name)
            _logger.warning("otel-rl: %s could not start (%s: %s); the run's other outputs go on", name, type(exc).__name__, exc)
            return None
        (self.sinks if into is None else into).append(output)
        return output

    def _motrix(self) -> Any:
        """The ``motrix.metrics/v1`` exporter, when live streaming or the JSONL file is on; returns the live sender."""
        config, identity, context = self.config, self.identity, self.context
        if not config.motrix_url and not config.jsonl:
            return None
        from otel_rl.outputs.motrix.exporter import MotrixSink
        from otel_rl.outputs.motrix.jsonl import JsonlWriter

        sink = MotrixSink(
            config.run_id, protocol.writer_id(config.run_id, identity.pid, identity.started_ns), context.seq, context.drops,
            project=config.project, group=config.group, meta=config.meta, trace_id=f"{identity.trace_id:032x}",
        )  # fmt: skip
        self.sinks.append(sink)  # stopped if a later output fails to start
        if config.jsonl:
            writer = JsonlWriter(config.run_dir / files.JSONL_FILE, context.drops, interval_s=context.file_interval_s)
            sink.writers.append(writer)
            self.jsonl = writer
        live = None
        if config.motrix_url:
            from otel_rl.outputs.motrix.http_sender import HttpSender

            sender = functools.partial(HttpSender, config.motrix_url, config.motrix_token, sink.heartbeat, context.drops)
            live = self.optional("the live stream", sender, sink.writers)
            folder = config.run_dir or config.trace_output_dir
            if live is not None and folder is not None:  # the files of the run's videos and images, beside its records
                from otel_rl.outputs.motrix.media_upload import MediaUploader

                sink.writers.append(MediaUploader(config.motrix_url, config.motrix_token, config.run_id, folder, context.drops))
        if not context.announced:  # an agent taking over continues a run whose pending record is out
            sink.pending(identity.started_ns / 1e9)
        return live

    def _perfetto(self) -> RecordSink:
        from otel_rl.outputs.perfetto.trace import PerfettoTraceSink, merge_fragments

        config, identity, takeover = self.config, self.identity, self.context.takeover
        previous = identity.previous
        if previous is not None and not takeover:  # what the previous part's workers left, before new ones reuse the names
            directory = config.trace_output_dir or config.run_dir
            last = files.trace_part(directory, previous.resumes, config.machine)
            if merges_fragments(config) and last.exists():
                merge_fragments(last, files.fragment_prefix(config.machine))
        node = config.machine
        host = None if node is None else identity.host or f"node {node}"
        return PerfettoTraceSink(
            trace_path(identity, takeover),
            trace.process_name(config.role, config.rank, host),
            self.context.drops,
            fragments=files.fragment_prefix(node) if merges_fragments(config) else None,
            node=node or 0,
            host=host,
            thread_time=config.trace_thread_time,
            cuda_events=config.trace_cuda_events,
            max_bytes=config.trace_max_bytes,
            pid=identity.pid,
            profile=config.profile if config.role == schema.LEARNER else None,  # learner iterations open the window
            clock_offset_ns=identity.clock_offset_ns,
        )

    def _tensorboard(self) -> RecordSink:
        from otel_rl.outputs.tensorboard import tensorboard_sink

        config = self.config
        return tensorboard_sink(config.tensorboard_folder, self.context.drops, self.resumed_after, media_root=config.run_dir or config.trace_output_dir)

    @property
    def resumed_after(self) -> int | None:
        """A resumed run's last step so far (its earlier parts'), which the trackers' steps stay above; None for a new run."""
        previous = self.identity.previous
        return None if previous is None else previous.last_step

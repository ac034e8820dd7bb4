"""One producer's outputs at work: the pipeline that feeds them, and the records made beside the producer.

:class:`ProducerOutputs` is what a host runs for one producer (a training
process, a worker, a rank): the pipeline reading the producer's segment, the
:class:`~otel_rl.outputs.factory.OutputSet` it feeds, and an inbox for the
records made on the outputs' side (system metrics, the cycles a worker
relays through this agent): a record source of its own
(:class:`otel_rl.core.inbox.Inbox`), which hands them to the pipeline as they
are, since they are made in its process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter_ns
from typing import Any

from otel_rl.base.clock import Clock
from otel_rl.base.deadline import Deadline
from otel_rl.base.drops import Drops
from otel_rl.base.log import logger
from otel_rl.core.identity import RunIdentity
from otel_rl.core.pipeline import Pipeline, RecordSink
from otel_rl.core.records import RunStart
from otel_rl.core.sampling import SpanBudget, SpanSampler
from otel_rl.core.inbox import Inbox
from otel_rl.core.live_verdict import LiveVerdict
from otel_rl.core.perf_windows import PerfWindows
from otel_rl.core.segment_source import SegmentSource
from otel_rl.core.step_check import StepCheck
from otel_rl.core.system_metrics import SystemSampler
from otel_rl.agent.media import MediaWriter
from otel_rl.formats import protocol, schema
from otel_rl.run import media
from otel_rl.outputs.factory import FLUSH_DRIVEN_S, OWN_PERIOD_S, Context, build_outputs

_logger = logger(__name__)


@dataclass(frozen=True)
class Counts:
    """What a producer reports without its outputs (``window_timings()``, ``stats()``, the end line), as of the last pass."""

    totals: tuple[dict[tuple[str, str], float], dict[str, tuple[int, float]]] = ({}, {})
    """Cumulative host milliseconds per (timeline, phase), and (cycles, wall ms) per timeline."""
    dropped: dict[str, int] | None = None
    spans_sampled_out: int = 0
    failed_outputs: tuple[str, ...] = ()
    live_undelivered: int = 0
    unwritten: tuple[str, ...] = ()
    """What the run folder's files could not keep (:meth:`otel_rl.outputs.factory.OutputSet.unwritten`)."""
    trackers_behind: tuple[tuple[str, int, int, float], ...] = ()
    """The trackers that had records yet to get at the close: title, how many, how many never go, how long it goes on after (:meth:`otel_rl.outputs.factory.OutputSet.trackers_behind`)."""


class ProducerOutputs:
    """The outputs of one producer and the pipeline feeding them from ``source`` and the inbox (see the module docstring).

    Args:
        takeover: how many agents served this producer before (see :class:`otel_rl.outputs.factory.Context`).
        announced: the run's ``pending`` record is out.
        durable: the serving loop commits only what the files hold (see :class:`otel_rl.agent.serve.SegmentServer`),
            flushing them after every pass; else they write on their own period.
        media_stem: how the producer's handoff files of videos and images are named (its segment's path less ``.seg``).
    """

    def __init__(
        self, identity: RunIdentity, source: SegmentSource, sinks: Sequence[RecordSink] = (), takeover: int = 0, announced: bool = False,
        durable: bool = True, media_stem: Path | None = None,
    ) -> None:
        config = identity.config
        self.identity, self.config, self.source = identity, config, source
        self.clock = Clock()
        self.clock.offset_ns = identity.clock_offset_ns
        self.drops = Drops()
        seq = protocol.seq_counter()
        self.inbox = Inbox()
        """Takes the records made on the outputs' side (the system metrics, relayed cycles), handed to the pipeline as they are."""
        file_interval_s = FLUSH_DRIVEN_S if durable else OWN_PERIOD_S
        context = Context(self.drops, seq, self.clock, takeover, announced, self.pending, self.dropped, file_interval_s)
        self.outputs = build_outputs(identity, context, sinks)
        self._state_too_large = False
        budget = SpanBudget(config.span_budget_per_s) if self.outputs.exports_spans else None
        previous = identity.previous
        step_check = StepCheck(None if previous is None else previous.last_steps)
        self.media: MediaWriter | None = None
        """Writes the producer's videos and images into the run folder (none without one)."""
        folder = config.run_dir or config.trace_output_dir
        if folder is not None:
            suffix = "" if config.role == schema.LEARNER and config.rank == 0 else f"-{config.role}{config.rank}"
            self.media = MediaWriter(Path(folder) / media.MEDIA_DIR, suffix, self.inbox.add_event, self.drops, media_stem, takeover > 0)
        self.pipeline = Pipeline([source, self.inbox], self.outputs.sinks, self.clock, seq, self.drops, step_check, SpanSampler(budget),
                                 verdict=LiveVerdict(), media=None if self.media is None else self.media.take,
                                 perf=PerfWindows(config.perf_interval_s, derive_fps=config.world_size == 1))
        if source.run is not None and self.pipeline.verdict is not None:
            self.pipeline.verdict.start()  # taken over mid-run: the run is open, its verdict goes on being said
        self.system: SystemSampler | None = None
        if config.system_metrics_interval_s:
            self.system = SystemSampler(self._system_scalars, config.system_metrics_interval_s, identity.pid)
            if self.outputs.meter_provider is not None:
                self.system.register_gauges(self.outputs.meter_provider.get_meter("otel_rl.system"))

    def _system_scalars(self, values: dict[str, float]) -> None:
        # perf_counter_ns() is CLOCK_MONOTONIC, one clock for every process of the machine: the producer's timebase.
        # They carry the run's latest iteration and env steps, so that they plot against the run's axes.
        iteration, env_steps = self.pipeline.latest_axes
        self.inbox.add_scalars((perf_counter_ns(), values, None, iteration, env_steps))

    def save_state(self, held: Any) -> None:
        """Save the outputs' counts for the commit with ``held`` about to be made (an agent taking over goes on from them)."""
        payload = self.outputs.state()
        if not self.source.save_state(held, payload) and not self._state_too_large:
            self._state_too_large = True
            _logger.warning("otel-rl: the outputs' counts (%d KiB) are too large to keep for an agent that takes over; "
                            "after one, run_summary.json counts from its start", len(payload) >> 10)  # fmt: skip

    def restore_state(self) -> None:
        """Go on from the counts the previous agent saved at its last commit (where this one reads on from)."""
        payload = self.source.saved_state()
        if payload is not None:
            self.outputs.restore(payload)

    def continue_run(self, run: RunStart) -> None:
        """A run another agent started (its start record is out): what the spans and the panel need of it."""
        self.outputs.continue_run(run)

    def add_sink(self, sink: RecordSink) -> None:
        self.pipeline.add_sink(sink)

    def pending(self) -> dict[str, int]:
        """Records waiting in the sources, per queue (the ``rl.telemetry.pending`` gauge)."""
        out: dict[str, int] = {}
        for source in (self.source, self.inbox):
            for queue, count in source.pending().items():
                out[queue] = out.get(queue, 0) + count
        if self.media is not None and self.media.pending():
            out["media"] = self.media.pending()
        return out

    def dropped(self) -> dict[str, int]:
        """Records dropped per queue, the sources' and the outputs' own, and (queue ``span_budget``) spans left out by the budget."""
        return {**self.pipeline.dropped(), "span_budget": self.pipeline.sampler.sampled_out}

    def counts(self) -> Counts:
        return Counts(
            self.outputs.totals(),
            self.pipeline.dropped(),
            self.pipeline.sampler.sampled_out,
            self.outputs.failed,
            self.outputs.live_undelivered,
            self.outputs.unwritten(self.drops),
            self.outputs.trackers_behind(),
        )

    def flush(self, deadline: Deadline) -> bool:
        return self.pipeline.flush(deadline)

    def finish_media(self, deadline: Deadline) -> None:
        """Write the videos and images handed over (half of what is left of ``deadline`` at most); what is left is lost,
        each named. Their records go in the next pass. Once: later videos and images are lost the same way."""
        if self.media is not None:
            self.pipeline.drain(deadline.left())  # the requests the producer wrote last
            self.media.close_by(Deadline(deadline.left() / 2))

    def close(self, deadline: Deadline) -> None:
        """The system sampler, then the final pass and every sink, by ``deadline`` (the serving loop has stopped)."""
        if self.system is not None:
            self.system.shutdown(Deadline(deadline.left(cap_s=1.0)))
        self.finish_media(deadline)
        self.pipeline.shutdown(deadline)
        self.inbox.close()

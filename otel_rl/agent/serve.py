"""Serving one producer's segment: its outputs, fed by passes of their pipeline, until it closes or dies.

:class:`SegmentServer` is the one loop that drives a producer's pipeline, in
an agent process and (``agent="thread"``) on a thread of the training process
alike. Each pass takes what the producer wrote, hands it to the outputs, waits
for the files to have it (``metrics.jsonl``, the trace part) and only then
commits the read position: an agent killed at any moment leaves every record
it had not written to the agent that replaces it, which cuts the files back to
what was committed (:func:`serve_segment`) and reads the rest again. A
segment in the producer's own memory (``agent="thread"``) dies with it, and
no agent can take it over: its server commits at once, and its file writers
write on their own period (waiting for them would hand the training thread's
GIL back and forth several times a pass).

The producer speaks through the segment's header: ``state`` (closing),
``flush_request`` / ``flush_done`` and ``deadline_ns`` (its close or flush
deadline, honoured here). The producer is watched
(:class:`~otel_rl.agent.watch.ProducerWatch`): when it dies without closing
(SIGKILL, OOM kill, segfault, a second SIGTERM), everything it wrote is read,
an open run ends as ``killed`` (with the signal when the kernel still tells
it) or ``failed`` (with the exit code), and every output closes.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from otel_rl.formats import lifecycle
from otel_rl.agent.producer import Counts, ProducerOutputs
from otel_rl.agent.trace_upload import send_trace_later
from otel_rl.agent.watch import ProducerDeadline, ProducerWatch
from otel_rl.base.deadline import Deadline
from otel_rl.base.log import logger
from otel_rl.base.loops import BackgroundLoop
from otel_rl.base.processes import pid_running
from otel_rl.core.identity import RunIdentity
from otel_rl.core.pipeline import RecordSink
from otel_rl.core.segment_source import SegmentSource
from otel_rl.formats import schema
from otel_rl.outputs.factory import merges_fragments, trace_path
from otel_rl.outputs.tracker import BACKGROUND_S as TRACKER_BACKGROUND_S
from otel_rl.run import files
from otel_rl.shm import segment as shm

_logger = logger(__name__)

CONTROL_POLL_S = 0.05
"""How often the server reads the producer's requests (close, flush) between passes."""
MAX_PASSES = 64
"""Passes in a row while each stops at its per-pass limits (then the requests are read again)."""
TRUNCATED = (lifecycle.FAILED, "the run's shared-memory segment was truncated by another process; records after that were lost")
"""How a run ends whose segment another process shrank (training goes on; its later records cannot be read)."""


class SegmentServer(BackgroundLoop):
    """The loop of one producer's outputs (see the module docstring).

    ``before_close`` runs first when serving ends (a learner's server waits
    there for its workers' outputs to close). ``durable``: commit only what the
    files hold (see the module docstring).
    """

    def __init__(
        self, reader: shm.SegmentReader, producer: ProducerOutputs, before_close: Callable[[], None] | None = None, durable: bool = True,
        in_process: bool = False,
    ) -> None:
        identity = producer.identity
        super().__init__(f"otel-rl-serve-{identity.pid}", min(identity.config.pipeline_interval_s, CONTROL_POLL_S))
        self.reader = reader
        self.producer = producer
        self.in_process = in_process
        """The producer is this process (the thread host): it reads what this publishes without a segment in between."""
        self.latest: Counts = Counts()
        """What the last pass reported (see :meth:`publish`)."""
        self._pass_every_s = identity.config.pipeline_interval_s
        self._next_pass = 0.0
        self._before_close = before_close
        self._durable = durable
        self.done = threading.Event()
        if reader.get("agent_state") == shm.AGENT_NONE:  # the first to serve it: the files as they were before
            self._commit_file_sizes()
        reader.set("agent_pid", os.getpid())
        reader.set("agent_state", shm.AGENT_ATTACHED)
        self.watch = ProducerWatch(identity.pid, self.wake)
        self.start()

    def run_once(self) -> None:
        if self.stopping:  # served to the end
            return
        reader = self.reader
        if reader.damaged():  # what it holds from now on cannot be trusted: the run ends with what was read
            _logger.warning("otel-rl: the segment of process %d was truncated by another process; its run ends here", self.producer.identity.pid)
            self._end(TRUNCATED)
            self.close(Deadline(0))
            return
        closing = reader.get("state") == shm.CLOSING
        ended = None if closing else self.watch.ended()
        request = reader.get("flush_request")
        flushing = request > reader.get("flush_done")
        if closing or ended is not None or flushing or time.monotonic() >= self._next_pass:
            try:
                self._passes()
            except Exception:
                if not (closing or ended is not None):
                    raise  # said once by the loop, and tried again next round
                _logger.warning("otel-rl: reading the segment of process %d failed; its run ends with what was read",
                                self.producer.identity.pid, exc_info=True)  # fmt: skip
            self._next_pass = time.monotonic() + self._pass_every_s
        if closing or ended is not None:
            try:
                self._end(ended)  # a pass that keeps failing never keeps the agent past its producer's end
            finally:
                self.close(Deadline(0))
        elif flushing:
            self.producer.flush(ProducerDeadline(reader, 5.0))
            reader.set("flush_done", request)

    def _passes(self) -> None:
        """A pass, more while one stopped at its limits (:data:`MAX_PASSES` at most), each followed by a commit of what the files now hold.

        What the producer writes during a pass waits for the next interval:
        a pass reads an interval's records at once, not a trickle each. A
        backlog (an agent that took over, say) is written pass by pass, so
        that no output's queue is handed more than one pass holds.
        """
        for _ in range(MAX_PASSES):
            self.producer.pipeline.drain()
            self._commit()
            if not self.producer.source.behind:
                break
        self.publish()

    def _commit(self) -> None:
        """Commit what the pipeline read, once the files hold it (at once where nothing can take over)."""
        deadline = Deadline(1.0)
        if not self._durable or self.producer.outputs.flush_files(deadline):
            held = self.producer.pipeline.lanes.held
            if self._durable:  # the counts as they stand at this commit, for an agent that takes over to go on from
                self.producer.save_state(held)
            self._commit_file_sizes()  # first: a death between the two re-reads (never skips) one pass
            self.producer.source.commit(held)  # an open iteration: read again whole by a next agent
            self.reader.set("commits", self.reader.get("commits") + 1)

    def _end(self, ended: tuple[str, str] | None) -> None:
        """The producer closed (or died: its open run ends, or its timeline): close every output within its deadline."""
        producer = self.producer
        identity, source = producer.identity, producer.source
        configured_s = identity.config.shutdown_timeout_s
        # A producer that waits bounds the close; one that died leaves the configured deadline (its own is stale).
        alive = ended is None and pid_running(identity.pid)
        deadline = ProducerDeadline(self.reader, configured_s) if alive else Deadline(configured_s)
        producer.finish_media(deadline)  # a killed producer's videos: written (or lost, named) before its run ends
        outlives = identity.pid != os.getpid()  # an agent process: its trackers go on after the deadline, nothing waits on them
        if outlives:
            producer.outputs.trackers_go_on(TRACKER_BACKGROUND_S)
        if ended is not None:
            if source.run is not None:
                source.end_run(*ended, producer.clock.to_epoch_ns)
            elif identity.config.role == schema.LEARNER and not self.reader.run_started():  # died before tel.run()
                source.end_run(*ended, producer.clock.to_epoch_ns, pending_since_ns=identity.started_ns)
            else:  # a worker, or a run that had ended: its timeline ends
                source.record_death(*ended, identity.pid)
        try:
            if self._before_close is not None:
                self._before_close()
        finally:
            producer.close(deadline)
            source.commit()
            self.publish()  # what closing dropped, for the producer's last stats()
            self.reader.set("agent_state", shm.AGENT_DONE)
            send_trace_later(identity.config, producer.outputs.live_undelivered)
            if outlives:  # the producer has what its end line says; the trackers' records still on their way go now
                producer.outputs.finish_trackers()

    def _commit_file_sizes(self) -> None:
        jsonl, trace = self.producer.outputs.file_sizes()
        self.reader.set("committed_jsonl_bytes", jsonl)
        self.reader.set("committed_trace_bytes", trace)

    def publish(self) -> None:
        """Hand the producer what it reports without the outputs (``window_timings()``, ``stats()``): as it is when the
        producer is this process (:attr:`latest`), through the segment when it is another."""
        counts = self.producer.counts()
        self.latest = counts
        if not self.in_process:
            self.reader.publish_totals(pickle.dumps(counts))

    def release(self) -> None:
        self.watch.shutdown(Deadline(1.0))
        self.done.set()


def attach(reader: shm.SegmentReader) -> int:
    """Count this agent among the segment's; returns how many served it before (0: this one writes the outputs first)."""
    before = reader.get("agents") if reader.get("agent_state") != shm.AGENT_NONE else 0
    reader.set("agents", max(before, reader.get("agents")) + 1)
    return before


def serve_segment(
    reader: shm.SegmentReader, identity: RunIdentity, sinks: Sequence[RecordSink] = (), before_close=None, durable: bool = True,
    in_process: bool = False, media_stem: Path | None = None,
) -> SegmentServer:
    """Build the producer's outputs from ``identity`` and serve its segment (the caller waits on ``.done``; ``durable`` and
    ``in_process``: see :class:`SegmentServer`; ``media_stem``: how a segment in memory names its handoff files).

    An agent taking over from one that died first cuts ``metrics.jsonl`` and
    the previous agent's trace part back to what that one committed: it reads
    the rest again, so every record is written once.
    """
    first = reader.get("agent_state") == shm.AGENT_NONE
    takeover = attach(reader)
    if not first:
        _cut_back(identity, takeover, reader.get("committed_jsonl_bytes"), reader.get("committed_trace_bytes"))
    source = SegmentSource(reader, takeover > 0)
    # Before a first commit, the previous agent's pending record is cut off with the rest: this one writes it.
    stem = media_stem if reader.path is None else reader.path.with_suffix("")
    producer = ProducerOutputs(identity, source, sinks, takeover, announced=reader.get("commits") > 0, durable=durable, media_stem=stem)
    if not first:
        producer.restore_state()  # what the previous agent counted up to its last commit: counted once, on from there
    if source.run is not None:
        producer.continue_run(source.run)
    return SegmentServer(reader, producer, before_close, durable, in_process)


def _cut_back(identity: RunIdentity, takeover: int, jsonl_bytes: int, trace_bytes: int) -> None:
    config = identity.config
    if config.jsonl and config.run_dir is not None:
        _cut(config.run_dir / files.JSONL_FILE, jsonl_bytes)
    if config.trace_enabled and takeover:
        previous_part = trace_path(identity, takeover - 1)
        _cut(previous_part if merges_fragments(config) else files.partial(previous_part), trace_bytes)


def _cut(path: Path, length: int) -> None:
    """Cut ``path`` back to ``length`` bytes (what was committed); quietly nothing when it is not longer."""
    with contextlib.suppress(OSError):
        if path.stat().st_size > length:
            os.truncate(path, length)

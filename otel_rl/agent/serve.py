"""Serving one producer's segment: its outputs, fed by passes of their pipeline, until it closes or dies.

:class:`SegmentServer` is the one loop that drives a producer's pipeline in an
agent. Each pass takes what the producer wrote (:class:`SegmentSource`), hands
it to the outputs, waits for the files to have it (``metrics.jsonl``, the
trace part) and only then commits the read position: an agent killed at any
moment leaves every record it had not written to the agent that replaces it.

The producer speaks through the segment's header: ``state`` (closing),
``flush_request`` / ``flush_done`` and ``deadline_ns`` (its close or flush
deadline, honoured here). The producer is watched (:class:`ProducerWatch`):
when it dies without closing (SIGKILL, OOM kill, segfault, a second SIGTERM),
everything it wrote is read, an open run ends as ``killed`` (with the signal
when the kernel still tells it) or ``failed`` (with the exit code), and every
output closes.
"""

from __future__ import annotations

import logging
import marshal
import os
import pickle
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence

from otel_rl.agent.segment_source import SegmentSource
from otel_rl.base.deadline import Deadline
from otel_rl.base.log import RELAYED, logger
from otel_rl.base.loops import BackgroundLoop
from otel_rl.base.processes import pid_alive, pid_running
from otel_rl.core.identity import RunIdentity
from otel_rl.core.pipeline import RecordSink
from otel_rl.formats import schema
from otel_rl.outputs.factory import Outputs
from otel_rl.shm import segment as shm
from otel_rl.shm.layout import MessageKind

_logger = logger(__name__)

CONTROL_POLL_S = 0.05
"""How often the server reads the producer's requests (close, flush) between passes."""
MAX_PASSES = 64
"""Passes in a row while each stops at its per-pass limits (then the requests are read again)."""
TRUNCATED = ("failed", "the run's shared-memory segment was truncated by another process; records after that were lost")
"""How a run ends whose segment another process shrank (training goes on; its later records cannot be read)."""


class ProducerDeadline(Deadline):
    """The producer's deadline as the segment's header holds it (else ``default_s`` from now), and earlier if it moves.

    ``time.monotonic()`` is one clock for every process of the machine, so
    the producer's close deadline is honoured here as it stands: when a
    second SIGTERM shortens it there, it is shorter here too.
    """

    __slots__ = ("_reader",)

    def __init__(self, reader: shm.SegmentReader, default_s: float) -> None:
        super().__init__(default_s)
        self._reader = reader
        at = self._header_at()
        if at is not None:
            self._at = at

    def _header_at(self) -> float | None:
        header = self._reader.header
        at_ns = header["deadline_ns"].value if header else shm.NO_DEADLINE
        return None if at_ns == shm.NO_DEADLINE else at_ns / 1e9

    def _follow(self) -> None:
        at = self._header_at()
        if at is not None and at < self._at:
            self._at = at

    @property
    def at(self) -> float:
        self._follow()
        return self._at

    def left(self, cap_s: float | None = None) -> float:
        self._follow()
        return super().left(cap_s)


class ProducerWatch(BackgroundLoop):
    """Whether the producer process lives, and how it ended; wakes ``on_exit`` the moment it exits.

    ``/proc/<pid>/stat`` tells apart a reused pid (its start time) and, while
    the dead process waits for its parent to collect it, its wait status; a
    pidfd makes the wake-up immediate, before the parent collects it.
    """

    def __init__(self, pid: int, on_exit: Callable[[], None]) -> None:
        super().__init__(f"otel-rl-watch-{pid}", 1.0)
        self.pid = pid
        self._on_exit = on_exit
        stat = self._stat()
        self._started = stat[1] if stat else None
        try:
            self._pidfd: int | None = os.pidfd_open(pid) if pid != os.getpid() else None
        except (AttributeError, OSError):
            self._pidfd = None
        if self._pidfd is not None:
            self.start()

    def run_once(self) -> None:
        if self._pidfd is not None and not self.stopping and select.select([self._pidfd], [], [], self.interval_s)[0]:
            self._on_exit()
            self.close(0)

    def finish(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def _stat(self) -> tuple[str, int | None, int | None] | None:
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                text = f.read().decode("ascii", "replace")
        except OSError:
            return None
        fields = text[text.rindex(")") + 2 :].split()
        state, started = fields[0], int(fields[19])
        exit_code = int(fields[49]) if len(fields) > 49 else None
        return state, started, exit_code

    def ended(self) -> tuple[str, str] | None:
        """None while the producer lives; else ``(status, reason)`` for a run it left open."""
        if self._started is None:  # no /proc here (or the producer was gone before the agent looked)
            return None if pid_alive(self.pid) else ("killed", "the process disappeared without ending its run")
        stat = self._stat()
        if stat is not None and stat[1] == self._started and stat[0] not in ("Z", "X"):
            return None
        if stat is not None and stat[1] == self._started and stat[2] is not None:
            wait_status = stat[2]
            if os.WIFSIGNALED(wait_status):
                number = os.WTERMSIG(wait_status)
                return "killed", f"killed by {signal.Signals(number).name}" if number in signal.valid_signals() else f"killed by signal {number}"
            code = os.WEXITSTATUS(wait_status)
            return "failed", f"exited with code {code} before ending its run"
        return "killed", "the process disappeared without ending its run (SIGKILL, OOM kill or os._exit)"


class SegmentServer(BackgroundLoop):
    """The loop of one producer's outputs in an agent (see the module docstring).

    ``before_close`` runs first when serving ends (a learner's server waits
    there for its workers' outputs to close).
    """

    def __init__(
        self,
        reader: shm.SegmentReader,
        outputs: Outputs,
        source: SegmentSource,
        before_close: Callable[[], None] | None = None,
    ) -> None:
        identity = outputs.identity
        super().__init__(f"otel-rl-serve-{identity.pid}", min(identity.config.pipeline_interval_s, CONTROL_POLL_S))
        self.reader = reader
        self.outputs = outputs
        self.source = source
        self._pass_every_s = identity.config.pipeline_interval_s
        self._next_pass = 0.0
        self._before_close = before_close
        self.done = threading.Event()
        if reader.get("agent_state") == shm.AGENT_NONE:  # the first agent: the files as they were before it
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
            _logger.warning("otel-rl: the segment of process %d was truncated by another process; its run ends here", self.outputs.identity.pid)
            self._end(TRUNCATED)
            self.close(0)
            return
        closing = reader.get("state") == shm.CLOSING
        ended = None if closing else self.watch.ended()
        request = reader.get("flush_request")
        flushing = request > reader.get("flush_done")
        if closing or ended is not None or flushing or time.monotonic() >= self._next_pass:
            self._passes()
            self._next_pass = time.monotonic() + self._pass_every_s
        if closing or ended is not None:
            self._end(ended)
            self.close(0)
        elif flushing:
            self.outputs.flush(ProducerDeadline(reader, 5.0).left())
            reader.set("flush_done", request)

    def _passes(self) -> None:
        """A pass, more while one stopped at its limits (:data:`MAX_PASSES` at most), each followed by a commit of what the files now hold.

        What the producer writes during a pass waits for the next interval:
        a pass reads an interval's records at once, not a trickle each. A
        backlog (an agent that took over, say) is written pass by pass, so
        that no output's queue is handed more than one pass holds.
        """
        pipeline = self.outputs.pipeline
        for _ in range(MAX_PASSES):
            pipeline.drain()  # type: ignore[union-attr]
            self._commit()
            if not self.source.behind:
                break
        self.publish()

    def _commit(self) -> None:
        """Commit what the pipeline read, once the files hold it."""
        if self.outputs.flush_files(1.0):
            self._commit_file_sizes()  # first: a death between the two re-reads (never skips) one pass
            self.source.commit()
            self.reader.set("commits", self.reader.get("commits") + 1)

    def _end(self, ended: tuple[str, str] | None) -> None:
        """The producer closed (or died: its open run ends, or its timeline): close every output within its deadline."""
        if ended is not None:
            identity = self.outputs.identity
            if self.source.run is not None:
                self.source.end_run(*ended, self.outputs.clock.to_epoch_ns)
            elif identity.config.role == schema.LEARNER and not self.reader.run_started():  # died before tel.run()
                self.source.end_run(*ended, self.outputs.clock.to_epoch_ns, pending_since_ns=identity.started_ns)
            else:  # a worker, or a run that had ended: its timeline ends
                self.source.record_death(*ended, identity.pid)
        try:
            if self._before_close is not None:
                self._before_close()
        finally:
            configured_s = self.outputs.config.shutdown_timeout_s
            # A producer that waits bounds the close; one that died leaves the configured deadline (its own is stale).
            alive = ended is None and pid_running(self.outputs.identity.pid)
            self.outputs.close(ProducerDeadline(self.reader, configured_s) if alive else Deadline(configured_s))
            self.source.commit()
            self.publish()  # what closing dropped, for the producer's last stats()
            self.reader.set("agent_state", shm.AGENT_DONE)

    def _commit_file_sizes(self) -> None:
        jsonl_bytes, trace_bytes = self.outputs.file_sizes()
        self.reader.set("committed_jsonl_bytes", jsonl_bytes)
        self.reader.set("committed_trace_bytes", trace_bytes)

    def publish(self) -> None:
        """Hand the producer what it reports without the outputs (``window_timings()``, ``stats()``)."""
        self.reader.publish_totals(pickle.dumps(self.outputs.counts()))

    def finish(self) -> None:
        self.watch.shutdown(1.0)
        self.done.set()


def attach(reader: shm.SegmentReader) -> int:
    """Count this agent among the segment's; returns how many served it before (0: this one writes the outputs first)."""
    before = reader.get("agents") if reader.get("agent_state") != shm.AGENT_NONE else 0
    reader.set("agents", max(before, reader.get("agents")) + 1)
    return before


def serve_segment(reader: shm.SegmentReader, identity: RunIdentity, sinks: Sequence[RecordSink] = (), before_close=None) -> SegmentServer:
    """Build the producer's outputs from ``identity`` and serve its segment (the caller waits on ``.done``)."""
    first = reader.get("agent_state") == shm.AGENT_NONE
    takeover = attach(reader)
    source = SegmentSource(reader, takeover > 0)
    committed = None if first else (reader.get("committed_jsonl_bytes"), reader.get("committed_trace_bytes"))
    # Before a first commit, the previous agent's pending record is cut off with the rest: this one writes it.
    announced = reader.get("commits") > 0
    outputs = Outputs(identity, [source], sinks, takeover, flush_driven=True, committed=committed, announced=announced)
    if source.run is not None:
        outputs.continue_run(source.run)
    return SegmentServer(reader, outputs, source, before_close)


class LogForwarder(logging.Handler):
    """The agent process's otel-rl log records, sent to a producer, which logs them as its own.

    Warnings about a producer's input then reach the training process's
    logging (its handlers, its files), not only the terminal. A record goes to
    the producer whose segment the logging thread serves (see :meth:`serving`);
    one from another thread (an exporter's) goes to the first producer still
    alive; with none, to stderr.
    """

    _current = threading.local()

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._producers: list[tuple[shm.SegmentReader, int]] = []
        self._lock = threading.Lock()

    @classmethod
    def serving(cls, reader: shm.SegmentReader, pid: int) -> None:
        """Records logged on this thread from now on are the producer ``pid``'s."""
        cls._current.producer = (reader, pid)

    def add(self, reader: shm.SegmentReader, pid: int) -> None:
        with self._lock:
            self._producers.append((reader, pid))

    def remove(self, reader: shm.SegmentReader) -> None:
        with self._lock:
            self._producers = [p for p in self._producers if p[0] is not reader]

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            payload = marshal.dumps((record.levelno, record.name, message))
            current = getattr(self._current, "producer", None)
            with self._lock:
                candidates = [current] if current is not None else list(self._producers)
            for reader, pid in candidates:
                if reader.logs is not None and pid_alive(pid) and reader.logs.put(MessageKind.LOG, payload, reader.logs.capacity):
                    return
            sys.stderr.write(message + "\n")
        except Exception:
            self.handleError(record)

    @classmethod
    def install(cls) -> LogForwarder:
        forwarder = cls()
        logging.getLogger("otel_rl").addHandler(forwarder)
        return forwarder


def relay_logs(segment: shm.Segment) -> None:
    """Log, in the producer, what the agent forwarded (see :class:`LogForwarder`)."""
    logs = segment.logs
    if logs is None:
        return
    frames = logs.take(shm.LOG_BYTES)
    logs.commit()
    for _, payload in frames:
        try:
            level, name, message = marshal.loads(payload)
        except (ValueError, EOFError, TypeError):
            continue
        logging.getLogger(name).log(level, "%s", message, extra=RELAYED)

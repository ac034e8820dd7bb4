"""Where a producer's outputs run: the :class:`Host` seam, and the host that keeps them in this process.

Both hosts are the same machinery: the training process records into a
shared-memory segment (:class:`~otel_rl.training.recorder.Recorder`) and a
:class:`~otel_rl.agent.serve.SegmentServer` serves it, in an agent process
(:class:`otel_rl.agent.launch.AgentHost`, the default: training then pays only
its recorder) or on a thread of this process (:class:`ThreadHost`,
``agent="thread"``: the segment is this process's own memory). The producer
speaks to its server through the segment's header either way
(:mod:`otel_rl.agent.handshake`). :func:`start_host` picks the host for
``config.agent``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, Protocol

from otel_rl.agent import handshake, switching
from otel_rl.agent.producer import Counts
from otel_rl.agent.serve import serve_segment
from otel_rl.base.deadline import Deadline
from otel_rl.base.log import logger, once
from otel_rl.core.identity import RunIdentity
from otel_rl.core.pipeline import RecordSink
from otel_rl.shm import segment as shm
from otel_rl.training.recorder import Recorder

_logger = logger(__name__)


class Host(Protocol):
    """What :class:`otel_rl.Telemetry` needs of the place its outputs run."""

    mode: str
    """``process`` (an agent process) or ``thread`` (this process)."""
    recorder: Recorder
    """What the training thread records into."""
    workers_agent: str | None
    """The agent this process's workers record into (None: they relay their cycles to this process)."""
    media_stem: Path | None
    """How this producer's handoff files of videos and images are named, where they go (None: in the run folder)."""

    def flush(self, deadline: Deadline) -> bool: ...

    def shutdown(self, deadline: Deadline, at_exit: bool) -> None:
        """Everything recorded reaches the outputs, which close; back when they have, or at ``deadline``."""

    def hurry(self, deadline: Deadline) -> None:
        """``deadline`` moved earlier (a second SIGTERM): the outputs' side honours it too."""

    def counts(self) -> Counts:
        """What the outputs reported after their last pass."""

    def pending(self) -> dict[str, int]: ...

    def agent_pid(self) -> int | None: ...

    def relay_logs(self) -> None:
        """Log here, now, the warnings the agent forwarded (an agent process's; a thread's are logged where they are said)."""

    def add_sink(self, sink: RecordSink) -> bool: ...

    def tracer_provider(self) -> Any: ...

    def meter_provider(self) -> Any: ...


class ThreadHost:
    """The outputs on a thread of this process, serving a segment in this process's memory."""

    mode = "thread"
    workers_agent = None

    def __init__(self, identity: RunIdentity, sinks: list[RecordSink]) -> None:
        self.segment = shm.Segment(None, b"", identity.config.lane_capacity)
        self.recorder = Recorder(self.segment, self.segment.lane_capacity)
        self.media_stem = _media_stem(identity)
        self._server = serve_segment(shm.SegmentReader(self.segment.buffer), identity, sinks, durable=False, in_process=True,
                                     media_stem=self.media_stem)  # fmt: skip
        switching.hold()

    def flush(self, deadline: Deadline) -> bool:
        self.recorder.publish_unlaned()
        return handshake.flush(self.segment, deadline, lambda: not self._server.done.is_set())

    def shutdown(self, deadline: Deadline, at_exit: bool = False) -> None:
        self.recorder.publish_unlaned()
        handshake.close(self.segment, deadline)
        self._server.wake()
        while not self._server.done.wait(min(0.05, max(deadline.left(), 0.0))) and deadline.left() > 0:
            pass  # in steps: the deadline may move earlier meanwhile (a second SIGTERM, a Ctrl-C)
        switching.release()
        self.recorder.detach()
        self.segment.close()
        if self.media_stem is not None and self._server.done.is_set():  # what the writer left it counted as lost
            shutil.rmtree(self.media_stem.parent, ignore_errors=True)

    def hurry(self, deadline: Deadline) -> None:
        handshake.hurry(self.segment, deadline)

    def counts(self) -> Counts:
        return self._server.latest  # what its last pass reported, as it is: no pickle to the segment and back

    def pending(self) -> dict[str, int]:
        return self.recorder.pending()

    def agent_pid(self) -> None:
        return None

    def relay_logs(self) -> None:
        """Nothing to relay: the outputs' warnings are logged in this process as they are said."""

    def add_sink(self, sink: RecordSink) -> bool:
        self._server.producer.add_sink(sink)
        return True

    def tracer_provider(self) -> Any:
        return self._server.producer.outputs.tracer_provider

    def meter_provider(self) -> Any:
        return self._server.producer.outputs.meter_provider


def _media_stem(identity: RunIdentity) -> Path | None:
    """Where a thread host's handoff files go: a folder of this process's own in the user's shared memory (made at the first)."""
    from otel_rl.agent.directory import segment_dir
    from otel_rl.agent.launch import segment_path

    with contextlib.suppress(OSError):
        return segment_path(identity.config, segment_dir() / f"thread-{os.getpid()}-{os.urandom(4).hex()}").with_suffix("")
    return None


def start_host(identity: RunIdentity, sinks: list[RecordSink]) -> Host:
    """The host for ``identity.config.agent``; sinks given here keep the outputs in this process."""
    config = identity.config
    if config.agent == "thread":
        return ThreadHost(identity, sinks)
    if sinks:
        _logger.warning("otel-rl: sinks passed to init() run in this process; the outputs run on a thread", extra=once("agent-sinks"))
        return ThreadHost(identity, sinks)
    from otel_rl.agent.launch import start_agent

    return start_agent(identity) or ThreadHost(identity, sinks)

"""Where a producer's outputs run: the :class:`Host` seam, and the host that keeps them in this process.

:func:`start_host` picks the host for ``config.agent``: an agent process
(:class:`otel_rl.agent.launch.AgentHost`, the default: training then pays only
its recorder) or this process (:class:`InProcessHost`, ``agent="thread"``:
the same outputs and pipeline, on a thread, reading in-memory lanes).
"""

from __future__ import annotations

from typing import Any, Protocol

from otel_rl.base.deadline import Deadline
from otel_rl.base.log import logger, once
from otel_rl.core.identity import RunIdentity
from otel_rl.core.pipeline import PipelineLoop, RecordSink
from otel_rl.outputs.factory import Outputs
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

    def flush(self, deadline: Deadline) -> bool: ...

    def stop(self, deadline: Deadline, at_exit: bool) -> None:
        """Everything recorded reaches the outputs, which close; back when they have, or at ``deadline``."""

    def hurry(self, deadline: Deadline) -> None:
        """``deadline`` moved earlier (a second SIGTERM): the outputs' side honours it too."""

    def counts(self) -> dict[str, Any]:
        """:meth:`otel_rl.outputs.factory.Outputs.counts`, as of the outputs' last pass."""

    def pending(self) -> dict[str, int]: ...

    def agent_pid(self) -> int | None: ...

    def add_sink(self, sink: RecordSink) -> bool: ...

    def tracer_provider(self) -> Any: ...

    def meter_provider(self) -> Any: ...


class InProcessHost:
    """The outputs on a thread of this process, fed from the training thread's in-memory lanes."""

    mode = "thread"
    workers_agent = None

    def __init__(self, identity: RunIdentity, sinks: list[RecordSink]) -> None:
        config = identity.config
        self.recorder = Recorder(config.lane_capacity, config.scalars_capacity)
        self.outputs = Outputs(identity, [self.recorder], sinks)
        self._loop = PipelineLoop(self.outputs.pipeline, config.pipeline_interval_s)  # type: ignore[arg-type]

    def flush(self, deadline: Deadline) -> bool:
        return self._loop.flush(deadline.left())

    def stop(self, deadline: Deadline, at_exit: bool = False) -> None:
        self._loop.close(deadline)
        self._loop.join(deadline.left(cap_s=1.0))
        self.outputs.close(deadline)

    def hurry(self, deadline: Deadline) -> None:
        """The loop and the sinks already run against the deadline the caller shortened."""

    def counts(self) -> dict[str, Any]:
        return self.outputs.counts()

    def pending(self) -> dict[str, int]:
        return self.recorder.pending()

    def agent_pid(self) -> None:
        return None

    def add_sink(self, sink: RecordSink) -> bool:
        self.outputs.add_sink(sink)
        return True

    def tracer_provider(self) -> Any:
        return self.outputs.otel.tracer_provider  # type: ignore[union-attr]

    def meter_provider(self) -> Any:
        return self.outputs.otel.meter_provider  # type: ignore[union-attr]



def start_host(identity: RunIdentity, sinks: list[RecordSink]) -> Host:
    """The host for ``identity.config.agent``; sinks given here keep the outputs in this process."""
    config = identity.config
    if config.agent == "thread":
        return InProcessHost(identity, sinks)
    if sinks:
        _logger.warning("otel-rl: sinks passed to init() run in this process; the outputs run on a thread", extra=once("agent-sinks"))
        return InProcessHost(identity, sinks)
    from otel_rl.agent.launch import start_agent

    return start_agent(identity) or InProcessHost(identity, sinks)

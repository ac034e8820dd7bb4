"""Where an agent runs: its own process (:class:`ProcessHost`) or a thread of the producer (:class:`ThreadHost`).

Both speak to the agent through the segment's header only: ``state``
(the producer is closing), ``flush_request``/``flush_done`` and
``agent_state``, so the producer's side is the same for both.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from otel_rl._logging import logger
from otel_rl.agent import segment as shm
from otel_rl.background import Deadline

_logger = logger(__name__)
POLL_S = 0.005


def segment_path(config: Any) -> Path:
    """A fresh segment file for this process, named after the run and role."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{config.run_id}-{config.role}")[:80]
    directory = shm.segment_dir()
    for stale in shm.remove_stale(directory):
        _logger.info("otel-rl: removed %s, left by a producer and agent that both died", stale.name)
    return directory / f"{name}-{os.getpid()}-{os.urandom(4).hex()}.seg"


def picklable(config: Any) -> bool:
    """Whether the configuration can travel to an agent process."""
    try:
        pickle.dumps(config)
    except Exception:
        return False
    return True


def _wait(condition, deadline: Deadline) -> bool:
    while not condition():
        if deadline.left() <= 0:
            return False
        time.sleep(POLL_S)
    return True


def build_outputs(
    agent_config: Any, clock_offset_ns: int, sinks: list | None = None, producer_pid: int | None = None, takeover: int = 0
):
    """The producer's outputs (a Telemetry of its configuration), on its trace and timebase.

    ``takeover``: how many agents served this producer before (their outputs are continued, not restarted).
    """
    from otel_rl.telemetry import Telemetry

    outputs = Telemetry(
        agent_config.config,
        sinks,
        trace=(agent_config.trace_id, agent_config.parent_span_id),
        producer_pid=producer_pid,
        started_ns=agent_config.started_ns,
        takeover=takeover,
    )
    outputs._clock.offset_ns = clock_offset_ns
    return outputs


class ThreadHost:
    """The agent on a daemon thread of the producer, reading the producer's own mapping."""

    def __init__(self, segment: shm.Segment, agent_config: Any, sinks: list) -> None:
        from otel_rl.agent.core import serve

        self.segment = segment
        reader = shm.SegmentReader(segment.buffer)
        # Built on the caller's thread: a bad option fails init() as it always has.
        self.outputs = build_outputs(agent_config, segment.get("clock_offset_ns"), sinks)
        config = agent_config.config
        self._thread = threading.Thread(
            target=serve,
            args=(reader, self.outputs, os.getpid(), config.pipeline_interval_s, config.shutdown_timeout_s),
            name="otel-rl-agent",
            daemon=True,
        )
        self._thread.start()

    def flush(self, deadline: Deadline) -> bool:
        return _flush(self.segment, deadline, self._thread.is_alive)

    def stop(self, deadline: Deadline) -> None:
        self.segment.set("state", shm.CLOSING)
        self._thread.join(deadline.left())
        if self._thread.is_alive():
            _logger.warning("otel-rl: the agent did not finish within the shutdown deadline")
        else:
            self.segment.close()


class ProcessHost:
    """The agent as a process of its own (``python -m otel_rl.agent SEGMENT``), started without waiting for it.

    It runs in a session of its own (a Ctrl-C meant for training does not stop
    it first), inherits the terminal (the panel) and the environment (OTLP
    settings), and removes the segment when it is done. A watcher thread
    (awake once a second) starts a new agent, once, if the first one dies
    while training runs; it resumes reading where the dead one stopped. If the
    agent is gone when the producer closes, the producer runs the agent's code
    itself to finish the work.
    """

    outputs = None
    WATCH_S = 1.0

    def __init__(self, segment: shm.Segment) -> None:
        self.segment = segment
        self.agents = 1
        self.process = self._start(0)
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="otel-rl-agent-watch", daemon=True)
        self._watcher.start()

    def _start(self, takeover: int) -> subprocess.Popen:
        command = [sys.executable, "-m", "otel_rl.agent", str(self.segment.path)]
        if takeover:
            command += ["--takeover", str(takeover)]
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True)

    def _alive(self) -> bool:
        return self.process.poll() is None

    def _watch(self) -> None:
        from otel_rl.agent.core import relay_logs

        while not self._stopping.wait(self.WATCH_S):
            relay_logs(self.segment)
            if self._alive() or self.segment.get("agent_state") == shm.AGENT_DONE:
                continue
            if self.agents > 1:
                return  # the second one died too: close() finishes the work
            _logger.warning(
                "otel-rl: the agent process ended (exit code %s) while training runs; starting a new one",
                self.process.returncode,
            )
            try:
                self.process = self._start(self.agents)
            except OSError as exc:
                _logger.warning("otel-rl: no new agent (%s); close() will finish the work", exc)
                return
            self.agents += 1

    def flush(self, deadline: Deadline) -> bool:
        from otel_rl.agent.core import relay_logs

        flushed = _flush(self.segment, deadline, self._alive)
        relay_logs(self.segment)
        return flushed

    def stop(self, deadline: Deadline) -> None:
        from otel_rl.agent.core import relay_logs

        self._stopping.set()
        self._watcher.join(deadline.left(cap_s=1.0))
        segment = self.segment
        segment.set("state", shm.CLOSING)
        _wait(lambda: segment.get("agent_state") == shm.AGENT_DONE or not self._alive(), deadline)
        if segment.get("agent_state") != shm.AGENT_DONE and not self._alive():
            _logger.warning("otel-rl: the agent process ended early (exit code %s); finishing its work here", self.process.returncode)
            self._take_over(deadline)
        elif segment.get("agent_state") != shm.AGENT_DONE:
            _logger.warning("otel-rl: the agent did not finish within the shutdown deadline; it goes on in the background")
        relay_logs(segment)
        segment.close()

    def _take_over(self, deadline: Deadline) -> None:
        from otel_rl.agent.core import serve

        reader = shm.SegmentReader(self.segment.path)  # type: ignore[arg-type]
        takeover = self.agents if reader.get("agent_state") != shm.AGENT_NONE else 0
        try:
            agent_config = pickle.loads(reader.config())
            outputs = build_outputs(agent_config, reader.get("clock_offset_ns"), takeover=takeover)
            serve(reader, outputs, os.getpid(), 0.0, deadline.left(), takeover=takeover > 0)
        except Exception:
            _logger.exception("otel-rl: the agent's work could not be finished")
        finally:
            reader.close()
            Path(self.segment.path).unlink(missing_ok=True)  # type: ignore[arg-type]


def _flush(segment: shm.Segment, deadline: Deadline, alive) -> bool:
    request = segment.get("flush_request") + 1
    segment.set("flush_request", request)
    return _wait(lambda: segment.get("flush_done") >= request or not alive(), deadline) and alive()


def main(path: str, takeover: int = 0) -> int:
    """The agent process: serve one producer's segment until it closes or dies; 0 when every output closed.

    ``takeover``: agents that served this segment before (this one continues their outputs).
    """
    from otel_rl.agent.core import LogForwarder, serve

    reader = shm.SegmentReader(Path(path))
    if reader.get("agent_state") == shm.AGENT_NONE:
        takeover = 0  # the agent before never started reading: this one is the first to write outputs
    try:
        agent_config = pickle.loads(reader.config())
        LogForwarder.install(reader, agent_config.pid)
        outputs = build_outputs(agent_config, reader.get("clock_offset_ns"), producer_pid=agent_config.pid, takeover=takeover)
        config = agent_config.config
        serve(reader, outputs, agent_config.pid, config.pipeline_interval_s, config.shutdown_timeout_s, takeover=takeover > 0)
    finally:
        done = reader.get("agent_state") == shm.AGENT_DONE
        reader.close()
        if done:
            Path(path).unlink(missing_ok=True)
    return 0

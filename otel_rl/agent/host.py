"""Where an agent runs: its own process (:class:`ProcessHost`) or a thread of the producer (:class:`ThreadHost`).

Both speak to the agent through the segment's header only: ``state``
(the producer is closing), ``flush_request``/``flush_done`` and
``agent_state``, so the producer's side is the same for both.
"""

from __future__ import annotations

import io
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
from otel_rl.shm import segment as shm
from otel_rl.background import Deadline

_logger = logger(__name__)
POLL_S = 0.005


def segment_path(config: Any, directory: Path) -> Path:
    """A fresh segment file for this process in the agent's ``directory``, named after the run and role."""
    role = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{config.role}-{config.rank}")[:40]
    for stale in shm.remove_stale(shm.segment_dir()):
        _logger.info("otel-rl: removed %s, left by a producer and agent that both died", stale.name)
    return directory / f"{shm.run_prefix(config.run_id)}{role}-{os.getpid()}-{os.urandom(4).hex()}.seg"


_PLAIN_MODULES = ("builtins", "pathlib", "collections", "copyreg", "datetime")


class _PlainUnpickler(pickle.Unpickler):
    """Loads only what any agent process can import: otel-rl's own classes and a few standard ones."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "otel_rl" or module.startswith("otel_rl.") or module in _PLAIN_MODULES:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


def travels(config: Any) -> str | None:
    """None when the configuration can travel to an agent process; else what keeps it here.

    Pickling is not enough: a class of the training script (``__main__``) or
    of a path only it put on ``sys.path`` would not load in the agent.
    """
    try:
        _PlainUnpickler(io.BytesIO(pickle.dumps(config))).load()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


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

    def stop(self, deadline: Deadline, at_exit: bool = False) -> None:
        self.segment.set("state", shm.CLOSING)
        self._thread.join(deadline.left())
        if self._thread.is_alive():
            _logger.warning("otel-rl: the agent did not finish within the shutdown deadline")
        else:
            self.segment.close()


class ProcessHost:
    """The agent as a process of its own, serving the directory the segment is in; started unless one runs.

    The agent (``python -m otel_rl.agent --dir DIRECTORY``) runs in a session
    of its own (a Ctrl-C meant for training does not stop it first), inherits
    the terminal (the panel) and the environment (OTLP settings), and removes
    the segment when it is done. ``init()`` does not wait for it: the rings
    hold records until it attaches. A watcher thread (awake once a second)
    starts a new agent, once, if the one serving this producer dies while
    training runs; it resumes reading where the dead one stopped. If no agent
    is there when the producer closes (or the one it started is still
    starting up), the producer runs the agent's code itself to finish the work.

    ``linger_s``: how long the agent started here waits, once idle, for
    further producers (workers, other ranks) before it ends.
    """

    outputs = None
    WATCH_S = 1.0

    def __init__(self, segment: shm.Segment, linger_s: float) -> None:
        self.segment = segment
        self.directory = Path(segment.path).parent  # type: ignore[arg-type]
        self.linger_s = linger_s
        self.restarts = 0
        self.process: subprocess.Popen | None = None
        if not shm.agent_running(self.directory):
            self.process = self._start()
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="otel-rl-agent-watch", daemon=True)
        self._watcher.start()

    def _start(self) -> subprocess.Popen:
        command = [sys.executable, "-m", "otel_rl.agent", "--dir", str(self.directory), "--linger", str(self.linger_s)]
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True)

    def _starting(self) -> bool:
        """The agent started here runs but does not serve yet (it has not taken the directory's lock)."""
        return self.process is not None and self.process.poll() is None and not shm.agent_running(self.directory)

    def _alive(self) -> bool:
        return (self.process is not None and self.process.poll() is None) or shm.agent_running(self.directory)

    def _watch(self) -> None:
        from otel_rl.agent.core import relay_logs

        while not self._stopping.wait(self.WATCH_S):
            relay_logs(self.segment)
            if self.segment.get("agent_state") == shm.AGENT_DONE or self._alive():
                continue
            if self.segment.get("agent_state") == shm.AGENT_ATTACHED:  # the agent serving this process died
                if self.restarts:
                    return  # the second one died too: close() finishes the work
                _logger.warning(
                    "otel-rl: the agent process ended (exit code %s) while training runs; starting a new one",
                    None if self.process is None else self.process.returncode,
                )
                self.restarts += 1
            try:  # else the agent ended before it saw this segment (it was idle): a new one serves it
                self.process = self._start()
            except OSError as exc:
                _logger.warning("otel-rl: no new agent (%s); close() will finish the work", exc)
                return

    def flush(self, deadline: Deadline) -> bool:
        from otel_rl.agent.core import relay_logs

        flushed = _flush(self.segment, deadline, self._alive)
        relay_logs(self.segment)
        return flushed

    def stop(self, deadline: Deadline, at_exit: bool = False) -> None:
        """Hand the segment over to the agent to close every output; back when it has, or at the deadline.

        With no agent left, the work is finished here; at interpreter exit
        (when the outputs could not start their threads here) a new agent
        process is started for it instead, which goes on after this process
        if the deadline passes.
        """
        from otel_rl.agent.core import relay_logs

        self._stopping.set()
        self._watcher.join(deadline.left(cap_s=1.0))
        segment = self.segment
        segment.set("state", shm.CLOSING)
        short = not at_exit and segment.get("agent_state") == shm.AGENT_NONE and self._starting()
        if short:  # a short run: finishing here is quicker than waiting for the agent's start-up
            self.process.kill()  # type: ignore[union-attr]
            self.process.wait()  # type: ignore[union-attr]
        done = lambda: segment.get("agent_state") == shm.AGENT_DONE  # noqa: E731
        _wait(lambda: done() or not self._alive(), deadline)
        if not done() and not self._alive():
            if not short:
                _logger.warning("otel-rl: the agent process ended early; finishing its work %s", "in a new one" if at_exit else "here")
            if at_exit:
                try:
                    self.process = self._start()
                except OSError as exc:
                    _logger.warning("otel-rl: no agent can finish the work (%s)", exc)
                _wait(lambda: done() or not self._alive(), deadline)
            else:
                self._take_over(deadline)
        if not done():
            _logger.warning("otel-rl: the agent did not finish within the shutdown deadline; it goes on in the background")
        relay_logs(segment)
        segment.close()
        if short:  # the agent it started never served: its directory goes too
            shm.remove_if_empty(self.directory)

    def _take_over(self, deadline: Deadline) -> None:
        from otel_rl.agent.core import attach, serve

        reader = shm.SegmentReader(self.segment.path)  # type: ignore[arg-type]
        if not reader.claim():  # an agent took it after all (one started by another producer): it finishes the work
            reader.close()
            _wait(lambda: self.segment.get("agent_state") == shm.AGENT_DONE, deadline)
            return
        try:
            takeover = attach(reader)
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

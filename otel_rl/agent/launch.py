"""The training process's side of its agent: the segment it records into, and the agent process serving it.

:func:`start_agent` creates the producer's segment in its agent's directory
(:mod:`otel_rl.agent.directory`), with the :class:`~otel_rl.core.identity.RunIdentity`
the agent builds the outputs from, and starts the agent unless one serves
that directory already. ``init()`` does not wait for it: the segment holds
every record until it attaches, and outlives this process.

The agent (``python -m otel_rl.agent --dir DIRECTORY``) runs in a session of
its own (a Ctrl-C meant for training does not stop it first), inherits the
terminal (the panel) and the environment (OTLP settings), and removes the
segment once its records are written. A watcher starts a new agent, once, if
the one serving this producer dies while training runs; it resumes from what
the dead one had committed. :meth:`AgentHost.stop` hands the segment over
with this process's deadline and waits for the agent within it; with no agent
left (it never came up, or died), this process serves the segment itself with
the agent's code, so the work is finished however the agent fared.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from otel_rl.agent import directory as agents
from otel_rl.agent import handshake
from otel_rl.agent.logs import relay_logs
from otel_rl.agent.producer import Counts
from otel_rl.agent.serve import serve_segment
from otel_rl.base.deadline import Deadline
from otel_rl.base.log import logger, once
from otel_rl.base.loops import BackgroundLoop
from otel_rl.core.identity import RunIdentity
from otel_rl.core.pipeline import RecordSink
from otel_rl.outputs.factory import resource
from otel_rl.shm import segment as shm
from otel_rl.training.recorder import Recorder

_logger = logger(__name__)

OWN_AGENT_LINGER_S = 1.0
"""How long the agent started for this process waits, once idle, for late workers before it ends."""
NAMED_AGENT_LINGER_S = 10.0
"""How long an agent started by name waits, once idle: the other ranks of a job start within seconds."""
MAX_RESTARTS = 2
"""Agents the watcher starts for one training process at most (one that keeps failing is not restarted in a loop)."""


def segment_path(config: Any, directory: Path) -> Path:
    """A fresh segment file for this process in the agent's ``directory``, named after the run and role."""
    role = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{config.role}-{config.rank}")[:40]
    return directory / f"{agents.run_prefix(config.run_id)}{role}-{os.getpid()}-{os.urandom(4).hex()}.seg"


_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_AGENT_MAIN = f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); from otel_rl.agent.__main__ import main; sys.exit(main())"
"""The agent's entry point, importing the otel-rl this process runs (a folder named ``otel_rl`` in the
working directory, which ``python -m`` would put first, cannot shadow it); the working directory stays
this process's, where a relative ``run_dir`` points."""


def spawn(directory: Path, linger_s: float | None, quiet: bool = False) -> subprocess.Popen:
    """An agent process serving ``directory`` (``linger_s`` once idle; None: until interrupted).

    ``quiet``: its standard error goes nowhere (an agent finishing another process's runs
    must not print their warnings in this one's output).
    """
    command = [sys.executable, "-c", _AGENT_MAIN, "--dir", str(directory)]
    if linger_s is not None:
        command += ["--linger", str(linger_s)]
    stderr = subprocess.DEVNULL if quiet else None
    # A session of its own: a Ctrl-C meant for training does not stop it before it wrote what training recorded.
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stderr=stderr, start_new_session=True, close_fds=True)


def recover_orphans() -> None:
    """What producers and agents that both died left: finished by new agents, or removed (see :func:`directory.tidy`)."""
    removed, orphaned = agents.tidy(agents.segment_dir())
    for path in removed:
        _logger.info("otel-rl: removed %s, left by a producer and agent that both died", path.name)
    for directory in orphaned:
        _logger.warning("otel-rl: a training process and its agent both died leaving records in %s; a new agent finishes them", directory)
        try:
            spawn(directory, OWN_AGENT_LINGER_S, quiet=True)
        except OSError as exc:
            _logger.warning("otel-rl: no agent for %s (%s)", directory, exc)


_PLAIN_MODULES = ("builtins", "pathlib", "collections", "copyreg", "datetime")


class _PlainUnpickler(pickle.Unpickler):
    """Loads only what any agent process can import: otel-rl's own classes and a few standard ones."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "otel_rl" or module.startswith("otel_rl.") or module in _PLAIN_MODULES:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


def travels(identity: RunIdentity) -> str | None:
    """None when the identity can travel to an agent process; else what keeps it here.

    Pickling is not enough: a class of the training script (``__main__``) or
    of a path only it put on ``sys.path`` would not load in the agent.
    """
    try:
        _PlainUnpickler(io.BytesIO(pickle.dumps(identity))).load()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def start_agent(identity: RunIdentity) -> AgentHost | None:
    """The host of an agent process for this producer; None (one warning) where none can run here."""
    config = identity.config
    kept = travels(identity)
    if kept:
        _logger.warning(
            "otel-rl: the configuration holds objects that cannot leave this process (%s); the outputs run on a thread",
            kept,
            extra=once("agent-thread"),
        )
        return None
    name = config.agent if config.agent != "process" else f"run-{os.getpid()}-{os.urandom(3).hex()}"
    linger_s = NAMED_AGENT_LINGER_S if config.agent != "process" else OWN_AGENT_LINGER_S
    try:
        recover_orphans()
        directory = agents.agent_dir(name)
        sizes = shm.fitted_sizes(config.lane_capacity, _free_bytes(directory))  # no room for a segment: no agent either
    except OSError as exc:  # no shared memory
        _logger.warning("otel-rl: no shared memory for the agent (%s); the outputs run on a thread", exc)
        return None
    try:
        # The agent starts before the segment exists: a producer killed at any moment after creating it is served.
        process = None if agents.agent_running(directory) else spawn(directory, linger_s)
    except OSError as exc:  # no process can be started here
        _logger.warning("otel-rl: the agent process could not start (%s); the outputs run on a thread", exc)
        return None
    try:
        payload = pickle.dumps(identity)
        try:
            segment = shm.Segment(segment_path(config, agents.agent_dir(name)), payload, *sizes)
        except FileNotFoundError:  # its idle agent removed the directory just now: the watcher starts a new one
            segment = shm.Segment(segment_path(config, agents.agent_dir(name)), payload, *sizes)
    except (OSError, AttributeError) as exc:  # AttributeError: no os.posix_fallocate on this platform
        _logger.warning("otel-rl: no shared memory for the agent (%s); the outputs run on a thread", exc)
        return None  # the agent started for it ends idle
    return AgentHost(identity, segment, name, linger_s, process)


def _free_bytes(directory: Path) -> int:
    """Free space of the filesystem the segments live on (/dev/shm, shared with every process of the machine)."""
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


class AgentHost:
    """The :class:`~otel_rl.agent.hosts.Host` of a producer whose outputs run in an agent process."""

    mode = "process"

    def __init__(
        self, identity: RunIdentity, segment: shm.Segment, name: str, linger_s: float, process: subprocess.Popen | None
    ) -> None:
        from otel_rl.outputs.otel.user_providers import UserProviders

        self.identity = identity
        self.segment = segment
        self.recorder = Recorder(segment, segment.lane_capacity)
        self.workers_agent = name
        self.directory = Path(segment.path).parent  # type: ignore[arg-type]
        self.media_stem = Path(segment.path).with_suffix("")  # type: ignore[arg-type]
        self.linger_s = linger_s
        self.process = process
        self.detached = False  # the segment was damaged: this process writes into it no more
        self._user_providers = UserProviders(lambda: resource(identity.config, identity.service_name, identity.host))
        self._watcher = AgentWatch(self)

    def check_segment(self) -> None:
        """Stop writing into the segment once another process truncated it (one warning): training goes on."""
        if not self.detached and self.segment.damaged():
            self.detached = True
            _logger.warning(
                "otel-rl: another process truncated this run's shared-memory segment %s; training goes on, "
                "its telemetry from then on is not recorded (the run ends as failed)",
                self.segment.path,
            )
            self.recorder.detach()  # nothing more is written into it

    def alive(self) -> bool:
        return (self.process is not None and self.process.poll() is None) or agents.agent_running(self.directory)

    def _done(self) -> bool:
        return handshake.done(self.segment)

    # -- the Host protocol ------------------------------------------------

    def relay_logs(self) -> None:
        relay_logs(self.segment)

    def flush(self, deadline: Deadline) -> bool:
        self.recorder.publish_unlaned()
        flushed = handshake.flush(self.segment, deadline, self.alive)
        relay_logs(self.segment)
        return flushed

    def shutdown(self, deadline: Deadline, at_exit: bool = False) -> None:
        """Hand the segment over to the agent, with ``deadline``; back when it closed every output, or at the deadline.

        With no agent left, this process serves the segment itself (at
        interpreter exit, when no thread pool can start here, a new agent
        process does, and goes on after this process if the deadline passes).
        """
        self._watcher.shutdown(Deadline(deadline.left(cap_s=1.0)))
        self.check_segment()
        self.recorder.publish_unlaned()
        segment = self.segment
        handshake.close(segment, deadline)
        handshake.wait(lambda: self._done() or not self.alive(), deadline)
        if not self._done() and not self.alive():
            _logger.warning("otel-rl: the agent process ended early; finishing its work %s", "in a new one" if at_exit else "here")
            if at_exit:
                self.restart()
                handshake.wait(lambda: self._done() or not self.alive(), deadline)
            else:
                self._serve_here(deadline)
        done = self._done()
        if not done:
            _logger.warning("otel-rl: the agent did not finish within the shutdown deadline; it goes on in the background")
        relay_logs(segment)
        if done:  # every record written: the segment is gone once close() returns (its agent removes it too, a moment later)
            with contextlib.suppress(OSError):
                os.unlink(segment.path)  # type: ignore[arg-type]
        self._user_providers.shutdown(deadline)
        self.recorder.detach()  # the lanes let the mapping go: a process that runs many runs keeps none of their segments
        segment.close()

    def hurry(self, deadline: Deadline) -> None:
        handshake.hurry(self.segment, deadline)

    def restart(self) -> bool:
        try:
            self.process = spawn(self.directory, self.linger_s)
            return True
        except OSError as exc:
            _logger.warning("otel-rl: no new agent (%s); close() will finish the work", exc)
            return False

    def _serve_here(self, deadline: Deadline) -> None:
        try:
            reader = shm.SegmentReader(self.segment.path)  # type: ignore[arg-type]
        except (OSError, ValueError):  # its file was removed (or replaced): this process's own mapping still holds the records
            reader = shm.SegmentReader(self.segment.buffer)
        if not reader.claim():  # an agent took it after all (one started by another producer): it finishes the work
            reader.close()
            handshake.wait(self._done, deadline)
            return
        served = False
        try:
            server = serve_segment(reader, self.identity)
            served = True
            server.done.wait(deadline.left())
        except Exception as exc:  # no outputs can be built here either: the run's records cannot be written
            _logger.warning("otel-rl: the run's outputs could not be built (%s: %s); its records are not written", type(exc).__name__, exc)
        finally:
            if self._done() or not served:  # served, or never servable: the segment goes with the run
                reader.close()
                Path(self.segment.path).unlink(missing_ok=True)  # type: ignore[arg-type]
                agents.remove_if_empty(self.directory)

    def counts(self) -> Counts:
        return handshake.counts(self.segment)

    def pending(self) -> dict[str, int]:
        return self.recorder.pending()

    def agent_pid(self) -> int | None:
        """The pid of the agent serving this process (None before one attached)."""
        return (self.segment.get("agent_pid") or None) if self.segment.control is not None else None

    def add_sink(self, sink: RecordSink) -> bool:
        return False

    def tracer_provider(self) -> Any:
        return self._user_providers.tracer_provider()

    def meter_provider(self) -> Any:
        return self._user_providers.meter_provider()



class AgentWatch(BackgroundLoop):
    """Once a second: checks the segment, relays the agent's warnings, and starts a new agent (once) if the one serving this producer died."""

    def __init__(self, host: AgentHost) -> None:
        super().__init__("otel-rl-agent-watch", 1.0)
        self._host = host
        self.restarts = 0
        self.start()

    def run_once(self) -> None:
        host = self._host
        if self.stopping or host.segment.control is None:
            return
        host.check_segment()
        relay_logs(host.segment)
        host.recorder.publish_unlaned()
        state = host.segment.get("agent_state")
        if state == shm.AGENT_DONE or host.alive() or self.restarts >= MAX_RESTARTS:
            return  # past MAX_RESTARTS an agent that cannot serve this process is not started again: close() finishes
        if state == shm.AGENT_ATTACHED and not self.restarts:  # the agent serving this process died
            _logger.warning(
                "otel-rl: the agent process ended (exit code %s) while training runs; starting a new one",
                None if host.process is None else host.process.returncode,
            )
        self.restarts += 1
        host.restart()  # or the agent ended before it saw this segment (it was idle): a new one serves it

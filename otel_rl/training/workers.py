"""The learner's side of its worker processes: what a worker needs to join, its relayed cycles, its exit.

A :class:`WorkerSpec` is what :meth:`otel_rl.Telemetry.worker_spec` hands a
worker process (see :mod:`otel_rl.worker_processes`). :class:`RelayReceiver`
moves the cycles a worker relays over a queue into the learner's recorder;
:class:`WorkerMonitor` turns a worker's abnormal exit into a
``worker_crashed`` event with its exit code.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from otel_rl.base.deadline import Deadline
from otel_rl.base.log import EVERY_TIME, logger
from otel_rl.base.loops import BackgroundLoop
from otel_rl.base.values import describe

_logger = logger(__name__)

RELAY_CAPACITY = 10_000


@dataclass
class WorkerSpec:
    """What a worker needs to join the run (picklable with its multiprocessing context)."""

    role: str
    run_id: str
    traceparent: str
    relay: Any
    run_dir: str | None = None
    trace_enabled: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    service_name: str | None = None
    """The learner's ``service.name``: one run, one service, in every process."""
    agent: str | None = None
    """The learner's agent: the worker records into it, which relays its cycles to the learner (``relay`` is None)."""



class RelayReceiver(BackgroundLoop):
    """In the learner: moves relayed cycles into the learner's pipeline."""

    def __init__(self, relay: Any, deliver, interval_s: float = 0.1) -> None:
        super().__init__("otel-rl-relay", interval_s)
        self._relay = relay
        self._deliver = deliver
        self._broken = False
        self.start()

    def run_once(self) -> None:
        while not self._broken:
            try:
                cycle = self._relay.get_nowait()
            except queue.Empty:
                return
            except (EOFError, OSError, ValueError):
                self._broken = True  # the queue was closed: nothing more will come
                return
            self._deliver(cycle)


def exit_code(process: Any) -> int | None:
    """The exit code of a ``multiprocessing.Process`` or a ``subprocess.Popen`` (None while it runs)."""
    poll = getattr(process, "poll", None)
    return poll() if callable(poll) else process.exitcode


class WorkerMonitor(BackgroundLoop):
    """Watches worker processes; an abnormal exit becomes a ``worker_crashed`` event."""

    def __init__(self, event, interval_s: float = 0.5) -> None:
        super().__init__("otel-rl-workers", interval_s)
        self._event = event
        self._workers: list[tuple[Any, str]] = []
        self._lock = threading.Lock()
        self.start()

    def watch(self, process: Any, role: str) -> None:
        with self._lock:
            self._workers.append((process, role))

    def run_once(self) -> None:
        self.check()

    def check(self) -> None:
        with self._lock:
            workers, self._workers = self._workers, []
        still = []
        for process, role in workers:
            code = exit_code(process)
            if code is None:
                still.append((process, role))
            elif code != 0:
                _logger.warning("otel-rl: worker %s (pid %s) exited with code %s", role, process.pid, code, extra=EVERY_TIME)
                self._event("worker_crashed", role=role, pid=process.pid, exit_code=code)
        with self._lock:
            self._workers.extend(still)


class Workers:
    """The worker processes of one learner: what each needs to join, the cycles they relay, their exits.

    Args:
        deliver: takes a relayed cycle (into the learner's recorder).
        event: records an event (``worker_crashed``).
    """

    def __init__(self, deliver: Callable[[Any], None], event: Callable[..., None]) -> None:
        self._deliver = deliver
        self._event = event
        self._relays: list[RelayReceiver] = []
        self._monitor: WorkerMonitor | None = None
        self._lock = threading.Lock()

    def relay(self, context: Any, relay: Any) -> Any:
        """The queue a worker relays its cycles over (``relay``, else a new one of ``context``), read from now on."""
        import multiprocessing

        if relay is None:
            relay = (context or multiprocessing).Queue(maxsize=RELAY_CAPACITY)
        with self._lock:
            self._relays.append(RelayReceiver(relay, self._deliver))
        return relay

    def watch(self, process: Any, role: str) -> None:
        """Report a ``worker_crashed`` event (with the exit code) if ``process`` exits abnormally.

        ``process``: a ``multiprocessing.Process`` (or one of its kind, with
        ``exitcode``) or a ``subprocess.Popen``; anything else is one warning.
        """
        if not callable(getattr(process, "poll", None)) and not hasattr(process, "exitcode"):
            _logger.warning("otel-rl: watch_worker() takes a multiprocessing.Process or a subprocess.Popen, got %s; %s is not watched", describe(process), role)
            return
        with self._lock:
            if self._monitor is None:
                self._monitor = WorkerMonitor(self._event)
        self._monitor.watch(process, role)

    def shutdown(self, deadline: Deadline) -> None:
        """Last crash events and relayed cycles in, all loops stopped, by ``deadline``."""
        with self._lock:
            loops = [loop for loop in (self._monitor, *self._relays) if loop is not None]
        for loop in loops:
            loop.close(deadline)
        for loop in loops:
            loop.join(deadline)

"""Worker processes (collectors) that join the learner's run.

The learner hands each worker a :class:`WorkerSpec` (picklable: pass it to
``multiprocessing.Process``, spawn or fork). In the worker,
:func:`init_worker` starts its own telemetry:

* it joins the learner's trace: the run span's W3C ``traceparent`` travels in
  the spec, so the worker's spans are children of the run span in OTLP;
* it writes its own Perfetto fragment (``trace-<role>.perfetto-trace``) with
  the same epoch timebase; the learner appends finished fragments to its
  ``trace.perfetto-trace`` at close, so the worker is its own process there;
* it relays a summary of each cycle (phase durations) over a queue, so the
  learner's panel and live metrics show the collector timeline; the learner
  owns the panel, the JSONL file and the live exporter.

:class:`WorkerMonitor` turns a worker's abnormal exit into a
``worker_crashed`` event with its exit code.
"""

from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from otel_rl._logging import EVERY_TIME, logger
from otel_rl.background import Worker
from otel_rl.outputs.relay import RelaySink

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


def init_worker(spec: WorkerSpec, **options: Any):
    """Telemetry of a worker process; call it first thing in the worker.

    Options override the spec's (same names as :func:`otel_rl.init`).
    """
    import otel_rl

    if spec.traceparent:
        os.environ["TRACEPARENT"] = spec.traceparent
    settings: dict[str, Any] = {
        "service_name": spec.service_name,
        "run_id": spec.run_id or None,
        "role": spec.role,
        "trace_enabled": spec.trace_enabled,
        "trace_output_dir": spec.run_dir,
        "jsonl": False,
        "motrix_url": None,
        "panel": False,
        "tensorboard": False,
        "wandb": False,
        **spec.options,
        **options,
    }
    from otel_rl.environment_variables import OTEL_RL_AGENT

    if spec.relay is None:
        # The learner's agent serves this worker too: it sees the worker's records and relays its cycles.
        if spec.agent is not None and "agent" not in spec.options and "agent" not in options:
            settings["agent"] = spec.agent
        tel = otel_rl.init(**settings)
        if tel.enabled and tel.stats().get("agent") != "process":
            _logger.warning("otel-rl: worker %s runs without the learner's agent; the learner will not see its cycles", spec.role)
        return tel
    settings["agent"] = "thread"  # the relay sink runs where the outputs are: on a thread of this worker
    tel = otel_rl.init(**settings)
    if tel.enabled:
        tel.add_sink(RelaySink(spec.role, spec.relay, tel._host.outputs.drops))
    return tel


class RelayReceiver(Worker):
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


class WorkerMonitor(Worker):
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
            code = process.exitcode
            if code is None:
                still.append((process, role))
            elif code != 0:
                _logger.warning("otel-rl: worker %s (pid %s) exited with code %s", role, process.pid, code, extra=EVERY_TIME)
                self._event("worker_crashed", role=role, pid=process.pid, exit_code=code)
        with self._lock:
            self._workers.extend(still)

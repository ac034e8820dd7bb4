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

import logging
import os
import queue
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from otel_rl.pipeline import RecordSink
from otel_rl.records import IterationRecord

_logger = logging.getLogger(__name__)

RELAY_CAPACITY = 10_000


@dataclass(frozen=True)
class RemoteCycle:
    """One cycle of a worker, as relayed to the learner (durations in ns)."""

    role: str
    timeline: str
    end_ns: int
    wall_ns: int
    top: dict[str, int]
    nested: dict[str, int]


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


def fragment_name(role: str) -> str:
    return "trace-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", role).strip("-") + ".perfetto-trace"


def init_worker(spec: WorkerSpec, **options: Any):
    """Telemetry of a worker process; call it first thing in the worker.

    Options override the spec's (same names as :func:`otel_rl.init`).
    """
    import otel_rl

    if spec.traceparent:
        os.environ["TRACEPARENT"] = spec.traceparent
    settings: dict[str, Any] = {
        "run_id": spec.run_id,
        "role": spec.role,
        "trace_enabled": spec.trace_enabled,
        "trace_output_dir": spec.run_dir,
        "jsonl": False,
        "motrix_url": None,
        "panel": False,
        **spec.options,
        **options,
    }
    tel = otel_rl.init(**settings)
    if tel.enabled:
        tel.add_sink(RelaySink(spec.role, spec.relay))
    return tel


class RelaySink(RecordSink):
    """In the worker: sends each cycle's phase durations to the learner, never blocking."""

    def __init__(self, role: str, relay: Any) -> None:
        self._role = role
        self._relay = relay
        self.dropped = 0

    def on_iteration(self, iteration: IterationRecord) -> None:
        top, nested = iteration.totals_ns()
        cycle = RemoteCycle(self._role, iteration.timeline, iteration.end_ns, iteration.wall_ns, top, nested)
        try:
            self._relay.put_nowait(cycle)
        except (queue.Full, ValueError, OSError):
            self.dropped += 1


class RelayReceiver:
    """In the learner: moves relayed cycles into the learner's pipeline."""

    def __init__(self, relay: Any, deliver) -> None:
        self._relay = relay
        self._deliver = deliver
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel-rl-relay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                cycle = self._relay.get(timeout=0.2)
            except queue.Empty:
                continue
            except (EOFError, OSError, ValueError):
                return
            self._deliver(cycle)

    def shutdown(self, timeout_s: float) -> None:
        self._stop.set()
        self._thread.join(max(timeout_s, 0.0))


class WorkerMonitor:
    """Watches worker processes; an abnormal exit becomes a ``worker_crashed`` event."""

    def __init__(self, event, interval_s: float = 0.5) -> None:
        self._event = event
        self._interval_s = interval_s
        self._workers: list[tuple[Any, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel-rl-workers", daemon=True)
        self._thread.start()

    def watch(self, process: Any, role: str) -> None:
        with self._lock:
            self._workers.append((process, role))

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
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
                _logger.warning("otel-rl: worker %s (pid %s) exited with code %s", role, process.pid, code)
                self._event("worker_crashed", role=role, pid=process.pid, exit_code=code)
        with self._lock:
            self._workers.extend(still)

    def shutdown(self, timeout_s: float) -> None:
        self._stop.set()
        self._thread.join(max(timeout_s, 0.0))
        self.check()

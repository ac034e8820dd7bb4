"""Timing GPU phases with CUDA events, without ever synchronizing training.

``Telemetry.phase(name, cuda=True)`` records a pair of
``torch.cuda.Event(enable_timing=True)`` on the current (or given) stream
around the phase, next to its host timing. A resolver thread polls the
pending pairs with ``query()`` and turns each completed pair into a device
interval with wall-clock timestamps:

* Calibration: an anchor event is recorded on an otherwise idle stream at a
  known host time and waited for on the resolver thread (never on the
  training thread, not even for a device's first phase: its pairs wait,
  unplaced, until the resolver has an anchor); ``anchor.elapsed_time(event)``
  then places any event of that device on the host timeline, before or
  after the anchor. Anchors are renewed every
  ``recalibrate_s``; the host-versus-device drift measured between two anchors
  is kept in :attr:`CudaTimer.last_drift_ns` (it stays far below 10 us at the
  default period).
* Events come from a pool and are reused. Pending pairs are bounded: when the
  GPU falls far behind, the oldest pairs are dropped (counted), never waited for.

Without torch or CUDA the same call times the phase on the host and says so
(``rl.clock=host`` on its data and one log line); nothing fails.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any, Protocol

from otel_rl.base.loops import BackgroundLoop
from otel_rl.formats.schema import PhaseSpec
from otel_rl.training.recorder import Phase, Recorder


def cuda_unavailable_reason() -> str | None:
    """Why CUDA timing cannot be used here, or None when it can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    try:
        if not torch.cuda.is_available():
            return "CUDA is not available"
    except Exception as exc:  # a broken driver install
        return f"CUDA check failed: {exc}"
    return None


@dataclass(slots=True)
class Anchor:
    """A device event whose host time is known: the origin for placing other events of its device."""

    event: Any
    wall_ns: int

    def place(self, elapsed_ms: float) -> int:
        """Wall-clock ns of an event ``elapsed_ms`` after the anchor (negative: before it)."""
        return self.wall_ns + round(elapsed_ms * 1e6)


def drift_ns(previous: Anchor, current: Anchor, device_elapsed_ms: float) -> int:
    """How far the device clock moved from the host clock between two anchors."""
    return round(device_elapsed_ms * 1e6) - (current.wall_ns - previous.wall_ns)


class EventPool:
    """Reusable timing events: creating CUDA events costs more than recording them."""

    def __init__(self, factory: Callable[[], Any], limit: int) -> None:
        self._factory = factory
        self._free: list[Any] = []
        self._limit = limit
        self.created = 0

    def __len__(self) -> int:
        """Events kept for reuse (at most ``limit``)."""
        return len(self._free)

    def acquire(self) -> Any:
        if self._free:
            return self._free.pop()
        self.created += 1
        return self._factory()

    def release(self, *events: Any) -> None:
        for event in events:
            if len(self._free) < self._limit:
                self._free.append(event)


@dataclass(slots=True)
class PendingPair:
    """Start and end events of one phase; ``anchor`` is None until its device is calibrated."""

    start: Any
    end: Any
    anchor: Anchor | None
    spec: PhaseSpec
    device: int
    stream: int
    correlation: int


class PendingPairs:
    """Pairs waiting for the GPU, oldest first; past ``limit`` the oldest is dropped and counted."""

    def __init__(self, limit: int, pool: EventPool) -> None:
        self._pairs: deque[PendingPair] = deque()
        self._lock = threading.Lock()
        self._limit = limit
        self._pool = pool
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._pairs)

    def add(self, pair: PendingPair) -> None:
        with self._lock:
            if len(self._pairs) >= self._limit:
                old = self._pairs.popleft()
                self._pool.release(old.start, old.end)  # re-recording a pending event is allowed
                self.dropped += 1
            self._pairs.append(pair)

    def take_completed(self, anchors: dict[int, Anchor] | None = None) -> list[PendingPair]:
        """Remove and return the pairs whose end event completed and that have an anchor, in order.

        A pair recorded before its device had an anchor takes the device's anchor from ``anchors``.
        """
        done: list[PendingPair] = []
        with self._lock:
            keep: deque[PendingPair] = deque()
            for pair in self._pairs:
                if pair.anchor is None and anchors:
                    pair.anchor = anchors.get(pair.device)
                (done if pair.anchor is not None and pair.end.query() else keep).append(pair)
            self._pairs = keep
        return done


class DeviceApi(Protocol):
    """What the timer needs from a GPU runtime: timing events and a stream for calibration."""

    def new_event(self) -> Any:
        """An event with ``record(stream)``, ``query()``, ``synchronize()`` and ``elapsed_time(other)`` in ms."""

    def new_stream(self, device: int) -> Any:
        """A stream of ``device`` that nothing else uses (anchors are recorded on it)."""

    def current_stream(self) -> Any:
        """The calling thread's current stream (with ``device.index`` and ``stream_id``)."""


class TorchCuda:
    """:class:`DeviceApi` of ``torch.cuda``."""

    def __init__(self) -> None:
        import torch

        self._cuda = torch.cuda

    def new_event(self) -> Any:
        return self._cuda.Event(enable_timing=True)

    def new_stream(self, device: int) -> Any:
        return self._cuda.Stream(device=device)

    def current_stream(self) -> Any:
        return self._cuda.current_stream()


class CudaTimer(BackgroundLoop):
    """Records event pairs for CUDA phases and resolves them on its own thread.

    Args:
        recorder: where resolved device intervals go (the pipeline drains them).
        to_epoch_ns: converts ``perf_counter_ns()`` readings to epoch ns.
        device_api: the GPU runtime (``torch.cuda`` by default; a stand-in in tests).
        max_pending: pairs waiting for the GPU before the oldest is dropped.
        recalibrate_s: period of anchor renewal.
    """

    def __init__(
        self,
        recorder: Recorder,
        to_epoch_ns: Callable[[int], int],
        device_api: DeviceApi | None = None,
        max_pending: int = 4096,
        poll_interval_s: float = 0.005,
        recalibrate_s: float = 2.0,
    ) -> None:
        super().__init__("otel-rl-cuda", poll_interval_s)
        self._api = device_api if device_api is not None else TorchCuda()
        self._recorder = recorder
        self._to_epoch = to_epoch_ns
        self.pool = EventPool(self._api.new_event, limit=2 * max_pending)
        self.pending = PendingPairs(max_pending, self.pool)
        self._anchors: dict[int, Anchor] = {}
        self._uncalibrated: set[int] = set()  # devices seen by the training thread, waiting for a first anchor
        self._calibration_streams: dict[int, Any] = {}
        self._recalibrate_s = recalibrate_s
        self._last_calibration = time.monotonic()
        self._correlations = itertools.count(1)
        self.last_drift_ns: dict[int, int] = {}
        self.calibrated_on: set[str] = set()
        """Names of the threads calibration ran on (the resolver's only)."""
        self.start()

    def _calibrate(self, device: int) -> Anchor:
        """Record an anchor on an idle stream and wait for it here, on the resolver thread."""
        self.calibrated_on.add(threading.current_thread().name)
        stream = self._calibration_streams.get(device)
        if stream is None:
            stream = self._calibration_streams[device] = self._api.new_stream(device)
        event = self._api.new_event()
        before = perf_counter_ns()
        event.record(stream)
        after = perf_counter_ns()
        event.synchronize()
        anchor = Anchor(event, self._to_epoch((before + after) // 2))
        previous = self._anchors.get(device)
        self._anchors[device] = anchor
        if previous is not None:
            self.last_drift_ns[device] = drift_ns(previous, anchor, previous.event.elapsed_time(event))
        return anchor

    def current_stream(self) -> Any:
        return self._api.current_stream()

    def start_pair(self, stream: Any) -> tuple[Any, Anchor | None]:
        """Record the start event on ``stream`` (training thread; no synchronization, no calibration)."""
        event = self.pool.acquire()
        event.record(stream)
        device = stream.device.index or 0
        anchor = self._anchors.get(device)
        if anchor is None and device not in self._uncalibrated:
            self._uncalibrated.add(device)
            self.wake()
        return event, anchor

    def end_pair(self, stream: Any, start: Any, anchor: Anchor | None, spec: PhaseSpec) -> int:
        """Record the end event and queue the pair; returns the correlation id of the host record."""
        event = self.pool.acquire()
        event.record(stream)
        correlation = next(self._correlations)
        self.pending.add(
            PendingPair(start, event, anchor, spec, stream.device.index or 0, stream.stream_id, correlation)
        )
        return correlation

    def run_once(self) -> None:
        for device in [d for d in self._uncalibrated if d not in self._anchors]:
            self._calibrate(device)
        self._resolve()
        if time.monotonic() - self._last_calibration >= self._recalibrate_s:
            self._last_calibration = time.monotonic()
            for device in list(self._anchors):
                self._calibrate(device)

    def has_work(self) -> bool:
        return len(self.pending) > 0

    def _resolve(self) -> None:
        for pair in self.pending.take_completed(self._anchors):
            anchor = pair.anchor
            if anchor is None:  # take_completed returns placed pairs only
                continue
            start_ns = anchor.place(anchor.event.elapsed_time(pair.start))
            end_ns = anchor.place(anchor.event.elapsed_time(pair.end))
            self.pool.release(pair.start, pair.end)
            # Raw, like every record of this side: (spec, device, stream, start_ns, end_ns, correlation).
            self._recorder.add_device_interval((pair.spec, pair.device, pair.stream, start_ns, end_ns, pair.correlation))


class CudaPhase:
    """A phase timed on the host and, through CUDA events, on its stream.

    Not for the tightest loops: recording two events costs microseconds,
    which is small next to GPU work but not next to a bare host phase.
    """

    __slots__ = ("spec", "_host", "_timer", "_stream", "_local", "_recorder")

    def __init__(self, host: Phase, timer: CudaTimer, stream: Any | None, recorder: Recorder) -> None:
        self.spec = host.spec
        self._host = host
        self._timer = timer
        self._stream = stream
        self._local = threading.local()
        self._recorder = recorder

    def __enter__(self) -> CudaPhase:
        stream = self._stream or self._timer.current_stream()
        self._host.__enter__()
        starts = getattr(self._local, "starts", None)
        if starts is None:
            starts = self._local.starts = []
        starts.append((stream, *self._timer.start_pair(stream)))
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        stream, start, anchor = self._local.starts.pop()
        correlation = self._timer.end_pair(stream, start, anchor, self.spec)
        self._recorder.lane().correlate(correlation)
        return self._host.__exit__(exc_type, exc, tb)

    def __call__(self, fn):
        return Phase.__call__(self, fn)  # type: ignore[arg-type]

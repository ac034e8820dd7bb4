"""Timing GPU phases with CUDA events, without ever synchronizing training.

``Telemetry.phase(name, cuda=True)`` records a pair of
``torch.cuda.Event(enable_timing=True)`` on the current (or given) stream
around the phase, next to its host timing. A resolver thread polls the
pending pairs with ``query()`` and turns each completed pair into a device
interval with wall-clock timestamps:

* Calibration: an anchor event is recorded on an otherwise idle stream at a
  known host time and waited for on the resolver thread (never on the
  training thread); ``anchor.elapsed_time(event)`` then places any event of
  that device on the host timeline. Anchors are renewed every
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
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

from otel_rl.recorder import CORRELATE, Phase, Recorder, warn_once
from otel_rl.records import DeviceIntervalRecord
from otel_rl.schema import PhaseSpec

_logger = logging.getLogger(__name__)


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
    start: Any
    end: Any
    anchor: Anchor
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

    def take_completed(self) -> list[PendingPair]:
        """Remove and return the pairs whose end event completed, in order."""
        done: list[PendingPair] = []
        with self._lock:
            keep: deque[PendingPair] = deque()
            for pair in self._pairs:
                (done if pair.end.query() else keep).append(pair)
            self._pairs = keep
        return done


class CudaTimer:
    """Records event pairs for CUDA phases and resolves them on its own thread.

    Args:
        recorder: where resolved device intervals go (the pipeline drains them).
        to_epoch_ns: converts ``perf_counter_ns()`` readings to epoch ns.
        max_pending: pairs waiting for the GPU before the oldest is dropped.
        recalibrate_s: period of anchor renewal.
    """

    def __init__(
        self,
        recorder: Recorder,
        to_epoch_ns: Callable[[int], int],
        max_pending: int = 4096,
        poll_interval_s: float = 0.005,
        recalibrate_s: float = 2.0,
    ) -> None:
        import torch

        self._torch = torch
        self._recorder = recorder
        self._to_epoch = to_epoch_ns
        self.pool = EventPool(lambda: torch.cuda.Event(enable_timing=True), limit=2 * max_pending)
        self.pending = PendingPairs(max_pending, self.pool)
        self._anchors: dict[int, Anchor] = {}
        self._calibration_streams: dict[int, Any] = {}
        self._anchors_lock = threading.Lock()
        self._poll_interval_s = poll_interval_s
        self._recalibrate_s = recalibrate_s
        self._correlations = itertools.count(1)
        self.last_drift_ns: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel-rl-cuda", daemon=True)
        self._thread.start()

    def _calibrate(self, device: int) -> Anchor:
        """Record an anchor on an idle stream and wait for it here, on the resolver thread."""
        torch = self._torch
        stream = self._calibration_streams.get(device)
        if stream is None:
            stream = self._calibration_streams[device] = torch.cuda.Stream(device=device)
        event = torch.cuda.Event(enable_timing=True)
        before = perf_counter_ns()
        event.record(stream)
        after = perf_counter_ns()
        event.synchronize()
        anchor = Anchor(event, self._to_epoch((before + after) // 2))
        with self._anchors_lock:
            previous = self._anchors.get(device)
            self._anchors[device] = anchor
        if previous is not None:
            self.last_drift_ns[device] = drift_ns(previous, anchor, previous.event.elapsed_time(event))
        return anchor

    def _anchor(self, device: int) -> Anchor:
        with self._anchors_lock:
            anchor = self._anchors.get(device)
        return anchor if anchor is not None else self._calibrate(device)

    def start(self, stream: Any) -> tuple[Any, Anchor]:
        """Record the start event on ``stream`` (training thread; no synchronization)."""
        event = self.pool.acquire()
        event.record(stream)
        return event, self._anchor(stream.device.index or 0)

    def end(self, stream: Any, start: Any, anchor: Anchor, spec: PhaseSpec) -> int:
        """Record the end event and queue the pair; returns the correlation id of the host record."""
        event = self.pool.acquire()
        event.record(stream)
        correlation = next(self._correlations)
        self.pending.add(
            PendingPair(start, event, anchor, spec, stream.device.index or 0, stream.stream_id, correlation)
        )
        return correlation

    def _run(self) -> None:
        last_calibration = time.monotonic()
        while not self._stop.wait(self._poll_interval_s):
            try:
                self._resolve()
                if time.monotonic() - last_calibration >= self._recalibrate_s:
                    last_calibration = time.monotonic()
                    for device in list(self._anchors):
                        self._calibrate(device)
            except Exception:
                warn_once("cuda-resolver", "otel-rl: CUDA event resolution failed; GPU intervals may be missing", exc_info=True)

    def _resolve(self) -> None:
        for pair in self.pending.take_completed():
            start_ns = pair.anchor.place(pair.anchor.event.elapsed_time(pair.start))
            end_ns = pair.anchor.place(pair.anchor.event.elapsed_time(pair.end))
            self.pool.release(pair.start, pair.end)
            self._recorder.add_device_interval(
                DeviceIntervalRecord(pair.spec, pair.device, pair.stream, start_ns, end_ns, pair.correlation)
            )

    def shutdown(self, timeout_s: float) -> None:
        """Resolve what completes within ``timeout_s`` (without blocking on the GPU), then stop."""
        deadline = time.monotonic() + timeout_s
        while len(self.pending) and time.monotonic() < deadline:
            self._resolve()
            time.sleep(self._poll_interval_s)
        self._stop.set()
        self._thread.join(max(deadline - time.monotonic(), 0.0))


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
        stream = self._stream or self._timer._torch.cuda.current_stream()
        self._host.__enter__()
        starts = getattr(self._local, "starts", None)
        if starts is None:
            starts = self._local.starts = []
        starts.append((stream, *self._timer.start(stream)))
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        stream, start, anchor = self._local.starts.pop()
        correlation = self._timer.end(stream, start, anchor, self.spec)
        lane = self._recorder.lane()
        lane.append((CORRELATE, correlation, lane.depth))
        return self._host.__exit__(exc_type, exc, tb)

    def __call__(self, fn):
        return Phase.__call__(self, fn)  # type: ignore[arg-type]

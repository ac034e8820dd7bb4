"""A window of learner iterations profiled with ``torch.profiler`` (``init(profile=(start, count))``).

The first learner iteration whose index is in ``[start, start + count)``
starts the profiler as it is entered; the ``count``-th profiled iteration
stops it as it is exited (so does an iteration past the window, or
``close()`` when training ends first, where stopping fits in half of what is
left of its deadline (the part ``close()`` gives it): stopping costs about as long as the window was open;
a longer window stops collecting, is not written, and is said). A resumed run past the window is not
profiled again. The profiler's own trace is exported where TensorBoard's
profiler plugin and HTA look for it (``profile/<host>_<pid>.<ms>.pt.trace.json``
in the run folder), and one :data:`otel_rl.formats.schema.EVENT_TORCH_PROFILE` event
names the file, the iterations and the ``perf_counter_ns`` readings around
timebase markers recorded inside the profile at its start and end: from those
the Perfetto output maps the profiler's clock onto the run's
(:mod:`otel_rl.outputs.perfetto.profile`).

Outside the window a learner iteration costs one comparison more. Whatever
the profiler raises is one warning, and training goes on unprofiled; so is a
profiler already running when the window opens (the user's own session,
which Kineto would otherwise cancel).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from time import perf_counter_ns
from typing import Any

from otel_rl.base import compat
from otel_rl.base.deadline import Deadline
from otel_rl.base.log import logger
from otel_rl.base.loops import run_bounded
from otel_rl.formats import schema, trace

_logger = logger(__name__)

STOP_S_PER_PROFILED_S = 1.0
"""What stopping ``torch.profiler`` costs per second it profiled (it turns every recorded event into its results on the
calling thread: 0.5 to 0.8 s per second of small CPU ops here), rounded up: close() stops a window only when that fits."""


class ProfileWindow:
    """Starts and stops ``torch.profiler`` around a window of learner iterations (see the module docstring).

    ``record_event(name, attributes)`` records the event that names the
    profile, once it is written: on the training thread, or on the export's
    own thread when ``close()`` finishes the window.
    """

    def __init__(self, start: int, count: int, folder: Path, record_event: Callable[[str, dict[str, Any]], None]) -> None:
        self.start = start
        self.count = count
        self._folder = folder
        self._record_event = record_event
        self._profiler: Any = None
        self._first: int | None = None
        self._profiled = 0
        self._markers: list[list[int]] = []
        self._opened = 0.0  # time.monotonic() when the profiler started
        self._activities: list[Any] = []
        self.done = False

    def around(self, iteration: Any) -> Any:
        """``iteration`` (of an index at least :attr:`start`, the window not yet :attr:`done`) as it is outside the window; inside it, a twin that starts and stops the profiler."""
        if iteration.index < self.start + self.count:
            return _ProfiledIteration(self, iteration)
        if self._profiler is not None:
            self.shutdown()  # the loop skipped past the window's last indices
        self.done = True  # past the window, profiled or not
        return iteration

    def begin(self, index: int) -> None:
        """Start the profiler before iteration ``index`` is entered (once per window; a failure is one warning)."""
        if self._profiler is not None or self.done:
            return
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile

            if compat.torch_profiler_running():
                # Kineto would cancel the session already running: the user's own profiler wins.
                self._fail("is already running (its own session)", None)
                return
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            profiler = profile(activities=activities)
            profiler.start()
            self._profiler, self._first = profiler, index
            self._opened, self._activities = time.monotonic(), activities
            self._mark()
        except Exception as exc:
            self._fail("could not start", exc)

    def iteration_done(self) -> None:
        """Count an iteration of the window as profiled; the last one stops the profiler."""
        if self._profiler is None:
            return
        self._profiled += 1
        if self._profiled >= self.count:
            self.shutdown()

    def shutdown(self, deadline: Deadline | None = None) -> None:
        """Stop the profiler and write what it recorded (the window's end, or training's when it ends first).

        It is stopped on the calling thread (the one that started it); the
        export runs here too, or on a thread of its own until ``deadline`` at
        most when given (``close()``: part of its deadline).
        """
        profiler, self._profiler = self._profiler, None
        self.done = True
        if profiler is None:
            return
        open_s = time.monotonic() - self._opened
        if deadline is not None and open_s * STOP_S_PER_PROFILED_S > deadline.left():
            self._abandon(profiler, open_s, deadline)
            return
        try:
            self._mark()
            profiler.stop()
        except Exception as exc:
            self._fail("could not stop", exc)
            return
        if deadline is None:
            self._write(profiler)
            return
        try:
            run_bounded(lambda: self._write(profiler), deadline, "torch.profiler export")
        except RuntimeError as exc:  # the interpreter is exiting and starts no thread: an unbounded export would overrun
            self._fail("could not be written within the shutdown deadline", exc)

    def _abandon(self, profiler: Any, open_s: float, deadline: Deadline) -> None:
        """Training ended inside a window too long to stop within ``deadline``: collection stops (at once, and the
        interpreter exits cleanly, which it does not with a profiler left running), and the window is not written."""
        try:
            profiler.toggle_collection_dynamic(False, self._activities)
        except Exception as exc:
            _logger.warning("otel-rl: torch.profiler could not be stopped (%s: %s)", type(exc).__name__, exc)
        last = self._first + self._profiled if self._first is not None else None
        _logger.warning(
            "otel-rl: torch.profiler's window (iterations %s to %s, open %.1f s) is not written: stopping it takes about as long as "
            "it was open, past the %.1f s close() gives it; a shorter window (profile=(start, count)) or a longer "
            "shutdown_timeout_s keeps it", self._first, last, open_s, deadline.left(),
        )

    def _write(self, profiler: Any) -> None:
        try:
            self._folder.mkdir(parents=True, exist_ok=True)
            path = self._folder / f"{socket.gethostname()}_{os.getpid()}.{int(time.time() * 1000)}.pt.trace.json"
            profiler.export_chrome_trace(str(path))
        except Exception as exc:
            self._fail("could not write its trace", exc)
            return
        attributes = {
            "file": str(path.resolve()),
            "first_iteration": self._first,
            "iterations": self._profiled,
            "timebase_markers_ns": self._markers,
        }
        self._record_event(schema.EVENT_TORCH_PROFILE, attributes)

    def _mark(self) -> None:
        """Record :data:`otel_rl.formats.trace.PROFILE_MARKERS` markers inside the profile, each between two ``perf_counter_ns`` readings."""
        from torch.profiler import record_function

        for _ in range(trace.PROFILE_MARKERS):
            before = perf_counter_ns()
            with record_function(trace.PROFILE_MARKER):
                pass
            self._markers.append([before, perf_counter_ns()])

    def _fail(self, what: str, exc: Exception | None) -> None:
        self.done = True
        profiler, self._profiler = self._profiler, None
        if profiler is not None:
            try:
                profiler.stop()
            except Exception:
                pass  # already failing: the warning below says so
        why = "" if exc is None else f" ({type(exc).__name__}: {exc})"
        _logger.warning("otel-rl: torch.profiler %s%s; the run goes on unprofiled", what, why)


class _ProfiledIteration:
    """An iteration of the window: the profiler starts before it is entered and counts it once it is exited."""

    __slots__ = ("_window", "_iteration")

    def __init__(self, window: ProfileWindow, iteration: Any) -> None:
        self._window = window
        self._iteration = iteration

    def __getattr__(self, name: str) -> Any:
        return getattr(self._iteration, name)

    def __enter__(self) -> Any:
        self._window.begin(self._iteration.index)
        return self._iteration.__enter__()

    def __exit__(self, *exc: Any) -> bool:
        try:
            return self._iteration.__exit__(*exc)
        finally:
            self._window.iteration_done()

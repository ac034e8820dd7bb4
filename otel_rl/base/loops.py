"""One shape for every background loop of otel-rl.

A :class:`BackgroundLoop` is a named daemon thread that runs :meth:`BackgroundLoop.run_once`
every ``interval_s``, or at once when woken, flushed or closed:

* it never dies of its work: an exception in a round is logged (once per
  loop and exception type, with its traceback) and the next round runs;
* :meth:`BackgroundLoop.flush` asks for a round and waits for a round that *started
  after* the call, so whatever was submitted before the call has been handled
  (no idle flag that a concurrent submit can race);
* :meth:`BackgroundLoop.close` asks for final rounds until :meth:`BackgroundLoop.has_work`
  is False or the deadline passes, then :meth:`BackgroundLoop.release` releases
  resources; :meth:`BackgroundLoop.join` waits for that, never past the deadline;
  :meth:`BackgroundLoop.shutdown` is both.

Every one of them takes a :class:`~otel_rl.base.deadline.Deadline`, as every
``flush``, ``close`` and ``shutdown`` of otel-rl does.
"""

from __future__ import annotations

import atexit
import ctypes
import threading
import time
import weakref
from collections.abc import Callable

from otel_rl.base.deadline import Deadline
from otel_rl.base.log import logger, once

_logger = logger(__name__)

EXIT_STOP_S = 1.0
"""How long the interpreter's exit waits, in all, for the :attr:`BackgroundLoop.stop_at_exit` loops it stops."""

STALL_S = 10.0
"""How long a writer may write nothing while its caller waits for room (:meth:`BackgroundLoop.wait_for_room`) before it is given up on."""


class BackgroundLoop:
    """Base of otel-rl's background loops (see the module docstring).

    Subclasses implement :meth:`run_once`, and :meth:`has_work` when stopping
    should wait for pending work; :meth:`release` runs once on the thread
    after the last round. Call :meth:`start` at the end of the subclass's
    constructor.
    """

    def __init__(self, name: str, interval_s: float) -> None:
        if not interval_s > 0:
            raise ValueError(f"{name}: interval must be positive, got {interval_s!r}")
        self.name = name
        self.interval_s = interval_s
        self._cond = threading.Condition()
        self._requested = 0  # rounds asked for (flush, wake, close)
        self._completed = 0  # the newest request a finished round started after
        self._in_round = False
        self._stop_at: float | None = None
        self._stalled_at: int | None = None  # the progress at which wait_for_room gave up on this loop
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    stop_at_exit = False
    """A loop whose rounds run a library's code (a tracker's SDK, with its Rust or C++ parts) that may still be running
    when the interpreter exits (past a close deadline): it is stopped then, before the interpreter tears threads down.
    Python before 3.14 ends a daemon thread that wakes during its finalization with ``pthread_exit``, which aborts the
    whole process where a Rust or C++ frame is on that thread's stack ("FATAL: exception not rethrown", exit status
    134: pydantic-core under SwanLab's and W&B's ``init``). See :func:`stop_loops_at_exit`."""

    queue_only = False
    """A subclass whose :meth:`has_work` covers every pending item sets this: flushing it while :attr:`settled` wakes no round."""

    # -- subclass hooks ---------------------------------------------------

    def run_once(self) -> None:
        """One round of work. Exceptions are logged and the loop goes on."""

    def has_work(self) -> bool:
        """Whether work is pending (a stopping loop keeps running rounds while it is, until its deadline)."""
        return False

    def release(self) -> None:
        """Release resources; runs once on the loop's thread after its last round."""

    # -- control -----------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        if self.stop_at_exit:
            _AT_EXIT.add(self)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def stopping(self) -> bool:
        return self._stop_at is not None

    def wake(self) -> None:
        """Run a round now rather than at the end of the interval."""
        with self._cond:
            self._requested += 1
            self._cond.notify_all()

    def sleep(self, seconds: float) -> bool:
        """Wait inside a round (a retry backoff), cut short only by the close deadline; False once that has passed."""
        end = time.monotonic() + seconds
        with self._cond:
            while True:
                limit = end if self._stop_at is None else min(end, self._stop_at)
                remaining = limit - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
        return self._stop_at is None or time.monotonic() < self._stop_at

    def wait_for_room(self, has_room: Callable[[], bool], progress: Callable[[], int], failing: Callable[[], bool] = lambda: False) -> bool:
        """Back-pressure on the caller (a writer's queue is full): wake the loop and wait until ``has_room()``.

        The caller waits while the loop makes progress (``progress()``, a
        count of what it wrote, rises) and is before its close deadline. A
        loop whose last write failed (``failing()``: a full disk answers at
        once, it is not slow) is not waited for; one that makes no progress
        for :data:`STALL_S` (a hung disk) is given up on: False, and False at
        once on later calls until its progress moves again. The caller then
        falls back to its drop policy (counted). Never call it on the
        training thread: the pipeline's thread waits, the source fills, and
        what is dropped is dropped (and counted) there.
        """
        if has_room():
            return True
        mark = progress()
        if mark == self._stalled_at or failing():
            return False
        since = time.monotonic()
        while True:
            self.flush(Deadline(min(STALL_S, 0.5)))  # a round that started after this call, or half a second
            if has_room():
                return True
            if not self._thread.is_alive() or (self._stop_at is not None and time.monotonic() >= self._stop_at) or failing():
                return False
            now = progress()
            if now != mark:
                mark, since = now, time.monotonic()
            elif time.monotonic() - since >= STALL_S:
                self._stalled_at = mark
                _logger.warning("otel-rl: %s made no progress for %.0f s; new records it cannot hold are dropped (counted)", self.name, STALL_S, extra=once(f"stalled:{self.name}"))
                return False

    def time_left(self) -> float | None:
        """Seconds until the close deadline; None while not closing."""
        stop_at = self._stop_at
        return None if stop_at is None else max(stop_at - time.monotonic(), 0.0)

    @property
    def settled(self) -> bool:
        """No round running or asked for, and :meth:`has_work` False: for a loop whose pending work is all in it, everything handed to it is done."""
        with self._cond:
            return not self._in_round and self._completed >= self._requested and not self._safe_has_work()

    def flush(self, deadline: Deadline) -> bool:
        """Wait until a round that started after this call finished; True if it did by ``deadline`` and no work is left.

        A :attr:`queue_only` loop that is :attr:`settled` has done everything handed to it: True at once.
        """
        if self.queue_only and self.settled:
            return True
        with self._cond:
            self._requested += 1
            target = self._requested
            self._cond.notify_all()
            if not self._thread.is_alive():
                return not self.has_work()
            finished = self._cond.wait_for(lambda: self._completed >= target or not self._thread.is_alive(), deadline.left())
        return finished and not self.has_work()

    def close(self, deadline: Deadline) -> None:
        """Finish pending work until ``deadline``, then stop; returns at once."""
        at = deadline.at
        with self._cond:
            self._stop_at = at if self._stop_at is None else min(self._stop_at, at)
            self._requested += 1
            self._cond.notify_all()

    def join(self, deadline: Deadline) -> bool:
        """Wait for the loop's thread to end, at most until ``deadline``; True if it did."""
        if self._thread is threading.current_thread():
            return False
        return deadline.join(self._thread)

    def shutdown(self, deadline: Deadline) -> bool:
        """:meth:`close` and :meth:`join` against ``deadline``; True if the thread ended in time."""
        self.close(deadline)
        return self.join(deadline)

    # -- the loop --------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._completed >= self._requested and self._stop_at is None:
                        self._cond.wait(self.interval_s)
                    target = self._requested
                    stop_at = self._stop_at
                    self._in_round = True
                self._round()
                with self._cond:
                    self._completed = max(self._completed, target)
                    self._in_round = False
                    self._cond.notify_all()
                if stop_at is not None:
                    if time.monotonic() >= stop_at or not self._safe_has_work():
                        break
                    # Pending work while stopping (a failing disk, a service down): retry soon, not every interval.
                    with self._cond:
                        self._cond.wait(min(self.interval_s, 0.2, max(stop_at - time.monotonic(), 0.0)))
        finally:
            try:
                if not self._exiting:  # stopped at the interpreter's exit: no more of the library's code
                    self.release()
            except Exception:
                _logger.warning("otel-rl: %s failed to release its resources", self.name, exc_info=True, extra=once(f"release:{self.name}"))
            with self._cond:
                self._cond.notify_all()

    _exiting = False

    def _round(self) -> None:
        try:
            self.run_once()
        except Exception as exc:
            _logger.warning(
                "otel-rl: %s round failed; it keeps running",
                self.name,
                exc_info=True,
                extra=once(f"round:{self.name}:{type(exc).__name__}"),
            )

    def _safe_has_work(self) -> bool:
        try:
            return self.has_work()
        except Exception:
            return False


def run_bounded(fn: Callable[[], object], deadline: Deadline, name: str) -> bool:
    """Run ``fn`` on a daemon thread and wait for it at most until ``deadline``.

    For calls that do not bound themselves (the SDK's shutdowns allow 30 s,
    the batch span processor's ``force_flush`` ignores its timeout,
    torch.profiler's export): this keeps otel-rl's deadline.
    """
    done = threading.Event()

    def target() -> None:
        try:
            fn()
        except Exception as exc:
            _logger.warning("otel-rl: %s failed (%s)", name, exc, extra=once(f"bounded:{name}"))
        finally:
            done.set()

    threading.Thread(target=target, name=f"otel-rl-{name}", daemon=True).start()
    waited = deadline.left()
    finished = done.wait(waited)
    if not finished:
        _logger.warning("otel-rl: %s did not finish within %.1f s; continuing without it", name, waited)
    return finished


_AT_EXIT: weakref.WeakSet[BackgroundLoop] = weakref.WeakSet()


def stop_loops_at_exit(timeout_s: float = EXIT_STOP_S) -> int:
    """Stop the :attr:`BackgroundLoop.stop_at_exit` loops still running (the interpreter is exiting): each is told to
    run no more of its library's code, ``SystemExit`` is raised in its thread at its next Python instruction, and
    they are waited for up to ``timeout_s`` in all. Returns how many still ran then (a thread blocked in a call that
    does not return). What they had not written was counted when their close deadline passed."""
    loops = [loop for loop in list(_AT_EXIT) if loop.alive]
    if not loops:
        return 0
    for loop in loops:
        loop._exiting = True  # noqa: SLF001 - the module's own
        ident = loop._thread.ident  # noqa: SLF001
        if ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(SystemExit))
        with loop._cond:  # noqa: SLF001 - one waiting between rounds wakes to it
            loop._cond.notify_all()  # noqa: SLF001
    end = time.monotonic() + timeout_s
    for loop in loops:
        loop._thread.join(max(end - time.monotonic(), 0.0))  # noqa: SLF001
    return sum(1 for loop in loops if loop.alive)


atexit.register(stop_loops_at_exit)  # at import, before any Telemetry's own exit hook: atexit runs the latest first, so it runs after them

"""Watching a producer from the process that serves it: whether it lives, how it ended, the deadline it set."""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Callable

from otel_rl.formats import lifecycle
from otel_rl.base.deadline import Deadline
from otel_rl.base.loops import BackgroundLoop
from otel_rl.base.processes import pid_alive
from otel_rl.shm import segment as shm


class ProducerDeadline(Deadline):
    """The producer's deadline as the segment's header holds it (else ``default_s`` from now), and earlier if it moves.

    ``time.monotonic()`` is one clock for every process of the machine, so
    the producer's close deadline is honoured here as it stands: when a
    second SIGTERM shortens it there, it is shorter here too.
    """

    __slots__ = ("_reader",)

    def __init__(self, reader: shm.SegmentReader, default_s: float) -> None:
        super().__init__(default_s)
        self._reader = reader
        at = self._header_at()
        if at is not None:
            self._at = at

    def _header_at(self) -> float | None:
        header = self._reader.header
        at_ns = header["deadline_ns"].value if header else shm.NO_DEADLINE
        return None if at_ns == shm.NO_DEADLINE else at_ns / 1e9

    def _follow(self) -> None:
        at = self._header_at()
        if at is not None and at < self._at:
            self._at = at

    @property
    def at(self) -> float:
        self._follow()
        return self._at

    def left(self, cap_s: float | None = None) -> float:
        self._follow()
        return super().left(cap_s)


class ProducerWatch(BackgroundLoop):
    """Whether the producer process lives, and how it ended; wakes ``on_exit`` the moment it exits.

    ``/proc/<pid>/stat`` tells apart a reused pid (its start time) and, while
    the dead process waits for its parent to collect it, its wait status; a
    pidfd makes the wake-up immediate, before the parent collects it.
    """

    def __init__(self, pid: int, on_exit: Callable[[], None]) -> None:
        super().__init__(f"otel-rl-watch-{pid}", 1.0)
        self.pid = pid
        self._on_exit = on_exit
        stat = self._stat()
        self._started = stat[1] if stat else None
        try:
            self._pidfd: int | None = os.pidfd_open(pid) if pid != os.getpid() else None
        except (AttributeError, OSError):
            self._pidfd = None
        if self._pidfd is not None:
            self.start()

    def run_once(self) -> None:
        if self._pidfd is not None and not self.stopping and select.select([self._pidfd], [], [], self.interval_s)[0]:
            self._on_exit()
            self.close(Deadline(0))

    def release(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def _stat(self) -> tuple[str, int | None, int | None] | None:
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                text = f.read().decode("ascii", "replace")
        except OSError:
            return None
        fields = text[text.rindex(")") + 2 :].split()
        state, started = fields[0], int(fields[19])
        exit_code = int(fields[49]) if len(fields) > 49 else None
        return state, started, exit_code

    def ended(self) -> tuple[str, str] | None:
        """None while the producer lives; else ``(status, reason)`` for a run it left open."""
        if self._started is None:  # no /proc here (or the producer was gone before the agent looked)
            return None if pid_alive(self.pid) else (lifecycle.KILLED, "the process disappeared without ending its run")
        stat = self._stat()
        if stat is not None and stat[1] == self._started and stat[0] not in ("Z", "X"):
            return None
        if stat is not None and stat[1] == self._started and stat[2] is not None:
            wait_status = stat[2]
            if os.WIFSIGNALED(wait_status):
                number = os.WTERMSIG(wait_status)
                return lifecycle.KILLED, f"killed by {signal.Signals(number).name}" if number in signal.valid_signals() else f"killed by signal {number}"
            code = os.WEXITSTATUS(wait_status)
            return lifecycle.FAILED, f"exited with code {code} before ending its run"
        return lifecycle.KILLED, "the process disappeared without ending its run (SIGKILL, OOM kill or os._exit)"

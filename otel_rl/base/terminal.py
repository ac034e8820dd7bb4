"""otel-rl's own output to a terminal (the start and end lines, the panel), bounded like every other output.

A terminal that stops reading (Ctrl-S, a stalled ssh connection, a pipe
nobody drains) blocks every write to it. Written from the closing thread,
the run's end line would hold ``close()`` past its deadline, for ever; written
from a thread through ``sys.stdout`` it would hold that stream's lock, and the
interpreter, flushing the stream at exit, would stop with a fatal error.

So what otel-rl writes to the process's own standard output or error, when
that is a terminal or a pipe, goes through a :class:`TerminalWriter`: a queue
of at most :data:`MAX_PENDING_BYTES` (the oldest writes give way, counted)
and a thread that writes it with ``os.write`` on a copy of the descriptor,
holding no lock of Python's. :meth:`TerminalWriter.wait` waits for it within
a deadline; at exit it is given :data:`EXIT_WAIT_S`. A stream that was
replaced (a notebook's, a test's capture) or is a file is written directly.
"""

from __future__ import annotations

import atexit
import os
import stat
import sys
import threading
import time
from collections import deque
from typing import Any, TextIO

MAX_PENDING_BYTES = 1 << 20
EXIT_WAIT_S = 0.5

_writers: dict[int, TerminalWriter] = {}
_lock = threading.Lock()


class TerminalWriter:
    """Writes text to descriptor ``fd`` on a thread of its own (see the module docstring)."""

    def __init__(self, fd: int) -> None:
        self._fd = os.dup(fd)
        self._chunks: deque[bytes] = deque()
        self._bytes = 0
        self._busy = False
        self.dropped = 0
        """Bytes given way to newer ones while the terminal did not read."""
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="otel-rl-terminal", daemon=True)
        self._thread.start()

    def write(self, text: str) -> int:
        data = text.encode("utf-8", "replace")
        with self._cond:
            self._chunks.append(data)
            self._bytes += len(data)
            while self._bytes > MAX_PENDING_BYTES and len(self._chunks) > 1:
                old = self._chunks.popleft()
                self._bytes -= len(old)
                self.dropped += len(old)
            self._cond.notify_all()
        return len(text)

    def wait(self, timeout_s: float) -> bool:
        """Wait until what was written reached the terminal, at most ``timeout_s``; True when it did."""
        end = time.monotonic() + max(timeout_s, 0.0)
        with self._cond:
            while self._chunks or self._busy:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._chunks:
                    self._cond.wait()
                data = self._chunks.popleft()
                self._bytes -= len(data)
                self._busy = True
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view) :]
            except OSError:  # a terminal that went away: nothing more to show there
                pass
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


class TerminalFile:
    """A file-like view of a :class:`TerminalWriter` for ``rich``: its writes are queued, ``flush`` never blocks."""

    def __init__(self, stream: TextIO, writer: TerminalWriter) -> None:
        self._stream, self._writer = stream, writer
        self.encoding = getattr(stream, "encoding", "utf-8") or "utf-8"

    def write(self, text: str) -> int:
        return self._writer.write(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def writer_for(stream: TextIO) -> TerminalWriter | None:
    """The writer of ``stream`` when it is this process's own standard output or error on a terminal or a pipe, else None."""
    if stream is None or stream not in (sys.__stdout__, sys.__stderr__):
        return None
    try:
        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError):
        return None
    if not (os.isatty(fd) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return None  # a file: a write never waits on a reader
    with _lock:
        writer = _writers.get(fd)
        if writer is None:
            try:
                stream.flush()  # what the program wrote before goes first
            except (OSError, ValueError):
                pass
            writer = _writers[fd] = TerminalWriter(fd)
        return writer


def terminal_file(stream: TextIO) -> Any:
    """``stream`` bounded (a :class:`TerminalFile`) where :func:`writer_for` gives a writer, else ``stream`` itself."""
    writer = writer_for(stream)
    return stream if writer is None else TerminalFile(stream, writer)


def say(text: str, stream: TextIO | None = None) -> None:
    """Write ``text`` and a newline to ``stream`` (standard error by default), never blocking on a stalled terminal."""
    stream = sys.stderr if stream is None else stream
    writer = writer_for(stream)
    if writer is not None:
        writer.write(text + "\n")
        return
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError, AttributeError):  # a closed or broken stream: nothing to tell
        pass


def wait_all(timeout_s: float) -> bool:
    """Wait for every writer within ``timeout_s`` in all; True when each wrote everything."""
    end = time.monotonic() + timeout_s
    with _lock:
        writers = list(_writers.values())
    return all([writer.wait(end - time.monotonic()) for writer in writers])


atexit.register(wait_all, EXIT_WAIT_S)

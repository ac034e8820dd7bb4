"""The agent's warnings, logged in the training process whose records they are about.

Warnings about a producer's input then reach the training process's logging
(its handlers, its files), not only the terminal: the agent writes them into
the segment's log ring (:class:`LogForwarder`), the producer logs them as its
own (:func:`relay_logs`).
"""

from __future__ import annotations

import logging
import marshal
import sys
import threading

from otel_rl.base.log import RELAYED
from otel_rl.base.processes import pid_alive
from otel_rl.shm import segment as shm
from otel_rl.shm.layout import MessageKind


class LogForwarder(logging.Handler):
    """The agent process's otel-rl log records, sent to a producer, which logs them as its own.

    Warnings about a producer's input then reach the training process's
    logging (its handlers, its files), not only the terminal. A record goes to
    the producer whose segment the logging thread serves (see :meth:`serving`);
    one from another thread (an exporter's) goes to the first producer still
    alive; with none, to stderr.
    """

    _current = threading.local()

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._producers: list[tuple[shm.SegmentReader, int]] = []
        self._lock = threading.Lock()

    @classmethod
    def serving(cls, reader: shm.SegmentReader, pid: int) -> None:
        """Records logged on this thread from now on are the producer ``pid``'s."""
        cls._current.producer = (reader, pid)

    def add(self, reader: shm.SegmentReader, pid: int) -> None:
        with self._lock:
            self._producers.append((reader, pid))

    def remove(self, reader: shm.SegmentReader) -> None:
        with self._lock:
            self._producers = [p for p in self._producers if p[0] is not reader]

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            payload = marshal.dumps((record.levelno, record.name, message))
            current = getattr(self._current, "producer", None)
            with self._lock:
                candidates = [current] if current is not None else list(self._producers)
            for reader, pid in candidates:
                if reader.logs is not None and pid_alive(pid) and reader.logs.put(MessageKind.LOG, payload, reader.logs.capacity):
                    return
            sys.stderr.write(message + "\n")
        except Exception:
            self.handleError(record)

    @classmethod
    def install(cls) -> LogForwarder:
        forwarder = cls()
        logging.getLogger("otel_rl").addHandler(forwarder)
        return forwarder


def relay_logs(segment: shm.Segment) -> None:
    """Log, in the producer, what the agent forwarded (see :class:`LogForwarder`)."""
    logs = segment.logs
    if logs is None:
        return
    frames = logs.take(shm.LOG_BYTES)
    logs.commit()
    for _, payload in frames:
        try:
            level, name, message = marshal.loads(payload)
        except (ValueError, EOFError, TypeError):
            continue
        logging.getLogger(name).log(level, "%s", message, extra=RELAYED)

"""otel-rl's loggers and the filter that keeps a hot loop from flooding the log.

Every module logs through ``logger(__name__)``: a standard :class:`logging.Logger`
(``exc_info``, ``stack_info`` and every other argument work as usual) with
:data:`DEDUP` attached. The filter passes each distinct warning once:

* a record's identity is its ``once`` extra when given
  (``_logger.warning("... %d records", n, extra=once("queue-full"))``), else
  its logger, message template and arguments, so a warning raised in a loop
  is logged once while distinct problems each get their line;
* at most :data:`MAX_VARIANTS` distinct identities per template are logged,
  then one line says that further ones are suppressed (50,000 bad keys give
  about 20 lines, not 50,000);
* ``extra=EVERY_TIME`` opts a record out (a worker crash is worth every line);
* ``extra=RELAYED`` marks a warning an agent process logged and forwarded: it
  passes unless this process already logged the same text itself;
* debug and info records always pass.

Where the lines go is the application's choice: otel-rl adds a handler only while its panel draws on the
terminal and the application has none of its own (:mod:`otel_rl.training.panel_warnings`: the panel prints
them above itself, where Python would have printed them over its frame).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

MAX_VARIANTS = 20
"""Distinct warnings logged per message template before the rest are suppressed."""

_ONCE = "otel_rl_once"
_RELAYED = "otel_rl_relayed"
_UNSET = object()
MAX_TEXTS = 10_000
"""Texts of passed warnings remembered, for relayed duplicates."""


def once(key: str) -> dict[str, Any]:
    """``extra=`` for a warning logged once per ``key`` (instead of once per message template)."""
    return {_ONCE: key}


EVERY_TIME: dict[str, Any] = {_ONCE: None}
"""``extra=`` for a warning that is logged every time."""

RELAYED: dict[str, Any] = {_RELAYED: True}
"""``extra=`` for a warning forwarded from an agent process (its text is the message)."""


class DuplicateFilter(logging.Filter):
    """Passes each distinct warning once (see the module docstring); thread-safe."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._seen: set[object] = set()
        self._variants: dict[tuple[str, object], int] = {}
        self._texts: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        if getattr(record, _RELAYED, False):
            return record.getMessage() not in self._texts
        if not self._passes(record):
            return False
        if len(self._texts) < MAX_TEXTS:
            self._texts.add(record.getMessage())
        return True

    def _passes(self, record: logging.LogRecord) -> bool:
        key = getattr(record, _ONCE, _UNSET)
        if key is None:
            return True
        if key is _UNSET:
            try:
                key = repr(record.args)
            except Exception:
                key = type(record.args).__name__
        template = (record.name, record.msg)
        with self._lock:
            identity = (template, key)
            if identity in self._seen:
                return False
            variants = self._variants.get(template, 0)
            if variants > MAX_VARIANTS:
                return False
            self._variants[template] = variants + 1
            self._seen.add(identity)
            if variants == MAX_VARIANTS:
                # The 21st variant is replaced by a note; later ones vanish.
                record.msg = "otel-rl: further warnings like %r are suppressed"
                record.args = (str(template[1])[:120],)
                record.exc_info = None
            return True

    def reset(self) -> None:
        """Forget what was logged (tests)."""
        with self._lock:
            self._seen.clear()
            self._variants.clear()
            self._texts.clear()


DEDUP = DuplicateFilter()


def logger(name: str) -> logging.Logger:
    """The module logger ``name`` with :data:`DEDUP` attached."""
    log = logging.getLogger(name)
    if DEDUP not in log.filters:
        log.addFilter(DEDUP)
    return log

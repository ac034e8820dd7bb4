"""Phases and iterations used wrongly: one warning per kind, and the training loop goes on.

Both hot paths (C and pure Python) call these; a record the misuse loses is
counted by the recorder (queue ``phase_misuse``).
"""

from __future__ import annotations

from typing import Any

from otel_rl.base.log import logger, once

_logger = logger(__name__)

MAX_DEPTH = 64
"""Deepest phase nesting recorded; deeper phases warn once and are not recorded (``MAX_DEPTH`` in ``_hotpath.c``)."""


def phase(kind: str, entered: Any, other: Any | None) -> None:
    """A phase used wrongly (``foreign``, ``not-open``, ``order``, ``too-deep``); warns once per phase and kind."""
    name = entered.spec.name
    if kind == "foreign":
        message = "otel-rl: phase %r exited on a thread that did not enter it; its record is dropped"
        _logger.warning(message, name, extra=once(f"exit-foreign:{name}"))
    elif kind == "not-open":
        message = "otel-rl: phase %r exited but it is not open on this thread (exited twice, or out of order); ignored"
        _logger.warning(message, name, extra=once(f"exit-not-open:{name}"))
    elif kind == "order":
        inner = other.spec.name if other is not None else "?"
        message = "otel-rl: phase %r exited while phase %r, entered inside it, was still open; %r is dropped, later phases are recorded"
        _logger.warning(message, name, inner, inner, extra=once(f"exit-order:{name}"))
    else:
        message = "otel-rl: phase %r nested deeper than %d phases; it is not recorded"
        _logger.warning(message, name, MAX_DEPTH, extra=once(f"too-deep:{name}"))


def iteration(kind: str, entered: Any, other: Any | None) -> None:
    """An iteration used wrongly (``twice``: entered while one is open; ``foreign``); warns once per kind."""
    if kind == "twice":
        _logger.warning(
            "otel-rl: %s iteration %r entered while iteration %r is open on this thread; the inner one is not recorded",
            entered.timeline,
            entered.index,
            other.index if other is not None else "?",
            extra=once(f"iteration-twice:{entered.timeline}"),
        )
    else:
        _logger.warning("otel-rl: iteration %r exited on another thread; dropped", entered.index)

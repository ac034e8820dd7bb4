"""otel-rl's warnings while a panel draws on the terminal: the panel says them, above its frame.

A line the training process writes to the terminal while the panel redraws lands inside the frame, and the
terminal keeps the old frame's header above the new one. Where the application has no handler of its own for
otel-rl's loggers (Python would print the line on stderr, through ``logging.lastResort``), :func:`install` hands
each warning to the recorder instead; the pipeline gives it to the panel (:meth:`otel_rl.core.pipeline.RecordSink.on_notice`),
which prints it above itself once. The agent's own warnings come back to the training process to be logged
(:mod:`otel_rl.agent.logs`) and take the same way. Where the recorder has no room for a line, it goes to stderr as
before: nothing is lost. An application that configured logging keeps its lines where it sends them.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

LOGGER = "otel_rl"


class PanelWarnings(logging.Handler):
    """Hands otel-rl's warnings to the panel through ``recorder`` (:meth:`otel_rl.training.recorder.Recorder.add_notice`)."""

    def __init__(self, recorder: Any) -> None:
        super().__init__(logging.WARNING)
        self._recorder = recorder
        self.closing = False
        """Set as the outputs close: what is said from then on may come after the panel's last pass, and goes to stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            if self.closing or not self._recorder.add_notice(text):
                sys.stderr.write(text + "\n")
        except Exception:
            self.handleError(record)


def draws_frames() -> bool:
    """Whether the panel redraws frames on this terminal (the panel's own test: a terminal, not a dumb one). Printing
    plain lines to a pipe or a dumb terminal, it garbles nothing: warnings stay on stderr, where logs and CI read them."""
    from rich.console import Console

    console = Console(file=sys.stdout)
    return console.is_terminal and not console.is_dumb_terminal


def install(recorder: Any) -> PanelWarnings | None:
    """Send otel-rl's warnings to the panel while it draws; None (nothing changed) where the application handles them
    itself or the panel draws no frames."""
    log = logging.getLogger(LOGGER)
    if log.hasHandlers():  # the application's own handlers, or the root logger's: where its lines go is its choice
        return None
    if not draws_frames():
        return None
    handler = PanelWarnings(recorder)
    log.addHandler(handler)
    return handler


def closing(handler: PanelWarnings | None) -> None:
    """The outputs are closing: the panel's last pass may not see a line said from now on, which goes to stderr."""
    if handler is not None:
        handler.closing = True


def remove(handler: PanelWarnings | None) -> None:
    """The panel is gone: otel-rl's warnings go where they went before :func:`install`."""
    if handler is not None:
        logging.getLogger(LOGGER).removeHandler(handler)

"""The run's lifecycle on the training side: its start and end records, SIGTERM while it is open.

:meth:`otel_rl.Telemetry.run` (a block), or :meth:`~otel_rl.Telemetry.start_run`
and :meth:`~otel_rl.Telemetry.end_run` (code that cannot wrap training in a
block, the integrations), open and end the run through a :class:`RunScope`:
it records :class:`~otel_rl.core.records.RunStart` and
:class:`~otel_rl.core.records.RunEnd`, and turns the first SIGTERM during the
run into a ``killed`` end (:class:`SigtermGuard`).
"""

from __future__ import annotations

import signal
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from time import perf_counter_ns
from typing import Any

from otel_rl.formats import lifecycle
from otel_rl.base.clock import Clock
from otel_rl.base.log import logger, once
from otel_rl.base.values import NAME_LIMIT, as_step, clean_text, describe, json_safe
from otel_rl.config import TelemetryConfig
from otel_rl.core.ids import new_span_id
from otel_rl.core.records import RunEnd, RunStart
from otel_rl.formats import protocol
from otel_rl.run import files, provenance
from otel_rl.run.provenance import redact
from otel_rl.run.resume import PreviousRun
from otel_rl.training.recorder import Recorder

_logger = logger(__name__)


class Terminated(SystemExit):
    """Raised in the main thread on SIGTERM during :meth:`otel_rl.Telemetry.run`; exits with status 143."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)

    def __str__(self) -> str:
        return "SIGTERM"


def failure_reason(exc: BaseException) -> str:
    """``Type: message`` of an exception, capped at 2 KB of UTF-8; never raises (even when ``str(exc)`` does)."""
    try:
        message = str(exc)
    except Exception as inner:  # noqa: BLE001 - any failure of a user's __str__
        message = f"<the message could not be read: {type(inner).__name__} in __str__>"
    text = clean_text(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)
    encoded = text.encode("utf-8")
    if len(encoded) > protocol.REASON_LIMIT_BYTES:
        text = encoded[: protocol.REASON_LIMIT_BYTES - 3].decode("utf-8", "ignore") + "..."
    return text


def run_status(exc: BaseException | None) -> str:
    """Terminal status of a run that ended with ``exc`` (None: normal exit)."""
    if exc is None:
        return lifecycle.FINISHED
    if isinstance(exc, Terminated):
        return lifecycle.KILLED
    if isinstance(exc, SystemExit):
        return lifecycle.FINISHED if exc.code in (None, 0) else lifecycle.FAILED
    if isinstance(exc, KeyboardInterrupt):
        return lifecycle.KILLED
    return lifecycle.FAILED


class SigtermGuard:
    """SIGTERM while a run is open: the first one ends the run as ``killed``; later ones only hurry shutdown.

    Installed on the main thread when SIGTERM has its default action. The
    first signal raises :class:`Terminated` in the main thread; the guard then
    stays installed until :meth:`otel_rl.Telemetry.close` has written every
    output, so a launcher that forwards a second signal (or a third) cannot
    kill the process mid-shutdown: it calls ``hurry`` instead.
    """

    def __init__(self, scope: RunScope, hurry: Callable[[], None]) -> None:
        self._scope = weakref.ref(scope)
        self._hurry = weakref.WeakMethod(hurry)  # type: ignore[arg-type]
        self.received = 0
        self.installed = False

    def install(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        try:
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
                return False  # the application handles SIGTERM itself
            signal.signal(signal.SIGTERM, self._handle)
        except (ValueError, OSError):
            return False
        self.installed = True
        return True

    def _handle(self, signum: int, frame: object) -> None:
        self.received += 1
        scope, hurry = self._scope(), self._hurry()
        if self.received == 1 and scope is not None and scope.open:
            raise Terminated()
        if hurry is not None:
            hurry()

    def restore(self) -> None:
        if not self.installed:
            return
        self.installed = False
        try:
            if signal.getsignal(signal.SIGTERM) == self._handle:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except (ValueError, OSError):
            pass


class RunScope:
    """The run of one :class:`otel_rl.Telemetry` (see the module docstring).

    Args:
        on_nonfinite: called with ``(path, value)`` for a NaN or Inf replaced in the configuration.
        hurry: called on a second SIGTERM.
    """

    def __init__(
        self,
        recorder: Recorder,
        clock: Clock,
        config: TelemetryConfig,
        parent_span_id: int | None,
        previous: PreviousRun | None,
        on_nonfinite: Callable[[str, Any], None],
        hurry: Callable[[], None],
    ) -> None:
        self._recorder, self._clock, self._config = recorder, clock, config
        self._parent_span_id = parent_span_id
        self._previous = previous
        self._on_nonfinite = on_nonfinite
        self.sigterm = SigtermGuard(self, hurry)
        self.open = False
        self.span_id: int | None = None
        """The open (or last) run's span id."""
        self.status: str | None = None
        """How the last run ended."""
        self.duration_s: float | None = None
        """How long the last run took, from its start to its end (the close that followed not counted)."""
        self._started: AbstractContextManager | None = None  # the run start() opened
        self.before_end: Callable[[str], None] | None = None
        """Called with the status before a run's end is recorded (what the run recorded still on its way: its videos)."""

    @contextmanager
    def scope(self, closed: bool, family: Any, total_steps: Any, num_envs: Any, config: Any, handle_sigterm: bool) -> Iterator[None]:
        """The run's block (see :meth:`otel_rl.Telemetry.run`); ``closed``: telemetry was closed, nothing is recorded."""
        if self.open or closed:
            why = "after close()" if closed else "while a run is open"
            _logger.warning("otel-rl: run() entered %s; it is not recorded", why, extra=once(f"run:{why}"))
            yield
            return
        if self.status is not None:  # one Telemetry, a second lifecycle (a second trainer.train()): one run id for both
            _logger.warning(
                "otel-rl: a run starts again in this Telemetry (its last one ended %s): both are run %r, in one folder, and "
                "their steps start over; call otel_rl.init() (and close()) once per run to keep them apart",
                self.status, self._config.run_id, extra=once("run-again"),
            )  # fmt: skip
        self.open = True
        start_ns = self._start(family, total_steps, num_envs, config)
        if handle_sigterm:
            self.sigterm.install()
        try:
            yield
        except BaseException as exc:
            status = run_status(exc)
            self._end(start_ns, status, None if status == lifecycle.FINISHED else failure_reason(exc))
            raise
        else:
            self._end(start_ns, lifecycle.FINISHED, None)
        finally:
            if not self.sigterm.received:
                self.sigterm.restore()  # else it guards shutdown until close() is done

    def _start(self, family: Any, total_steps: Any, num_envs: Any, config: Any) -> int:
        self.span_id = new_span_id()
        start_ns = self._clock.now_ns()
        self._recorder.add_run(
            RunStart(
                start_ns,
                self.span_id,
                self._parent_span_id,
                None if family is None else clean_text(str(json_safe(family)), NAME_LIMIT),
                _count("total_steps", total_steps),
                _count("num_envs", num_envs),
                redact(_config_document(config, self._on_nonfinite)),
                provenance.collect(),
            )
        )
        if self._previous is not None:
            previous, self._previous = self._previous, None  # a second run() in this process is not a resumption
            attributes = {"previous_status": previous.status, "last_step": previous.last_step, "resumes": previous.resumes + 1}
            self._recorder.add_event((perf_counter_ns(), "resumed", attributes))
        return start_ns

    def _end(self, start_ns: int, status: str, reason: str | None) -> None:
        if self.before_end is not None:
            try:
                self.before_end(status)
            except Exception:  # never into training
                _logger.warning("otel-rl: what the run recorded last may follow its end", exc_info=True)
        self.open = False
        self.status = status
        error_logs: tuple[str, ...] = ()
        if status == lifecycle.FAILED and self._config.run_dir is not None:
            try:
                error_logs = tuple(sorted(str(p) for p in (self._config.run_dir / files.ERRORS_DIR).glob("*.log")))
            except OSError:
                pass
        end_ns = self._clock.now_ns()
        self.duration_s = (end_ns - start_ns) / 1e9
        self._recorder.add_run(RunEnd(status, start_ns, end_ns, reason, error_logs))

    def start(self, closed: bool, family: Any, total_steps: Any, num_envs: Any, config: Any) -> bool:
        """Open a run that :meth:`end` ends (see :meth:`otel_rl.Telemetry.start_run`)."""
        if self.open or closed:
            return False
        scope = self.scope(closed, family, total_steps, num_envs, config, True)
        scope.__enter__()
        self._started = scope
        return True

    def end(self, error: Any = None) -> None:
        """End the run :meth:`start` opened (see :meth:`otel_rl.Telemetry.end_run`)."""
        scope, self._started = self._started, None
        if scope is None:
            return
        if error is not None and not isinstance(error, BaseException):
            _logger.warning("otel-rl: end_run() takes an exception or None, got %s; the run ends as failed with it as the reason", describe(error))
            error = RuntimeError(clean_text(str(error) if isinstance(error, str) else describe(error), NAME_LIMIT))
        if error is None:
            scope.__exit__(None, None, None)
            return
        try:
            scope.__exit__(type(error), error, error.__traceback__)
        except BaseException as raised:  # the run's block re-raises what ended it: not this caller's to see
            if raised is not error:
                raise


    def fail_unopened(self, announced_ns: int, error: BaseException) -> None:
        """The process ends of ``error`` before any run was opened: the run its ``init()`` announced (``pending``) ends failed, with the reason."""
        if self.open or self.status is not None:
            return
        status = run_status(error)
        if status == lifecycle.FINISHED:  # sys.exit(0) before a run: nothing failed
            return
        self._end(announced_ns, status, failure_reason(error))


def _count(what: str, value: Any) -> int | None:
    """A non-negative count (env steps, envs) as an int, or None with one warning."""
    if value is None:
        return None
    number = as_step(value, what)
    if number is not None and number < 0:
        _logger.warning("otel-rl: %s=%d is negative; ignored", what, number)
        return None
    return number


def _config_document(config: Any, on_nonfinite: Callable[[str, Any], None]) -> Mapping[str, Any] | None:
    """The run's configuration as a JSON object (a non-mapping is kept under ``value``)."""
    if config is None:
        return None
    safe = json_safe(config, on_nonfinite, "config")
    if isinstance(safe, dict):
        return safe
    _logger.warning("otel-rl: run(config=...) got %s, not a mapping; kept under 'value'", type(config).__name__)
    return {"value": safe}

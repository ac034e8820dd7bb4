"""The training API as a type, and its disabled twin: :class:`otel_rl.Telemetry` and :class:`NoOpTelemetry` are both a :class:`TrainingTelemetry`.

A training loop holds whichever :func:`otel_rl.init` returned and calls it
unconditionally. The type checker holds both classes to this protocol
(``tests/unit/test_api_types.py`` runs mypy over that), so the disabled twin can
never miss a method or take different arguments.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

from otel_rl.config import TelemetryConfig
from otel_rl.formats import schema


class TrainingTelemetry(Protocol):
    """What a training loop calls (see :class:`otel_rl.Telemetry` for each method's contract)."""

    enabled: bool
    trace_id: int

    @property
    def run_id(self) -> str: ...

    @property
    def tracer_provider(self) -> Any: ...

    @property
    def meter_provider(self) -> Any: ...

    def phase(self, name: str, timeline: str = schema.LEARNER, cuda: bool = False, stream: Any = None) -> Any: ...  # a Phase: a context manager and decorator

    def iteration(self, index: int, env_steps: int | None = None, timeline: str = schema.LEARNER) -> Any: ...  # an Iteration: a context manager

    def flow(self, flow_id: int, end: bool = False) -> None: ...

    def record_phase(self, name: str, start_ns: int, end_ns: int, timeline: str = schema.LEARNER) -> None: ...

    def record_iteration(
        self, index: int, start_ns: int, end_ns: int, phases: Sequence[tuple[str, int, int]] = (), env_steps: int | None = None,
        timeline: str = schema.LEARNER,
    ) -> None: ...

    def scalars(self, values: Mapping[str, Any], step: int | None = None, env_steps: int | None = None) -> None: ...

    def reward_terms(self, terms: Mapping[str, Any], step: int | None = None, env_steps: int | None = None) -> None: ...

    def distribution(self, key: str, values: Any, step: int | None = None) -> None: ...

    def event(self, name: str, **attributes: Any) -> None: ...

    def status(self, text: str) -> None: ...

    def add_summary(self, **fields: Any) -> None: ...

    def video(self, key: str, source: Any, fps: float = 30.0, step: int | None = None, caption: str | None = None) -> None: ...

    def image(self, key: str, source: Any, step: int | None = None, caption: str | None = None) -> None: ...

    def run(
        self,
        *,
        family: str | None = None,
        total_steps: int | None = None,
        num_envs: int | None = None,
        config: Mapping[str, Any] | None = None,
        handle_sigterm: bool = True,
    ) -> AbstractContextManager[Any]: ...

    def start_run(
        self,
        *,
        family: str | None = None,
        total_steps: int | None = None,
        num_envs: int | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> bool: ...

    def end_run(self, error: BaseException | None = None) -> None: ...

    def describe_system(self, system: str, environment: str | None = None, algorithm: str | None = None) -> None: ...

    def window_timings(self) -> dict[str, float]: ...

    def log_window(self, values: Mapping[str, Any] | None = None, group: Any = None) -> dict[str, float]: ...

    def align_clocks(self, group: Any = None) -> float: ...

    def add_sink(self, sink: Any) -> None: ...

    def worker_spec(self, role: str, context: Any = None, relay: Any = None, **options: Any) -> Any: ...

    def watch_worker(self, process: Any, role: str) -> None: ...

    def traceparent(self) -> str: ...

    def flush(self, timeout_s: float = 5.0) -> bool: ...

    def close(self, timeout_s: float | None = None) -> None: ...

    def stats(self) -> dict[str, Any]: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


class _NoOpPhase:
    __slots__ = ()

    def __enter__(self) -> _NoOpPhase:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False

    def __call__(self, fn):
        return fn


_NOOP_PHASE = _NoOpPhase()


class NoOpTelemetry:
    """Disabled telemetry: the same public API (methods and attributes), no thread, no file, no work."""

    enabled = False
    trace_id = 0
    tracer_provider = None
    meter_provider = None

    def __init__(self, config: TelemetryConfig | None = None) -> None:
        self.config = config

    @property
    def run_id(self) -> str:
        return (self.config.run_id if self.config is not None else None) or ""

    def phase(self, name: str, timeline: str = schema.LEARNER, cuda: bool = False, stream: Any = None) -> _NoOpPhase:
        return _NOOP_PHASE

    def iteration(self, index: int, env_steps: int | None = None, timeline: str = schema.LEARNER) -> _NoOpPhase:
        return _NOOP_PHASE

    def scalars(self, values: Mapping[str, Any], step: int | None = None, env_steps: int | None = None) -> None:
        pass

    def reward_terms(self, terms: Mapping[str, Any], step: int | None = None, env_steps: int | None = None) -> None:
        pass

    def distribution(self, key: str, values: Any, step: int | None = None) -> None:
        pass

    def flow(self, flow_id: int, end: bool = False) -> None:
        pass

    def event(self, name: str, **attributes: Any) -> None:
        pass

    def status(self, text: str) -> None:
        pass

    def add_summary(self, **fields: Any) -> None:
        pass

    def video(self, key: str, source: Any, fps: float = 30.0, step: int | None = None, caption: str | None = None) -> None:
        pass

    def image(self, key: str, source: Any, step: int | None = None, caption: str | None = None) -> None:
        pass

    @contextmanager
    def run(
        self,
        *,
        family: str | None = None,
        total_steps: int | None = None,
        num_envs: int | None = None,
        config: Mapping[str, Any] | None = None,
        handle_sigterm: bool = True,
    ) -> Iterator[NoOpTelemetry]:
        yield self

    def start_run(
        self,
        *,
        family: str | None = None,
        total_steps: int | None = None,
        num_envs: int | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> bool:
        return False

    def end_run(self, error: BaseException | None = None) -> None:
        pass

    def describe_system(self, system: str, environment: str | None = None, algorithm: str | None = None) -> None:
        pass

    def traceparent(self) -> str:
        return ""

    def record_phase(self, name: str, start_ns: int, end_ns: int, timeline: str = schema.LEARNER) -> None:
        pass

    def record_iteration(
        self, index: int, start_ns: int, end_ns: int, phases: Sequence[tuple[str, int, int]] = (), env_steps: int | None = None,
        timeline: str = schema.LEARNER,
    ) -> None:
        pass

    def window_timings(self) -> dict[str, float]:
        return {}

    def log_window(self, values: Mapping[str, Any] | None = None, group: Any = None) -> dict[str, float]:
        return dict(values or {})

    def align_clocks(self, group: Any = None) -> float:
        return 0.0

    def add_sink(self, sink: Any) -> None:
        pass

    def worker_spec(self, role: str, context: Any = None, relay: Any = None, **options: Any):
        """A spec that makes the worker's telemetry disabled too."""
        from otel_rl.training.workers import WorkerSpec

        return WorkerSpec(role=role, run_id="", traceparent="", relay=None, options={"enabled": False})

    def watch_worker(self, process: Any, role: str) -> None:
        pass

    def flush(self, timeout_s: float = 5.0) -> bool:
        return True

    def close(self, timeout_s: float | None = None) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {}

    def __enter__(self) -> NoOpTelemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

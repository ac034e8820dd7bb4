"""The training API as a type: :class:`otel_rl.Telemetry` and its disabled twin are both a :class:`TrainingTelemetry`.

A training loop holds whichever :func:`otel_rl.init` returned and calls it
unconditionally. The type checker holds both classes to this protocol
(``tests/test_api_types.py`` runs mypy over that), so the disabled twin can
never miss a method or take different arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

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

    def scalars(self, values: Mapping[str, Any], step: int | None = None) -> None: ...

    def distribution(self, key: str, values: Any, step: int | None = None) -> None: ...

    def event(self, name: str, **attributes: Any) -> None: ...

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

    def add_sink(self, sink: Any) -> None: ...

    def worker_spec(self, role: str, context: Any = None, relay: Any = None, **options: Any) -> Any: ...

    def watch_worker(self, process: Any, role: str) -> None: ...

    def traceparent(self) -> str: ...

    def flush(self, timeout_s: float = 5.0) -> bool: ...

    def close(self, timeout_s: float | None = None) -> None: ...

    def stats(self) -> dict[str, Any]: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...

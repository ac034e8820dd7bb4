"""otel-rl: OpenTelemetry-native telemetry for reinforcement-learning training loops.

>>> import otel_rl
>>> tel = otel_rl.init(run_dir="runs/demo", algorithm="sac")
>>> with tel.run():
...     for i in range(3):
...         with tel.iteration(i, env_steps=i * 8):
...             with tel.phase("collector_wait"):
...                 pass
...             with tel.phase("learning"):
...                 pass
...         tel.scalars({"Loss/critic": 0.5})
>>> tel.close()
"""

from __future__ import annotations

import os
from typing import Any

from otel_rl.api import NoOpTelemetry, TrainingTelemetry
from otel_rl.config import DEFAULT, TelemetryConfig
from otel_rl.formats.schema import SchemaError
from otel_rl.run.folder import RunFolderInUse
from otel_rl.telemetry import Telemetry
from otel_rl.version import __version__

__all__ = ["init", "Telemetry", "NoOpTelemetry", "TrainingTelemetry", "TelemetryConfig", "SchemaError", "RunFolderInUse", "__version__"]


def init(
    run_dir: str | os.PathLike[str] | bool | None = None,
    service_name: str | None = None,
    *,
    enabled: bool = DEFAULT,
    run_id: str | None = DEFAULT,
    algorithm: str | None = DEFAULT,
    resource_attributes: dict[str, Any] = DEFAULT,
    span_budget_per_s: float = DEFAULT,
    lane_capacity: int = DEFAULT,
    scalars_capacity: int | None = DEFAULT,
    pipeline_interval_s: float = DEFAULT,
    strict: bool = DEFAULT,
    shutdown_timeout_s: float = DEFAULT,
    upload_wait_s: float = DEFAULT,
    metric_export_interval_ms: float | None = DEFAULT,
    motrix_url: str | None = DEFAULT,
    motrix_token: str | None = DEFAULT,
    project: str | None = DEFAULT,
    group: str | None = DEFAULT,
    meta: dict[str, Any] = DEFAULT,
    jsonl: bool | None = DEFAULT,
    perf_interval_s: float = DEFAULT,
    system_metrics_interval_s: float = DEFAULT,
    panel: bool | None = DEFAULT,
    quiet: bool = DEFAULT,
    role: str = DEFAULT,
    trace_enabled: bool | None = DEFAULT,
    tensorboard: bool | None = DEFAULT,
    tensorboard_dir: str | os.PathLike[str] | None = DEFAULT,
    wandb: bool = DEFAULT,
    wandb_project: str | None = DEFAULT,
    wandb_entity: str | None = DEFAULT,
    wandb_group: str | None = DEFAULT,
    wandb_name: str | None = DEFAULT,
    wandb_tags: tuple[str, ...] = DEFAULT,
    wandb_notes: str | None = DEFAULT,
    wandb_mode: str | None = DEFAULT,
    wandb_job_type: str | None = DEFAULT,
    trackio: bool = DEFAULT,
    trackio_mode: str | None = DEFAULT,
    swanlab: bool = DEFAULT,
    swanlab_mode: str | None = DEFAULT,
    resume: bool = DEFAULT,
    agent: str = DEFAULT,
    trace_output_dir: str | os.PathLike[str] | None = DEFAULT,
    trace_thread_time: bool = DEFAULT,
    trace_cuda_events: bool = DEFAULT,
    trace_max_bytes: int = DEFAULT,
    profile: tuple[int, int] | None = DEFAULT,
    span_exporters: list | None = DEFAULT,
    metric_exporters: list | None = DEFAULT,
    log_exporters: list | None = DEFAULT,
    relay: Any = DEFAULT,
    outputs_on_every_rank: bool = DEFAULT,
    rank: int = DEFAULT,
    world_size: int = DEFAULT,
    node_rank: int | None = DEFAULT,
    local_rank: int | None = DEFAULT,
    local_world_size: int | None = DEFAULT,
    node_count: int | None = DEFAULT,
    **misspelt: Any,
) -> Telemetry | NoOpTelemetry:
    """Start telemetry for this process and return its handle.

    Every keyword is a field of :class:`TelemetryConfig`, documented there,
    with the same type (but ``scalars_capacity``, which no longer applies and
    is ignored with one warning). One not given takes its environment
    variable, else the field's default; a misspelt one is refused with the
    name it resembles.
    Reads the standard OpenTelemetry environment (``OTEL_SDK_DISABLED``,
    which wins over ``enabled=True``, ``OTEL_SERVICE_NAME``,
    ``OTEL_RESOURCE_ATTRIBUTES``, the ``OTEL_EXPORTER_OTLP_*`` family
    including the protocol, and ``OTEL_{TRACES,METRICS,LOGS}_EXPORTER``).

    Returns:
        A :class:`Telemetry`, or a :class:`NoOpTelemetry` when disabled.

    Raises:
        TypeError: an unknown option, or an option of the wrong type.
        ValueError: an option with an invalid value.
        ImportError: an output switched on whose package is not installed (the message names the extra).
        RunFolderInUse: another live process writes ``run_dir``.
    """
    given = {name: value for name, value in locals().items() if value is not DEFAULT and name not in _POSITIONAL}
    config = TelemetryConfig.from_options(run_dir, service_name, **given, **misspelt)
    if not config.enabled:
        return NoOpTelemetry(config)
    return Telemetry(config)


_POSITIONAL = frozenset({"run_dir", "service_name", "misspelt"})

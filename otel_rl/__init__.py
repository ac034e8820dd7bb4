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

from typing import Any

from otel_rl.api import TrainingTelemetry
from otel_rl.config import TelemetryConfig
from otel_rl.run_folder import RunFolderInUse
from otel_rl.schema import SchemaError
from otel_rl.telemetry import NoOpTelemetry, Telemetry
from otel_rl.version import __version__

__all__ = ["init", "Telemetry", "NoOpTelemetry", "TrainingTelemetry", "TelemetryConfig", "SchemaError", "RunFolderInUse", "__version__"]


def init(run_dir: Any = None, service_name: str | None = None, **options: Any) -> Telemetry | NoOpTelemetry:
    """Start telemetry for this process and return its handle.

    Reads the standard OpenTelemetry environment (``OTEL_SDK_DISABLED``,
    ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, the
    ``OTEL_EXPORTER_OTLP_*`` family including the protocol, and
    ``OTEL_{TRACES,METRICS,LOGS}_EXPORTER``). Options are the fields of
    :class:`TelemetryConfig`; arguments beat environment variables.

    Returns:
        A :class:`Telemetry`, or a :class:`NoOpTelemetry` when disabled.

    Raises:
        TypeError: an unknown option.
        ValueError: an option with an invalid value.
        RunFolderInUse: another live process writes ``run_dir``.
    """
    config = TelemetryConfig.from_options(run_dir, service_name, **options)
    if not config.enabled:
        return NoOpTelemetry(config)
    return Telemetry(config)

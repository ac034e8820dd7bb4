"""What a host needs to build a producer's outputs: plain data, pickled into the segment for an agent."""

from __future__ import annotations

import os
from dataclasses import dataclass

from otel_rl.base.environment_variables import OTEL_SERVICE_NAME
from otel_rl.config import TelemetryConfig
from otel_rl.run.resume import PreviousRun


@dataclass(frozen=True)
class RunIdentity:
    """What a host needs to build a producer's outputs (pickled into the segment for an agent)."""

    config: TelemetryConfig
    trace_id: int
    parent_span_id: int | None
    pid: int
    """The producer's process id."""
    started_ns: int
    """When the producer called :func:`otel_rl.init` (epoch ns: the run's ``pending`` record)."""
    clock_offset_ns: int
    """The producer's ``perf_counter_ns()`` to epoch offset: every record's timebase."""
    previous: PreviousRun | None = None
    """The run this one resumes, as its folder said at ``init()``."""
    service_name: str = "otel-rl"
    host: str = ""
    """The producer's host name (``socket.gethostname()``): its processes' names in a job of several machines, ``host.name``."""


def service_name(config: TelemetryConfig) -> str:
    """``service.name``: the option, else ``OTEL_SERVICE_NAME``, else ``otel-rl``."""
    return config.service_name or os.environ.get(OTEL_SERVICE_NAME) or "otel-rl"

"""Typed configuration of :func:`otel_rl.init`.

Precedence: an argument beats its environment variable, which beats the
default. Bad arguments raise at construction; bad environment values warn once
and fall back to the default.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_rl import environment_variables as env


@dataclass(kw_only=True, slots=True)
class TelemetryConfig:
    enabled: bool = True
    """False (or ``OTEL_SDK_DISABLED=true``) makes every call a no-op: no thread, no file."""

    run_dir: Path | None = None
    """Folder for the local outputs (``run_summary.json`` and later sinks); None writes no file."""

    service_name: str | None = None
    """``service.name`` of the resource; falls back to ``OTEL_SERVICE_NAME``, then ``otel-rl``."""

    run_id: str | None = None
    """``rl.run.id``; default: the run folder's name, else a timestamp and random suffix."""

    algorithm: str | None = None
    """``rl.algorithm`` resource attribute (``sac``, ``ppo``...)."""

    resource_attributes: dict[str, Any] = field(default_factory=dict)
    """Extra resource attributes (``OTEL_RESOURCE_ATTRIBUTES`` is read too)."""

    span_budget_per_s: float = 1000.0
    """Phase spans per second handed to span exporters; whole iterations are sampled above it."""

    lane_capacity: int = 65_536
    """Raw phase records buffered per thread; the oldest is dropped (and counted) when full."""

    scalars_capacity: int = 10_000
    """Pending ``scalars()`` calls; the oldest is dropped (and counted) when full."""

    pipeline_interval_s: float = 0.1
    """How often the pipeline thread drains the buffers."""

    strict: bool = False
    """Reject scalar keys and phases outside the canonical schema with :class:`otel_rl.schema.SchemaError`."""

    shutdown_timeout_s: float = 5.0
    """Upper bound of :meth:`Telemetry.close` (and of the exit hook)."""

    metric_export_interval_ms: float | None = None
    """Metric export interval; None reads ``OTEL_METRIC_EXPORT_INTERVAL`` (default 10 s)."""

    motrix_url: str | None = None
    """Base URL of a ``motrix.metrics/v1`` ingest service (``MOTRIX_METRICS_URL``); None: no live streaming."""

    motrix_token: str | None = field(default=None, repr=False)
    """Bearer token for the ingest service (``MOTRIX_METRICS_TOKEN``); only ever sent in a header."""

    project: str | None = None
    """Project of the run's records (``MOTRIX_METRICS_PROJECT``)."""

    group: str | None = None
    """Group of the run's records (``MOTRIX_METRICS_GROUP``)."""

    meta: dict[str, Any] = field(default_factory=dict)
    """Free-form metadata of the run (``MOTRIX_METRICS_META``, a JSON object)."""

    jsonl: bool | None = None
    """Write ``run_dir/metrics.jsonl``; None: on when ``motrix_url`` is set and there is a run folder."""

    perf_interval_s: float = 1.0
    """At most one ``Perf/*`` protocol record per this many seconds (a window average when iterations are faster)."""

    system_metrics_interval_s: float = 2.0
    """Sampling period of the ``sys/*`` metrics (``OTEL_RL_SYSTEM_METRICS_INTERVAL``); 0 turns them off."""

    panel: bool = False
    """Show the live terminal panel (a plain line every few seconds when stdout is not a terminal)."""

    role: str = "learner"
    """What this process is (``learner``, ``collector 0``...): its process name in the trace."""

    trace_enabled: bool = False
    """Write a Perfetto trace of every phase (``OTEL_RL_TRACE_ENABLED``)."""

    trace_output_dir: Path | None = None
    """Folder of ``trace.perfetto-trace`` (``OTEL_RL_TRACE_OUTPUT_DIR``); default: the run folder."""

    trace_thread_time: bool = False
    """Add each thread's CPU share per iteration as a counter (``OTEL_RL_TRACE_THREAD_TIME``)."""

    trace_cuda_events: bool = True
    """Put CUDA-timed device intervals on GPU stream tracks (``OTEL_RL_TRACE_CUDA_EVENTS``)."""

    trace_max_bytes: int = 256 * 1024 * 1024
    """Rotate the trace file to ``trace.1.perfetto-trace`` past this size."""

    span_exporters: list | None = None
    """SDK span exporters to use instead of those the environment asks for (None: from the environment)."""

    metric_exporters: list | None = None
    """SDK metric exporters to use instead of those the environment asks for."""

    log_exporters: list | None = None
    """SDK log exporters to use instead of those the environment asks for."""

    outputs_on_every_rank: bool = False
    """By default only rank 0 writes the panel, the JSONL file, the live stream and the trace; every rank exports OTLP."""

    rank: int = 0
    """Rank of this process (``RANK`` is read by default)."""

    world_size: int = 1
    """Number of ranks (``WORLD_SIZE`` is read by default)."""

    def __post_init__(self) -> None:
        if self.run_dir is not None:
            self.run_dir = Path(self.run_dir)
        if not self.span_budget_per_s >= 0:
            raise ValueError(f"span_budget_per_s must be >= 0, got {self.span_budget_per_s!r}")
        for name in ("lane_capacity", "scalars_capacity"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("pipeline_interval_s", "shutdown_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={self.rank} world_size={self.world_size}")
        if self.trace_output_dir is not None:
            self.trace_output_dir = Path(self.trace_output_dir)
        if self.trace_enabled and self.trace_output_dir is None and self.run_dir is None:
            raise ValueError("trace_enabled needs a run_dir or a trace_output_dir")
        if self.jsonl is None:
            self.jsonl = bool(self.motrix_url) and self.run_dir is not None
        if self.rank != 0 and not self.outputs_on_every_rank:
            # Rank 0 speaks for the job; the others would duplicate its records.
            self.jsonl, self.motrix_url, self.panel, self.trace_enabled = False, None, False, False
        if self.jsonl and self.run_dir is None:
            raise ValueError("jsonl=True needs a run_dir to write metrics.jsonl into")
        if not isinstance(self.meta, dict):
            raise TypeError(f"meta must be a dict, got {type(self.meta).__name__}")
        if not self.perf_interval_s > 0:
            raise ValueError(f"perf_interval_s must be positive, got {self.perf_interval_s!r}")
        if self.run_id is None:
            if self.run_dir is not None:
                self.run_id = self.run_dir.resolve().name
            else:
                self.run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)

    @classmethod
    def from_options(cls, run_dir: Any = None, service_name: str | None = None, **options: Any) -> TelemetryConfig:
        """Build a config from :func:`otel_rl.init` arguments and the environment.

        Raises:
            TypeError: an option that is not a field of this class.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise TypeError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        defaults: dict[str, Any] = {
            "enabled": not env.read(env.OTEL_SDK_DISABLED, env.parse_bool, False, "true or false"),
            "run_id": os.environ.get(env.OTEL_RL_RUN_ID) or os.environ.get(env.MOTRIX_METRICS_RUN_ID) or None,
            "motrix_url": os.environ.get(env.MOTRIX_METRICS_URL, "").strip() or None,
            "motrix_token": os.environ.get(env.MOTRIX_METRICS_TOKEN) or None,
            "project": os.environ.get(env.MOTRIX_METRICS_PROJECT) or None,
            "group": os.environ.get(env.MOTRIX_METRICS_GROUP) or None,
            "meta": env.read(env.MOTRIX_METRICS_META, _json_object, {}, "a JSON object"),
            "algorithm": os.environ.get(env.OTEL_RL_ALGORITHM) or None,
            "span_budget_per_s": env.read(env.OTEL_RL_SPAN_BUDGET, _non_negative, 1000.0, "spans per second >= 0"),
            "strict": env.read(env.OTEL_RL_STRICT, env.parse_bool, False, "true or false"),
            "system_metrics_interval_s": env.read(
                env.OTEL_RL_SYSTEM_METRICS_INTERVAL, _non_negative, 2.0, "seconds >= 0"
            ),
            "trace_enabled": env.read(env.OTEL_RL_TRACE_ENABLED, env.parse_bool, False, "true or false"),
            "trace_output_dir": os.environ.get(env.OTEL_RL_TRACE_OUTPUT_DIR) or None,
            "trace_thread_time": env.read(env.OTEL_RL_TRACE_THREAD_TIME, env.parse_bool, False, "true or false"),
            "trace_cuda_events": env.read(env.OTEL_RL_TRACE_CUDA_EVENTS, env.parse_bool, True, "true or false"),
            "rank": env.read("RANK", int, 0, "an integer"),
            "world_size": env.read("WORLD_SIZE", int, 1, "an integer"),
        }
        merged = {**defaults, **options}
        if options.get("enabled") is None:
            merged["enabled"] = defaults["enabled"]
        return cls(run_dir=run_dir, service_name=service_name, **merged)


def _json_object(raw: str) -> dict[str, Any]:
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError(raw)
    return value


def _non_negative(raw: str) -> float:
    value = float(raw)
    if not value >= 0:
        raise ValueError(raw)
    return value

"""Environment variables read by otel-rl, in one place.

Precedence everywhere: an argument of :func:`otel_rl.init` beats the
environment, which beats the default. A malformed value gets one warning
naming the variable, and the default is used.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from otel_rl.base.log import logger, once

_logger = logger(__name__)
_T = TypeVar("_T")

# Standard OpenTelemetry variables.
OTEL_SDK_DISABLED = "OTEL_SDK_DISABLED"
OTEL_SERVICE_NAME = "OTEL_SERVICE_NAME"
OTEL_RESOURCE_ATTRIBUTES = "OTEL_RESOURCE_ATTRIBUTES"
OTEL_TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
OTEL_METRICS_EXPORTER = "OTEL_METRICS_EXPORTER"
OTEL_LOGS_EXPORTER = "OTEL_LOGS_EXPORTER"
OTEL_METRIC_EXPORT_INTERVAL = "OTEL_METRIC_EXPORT_INTERVAL"
OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_EXPORTER_OTLP_HEADERS = "OTEL_EXPORTER_OTLP_HEADERS"
OTEL_EXPORTER_OTLP_TIMEOUT = "OTEL_EXPORTER_OTLP_TIMEOUT"
OTEL_EXPORTER_OTLP_COMPRESSION = "OTEL_EXPORTER_OTLP_COMPRESSION"
TRACEPARENT = "TRACEPARENT"
"""W3C trace context of a parent process; a worker's run joins that trace."""

# otel-rl's own variables.
OTEL_RL_RUN_ID = "OTEL_RL_RUN_ID"
OTEL_RL_RUN_DIR = "OTEL_RL_RUN_DIR"
"""The run folder of a process whose code gives none; ``off`` (or ``none``, ``false``, ``0``): no folder."""
OTEL_RL_ALGORITHM = "OTEL_RL_ALGORITHM"
OTEL_RL_SPAN_BUDGET = "OTEL_RL_SPAN_BUDGET"
"""Phase spans per second sent to span exporters; whole iterations are sampled above it."""
OTEL_RL_STRICT = "OTEL_RL_STRICT"
"""``true``: unknown scalar keys and phases raise instead of being namespaced."""
OTEL_RL_SYSTEM_METRICS_INTERVAL = "OTEL_RL_SYSTEM_METRICS_INTERVAL"
"""Seconds between ``sys/*`` samples; ``0`` turns system metrics off."""
OTEL_RL_TRACE_ENABLED = "OTEL_RL_TRACE_ENABLED"
"""``true``: write the Perfetto trace."""
OTEL_RL_TENSORBOARD = "OTEL_RL_TENSORBOARD"
"""``true``: write TensorBoard event files to ``run_dir/tensorboard`` (or ``OTEL_RL_TENSORBOARD_DIR``)."""
OTEL_RL_TENSORBOARD_DIR = "OTEL_RL_TENSORBOARD_DIR"
"""Folder of the TensorBoard event files; setting it switches TensorBoard on."""
OTEL_RL_WANDB = "OTEL_RL_WANDB"
"""``true``: log the run to Weights & Biases (offline unless ``WANDB_MODE`` or ``WANDB_API_KEY`` says otherwise)."""
OTEL_RL_TRACKIO = "OTEL_RL_TRACKIO"
"""``true``: log the run to Trackio (its local database unless ``TRACKIO_SPACE_ID`` or ``TRACKIO_SERVER_URL`` is set)."""
OTEL_RL_TRACKIO_MODE = "OTEL_RL_TRACKIO_MODE"
"""``local``, ``online`` or ``disabled`` (Trackio has no mode variable of its own)."""
OTEL_RL_SWANLAB = "OTEL_RL_SWANLAB"
"""``true``: log the run to SwanLab (offline unless ``SWANLAB_MODE`` or ``SWANLAB_API_KEY`` says otherwise)."""
OTEL_RL_UPLOAD_WAIT = "OTEL_RL_UPLOAD_WAIT"
"""Seconds ``close()`` waits for the trace and diagnosis to reach the live service (0, the default: not at all)."""
OTEL_RL_PANEL = "OTEL_RL_PANEL"
"""``false``: no live terminal panel (it is on by default when standard output is a terminal); ``true``: on anyway
(a plain line every few seconds when standard output is not a terminal)."""
OTEL_RL_QUIET = "OTEL_RL_QUIET"
"""``true``: no line at start and end saying where the run's files are."""
OTEL_RL_RESUME = "OTEL_RL_RESUME"
"""``true``: continue the run named by the run id (and run folder) after a restart."""
OTEL_RL_AGENT = "OTEL_RL_AGENT"
"""``process`` (default): the outputs are assembled by an agent process fed over shared memory (one per
learner and its workers); a name (``A-Z a-z 0-9 _ . -``): the agent of that name, shared by every process that
names it (ranks on one machine); ``thread`` (or ``inprocess``): the agent on a thread; ``off``: in-process buffers."""
OTEL_RL_TRACE_OUTPUT_DIR = "OTEL_RL_TRACE_OUTPUT_DIR"
OTEL_RL_TRACE_THREAD_TIME = "OTEL_RL_TRACE_THREAD_TIME"
OTEL_RL_TRACE_CUDA_EVENTS = "OTEL_RL_TRACE_CUDA_EVENTS"
OTEL_RL_PROFILE = "OTEL_RL_PROFILE"
"""``START,COUNT``: profile ``COUNT`` learner iterations from index ``START`` with ``torch.profiler``."""
OTEL_RL_TRACE_PROCESSOR = "OTEL_RL_TRACE_PROCESSOR"
"""Path of a ``trace_processor_shell`` binary for the SQL engine of ``otel-rl analyze``."""
OTEL_RL_PURE_PYTHON = "OTEL_RL_PURE_PYTHON"
"""``1``: use the pure-Python recorder, trace encoder and scalars line encoder even where their C extensions are built."""

# The motrix.metrics/v1 live-metrics protocol.
MOTRIX_METRICS_URL = "MOTRIX_METRICS_URL"
"""Base URL of the ingest service; live streaming is off without it."""
MOTRIX_METRICS_TOKEN = "MOTRIX_METRICS_TOKEN"
"""Bearer token; sent only in the Authorization header."""
MOTRIX_METRICS_RUN_ID = "MOTRIX_METRICS_RUN_ID"
MOTRIX_METRICS_PROJECT = "MOTRIX_METRICS_PROJECT"
MOTRIX_METRICS_GROUP = "MOTRIX_METRICS_GROUP"
MOTRIX_METRICS_META = "MOTRIX_METRICS_META"
"""A JSON object of free-form run metadata."""

# The launcher's: where this rank sits in the job (torchrun's, else Slurm's under srun).
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
GROUP_RANK = "GROUP_RANK"
"""This machine's index in the job (torchrun)."""
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
SLURM_NODEID = "SLURM_NODEID"
"""This machine's index among the job's (srun)."""
SLURM_LOCALID = "SLURM_LOCALID"
"""This task's index on its machine (srun)."""
SLURM_TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"
SLURM_JOB_ID = "SLURM_JOB_ID"
"""Shared by the ranks of one Slurm job: their default run folder is named after it."""
SLURM_STEP_ID = "SLURM_STEP_ID"
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
"""torchrun's rendezvous id (a fresh one per job with ``--standalone``, else ``--rdzv-id``; ``none`` unset)."""
"""The tasks of each machine, as Slurm writes them: ``2(x3),1`` is 2, 2, 2 and 1."""

# Weights & Biases' own variables, read for the W&B output's fields (an init() keyword wins).
WANDB_PROJECT = "WANDB_PROJECT"
WANDB_ENTITY = "WANDB_ENTITY"
WANDB_RUN_GROUP = "WANDB_RUN_GROUP"
WANDB_NAME = "WANDB_NAME"
WANDB_TAGS = "WANDB_TAGS"
"""Comma-separated tags."""
WANDB_NOTES = "WANDB_NOTES"
WANDB_MODE = "WANDB_MODE"
"""``online``, ``offline``, ``disabled`` or ``shared``."""
WANDB_JOB_TYPE = "WANDB_JOB_TYPE"
WANDB_API_KEY = "WANDB_API_KEY"
"""Only its presence is read: with it the default mode is ``online``."""
SWANLAB_MODE = "SWANLAB_MODE"
"""``online`` (or ``cloud``), ``offline``, ``local`` or ``disabled``."""
SWANLAB_API_KEY = "SWANLAB_API_KEY"
"""Only its presence is read: with it SwanLab's default mode is ``online``."""
TRACKIO_SPACE_ID = "TRACKIO_SPACE_ID"
"""Trackio's Hugging Face Space: with it (or ``TRACKIO_SERVER_URL``) Trackio's default mode is ``online``."""
TRACKIO_SERVER_URL = "TRACKIO_SERVER_URL"
"""A self-hosted Trackio server."""
WANDB_FIELD_VARIABLES = (WANDB_PROJECT, WANDB_ENTITY, WANDB_RUN_GROUP, WANDB_NAME, WANDB_TAGS, WANDB_NOTES, WANDB_MODE, WANDB_JOB_TYPE)
"""The variables of the W&B run's fields, which otel-rl reads and hands to ``wandb.init`` itself."""


def signal_variable(base: str, signal: str) -> str:
    """Per-signal form of an OTLP variable: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``."""
    return base.replace("OTEL_EXPORTER_OTLP_", f"OTEL_EXPORTER_OTLP_{signal.upper()}_")


def warn_invalid(name: str, value: str, expected: str) -> None:
    """One warning per variable: what was wrong and that the default is used."""
    _logger.warning("otel-rl: ignoring %s=%r: expected %s; using the default", name, value, expected, extra=once(f"variable:{name}"))


def read(name: str, parse: Callable[[str], _T], default: _T, expected: str) -> _T:
    """Parse a variable; unset or empty gives ``default``, malformed warns once."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse(raw)
    except (TypeError, ValueError):
        warn_invalid(name, raw, expected)
        return default


def parse_bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError(raw)


def parse_positive_float(raw: str) -> float:
    value = float(raw)
    if not value > 0 or value == float("inf"):
        raise ValueError(raw)
    return value


def parse_key_values(raw: str) -> dict[str, str]:
    """``k1=v1,k2=v2`` with percent-decoding, as the OTLP header and resource variables use."""
    from urllib.parse import unquote

    out: dict[str, str] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(item)
        out[unquote(key.strip())] = unquote(value.strip())
    return out

"""Typed configuration of :func:`otel_rl.init`.

Precedence: an argument beats its environment variable, which beats the
default. Bad arguments raise at construction; bad environment values warn once
and fall back to the default, and a variable that switches on what this
process cannot use (a resume without a run folder, an output without its
package) is ignored with one warning.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import operator
import os
import re
import secrets
import socket
import sys
import time
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_rl.base import environment_variables as env
from otel_rl.base import extras, tracker_options, user_dir
from otel_rl.base.files import safe_name
from otel_rl.base.log import logger, once
from otel_rl.base.values import clean_text

_logger = logger(__name__)


class _Default:
    """The value of an :func:`otel_rl.init` keyword not given (its ``repr`` is what a signature shows)."""

    def __repr__(self) -> str:
        return "<default>"


DEFAULT: Any = _Default()
"""An option not given to :func:`otel_rl.init`: its environment variable, else the field's default."""

AGENT_MODES = ("thread", "process")
AGENT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""An agent's name: also its directory's (``.`` and ``..`` excepted)."""
AGENT_CHOICES = (
    "process, thread (or off) or the name of a shared agent (1 to 64 of A-Z a-z 0-9 _ . -, not a misspelt mode:"
    " every process that names it records into that one agent)"
)


def _agent_mode(raw: str) -> str:
    """A mode (case-insensitive; ``inprocess`` is ``thread``) or an agent's name (kept as written).

    A value a letter or two from a mode (``procss``) is a misspelt mode, not a name.
    """
    mode = raw.strip()
    if mode.lower() in (*AGENT_MODES, "inprocess", "off"):  # the older names of the in-process host
        return "thread" if mode.lower() in ("inprocess", "off") else mode.lower()
    if not AGENT_NAME.fullmatch(mode) or mode in (".", "..") or _close_to_a_mode(mode):
        raise ValueError(raw)
    return mode


def _close_to_a_mode(value: str) -> str | None:
    found = difflib.get_close_matches(value.lower(), AGENT_MODES, n=1, cutoff=0.75)
    return found[0] if found else None


def _is_agent_mode(value: str) -> bool:
    try:
        _agent_mode(value)
    except ValueError:
        return False
    return True


RETIRED_OPTIONS = {"scalars_capacity": "scalars share the segment's data ring"}
"""Options :func:`otel_rl.init` still takes from older code, and why each is ignored (with one warning)."""


@dataclass(kw_only=True, slots=True)
class TelemetryConfig:
    enabled: bool = True
    """False makes every call a no-op: no thread, no file. ``OTEL_SDK_DISABLED=true`` does too, whatever the code says."""

    run_dir: Path | None = None
    """Folder of the run's files (``metrics.jsonl``, the trace, ``run_summary.json``...); None writes no file.
    :func:`otel_rl.init` without one takes ``OTEL_RL_RUN_DIR``, else ``runs/<algorithm>/<run id>``;
    ``run_dir=False`` (``OTEL_RL_RUN_DIR=off``) records nothing to disk."""

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
    """Phase records buffered per recording thread (65,536 at most, fewer where ``/dev/shm`` is small); a full
    lane refuses new records and counts them. Scalars, events and the rest share the segment's message rings."""

    pipeline_interval_s: float = 0.1
    """How often the pipeline reads what was recorded."""

    strict: bool = False
    """Reject scalar keys and phases outside the canonical schema with :class:`otel_rl.formats.schema.SchemaError`."""

    shutdown_timeout_s: float = 5.0
    """Upper bound of :meth:`Telemetry.close` (and of the exit hook)."""

    upload_wait_s: float = 0.0
    """How long :meth:`Telemetry.close` then waits for the trace and diagnosis to reach the live service
    (``OTEL_RL_UPLOAD_WAIT``): for a job whose end kills every process, the upload's own included. 0: not at
    all, the upload goes on in a process of its own."""

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
    """Write ``run_dir/metrics.jsonl``; None: on when there is a run folder."""

    perf_interval_s: float = 1.0
    """At most one ``Perf/*`` protocol record per this many seconds (a window average when iterations are faster)."""

    system_metrics_interval_s: float = 2.0
    """Sampling period of the ``sys/*`` metrics (``OTEL_RL_SYSTEM_METRICS_INTERVAL``); 0 turns them off."""

    panel: bool | None = None
    """Show the live terminal panel (``OTEL_RL_PANEL``); None: on when standard output is a terminal, as a training
    run's console is (``panel=True`` off a terminal prints a plain line every few seconds)."""

    quiet: bool = False
    """No line on standard error at start and end saying where the run's files are and how to read them (``OTEL_RL_QUIET``)."""

    role: str = "learner"
    """What this process is (``learner``, ``collector 0``...): its process name in the trace."""

    trace_enabled: bool | None = None
    """Write a Perfetto trace of every phase (``OTEL_RL_TRACE_ENABLED``); None: on when there is a run folder or a ``trace_output_dir``."""

    tensorboard: bool | None = None
    """Write TensorBoard event files (``OTEL_RL_TENSORBOARD``); None: on when ``tensorboard_dir`` is given."""

    tensorboard_dir: Path | None = None
    """Folder of the TensorBoard event files (``OTEL_RL_TENSORBOARD_DIR``); default ``run_dir/tensorboard``."""

    wandb: bool = False
    """Log the run to Weights & Biases (``OTEL_RL_WANDB``; see :mod:`otel_rl.outputs.wandb`)."""

    wandb_project: str | None = None
    """The W&B project (``WANDB_PROJECT``); default: ``project``, else ``otel-rl``."""

    wandb_entity: str | None = None
    """The W&B team or user the run belongs to (``WANDB_ENTITY``); default: the API key's."""

    wandb_group: str | None = None
    """The W&B group (``WANDB_RUN_GROUP``); default: ``group``."""

    wandb_name: str | None = None
    """The W&B run's display name (``WANDB_NAME``); default: the run id."""

    wandb_tags: tuple[str, ...] = ()
    """The W&B run's tags (``WANDB_TAGS``, comma-separated), each 1 to 64 characters."""

    wandb_notes: str | None = None
    """The W&B run's description (``WANDB_NOTES``)."""

    wandb_mode: str | None = None
    """``online``, ``offline``, ``disabled`` (the W&B output is off) or ``shared`` (several writers of one online run)
    (``WANDB_MODE``); None: ``online`` with ``WANDB_API_KEY`` set, else ``offline``."""

    wandb_job_type: str | None = None
    """The W&B run's job type (``WANDB_JOB_TYPE``: ``train``, ``eval``...)."""

    trackio: bool = False
    """Log the run to Trackio (``OTEL_RL_TRACKIO``; project, name and group as W&B's defaults; see :mod:`otel_rl.outputs.trackio`)."""

    trackio_mode: str | None = None
    """``local``, ``online`` (``TRACKIO_SPACE_ID`` or ``TRACKIO_SERVER_URL``) or ``disabled`` (``OTEL_RL_TRACKIO_MODE``);
    None: ``online`` when one of those variables is set, else ``local``."""

    swanlab: bool = False
    """Log the run to SwanLab (``OTEL_RL_SWANLAB``; project, name and group as W&B's defaults; see :mod:`otel_rl.outputs.swanlab`)."""

    swanlab_mode: str | None = None
    """``online`` (or ``cloud``), ``offline``, ``local`` or ``disabled`` (``SWANLAB_MODE``); None: ``online`` with
    ``SWANLAB_API_KEY`` set, else ``offline``."""

    resume: bool = False
    """Continue the run ``run_id`` after a restart (``OTEL_RL_RESUME``): same run and trace, a ``resumed`` event, outputs appended."""

    agent: str = "process"
    """Where the outputs are assembled (``OTEL_RL_AGENT``): ``process``, an agent process fed over shared
    memory (what this process recorded survives its death; its workers record into it too); the name of an
    agent shared by every process that names it (the ranks of a machine: one trace with every rank);
    ``thread`` (or its older name ``off``), the same serving loop on a thread of this process, reading a
    segment in this process's memory (chosen instead when the configuration holds exporter objects or
    sinks, or no process or shared memory is available). See :mod:`otel_rl.agent`."""

    trace_output_dir: Path | None = None
    """Folder of ``trace.perfetto-trace`` (``OTEL_RL_TRACE_OUTPUT_DIR``); default: the run folder."""

    trace_thread_time: bool = False
    """Add each thread's CPU share per iteration as a counter (``OTEL_RL_TRACE_THREAD_TIME``)."""

    trace_cuda_events: bool = True
    """Put CUDA-timed device intervals on GPU stream tracks (``OTEL_RL_TRACE_CUDA_EVENTS``)."""

    trace_max_bytes: int = 256 * 1024 * 1024
    """Rotate the trace file to ``trace.1.perfetto-trace`` past this size."""

    profile: tuple[int, int] | None = None
    """``(start, count)``: run ``torch.profiler`` over ``count`` learner iterations from index ``start``
    (``OTEL_RL_PROFILE=start,count``); its operators go into the Perfetto trace inside their phases, its
    own trace file to ``profile/`` in the run folder (see :mod:`otel_rl.training.profiling`)."""

    span_exporters: list | None = None
    """SDK span exporters to use instead of those the environment asks for (None: from the environment)."""

    metric_exporters: list | None = None
    """SDK metric exporters to use instead of those the environment asks for."""

    log_exporters: list | None = None
    """SDK log exporters to use instead of those the environment asks for."""

    relay: Any = None
    """A worker's relay to its learner (set by :func:`otel_rl.worker_processes.init_worker`): a queue each
    completed cycle's phase durations are put on (``put_nowait``, raising ``queue.Full``); what does not fit
    is counted (queue ``relay``). A queue object keeps the outputs on a thread of this process."""

    outputs_on_every_rank: bool = False
    """By default only rank 0 writes the panel, the JSONL file, the live stream, the trace, TensorBoard and W&B; every rank exports OTLP."""

    rank: int = 0
    """Rank of this process (``RANK`` is read by default)."""

    world_size: int = 1
    """Number of ranks (``WORLD_SIZE`` is read by default)."""

    node_rank: int | None = None
    """Index of this machine in a job of several (``GROUP_RANK``, which ``torchrun`` sets, is read by default);
    None: ``rank // local_world_size`` (machines hold consecutive ranks, as ``torchrun`` places them)."""

    local_rank: int | None = None
    """Rank of this process on its machine (``LOCAL_RANK``); None: ``rank`` minus the ranks of the machines before."""

    local_world_size: int | None = None
    """Ranks on this machine (``LOCAL_WORLD_SIZE``); None: ``world_size``, every rank on one machine."""

    node_count: int | None = None
    """Machines in the job, where they hold different numbers of ranks (read from ``SLURM_TASKS_PER_NODE`` under
    ``srun``); None: ``world_size / local_world_size``, machines of one size."""

    @property
    def tensorboard_folder(self) -> Path | None:
        """Where the TensorBoard event files go: ``tensorboard_dir``, else ``run_dir/tensorboard``."""
        if self.tensorboard_dir is not None:
            return self.tensorboard_dir
        return None if self.run_dir is None else self.run_dir / "tensorboard"

    def wandb_fields(self) -> dict[str, Any]:
        """The W&B run as ``wandb.init`` names it: project, entity, group, name, tags, notes, mode and job type."""
        return {
            "project": self.wandb_project or self.project or "otel-rl", "entity": self.wandb_entity,
            "group": self.wandb_group or self.group, "name": self.wandb_name or self.run_id, "tags": list(self.wandb_tags),
            "notes": self.wandb_notes, "mode": self.wandb_mode, "job_type": self.wandb_job_type,
        }  # fmt: skip

    @property
    def nodes(self) -> int:
        """Machines in the job: each writes its own part of the trace when there are several."""
        if self.node_count is not None:
            return self.node_count
        return -(-self.world_size // self.local_world_size)  # type: ignore[operator]

    @property
    def machine(self) -> int | None:
        """This machine's index in a job of several (None on one machine, or rank 0's where the launcher numbers no
        machine: the run folder's names stay as they were)."""
        return self.node_rank if self.nodes > 1 or (self.node_rank or 0) > 0 else None

    @property
    def first_on_node(self) -> bool:
        """This process is its machine's first rank (a learner there writes the machine's part of the trace)."""
        return self.local_rank == 0

    def __post_init__(self) -> None:
        """Check every option before anything starts: a bad one raises here, never later on a thread."""
        if self.panel is None:  # decided here, in the training process, whose standard output the panel draws on
            self.panel = self.role == "learner" and _is_terminal(sys.stdout)  # one panel: the learner's, not its workers'

        if self.run_dir is not None:
            self.run_dir = Path(self.run_dir)
        if self.tensorboard_dir is not None:
            self.tensorboard_dir = Path(self.tensorboard_dir)
        if self.trace_output_dir is not None:
            self.trace_output_dir = Path(self.trace_output_dir)
        for name in ("run_dir", "trace_output_dir", "tensorboard_dir"):
            folder = getattr(self, name)
            if folder is not None and folder.exists() and not folder.is_dir():
                raise ValueError(f"{name} {str(folder)!r} is a file, not a folder")
            below = next((parent for parent in (folder.parents if folder is not None else ()) if parent.exists()), None)
            if below is not None and not below.is_dir():  # mkdir would fail later, on the agent's side
                raise ValueError(f"{name} {str(folder)!r} lies below {str(below)!r}, which is a file, not a folder")
        if self.tensorboard is None:
            self.tensorboard = self.tensorboard_dir is not None
        for name in ("enabled", "strict", "panel", "quiet", "trace_thread_time", "trace_cuda_events", "outputs_on_every_rank", "tensorboard", "wandb", "trackio", "swanlab", "resume"):
            _check(name, getattr(self, name), bool, "True or False")
        for name in ("service_name", "run_id", "algorithm", "motrix_url", "motrix_token", "project", "group", *tracker_options.WANDB_TEXT):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a string, got {type(value).__name__}")
        self.wandb_tags = tracker_options.wandb_tags(self.wandb_tags)
        self.wandb_mode = tracker_options.mode("wandb_mode", self.wandb_mode, tracker_options.WANDB_MODES)
        self.swanlab_mode = tracker_options.mode("swanlab_mode", self.swanlab_mode, tracker_options.SWANLAB_MODES)
        self.trackio_mode = tracker_options.mode("trackio_mode", self.trackio_mode, tracker_options.TRACKIO_MODES)
        tracker_options.default_modes(self)  # a background output never prompts for a login
        _check("role", self.role, str, "a non-empty string", lambda v: bool(v))
        if isinstance(self.agent, str) and not _is_agent_mode(self.agent) and _close_to_a_mode(self.agent.strip()):
            raise ValueError(f"agent={self.agent!r} is not a mode; did you mean {_close_to_a_mode(self.agent.strip())!r}? ({AGENT_CHOICES})")
        _check("agent", self.agent, str, AGENT_CHOICES, _is_agent_mode)
        self.agent = _agent_mode(self.agent)
        _check("span_budget_per_s", self.span_budget_per_s, (int, float), ">= 0", lambda v: v >= 0)
        for name in ("lane_capacity", "trace_max_bytes"):
            _check(name, getattr(self, name), int, "a positive integer", lambda v: v >= 1)
        for name in ("pipeline_interval_s", "shutdown_timeout_s", "perf_interval_s"):
            _check(name, getattr(self, name), (int, float), "a positive number of seconds", lambda v: v > 0)
        _check("system_metrics_interval_s", self.system_metrics_interval_s, (int, float), "seconds >= 0 (0: off)", lambda v: v >= 0)
        _check("upload_wait_s", self.upload_wait_s, (int, float), "seconds >= 0 (0: do not wait)", lambda v: v >= 0)
        if self.metric_export_interval_ms is not None:
            _check("metric_export_interval_ms", self.metric_export_interval_ms, (int, float), "positive milliseconds", lambda v: v > 0)
        for name in ("jsonl", "trace_enabled"):
            if getattr(self, name) is not None:
                _check(name, getattr(self, name), bool, "True, False or None")
        for name in ("rank", "world_size"):
            _check(name, getattr(self, name), int, "an integer")
        if self.profile is not None:
            self.profile = _profile_window(self.profile)
            if self.run_dir is None and self.trace_output_dir is None:
                raise ValueError("profile needs a run_dir or a trace_output_dir to write the profile into")
        if not isinstance(self.meta, dict):
            raise TypeError(f"meta must be a dict, got {type(self.meta).__name__}")
        if not isinstance(self.resource_attributes, dict):
            raise TypeError(f"resource_attributes must be a dict, got {type(self.resource_attributes).__name__}")
        if self.motrix_url is not None and not self.motrix_url.startswith(("http://", "https://")):
            raise ValueError(f"motrix_url must be an http:// or https:// URL, got {self.motrix_url!r}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={self.rank} world_size={self.world_size}")
        _place_on_node(self)
        if self.trace_enabled and self.trace_output_dir is None and self.run_dir is None:
            raise ValueError("trace_enabled needs a run_dir or a trace_output_dir")
        # A run folder holds every local output unless one is switched off.
        if self.jsonl is None:
            self.jsonl = self.run_dir is not None
        if self.trace_enabled is None:
            self.trace_enabled = self.run_dir is not None or self.trace_output_dir is not None
        if self.rank != 0 and not self.outputs_on_every_rank:
            # Rank 0 speaks for the job; the others would duplicate its records. Every rank keeps its part of the trace.
            self.jsonl, self.motrix_url, self.panel, self.tensorboard, self.wandb = False, None, False, False, False
            self.trackio = self.swanlab = False
        if self.jsonl and self.run_dir is None:
            raise ValueError("jsonl=True needs a run_dir to write metrics.jsonl into")
        if self.tensorboard and self.run_dir is None and self.tensorboard_dir is None:
            raise ValueError("tensorboard=True needs a run_dir or a tensorboard_dir to write event files into")
        if self.resume and self.run_dir is None:
            raise ValueError("resume=True needs the run_dir of the run to continue")
        missing = extras.missing_outputs(self) if self.enabled else []
        if missing:  # here, in the training process: an agent could only leave the output out
            raise extras.MissingExtra(missing[0].message())
        if self.run_id is None:
            if self.run_dir is not None:
                self.run_id = self.run_dir.resolve().name
            else:
                self.run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
        if not 0 < len(self.run_id) <= 256 or clean_text(self.run_id) != self.run_id:
            raise ValueError(f"run_id must be 1 to 256 characters of valid text, got {self.run_id[:300]!r}")

    @classmethod
    def from_options(cls, run_dir: Any = None, service_name: str | None = None, **options: Any) -> TelemetryConfig:
        """Build a config from :func:`otel_rl.init` arguments and the environment.

        Raises:
            TypeError: an option that is not a field of this class.
        """
        for name, why in RETIRED_OPTIONS.items():
            if options.pop(name, None) is not None:
                _logger.warning("otel-rl: %s no longer applies (%s); ignored", name, why, extra=once(f"retired-{name}"))
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            hints = [f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                     for name in unknown for close in [difflib.get_close_matches(name, names, n=1, cutoff=0.6)]]  # fmt: skip
            raise TypeError(f"unknown option {', '.join(hints)}; the options are the fields of otel_rl.TelemetryConfig")
        field = {f.name: f.default for f in dataclasses.fields(cls)}  # each default written once: on its field
        defaults: dict[str, Any] = {
            "enabled": not env.read(env.OTEL_SDK_DISABLED, env.parse_bool, False, "true or false"),
            "run_id": os.environ.get(env.OTEL_RL_RUN_ID) or os.environ.get(env.MOTRIX_METRICS_RUN_ID) or None,
            "motrix_url": os.environ.get(env.MOTRIX_METRICS_URL, "").strip() or None,
            "motrix_token": os.environ.get(env.MOTRIX_METRICS_TOKEN) or None,
            "project": os.environ.get(env.MOTRIX_METRICS_PROJECT) or None,
            "group": os.environ.get(env.MOTRIX_METRICS_GROUP) or None,
            "meta": env.read(env.MOTRIX_METRICS_META, _json_object, {}, "a JSON object"),
            "algorithm": os.environ.get(env.OTEL_RL_ALGORITHM) or None,
            "span_budget_per_s": env.read(env.OTEL_RL_SPAN_BUDGET, _non_negative, field["span_budget_per_s"], "spans per second >= 0"),
            "upload_wait_s": env.read(env.OTEL_RL_UPLOAD_WAIT, _non_negative, field["upload_wait_s"], "seconds >= 0"),
            "strict": env.read(env.OTEL_RL_STRICT, env.parse_bool, field["strict"], "true or false"),
            "system_metrics_interval_s": env.read(
                env.OTEL_RL_SYSTEM_METRICS_INTERVAL, _non_negative, field["system_metrics_interval_s"], "seconds >= 0"
            ),
            "trace_enabled": env.read(env.OTEL_RL_TRACE_ENABLED, env.parse_bool, field["trace_enabled"], "true or false"),
            "tensorboard": env.read(env.OTEL_RL_TENSORBOARD, env.parse_bool, field["tensorboard"], "true or false"),
            "tensorboard_dir": os.environ.get(env.OTEL_RL_TENSORBOARD_DIR) or None,
            "wandb": env.read(env.OTEL_RL_WANDB, env.parse_bool, field["wandb"], "true or false"),
            "trackio": env.read(env.OTEL_RL_TRACKIO, env.parse_bool, field["trackio"], "true or false"),
            "swanlab": env.read(env.OTEL_RL_SWANLAB, env.parse_bool, field["swanlab"], "true or false"),
            **tracker_options.defaults(),
            "quiet": env.read(env.OTEL_RL_QUIET, env.parse_bool, field["quiet"], "true or false"),
            "panel": env.read(env.OTEL_RL_PANEL, env.parse_bool, field["panel"], "true or false"),
            "resume": env.read(env.OTEL_RL_RESUME, env.parse_bool, field["resume"], "true or false"),
            "agent": env.read(env.OTEL_RL_AGENT, _agent_mode, field["agent"], AGENT_CHOICES),
            "trace_output_dir": os.environ.get(env.OTEL_RL_TRACE_OUTPUT_DIR) or None,
            "trace_thread_time": env.read(env.OTEL_RL_TRACE_THREAD_TIME, env.parse_bool, field["trace_thread_time"], "true or false"),
            "trace_cuda_events": env.read(env.OTEL_RL_TRACE_CUDA_EVENTS, env.parse_bool, field["trace_cuda_events"], "true or false"),
            "profile": env.read(env.OTEL_RL_PROFILE, _parse_profile, field["profile"], "START,COUNT (iterations, COUNT >= 1)"),
            "rank": env.read(env.RANK, int, field["rank"], "an integer"),
            "world_size": env.read(env.WORLD_SIZE, int, field["world_size"], "an integer"),
            "node_rank": env.read(env.GROUP_RANK, int, field["node_rank"], "an integer"),
            "local_rank": env.read(env.LOCAL_RANK, int, field["local_rank"], "an integer"),
            "local_world_size": env.read(env.LOCAL_WORLD_SIZE, int, field["local_world_size"], "an integer"),
        }
        launcher = {name: variable for name, variable in _LAUNCHER.items() if os.environ.get(variable, "").strip()}
        _slurm_placement(defaults, launcher)
        merged = {**defaults, **options}
        _check_launcher(merged, {name: variable for name, variable in launcher.items() if name not in options})
        if options.get("enabled") is None or not defaults["enabled"]:
            # OTEL_SDK_DISABLED=true is the operator's kill switch: it wins over code, as in OpenTelemetry.
            merged["enabled"] = defaults["enabled"]
        run_dir = _run_folder(run_dir, merged)
        _ignore_inapplicable(merged, options, run_dir)
        return cls(run_dir=run_dir, service_name=service_name, **merged)


DEFAULT_RUNS_ROOT = "runs"
"""Where a run given no folder records: ``runs/<algorithm>/<run id>`` under the working directory."""

_NO_FOLDER = frozenset({"off", "none", "false", "0", "no"})


def _run_folder(run_dir: Any, merged: dict[str, Any]) -> Any:
    """The run folder: the one given, else ``OTEL_RL_RUN_DIR``, else a default one of its own (None: no folder).

    ``run_dir=False`` (or ``OTEL_RL_RUN_DIR=off``) records nothing to disk. The default is
    ``runs/<algorithm>/<run id>``, the id a timestamp and a random suffix unless the job
    names one: ``OTEL_RL_RUN_ID``, torchrun's rendezvous id or Slurm's job id, so that every
    rank of a job takes the same folder. A job of several ranks that shares no id gets no
    default folder (each rank would take its own), said once on rank 0; a worker process
    writes where its learner tells it.
    """
    if run_dir is False:
        return None
    if run_dir is not None or not merged["enabled"]:
        return run_dir
    raw = os.environ.get(env.OTEL_RL_RUN_DIR, "").strip()
    if raw.lower() in _NO_FOLDER:
        return None
    if raw:
        blocked = _file_in_the_way(Path(raw))
        if blocked is None:
            return raw
        _logger.warning("otel-rl: %s=%s names no folder (%s is a file); the run records into the default folder", env.OTEL_RL_RUN_DIR,
                        raw[:200], str(blocked)[:200], extra=once("run-dir-env-file"))  # fmt: skip
    if merged.get("role", "learner") != "learner":
        return None
    name = merged["run_id"] or _job_id()
    if merged["world_size"] > 1 and name is None:
        if merged["rank"] == 0:
            _logger.warning(
                "otel-rl: a job of %d ranks given no run_dir records nothing to disk: its ranks share no id to name one "
                "folder by (give run_dir=, %s or %s)", merged["world_size"], env.OTEL_RL_RUN_DIR, env.OTEL_RL_RUN_ID,
                extra=once("no-run-folder"),
            )
        return None
    name = name or time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
    parts = [DEFAULT_RUNS_ROOT] + ([safe_name(merged["algorithm"], "run")] if merged.get("algorithm") else [])
    return Path(*parts, safe_name(name, "run"))


def _file_in_the_way(path: Path) -> Path | None:
    """The file (not a folder) that ``path`` or the nearest of its parents that exists is, if it is one."""
    for candidate in (path, *path.parents):
        try:
            if candidate.exists():
                return None if candidate.is_dir() else candidate
        except OSError:
            return None
    return None


def _job_id() -> str | None:
    """The id every rank of this job shares from its launcher (torchrun's rendezvous id, Slurm's job and step), if any."""
    rendezvous = os.environ.get(env.TORCHELASTIC_RUN_ID, "").strip()
    if rendezvous and rendezvous != "none":
        return rendezvous
    job = os.environ.get(env.SLURM_JOB_ID, "").strip()
    if job:
        step = os.environ.get(env.SLURM_STEP_ID, "").strip()
        return f"slurm-{job}" + (f".{step}" if step else "")
    return None



_ENVIRONMENT_OUTPUTS = {
    "resume": env.OTEL_RL_RESUME,
    "tensorboard": env.OTEL_RL_TENSORBOARD,
    "wandb": env.OTEL_RL_WANDB,
    "trackio": env.OTEL_RL_TRACKIO,
    "swanlab": env.OTEL_RL_SWANLAB,
    "trace_enabled": env.OTEL_RL_TRACE_ENABLED,
    "profile": env.OTEL_RL_PROFILE,
}
"""Options an environment variable can switch on that need a folder (or a package) a process may not have."""


def _ignore_inapplicable(merged: dict[str, Any], options: dict[str, Any], run_dir: Any) -> None:
    """Switch off what an environment variable switched on that this process cannot use, with one warning each.

    Such a variable is set for a whole job (``OTEL_RL_RESUME=1`` for every
    worker of a restarted one): it applies where it can and is ignored
    elsewhere, never fatal. A worker resumes nothing (its learner does);
    with the kill switch on nothing is said.
    """
    for name, variable in _ENVIRONMENT_OUTPUTS.items():
        if name == "resume" and merged.get("role", "learner") != "learner":
            merged[name] = False
        elif name not in options and merged[name]:
            why = _not_applicable(name, run_dir, merged)
            if why:
                if merged["enabled"]:
                    _logger.warning("otel-rl: %s=%s is ignored here: %s", variable, os.environ.get(variable, ""), why, extra=once(variable))
                merged[name] = None if name in ("trace_enabled", "profile") else False


def _not_applicable(name: str, run_dir: Any, merged: dict[str, Any]) -> str | None:
    """Why the option ``name``, switched on by its environment variable, cannot apply to this process (None: it can)."""
    folder = run_dir is not None or merged.get("trace_output_dir") is not None
    if name == "resume" and run_dir is None:
        return "this process has no run_dir"
    if name == "tensorboard" and run_dir is None and merged.get("tensorboard_dir") is None:
        return "this process has no run_dir or tensorboard_dir"
    if name in ("trace_enabled", "profile") and not folder:
        return "this process has no run_dir or trace_output_dir"
    if name in extras.OUTPUTS and extras.OUTPUTS[name].missing():
        return extras.OUTPUTS[name].message()
    return None




def _check(name: str, value: Any, kinds: type | tuple[type, ...], expected: str, valid=None) -> None:
    """Raise TypeError or ValueError naming ``name`` unless ``value`` is of ``kinds`` (bools are not numbers) and ``valid``."""
    wants_bool = kinds is bool
    if (isinstance(value, bool) and not wants_bool) or not isinstance(value, kinds):
        raise TypeError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")
    if valid is not None and not valid(value):
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def _is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (a replaced or closed ``sys.stdout`` is not)."""
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


_LAUNCHER = {"rank": env.RANK, "world_size": env.WORLD_SIZE, "node_rank": env.GROUP_RANK, "local_rank": env.LOCAL_RANK,
             "local_world_size": env.LOCAL_WORLD_SIZE}  # fmt: skip
"""The placement fields and the launcher variables they are read from."""


def _slurm_placement(defaults: dict[str, Any], launcher: dict[str, str]) -> None:
    """The machine, its ranks and this rank's place among them from Slurm's variables (``srun``), where ``torchrun``'s are not set.

    Slurm places ranks on machines of any sizes (``SLURM_TASKS_PER_NODE=2,1``): this machine's size is its own
    count, and the job's machines are counted from the list. ``launcher`` learns which variable each field came from.
    """
    if defaults["world_size"] <= 1:
        return
    if defaults["node_rank"] is None:
        defaults["node_rank"] = env.read(env.SLURM_NODEID, int, None, "an integer")
        if defaults["node_rank"] is not None:
            launcher["node_rank"] = env.SLURM_NODEID
    if defaults["local_rank"] is None:
        defaults["local_rank"] = env.read(env.SLURM_LOCALID, int, None, "an integer")
        if defaults["local_rank"] is not None:
            launcher["local_rank"] = env.SLURM_LOCALID
    node = defaults["node_rank"]
    if defaults["local_world_size"] is None and node is not None:
        per_node = env.read(env.SLURM_TASKS_PER_NODE, _tasks_per_node, None, "Slurm's tasks per node, as 2(x3),1")
        if per_node is not None and 0 <= node < len(per_node) and sum(per_node) == defaults["world_size"]:
            defaults["local_world_size"] = per_node[node]
            launcher["local_world_size"] = env.SLURM_TASKS_PER_NODE
            if len(set(per_node)) > 1:  # machines of several sizes: their count is not world_size / this one's
                defaults["node_count"] = len(per_node)


def _check_launcher(merged: dict[str, Any], launcher: dict[str, str]) -> None:
    """Refuse placement values the launcher's variables gave that cannot be, naming the variables (``RANK=2 is not below WORLD_SIZE=2``).

    ``launcher``: the fields read from a variable (a keyword's value is checked, by its name, when the config is made).
    """
    if not launcher:
        return

    def said(name: str) -> str:
        return f"{launcher[name]}={merged[name]}" if name in launcher else f"{name}={merged[name]!r}"

    values = {name: merged.get(name) for name in _LAUNCHER}
    if not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in values.values()):
        return  # a keyword of the wrong type: its own error, by its name
    problems = []
    if values["world_size"] < 1:
        problems.append(f"{said('world_size')} is not a number of ranks (1 or more)")
    elif not 0 <= values["rank"] < values["world_size"]:
        problems.append(f"{said('rank')} is not " + ("below " + said("world_size") if values["rank"] >= 0 else "0 or more"))
    for name in ("node_rank", "local_rank"):
        if values[name] is not None and values[name] < 0:
            problems.append(f"{said(name)} is not 0 or more")
    if values["local_world_size"] is not None and values["local_world_size"] < 1:
        problems.append(f"{said('local_world_size')} is not a number of ranks (1 or more)")
    elif values["local_world_size"] is not None and values["local_rank"] is not None and values["local_rank"] >= values["local_world_size"]:
        problems.append(f"{said('local_rank')} is not below {said('local_world_size')}")
    problems = [p for p in problems if any(variable in p for variable in launcher.values())]  # a keyword's own check says the rest
    if problems:
        raise ValueError(f"the launcher's variables do not place this rank: {'; '.join(problems)}")


def _tasks_per_node(raw: str) -> list[int]:
    """``SLURM_TASKS_PER_NODE`` (``2(x3),1``) as the count of each machine: ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in raw.split(","):
        count, _, times = part.partition("(x")
        counts += [int(count)] * (int(times.rstrip(")")) if times else 1)
    return counts


def host_machine(host: str, machine: str = "") -> int:
    """A machine's index from its host name and whole id (:func:`otel_rl.base.user_dir.machine_id`, 128 random bits),
    for a launcher that numbers no machine: 1 to 2**63 - 1 (0 is rank 0's), 63 bits of their SHA-256. The id tells
    apart machines that share a host name; two machines of one job share an index fewer than once in 10**13 jobs of
    1,000 machines (the birthday bound)."""
    digest = hashlib.sha256(f"{host}\0{machine}".encode("utf-8", "surrogatepass")).digest()
    return 1 + int.from_bytes(digest[:8], "big") % (2**63 - 1)


def _place_on_node(config: TelemetryConfig) -> None:
    """Fill and check ``local_world_size`` and ``local_rank`` (``torchrun`` numbers the ranks of each machine in a row).

    A launcher that gives each rank its place on its machine (``LOCAL_RANK``) but neither the machine nor its size
    (``srun`` without Slurm's placement, ``mpirun``) leaves the machines unknown: a rank whose local rank is not its
    rank is not on rank 0's machine, and its machine is told apart by its host name and the id its ``/dev/shm`` holds
    (:func:`host_machine`), so that no two machines ever write one part of the trace, whatever their names.
    """
    if config.local_world_size is None and config.node_rank is None and config.local_rank is not None and config.local_rank != config.rank:
        _check("local_rank", config.local_rank, int, "an integer", lambda v: 0 <= v < config.world_size)
        config.node_rank = host_machine(socket.gethostname(), user_dir.machine_id())
        config.local_world_size = config.world_size  # unknown: at most every rank
        return
    if config.local_world_size is None:
        config.local_world_size = config.world_size
    _check("local_world_size", config.local_world_size, int, "a positive integer", lambda v: v >= 1)
    if config.node_count is not None:
        _check("node_count", config.node_count, int, "a positive integer", lambda v: v >= 1)
    if config.node_rank is None:
        config.node_rank = config.rank // config.local_world_size
    _check("node_rank", config.node_rank, int, "an integer")
    if config.local_rank is None:
        config.local_rank = config.rank - config.node_rank * config.local_world_size
    _check("local_rank", config.local_rank, int, "an integer")
    if not 0 <= config.node_rank < config.nodes or not 0 <= config.local_rank < config.local_world_size:
        raise ValueError(
            f"node_rank={config.node_rank}, local_rank={config.local_rank} do not fit world_size={config.world_size} "
            f"with local_world_size={config.local_world_size} ranks per machine"
        )


def _profile_window(value: Any) -> tuple[int, int]:
    """``profile`` as ``(start, count)``: two integers, ``start >= 0`` and ``count >= 1``."""
    expected = "(start, count): the first learner iteration and how many to profile"
    try:  # numpy and torch integers too; not floats, not bools
        if len(value) != 2 or isinstance(value, str) or any(isinstance(v, bool) for v in value):
            raise TypeError
        start, count = (operator.index(v) for v in value)
    except TypeError:
        raise TypeError(f"profile must be {expected}, got {value!r}") from None
    if start < 0 or count < 1:
        raise ValueError(f"profile must be {expected} (start >= 0, count >= 1), got {value!r}")
    return start, count


def _parse_profile(raw: str) -> tuple[int, int]:
    start, count = raw.split(",")
    return _profile_window((int(start), int(count)))


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

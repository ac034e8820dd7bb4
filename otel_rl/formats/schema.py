"""Canonical metric schema, version 1: the one place that spells metric names.

Every scalar key a backend sees, every OpenTelemetry instrument and attribute
name, and every phase of the learner and collector timelines is defined here.
Exporters, dashboards and readers import these names; nothing else writes them
by hand.

Conventions (stable within schema version 1):

* Phase timings are persisted in milliseconds with an ``_ms`` suffix, except
  ``Perf/learning_time``, ``Perf/iteration_time`` and ``Perf/collection_time``,
  which are wall times in seconds.
* Keys live in families (``Perf/``, ``Train/``, ``Loss/``, ``Policy/``,
  ``Episode/``, ``reward/``, ``sys/``). User keys outside these families are
  namespaced (``team/metric``); strict mode rejects anything that is not
  canonical.
* Terminal-only derived values (Other, per-phase shares, collector cycle) are
  never persisted.
* A reader given a missing or unknown ``metric_schema_version`` fails closed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

SCHEMA_VERSION = 1
"""Value of ``metric_schema_version`` in ``run_summary.json``."""

SUPPORTED_SCHEMA_VERSIONS = frozenset({1})

LEARNER = "learner"
COLLECTOR = "collector"
TIMELINES = (LEARNER, COLLECTOR)

# OpenTelemetry names. Attribute names follow the proposed ``rl.*`` semantic
# conventions where one exists.
ATTR_TIMELINE = "rl.timeline"
ATTR_PHASE = "rl.phase"
ATTR_ITERATION = "rl.iteration"
ATTR_ENV_STEPS = "rl.env_steps"
ATTR_RANK = "rl.rank"
ATTR_WORLD_SIZE = "rl.world_size"
ATTR_CLOCK = "rl.clock"
ATTR_RUN_ID = "rl.run.id"
ATTR_ALGORITHM = "rl.algorithm"
ATTR_STATUS = "rl.run.status"
ATTR_QUEUE = "rl.telemetry.queue"

METRIC_PHASE_DURATION = "rl.phase.duration"
METRIC_ITERATION_DURATION = "rl.iteration.duration"
METRIC_ENV_STEPS = "rl.env_steps"
METRIC_DROPPED = "rl.telemetry.dropped"
METRIC_EVENTS = "rl.events"
"""Events recorded, by name (``rl.event``): ``worker_crashed``, ``nonfinite``, ``records_dropped``..."""
ATTR_EVENT = "rl.event"
EVENT_PROCESS_DIED = "process_died"
"""Recorded by the agent for a producer without an open run (a worker) that died: ``status``, ``reason``, ``pid``."""
EVENT_CHECKPOINT_SAVED = "checkpoint_saved"
"""A checkpoint was written (``path``, where the library gives it); the integrations say it for their library's saves."""
EVENT_WARMUP_DONE = "warmup_done"
"""The warm-up ended (an off-policy algorithm's first update after ``learning_starts``); the panel's status clears."""
EVENT_COMMIT = "stats_commit"
"""A set of stats was committed (:func:`otel_rl.stats_tracker.commit`): ``epoch``, ``epoch_step``, ``global_step`` where given."""
EVENT_SUMMARY_FIELDS = "summary_fields"
"""The loop's own fields for ``run_summary.json`` (:meth:`otel_rl.Telemetry.add_summary`), one attribute each."""
EVENT_CLOCK_OFFSET = "clock_offset"
"""A rank's clock minus the first rank's, as :meth:`otel_rl.Telemetry.align_clocks` measured it (``offset_ms``): written to
the trace (the counter :data:`otel_rl.formats.trace.CLOCK_OFFSET_KEY`, which the merge and ``analyze`` subtract), and no
tracker's scalar."""
EVENT_BOTTLENECK = "bottleneck"
"""The live verdict changed (:mod:`otel_rl.core.live_verdict`): ``text`` (the line ``otel-rl analyze`` prints), ``side``,
``phase``, ``rank`` (a straggler's), ``confidence`` (``high`` or ``low``, ``caveat`` says why), ``cycles`` and ``window_s``
(what it read), ``env_steps_per_s``, ``evidence``, ``iteration`` (the learner's latest) and ``previous`` (the verdict it
replaces; absent where the same verdict is said again, more or less sure). ``side`` is ``balanced`` where neither side
clearly sets the pace."""
METRIC_BOTTLENECK = "rl.bottleneck"
"""1 for the run's current live verdict, labelled with its ``rl.timeline`` (the side) and ``rl.phase``."""
EVENT_MEDIA = "media"
"""A video or image written to the run folder's ``media/`` (key, type, path, format, bytes, step...): a ``media`` record."""
SUMMARY_KEYS = frozenset({
    "metric_schema_version", "run_id", "algorithm", "status", "reason", "start_time_unix_nano", "end_time_unix_nano",
    "env_steps", "rank", "world_size", "timelines", "last_scalars",
})  # fmt: skip
"""The fields otel-rl writes into ``run_summary.json``; a loop's own field of one of these names is refused."""
EVENT_FRAMEWORK = "framework"
"""An integration named the framework training runs on (``system``) and its environment (``environment``, when it knows it)."""
ATTR_SYSTEM = "rl.system"
"""The RL framework (resource attribute of the proposed ``rl.*`` conventions): ``stable_baselines3``, ``torchrl``..."""
ATTR_ENVIRONMENT = "rl.environment.name"
"""The environment trained on (resource attribute of the proposed ``rl.*`` conventions): ``CartPole-v1``..."""
EVENT_TORCH_PROFILE = "torch_profile"
"""A ``torch.profiler`` window was written: ``file``, ``first_iteration``, ``iterations``, ``timebase_markers_ns``."""
METRIC_RUN_ACTIVE = "rl.run.active"
"""1 from the run's start, 0 once it ended (finished, failed or killed): a finished run is not a stalled one."""
METRIC_RUN_INFO = "rl.run.info"
"""Always 1; its labels are the run's id, commit and configuration (``rl.config.*``), for joining runs with their settings."""

SPAN_RUN = "rl.run"
SPAN_ITERATION = "rl.iteration"

# Explicit histogram bounds in ms: 1-2-5 steps from 0.01 ms to 10 s.
PHASE_BUCKETS_MS: tuple[float, ...] = tuple(
    m * 10.0**e for e in range(-2, 4) for m in (1.0, 2.0, 5.0)
) + (10_000.0,)


METRIC_DISTRIBUTION = "rl.distribution"
"""Histogram of the values passed to ``Telemetry.distribution``, by ``rl.key``."""
ATTR_KEY = "rl.key"

DISTRIBUTION_STATS = ("min", "mean", "max", "std", "p05", "p25", "p50", "p75", "p95")
"""What a distribution contributes to the live records, as ``<key>/<stat>`` scalars."""
DISTRIBUTION_QUANTILES = {"p05": 0.05, "p25": 0.25, "p50": 0.5, "p75": 0.75, "p95": 0.95}

_MAGNITUDES = tuple(float(f"{m}e{e}") for e in range(-6, 7) for m in (1, 2, 5) if e < 6 or m == 1)
DISTRIBUTION_BOUNDS: tuple[float, ...] = tuple(-b for b in reversed(_MAGNITUDES)) + (0.0,) + _MAGNITUDES
"""Bucket bounds of ``rl.distribution``: 1-2-5 steps from 1e-6 to 1e6 on either side of zero.

One fixed set for every key, so the cumulative histogram stays valid whatever
the values' scale does over a run (actions in [-1, 1], advantages, gradient norms).
"""


def distribution_keys(key: str) -> dict[str, str]:
    """The scalar key of each statistic of distribution ``key`` (``Policy/action`` -> ``Policy/action/p50``...)."""
    return {stat: f"{key}/{stat}" for stat in DISTRIBUTION_STATS}


class SchemaError(ValueError):
    """A key, phase or schema version that the canonical schema rejects."""


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One persisted scalar key.

    ``aggregation`` says how values are combined over a window or across ranks
    (``mean`` for timings and losses, ``sum`` for throughput, ``last`` for
    state). ``axis`` is the step axis the key is plotted against.
    """

    key: str
    unit: str
    aggregation: str = "mean"
    axis: str = "env_steps"
    description: str = ""


@dataclass(frozen=True, slots=True)
class PhaseSpec:
    """One phase of a timeline.

    Top-level phases (``parent is None``) are mutually exclusive slices of the
    timeline's cycle; nested phases are diagnostics of their parent and are
    never counted twice.
    """

    name: str
    timeline: str
    title: str
    parent: str | None = None
    waits: bool = False
    """Time spent waiting for others (the other side, a collective, a queue), not work of its own."""
    semconv: str | None = None
    """The ``rl.*`` span of the proposed OpenTelemetry conventions for RL (semantic-conventions-genai#88) this phase is
    part of: ``rl.sample`` (making experience), ``rl.reward``, ``rl.train``, ``rl.sync`` (publishing weights)."""

    @property
    def key(self) -> str:
        return phase_key(self.timeline, self.name)


LEARNER_PHASES: tuple[PhaseSpec, ...] = (
    PhaseSpec("collector_wait", LEARNER, "Collector Wait", waits=True),
    PhaseSpec("inference", LEARNER, "Inference"),
    PhaseSpec("inference_h2d", LEARNER, "H2D", parent="inference"),
    PhaseSpec("inference_forward", LEARNER, "Forward", parent="inference"),
    PhaseSpec("inference_d2h", LEARNER, "D2H", parent="inference"),
    PhaseSpec("collector_release", LEARNER, "Collector Release"),
    PhaseSpec("replay_batch_wait", LEARNER, "Replay Batch Wait", waits=True),
    PhaseSpec("replay_stage", LEARNER, "Replay Stage"),
    PhaseSpec("replay_sample", LEARNER, "Replay Sample"),
    PhaseSpec("learning", LEARNER, "Learning", semconv="rl.train"),
    PhaseSpec("gradient_sync", LEARNER, "Gradient Sync", waits=True, semconv="rl.train"),  # the ranks' all-reduce: where the others wait for a straggler
    PhaseSpec("weight_publish", LEARNER, "Weight Publish", semconv="rl.sync"),
    # LLM RL (TRL, verl): a step generates completions, scores them, runs the log-prob passes, then learns.
    PhaseSpec("generation", LEARNER, "Generation", semconv="rl.sample"),
    PhaseSpec("reward", LEARNER, "Reward", semconv="rl.reward"),
    PhaseSpec("old_log_prob", LEARNER, "Old Log-Prob", semconv="rl.train"),
    PhaseSpec("ref_log_prob", LEARNER, "Ref Log-Prob", semconv="rl.train"),
    PhaseSpec("values", LEARNER, "Values", semconv="rl.train"),
    PhaseSpec("advantage", LEARNER, "Advantage", semconv="rl.train"),
    PhaseSpec("critic_update", LEARNER, "Critic Update", semconv="rl.train"),
)

COLLECTOR_PHASES: tuple[PhaseSpec, ...] = (
    PhaseSpec("inference_request", COLLECTOR, "Inference Request"),
    PhaseSpec("learner_action_wait", COLLECTOR, "Learner Action Wait", waits=True),
    PhaseSpec("policy_inference", COLLECTOR, "Policy Inference"),
    PhaseSpec("mlp_infer", COLLECTOR, "MLP Infer"),  # APPO's own policy step in the collector
    PhaseSpec("env_step", COLLECTOR, "Env Step", semconv="rl.sample"),
    PhaseSpec("action_validate", COLLECTOR, "Action Validate", parent="env_step"),
    PhaseSpec("action_apply", COLLECTOR, "Apply Action", parent="env_step"),
    PhaseSpec("action_backend", COLLECTOR, "Action+Backend", parent="env_step"),
    PhaseSpec("backend_step", COLLECTOR, "Backend Step", parent="env_step"),
    PhaseSpec("update_state", COLLECTOR, "Update State", parent="env_step"),
    PhaseSpec("reset_done", COLLECTOR, "Reset Done", parent="env_step"),
    PhaseSpec("transition_extract", COLLECTOR, "Transition Extract"),
    PhaseSpec("replay_write", COLLECTOR, "Replay Write"),
    PhaseSpec("metrics_publish", COLLECTOR, "Metrics Publish"),
)

PHASES: dict[tuple[str, str], PhaseSpec] = {
    (p.timeline, p.name): p for p in LEARNER_PHASES + COLLECTOR_PHASES
}

_PHASE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")

# Phases persisted as seconds under a dedicated key instead of ``_ms``.
_SECONDS_PHASE_KEYS = {(LEARNER, "learning"): "Perf/learning_time"}


def phase_key(timeline: str, phase: str) -> str:
    """Persisted key of a phase, e.g. ``Perf/learner_replay_sample_ms``."""
    return _SECONDS_PHASE_KEYS.get((timeline, phase), f"Perf/{timeline}_{phase}_ms")


_PHASE_KEY = re.compile(r"^Perf/(" + "|".join(TIMELINES) + r")_([a-z][a-z0-9_]*)_ms$")
_SECONDS_PHASES = {key: spec for spec, key in _SECONDS_PHASE_KEYS.items()}


def parse_phase_key(key: str) -> tuple[str, str] | None:
    """``(timeline, phase)`` of a :func:`phase_key`; None for any other key. The one reader of the key grammar."""
    found = _SECONDS_PHASES.get(key)
    if found is not None:
        return found
    match = _PHASE_KEY.match(key)
    return (match[1], match[2]) if match else None


def phase_title(timeline: str, phase: str) -> str:
    """A phase's title: the canonical one, else its name in words (``env_reset``: ``Env Reset``)."""
    spec = PHASES.get((timeline, phase))
    return spec.title if spec is not None else phase.replace("_", " ").title()


def phase_key_scale(timeline: str, phase: str) -> float:
    """Factor from milliseconds to the unit of :func:`phase_key`."""
    return 1e-3 if (timeline, phase) in _SECONDS_PHASE_KEYS else 1.0


def phase_spec(timeline: str, phase: str, *, strict: bool = False) -> PhaseSpec:
    """Return the canonical spec of a phase, or a custom one.

    Raises:
        SchemaError: the timeline is unknown, the name is not snake_case, or
            ``strict`` is set and the phase is not canonical.
    """
    if timeline not in TIMELINES:
        raise SchemaError(f"unknown timeline {timeline!r}; expected one of {TIMELINES}")
    spec = PHASES.get((timeline, phase))
    if spec is not None:
        return spec
    if not isinstance(phase, str) or not _PHASE_NAME.match(phase):
        raise SchemaError(f"phase name {phase!r} must be snake_case ([a-z][a-z0-9_]*)")
    if strict:
        raise SchemaError(
            f"phase {phase!r} is not a canonical {timeline} phase (strict mode); "
            f"known: {', '.join(n for (t, n) in PHASES if t == timeline)}"
        )
    return PhaseSpec(phase, timeline, phase_title(timeline, phase))


SIDE_WAITS = {LEARNER: "collector_wait", COLLECTOR: "learner_action_wait"}
"""Each side's wait for the other: the learner for the collector's data, the collector for the learner's actions."""


@functools.lru_cache(maxsize=4096)
def is_wait(name: str) -> bool:
    """Whether phase ``name`` is waiting for others, not work of its own: a canonical phase says so (:attr:`PhaseSpec.waits`);
    a phase of the loop's own is judged by its name (``*_wait``, ``*_sync``, a barrier, an all-reduce)."""
    canonical = [spec for (_, phase), spec in PHASES.items() if phase == name.lower()]
    if canonical:
        return any(spec.waits for spec in canonical)
    lowered = name.lower()
    return lowered.endswith(("_wait", "_sync", "wait", "barrier")) or any(w in lowered for w in ("all_reduce", "allreduce", "barrier"))


def top_level_phases(timeline: str) -> tuple[PhaseSpec, ...]:
    return tuple(p for p in PHASES.values() if p.timeline == timeline and p.parent is None)


DP_SYNC_KEY = "Perf/dp_gradient_sync_ms_per_rank"
"""A rank's gradient all-reduce per iteration (ms): its learner ``gradient_sync`` phase, under seed 001's name."""
DP_SYNC_KEY_FROM = "Perf/learner_gradient_sync_ms"
GRADIENT_SYNC = "gradient_sync"
DP_SYNC_CALLS_KEY = "Perf/dp_gradient_sync_calls_per_rank"
"""A rank's ``gradient_sync`` phases per iteration (its all-reduces: one per bucket, or per update), under seed 001's name."""
WINDOW_ITERATIONS = "Perf/window_iterations"
"""The learner iterations a ``Perf/*`` record's means are over (1: an iteration longer than the window, as it was)."""
TOTAL_FPS = "Perf/total_fps"
"""Env steps per second: the loop's own, else derived from the learner's env steps on a run of one rank."""
JOB_ENV_STEPS = "Perf/job_env_steps"
"""The whole job's env steps, which :meth:`otel_rl.Telemetry.log_window` sums across the ranks."""

TOKENS_PER_S = "Perf/tokens_per_s"
"""Tokens per second of an LLM-RL step (TRL, verl: ``perf/throughput``)."""

_CANONICAL_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(TOTAL_FPS, "1/s", "sum", description="Env steps per second of the whole job (derived on a run of one rank that does not log it)"),
    MetricSpec("Perf/job_env_steps", "", "sum", description="Env steps of the whole job: each rank's latest, summed (log_window)"),
    MetricSpec("Perf/iteration_time", "s", description="Learner Iter Wall"),
    MetricSpec(WINDOW_ITERATIONS, "", "sum", description="Learner iterations a Perf/* record's means are over"),
    MetricSpec("Perf/learning_time", "s", description="Learner update wall time"),
    MetricSpec("Perf/collection_time", "s", description="Collector rollout wall time: the collector cycle's wall"),
    MetricSpec("Perf/replay_ingress_h2d_submit_ms", "ms", description="Background replay submit (overlaps)"),
    MetricSpec("Perf/dp_gradient_sync_ms_per_rank", "ms"),
    MetricSpec(DP_SYNC_CALLS_KEY, "", description="A rank's gradient all-reduces per iteration (its learner gradient_sync phases)"),
    MetricSpec(TOKENS_PER_S, "1/s", "sum", description="Tokens (prompts and completions) an LLM-RL step processes per second"),
    MetricSpec("Train/prompt_tokens", "", description="Prompt tokens of an LLM-RL step"),
    MetricSpec("Train/completion_tokens", "", description="Completion tokens an LLM-RL step generated"),
    MetricSpec("Train/mean_reward", "", description="Mean return of the last 100 episodes"),
    MetricSpec("Train/mean_episode_length", ""),
    MetricSpec("Episode/timeout_rate", "", description="Share of the episodes ended since the last value that hit the time limit"),
    MetricSpec("Episode/terminated_rate", "", description="Share of the episodes ended since the last value that terminated"),
) + tuple(
    MetricSpec(phase_key(p.timeline, p.name), "s" if phase_key_scale(p.timeline, p.name) != 1.0 else "ms")
    for p in LEARNER_PHASES + COLLECTOR_PHASES
)

METRICS: dict[str, MetricSpec] = {m.key: m for m in _CANONICAL_METRICS}

# Families whose members are canonical by prefix, with their default unit.
# Dimensionless values have no unit (""), not "1": Prometheus would append
# "_ratio" to a unit-1 gauge, which a reward or a loss is not.
FAMILIES: dict[str, str] = {
    "Perf/": "",
    "Train/": "",
    "Loss/": "",
    "Policy/": "",
    "Episode/": "",
    "Episode_Termination/": "",  # Manager-Based environments: the envs a termination term reset, a diagnostic of its own
    "Episode_Reward/": "",  # the retired per-term normalised episode sums: kept apart from reward/, as old runs have them
    "reward/": "",
    "sys/": "",
}

_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]*(/[A-Za-z0-9_.\-]+)+$")


def metric_spec(key: str, *, strict: bool = False) -> MetricSpec:
    """Return the spec of a scalar key.

    Canonical keys and members of the canonical families are accepted as is.
    Other keys must be namespaced (``namespace/name``); in strict mode they are
    rejected.

    Raises:
        SchemaError: the key is malformed, not namespaced, or unknown in strict mode.
    """
    spec = METRICS.get(key)
    if spec is not None:
        return spec
    if not isinstance(key, str) or not _KEY.match(key):
        raise SchemaError(
            f"scalar key {key!r} must be namespaced like 'Family/name' "
            "(letters, digits, '_', '.', '-' separated by '/')"
        )
    for prefix, unit in FAMILIES.items():
        if key.startswith(prefix):
            unit = _unit_from_suffix(key) or unit
            return MetricSpec(key, unit, "sum" if key.endswith("_fps") else "mean")
    if strict:
        raise SchemaError(
            f"scalar key {key!r} is outside the canonical families "
            f"({', '.join(FAMILIES)}) and strict mode is on"
        )
    return MetricSpec(key, _unit_from_suffix(key) or "")


def _unit_from_suffix(key: str) -> str | None:
    if key.endswith("_ms"):
        return "ms"
    if key.endswith("_bytes"):
        return "By"
    if key.endswith("_percent") or key.endswith("_pct"):
        return "%"
    return None


def otel_gauge_name(key: str) -> str:
    """OpenTelemetry instrument name of a scalar key.

    ``Perf/learner_collector_wait_ms`` becomes ``rl.perf.learner_collector_wait``
    (the unit is metadata: Prometheus appends ``_milliseconds`` itself).
    """
    name = key.lower()
    for suffix in ("_ms", "_bytes", "_percent", "_pct"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return "rl." + re.sub(r"[^a-z0-9_.]", "_", name.replace("/", "."))


# Legacy tags of earlier loggers and their canonical replacements:
# legacy -> (canonical, factor to multiply the legacy value by).
LEGACY_TAGS: dict[str, tuple[str, float]] = {
    "perf/steps_per_sec": ("Perf/total_fps", 1.0),
    "reward/mean": ("Train/mean_reward", 1.0),
    "reward/mean_ep100": ("Train/mean_reward", 1.0),
    "episode/timeout_rate": ("Episode/timeout_rate", 1.0),
    "perf/iter_ms": ("Perf/iteration_time", 1e-3),
    "timing/learner_train_ms": ("Perf/learning_time", 1e-3),
    "timing/inference_total_ms": ("Perf/learner_inference_ms", 1.0),
    "timing/inference_h2d_ms": ("Perf/learner_inference_h2d_ms", 1.0),
    "timing/inference_forward_ms": ("Perf/learner_inference_forward_ms", 1.0),
    "timing/inference_d2h_ms": ("Perf/learner_inference_d2h_ms", 1.0),
    "timing/learner_incremental_h2d_ms": ("Perf/replay_ingress_h2d_submit_ms", 1.0),
    "timing/replay_ingress_h2d_submit_ms": ("Perf/replay_ingress_h2d_submit_ms", 1.0),
    "timing/collector_inference_wait_ms": ("Perf/collector_learner_action_wait_ms", 1.0),
    "timing/collector_rollout_ms": ("Perf/collection_time", 1e-3),
    "train/dp_sync_time": ("Perf/dp_gradient_sync_ms_per_rank", 1e3),
    "train/dp_gradient_sync_calls": ("Perf/dp_gradient_sync_calls_per_rank", 1.0),
}

# Legacy tags retired without a replacement: derivable or terminal-only.
RETIRED_TAGS = frozenset(
    {
        "perf/effective_samples_per_sec",
        "perf/learner_samples_per_sec",
        "perf/collector_active_steps_per_sec",
        "perf/collector_cycle_ms",
        "timing/learner_other_ms",
        "perf/learner_pipeline_ms",
    }
)

_LEGACY_PHASE = re.compile(r"^timing/(learner|collector)_([a-z0-9_]+)_ms$")


def legacy_to_canonical(tag: str) -> tuple[str, float] | None:
    """Canonical key and factor for a legacy tag; None if retired or not legacy."""
    if tag in LEGACY_TAGS:
        return LEGACY_TAGS[tag]
    if tag in RETIRED_TAGS or tag.startswith("perf/learner_") and tag.endswith("_pct"):
        return None
    match = _LEGACY_PHASE.match(tag)
    if match:
        return f"Perf/{match.group(1)}_{match.group(2)}_ms", 1.0
    return None


def is_legacy(tag: str) -> bool:
    return (
        tag in LEGACY_TAGS
        or tag in RETIRED_TAGS
        or bool(_LEGACY_PHASE.match(tag))
        or (tag.startswith("perf/learner_") and tag.endswith("_pct"))
    )


def migrate_legacy(values: Mapping[str, float]) -> dict[str, float]:
    """Translate a pre-schema (unversioned) record into canonical keys.

    Only for logs written before schema version 1. Retired tags are dropped;
    keys that are neither legacy nor canonical pass through unchanged.

    Raises:
        SchemaError: the record mixes canonical and legacy keys, which means it
            is not an unversioned legacy record and must not be guessed at.
    """
    legacy = [k for k in values if is_legacy(k)]
    canonical = [k for k in values if k in METRICS]
    if legacy and canonical:
        raise SchemaError(
            f"record mixes canonical keys ({canonical[0]!r}) and legacy tags ({legacy[0]!r}); refusing to guess"
        )
    out: dict[str, float] = {}
    for tag, value in values.items():
        if not is_legacy(tag):
            out[tag] = value
            continue
        target = legacy_to_canonical(tag)
        if target is not None:
            key, factor = target
            out[key] = value * factor if value is not None else None
    return out


def check_schema_version(document: Mapping[str, object]) -> int:
    """Return ``metric_schema_version`` of a summary, failing closed.

    Raises:
        SchemaError: the version is missing or not supported by this reader.
    """
    version = document.get("metric_schema_version")
    if version is None:
        raise SchemaError("metric_schema_version is missing; refusing to read an unversioned record")
    if isinstance(version, bool) or version not in SUPPORTED_SCHEMA_VERSIONS:
        raise SchemaError(
            f"metric_schema_version {version!r} is not supported (supported: {sorted(SUPPORTED_SCHEMA_VERSIONS)})"
        )
    return int(version)  # type: ignore[arg-type]


# What the RL libraries log, mapped into the canonical schema (otel_rl.integrations):
# library -> {the library's key -> canonical key}. Keys not listed keep their
# name when it is namespaced ("rollout/foo"), else go under "<library>/".
LIBRARY_TAGS: dict[str, dict[str, str]] = {
    "sb3": {
        "rollout/ep_rew_mean": "Train/mean_reward",
        "rollout/ep_len_mean": "Train/mean_episode_length",
        "rollout/success_rate": "Episode/success_rate",
        "rollout/exploration_rate": "Policy/exploration_rate",
        "time/fps": "Perf/total_fps",
        "train/loss": "Loss/total",
        "train/value_loss": "Loss/value",
        "train/policy_gradient_loss": "Loss/policy",
        "train/policy_loss": "Loss/policy",  # A2C
        "train/entropy_loss": "Loss/entropy",
        "train/actor_loss": "Loss/actor",
        "train/critic_loss": "Loss/critic",
        "train/ent_coef_loss": "Loss/alpha",
        "train/ent_coef": "Policy/alpha",
        "train/approx_kl": "Policy/approx_kl",
        "train/clip_fraction": "Policy/clip_fraction",
        "train/clip_range": "Policy/clip_range",
        "train/explained_variance": "Policy/explained_variance",
        "train/std": "Policy/mean_std",
        "train/learning_rate": "Train/learning_rate",
        "train/n_updates": "Train/n_updates",
    },
    "torchrl": {
        "loss_objective": "Loss/policy",
        "loss_critic": "Loss/value",
        "loss_entropy": "Loss/entropy",
        "loss_actor": "Loss/actor",
        "loss_qvalue": "Loss/critic",
        "loss_value": "Loss/value",
        "loss_alpha": "Loss/alpha",
        "alpha": "Policy/alpha",
        "entropy": "Policy/entropy",
        "kl_approx": "Policy/approx_kl",
        "clip_fraction": "Policy/clip_fraction",
        "explained_variance": "Policy/explained_variance",
        "reward": "Train/mean_step_reward",
        "episode_reward": "Train/mean_reward",
        "lr": "Train/learning_rate",
    },
    "rsl_rl": {
        "Loss/value_function": "Loss/value",
        "Loss/value": "Loss/value",
        "Loss/surrogate": "Loss/policy",
        "Loss/entropy": "Loss/entropy",
        "Loss/learning_rate": "Train/learning_rate",
        "Policy/mean_std": "Policy/mean_std",
        "Policy/mean_noise_std": "Policy/mean_std",
    },
    "skrl": {
        "Reward / Total reward (mean)": "Train/mean_reward",
        "Reward / Instantaneous reward (mean)": "Train/mean_step_reward",
        "Episode / Total timesteps (mean)": "Train/mean_episode_length",
        "Loss / Policy loss": "Loss/policy",
        "Loss / Value loss": "Loss/value",
        "Loss / Entropy loss": "Loss/entropy",
        "Loss / Critic loss": "Loss/critic",
        "Loss / Entropy coefficient loss": "Loss/alpha",
        "Coefficient / Entropy coefficient": "Policy/alpha",
        "Policy / Standard deviation": "Policy/mean_std",
        "Learning / Learning rate": "Train/learning_rate",
        "Learning / Policy learning rate": "Train/learning_rate",
    },
    "trl": {  # GRPOTrainer's and RLOOTrainer's merged logs (their averaged metrics and the Trainer's own)
        "loss": "Loss/policy",
        "grad_norm": "Train/grad_norm",
        "learning_rate": "Train/learning_rate",
        "reward": "Train/mean_reward",
        "reward_std": "Train/reward_std",
        "kl": "Policy/approx_kl",
        "entropy": "Policy/entropy",
        "clip_ratio/region_mean": "Policy/clip_fraction",
        "completions/mean_length": "Train/mean_completion_length",
        "num_tokens": "Train/num_tokens",
        "epoch": "Train/epoch",
    },
    "verl": {  # the keys of verl's metric_utils and its trainer
        "actor/pg_loss": "Loss/policy",
        "critic/vf_loss": "Loss/value",
        "actor/entropy": "Policy/entropy",
        "actor/ppo_kl": "Policy/approx_kl",
        "actor/pg_clipfrac": "Policy/clip_fraction",
        "actor/grad_norm": "Train/grad_norm",
        "actor/lr": "Train/learning_rate",
        "critic/score/mean": "Train/mean_reward",
        "response_length/mean": "Train/mean_completion_length",
        "perf/throughput": TOKENS_PER_S,
        "perf/total_num_tokens": "Train/num_tokens",
    },
    "rllib": {
        "env_runners/episode_return_mean": "Train/mean_reward",
        "env_runners/episode_len_mean": "Train/mean_episode_length",
        "learners/default_policy/total_loss": "Loss/total",
        "learners/default_policy/policy_loss": "Loss/policy",
        "learners/default_policy/vf_loss": "Loss/value",
        "learners/default_policy/entropy": "Policy/entropy",
        "learners/default_policy/mean_kl_loss": "Policy/approx_kl",
        "learners/default_policy/vf_explained_var": "Policy/explained_variance",
        "learners/default_policy/default_optimizer_learning_rate": "Train/learning_rate",
        "num_env_steps_sampled_lifetime_throughput": "Perf/total_fps",
    },
}


# Families renamed by prefix: library -> {the library's prefix -> canonical prefix}.
LIBRARY_PREFIXES: dict[str, dict[str, str]] = {}
"""None renamed today: RSL-RL's ``Episode_Reward/<term>`` (and legacy Isaac Gym's ``Episode/rew_<term>``) are episode
sums, not the per-step ``reward/<term>`` of a reward manager, and keep their names."""

LIBRARY_NAMESPACES: dict[str, str] = {"rsl_rl": "rslrl"}
"""The namespace of a library's unmapped tags where it is not the library's name (``rslrl/<tag>``, as seed 000 gives)."""


def library_key(library: str, key: str) -> str:
    """The canonical key of what ``library`` logs as ``key`` (see :data:`LIBRARY_TAGS`, :data:`LIBRARY_PREFIXES`).

    A tag without a canonical counterpart keeps its name under the library's
    namespace (``time/iterations`` of SB3 is ``sb3/time/iterations``), unless
    it is already a key of a canonical family (``Train/...``, ``Episode/...``).

    Raises:
        KeyError: an unknown library.
    """
    canonical = LIBRARY_TAGS[library].get(key)
    if canonical is not None:
        return canonical
    for prefix, replacement in LIBRARY_PREFIXES.get(library, {}).items():
        if key.startswith(prefix) and len(key) > len(prefix):
            key = replacement + key[len(prefix) :]
            break
    if _KEY.match(key) and (key in METRICS or key.startswith((*FAMILIES, LIBRARY_NAMESPACES.get(library, library) + "/"))):
        return key
    # Anything else is the library's own: ``<library>/<its tag>``, never mistaken for a canonical key.
    namespace = LIBRARY_NAMESPACES.get(library, library)
    parts = [re.sub(r"[^A-Za-z0-9_.\-]+", "_", part.strip()).strip("_") for part in key.split("/")]
    return "/".join([namespace, *(p for p in parts if p)] if any(parts) else [namespace, "unnamed"])


_RANK_KEY = re.compile(r"^Perf/rank_(\d+)/(.+)$")


def rank_key(rank: int, key: str) -> str:
    """One rank's value of a job's ``Perf/*`` timing, as rank 0 records it: ``Perf/rank_3/learner_learning_ms``."""
    return f"Perf/rank_{rank}/{key.removeprefix('Perf/')}"


def parse_rank_key(key: str) -> tuple[int, str] | None:
    """``(rank, the job's key)`` of a :func:`rank_key`; None for any other key."""
    match = _RANK_KEY.match(key)
    return (int(match[1]), "Perf/" + match[2]) if match else None


def is_learner_timing(key: str) -> bool:
    """A learner timing of a log window (:meth:`otel_rl.Telemetry.window_timings`): each rank's is kept per rank."""
    if key == "Perf/iteration_time" or key in _LEARNER_TIMING_KEYS:
        return True
    parsed = parse_phase_key(key)
    return parsed is not None and parsed[0] == LEARNER


_LEARNER_TIMING_KEYS = frozenset(key for (timeline, _), key in _SECONDS_PHASE_KEYS.items() if timeline == LEARNER)

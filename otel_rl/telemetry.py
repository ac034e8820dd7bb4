"""The public :class:`Telemetry` object: what a training loop calls.

It keeps the training thread's hot path (phases, iterations, scalars,
events: raw records into the recorder), ``close()`` and ``stats()``; the run's
lifecycle (:class:`~otel_rl.training.run_scope.RunScope`), worker processes
(:class:`~otel_rl.training.workers.Workers`) and log windows
(:class:`~otel_rl.training.windows.Windows`) have owners of their own, and
the outputs run in a host (:mod:`otel_rl.agent.hosts`). When telemetry is
disabled the calls land on :class:`otel_rl.api.NoOpTelemetry`.
"""

from __future__ import annotations

import atexit
import json
import operator
import os
import shlex
import signal
import socket
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from time import perf_counter_ns
from typing import Any

from otel_rl.base import environment_variables as env
from otel_rl.agent.hosts import Host, start_host
from otel_rl.agent.trace_upload import RESEND_WINDOW_S
from otel_rl.api import NoOpTelemetry
from otel_rl.base import extras, terminal
from otel_rl.base.clock import Clock
from otel_rl.base.deadline import Deadline
from otel_rl.base.log import logger, once
from otel_rl.base.values import INT64_MAX, INT64_MIN, NAME_LIMIT, as_step, clean_text, describe, json_safe, shorten, snapshot
from otel_rl.config import TelemetryConfig
from otel_rl.core.distributions import to_host_array
from otel_rl.core.identity import RunIdentity, service_name
from otel_rl.core.ids import new_span_id, new_trace_id, parse_traceparent
from otel_rl.core.pipeline import RecordSink
from otel_rl.core.records import CudaFallback
from otel_rl.formats import lifecycle, schema, trace
from otel_rl.run import files, media, notices
from otel_rl.run import folder as run_folder
from otel_rl.run.provenance import redact
from otel_rl.shm import layout
from otel_rl.training import panel_warnings
from otel_rl.training.media_out import HANDOFF_FOLDER, MediaOut, Refused
from otel_rl.training.recorder import Iteration, Phase
from otel_rl.training.run_scope import RunScope
from otel_rl.training.windows import Windows
from otel_rl.training.workers import Workers, WorkerSpec

__all__ = ["Telemetry", "NoOpTelemetry"]

_logger = logger(__name__)

ALIGN_EVERY = 50
"""Log windows (with a process group) between two measurements of the ranks' clocks; the first window measures too."""

HURRY_S = 2.0
"""What is left of the shutdown deadline after a second SIGTERM."""

_live: weakref.WeakSet = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child inherits Telemetry objects whose threads did not come along: switch them off.

    The child starts its own telemetry instead (:func:`otel_rl.worker_processes.init_worker`).
    """
    for telemetry in list(_live):
        telemetry._forked()  # noqa: SLF001 - the module's own class


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Telemetry:
    """Telemetry of one process of a training job. Create it with :func:`otel_rl.init`.

    All methods are safe to call from any thread. Nothing here raises into
    training once construction succeeded, except the documented argument
    errors (unknown timeline, malformed phase name, strict-mode schema
    errors). Values that are not plain JSON (numpy and torch values, paths,
    enums, dates, NaN...) are converted by the rules of :mod:`otel_rl.base.values`,
    with one warning naming what was changed.

    Public attributes: ``enabled``, ``config``, ``run_id``, ``trace_id`` and
    the SDK providers; everything else is internal.
    """

    enabled = True

    def __init__(self, config: TelemetryConfig, sinks: list[RecordSink] | None = None) -> None:
        """``sinks``: extra record sinks (they keep the outputs in this process: ``agent="thread"``)."""
        self.config = config
        self._clock = Clock()
        self._started_ns = self._clock.now_ns()
        self._phases: dict[tuple, Phase] = {}
        self._phases_lock = threading.Lock()
        self._closed = False
        self._close_lock = threading.Lock()
        self._last_iteration: int | None = None
        self._last_env_steps: int | None = None
        self._strict_keys: set[str] = set()
        self._cuda_timer = None
        self._nonfinite_paths: set[str] = set()
        self._deadline: Deadline | None = None
        self._hurried = False
        self._described: dict[str, str] = {}  # what describe_system() last recorded
        self._media: MediaOut | None = None
        if config.resume and config.run_dir is not None and config.run_id == config.run_dir.resolve().name:
            self._resume_folder_run(config)  # the id a run given none gets: the folder's, which may have been moved
        # The process that writes the run folder owns it (a second one is refused, a resume waits for none).
        owner = config.run_dir is not None and config.role == schema.LEARNER and (config.rank == 0 or config.outputs_on_every_rank)
        # A job of several ranks: its rendezvous tells it apart from another job under the same id (one default folder).
        job = run_folder.job_key() if config.world_size > 1 and not config.resume else None
        self._run_folder, in_use = None, False
        self._job_notes: list[Path] = []
        if owner:
            try:
                self._run_folder = run_folder.claim(config.run_dir)  # type: ignore[arg-type]
            except run_folder.RunFolderInUse:
                if config.resume or (config.world_size > 1 and (job is None or config.outputs_on_every_rank)):
                    raise  # it must be this folder: refused, naming the holder
                in_use = True  # a run (another job's) that started there an instant before: this one takes the next free name
        elif job is not None and config.run_dir is not None and config.role == schema.LEARNER:
            self._follow_job(config, job)  # where this job's rank 0 writes: the folder, or where it moved from another job's
        moved_from = self._own_folder(config, in_use, job) if owner else None
        if owner and job is not None and self._run_folder is not None:
            self._job_notes.append(run_folder.note_job(config.run_dir, job))  # type: ignore[arg-type]
        if self._run_folder is not None:  # said before a panel can draw (the thread host's draws at once): a line printed over its frame garbles it
            notices.started(config, moved_from)
        try:
            self._start(config, sinks)
        except BaseException:
            run_folder.forget(self._job_notes)
            run_folder.release(self._run_folder)
            raise
        # The exit hook holds a weak reference: it must not keep a forgotten
        # Telemetry alive, and it is bounded by the shutdown timeout.
        # While a panel draws, otel-rl's warnings are said by it, above its frame (printed here, they land inside it).
        self._panel_warnings = panel_warnings.install(self._recorder) if config.panel else None
        ref = weakref.ref(self)
        self._at_exit = False
        self._atexit = lambda: (t := ref()) is not None and t._close_at_exit()  # noqa: SLF001 - its own method
        atexit.register(self._atexit)
        _live.add(self)

    @staticmethod
    def _resume_folder_run(config: TelemetryConfig) -> None:
        """A folder resumed without a run id continues the run it holds, whatever the folder is called now (moved, renamed)."""
        from otel_rl.run.resume import folder_run_id

        found = folder_run_id(config.run_dir)  # type: ignore[arg-type]
        if found is not None and found != config.run_id:
            if not config.quiet:
                _logger.warning("otel-rl: resume: %s holds run %r (the folder was moved or renamed); continuing it", config.run_dir, found)
            config.run_id = found

    @staticmethod
    def _follow_job(config: TelemetryConfig, job: str) -> None:
        """A rank other than 0: the folder its rank 0 holds for this job (another job of the same id may hold the one it was given)."""
        given = config.run_dir
        found = run_folder.job_folder(given, job)  # type: ignore[arg-type]
        if found == given:
            return
        if found is None:
            _logger.warning("otel-rl: %s is another job's (the same id) and rank 0 of this one (rendezvous %s) did not say within %.0f s where "
                            "it went; rank %d records into no folder", given, job, run_folder.FOLLOW_S, config.rank)
            config.run_dir = None
            if config.trace_output_dir == given:
                config.trace_output_dir = None
            return
        config.run_dir = found
        if config.trace_output_dir == given:
            config.trace_output_dir = found
        config.run_id = _moved_id(config.run_id, given, found)  # type: ignore[arg-type]

    def _own_folder(self, config: TelemetryConfig, in_use: bool = False, job: str | None = None) -> tuple[Path, str] | None:
        """A run that does not resume never writes into a folder holding another: it gets a fresh one, and an id of its own.

        Returns the folder and run id it would have shared, None when it keeps its own. A job of several
        ranks keeps the folder its ranks agreed on (they cannot all move at once), as does a run that resumes.
        ``in_use``: a live run holds the folder's lock (two started at once): this one moves too.
        """
        run_dir = config.run_dir
        if config.resume or run_dir is None or not (in_use or run_folder.holds_run(run_dir)):
            return None
        if config.world_size > 1 and not (in_use and job is not None):  # its ranks can follow it only away from another live job
            return None
        earlier, earlier_id = run_dir, config.run_id
        claim, fresh = run_folder.claim_fresh(run_dir)
        run_folder.release(self._run_folder)
        self._run_folder = claim
        config.run_dir = fresh
        if config.trace_output_dir == earlier:
            config.trace_output_dir = fresh
        config.run_id = _moved_id(earlier_id, earlier, fresh)
        if job is not None:
            self._job_notes.append(run_folder.note_moved(earlier, job, fresh))  # its other ranks follow
        return earlier, earlier_id  # type: ignore[return-value]

    def _start(self, config: TelemetryConfig, sinks: list[RecordSink] | None) -> None:
        """The trace, the run being resumed, the configuration made plain data, the host, its recorder and the owners."""
        parent = parse_traceparent(os.environ.get(env.TRACEPARENT, ""))
        self.trace_id, self._parent_span_id = parent if parent else (new_trace_id(), None)
        previous = self._previous_run() if config.resume and config.role == schema.LEARNER else None
        if previous is not None and previous.trace_id and not parent:
            self.trace_id = previous.trace_id  # the resumed run's spans join the first part's trace
        # Plain data before anything holds the configuration (an agent process reads a copy of it); a NaN
        # replaced there is reported once the recorder exists.
        replaced: list[tuple[str, Any]] = []
        config.meta = redact(json_safe(config.meta, lambda path, value: replaced.append((path, value)), "meta"))
        self._service_name = service_name(config)
        identity = RunIdentity(
            config, self.trace_id, self._parent_span_id, os.getpid(), self._started_ns, self._clock.offset_ns, previous, self._service_name,
            socket.gethostname(),
        )
        self._host: Host = start_host(identity, list(sinks or []))
        self._recorder = self._host.recorder
        self._recorder.lane()  # the thread that starts telemetry (the training loop's, mostly) always has a lane
        for path, value in replaced:
            self._nonfinite(path, value)
        self._new_iteration = self._recorder.iteration_factory(self._on_iteration, config.trace_thread_time)
        self._runs = RunScope(self._recorder, self._clock, config, self._parent_span_id, previous, self._nonfinite, self._hurry)
        self._runs.before_end = self._media_before_end
        self._workers = Workers(self._recorder.add_remote, self.event)
        self._windows = Windows(lambda: self._host.counts().totals)
        self._profile = None
        if config.profile is not None:
            from otel_rl.training.profiling import ProfileWindow

            folder = (config.run_dir or config.trace_output_dir) / files.PROFILE_DIR  # type: ignore[operator]
            self._profile = ProfileWindow(*config.profile, folder, self._internal_event)

    def _previous_run(self):
        """The run this one resumes (read from its folder), or None when there is nothing to resume."""
        from otel_rl.agent.directory import wait_for_agents
        from otel_rl.agent.launch import recover_orphans
        from otel_rl.run.resume import previous_run

        recover_orphans()  # a previous process whose agent died too: a new agent writes its records first
        if not wait_for_agents(self.config.run_id, self.config.shutdown_timeout_s):  # type: ignore[arg-type]
            _logger.warning("otel-rl: the agent of the run's previous process is still writing its outputs; resuming anyway")
        return previous_run(self.config.run_dir, self.config.run_id)  # type: ignore[arg-type]

    @property
    def run_id(self) -> str:
        """``rl.run.id`` of this run."""
        return self.config.run_id  # type: ignore[return-value]

    # -- the training thread's API ---------------------------------------

    def phase(self, name: str, timeline: str = schema.LEARNER, cuda: bool = False, stream: Any = None) -> Phase:
        """A phase of ``timeline``: use as ``with tel.phase("learning"):`` or as a decorator.

        Phases nest; a nested phase is a diagnostic child of the enclosing one
        and is not counted again in the iteration's accounted time.

        ``cuda=True`` (or a ``torch.cuda.Stream`` as ``stream``) also times the
        phase on the GPU with CUDA events, without synchronizing (see
        :mod:`otel_rl.training.cuda_timing`); without CUDA it is timed on the host and
        its spans say so.

        Raises:
            otel_rl.formats.schema.SchemaError: unknown timeline, malformed name, or a
                non-canonical phase in strict mode.
        """
        if cuda or stream is not None:
            return self._cuda_phase(name, timeline, stream)
        phase = self._phases.get((name, timeline))
        if phase is None:
            spec = schema.phase_spec(timeline, name, strict=self.config.strict)
            with self._phases_lock:
                phase = self._phases.setdefault((name, timeline), self._recorder.new_phase(spec))
        if self._closed:
            _logger.warning("otel-rl: phase() after close(); nothing is recorded")
        return phase

    def iteration(self, index: int, env_steps: int | None = None, timeline: str = schema.LEARNER) -> Iteration:
        """One cycle of ``timeline``; for the learner its wall time is Iter Wall.

        ``env_steps`` is the job's cumulative env-step count at this iteration
        (the step axis of scalars recorded during it). numpy and torch
        integers are accepted for both.
        """
        if timeline not in schema.TIMELINES:
            raise schema.SchemaError(f"unknown timeline {timeline!r}; expected one of {schema.TIMELINES}")
        if type(index) is not int or (env_steps is not None and type(env_steps) is not int):
            # numpy and torch integers (Python ints out of the 64-bit range are caught off this thread).
            index = as_step(index, "iteration index")
            index = -1 if index is None else index
            env_steps = None if env_steps is None else as_step(env_steps, "env_steps")
        if self._closed:
            _logger.warning("otel-rl: iteration() after close(); nothing is recorded")
        profile = self._profile
        if profile is not None and index >= profile.start and timeline == schema.LEARNER:
            if not profile.done:
                return profile.around(self._new_iteration(timeline, index, env_steps))
            self._profile = None  # the window has passed: nothing more to check
        return self._new_iteration(timeline, index, env_steps)

    def flow(self, flow_id: int, end: bool = False) -> None:
        """Link the innermost open phase of this thread to others marked with the same ``flow_id``.

        In the Perfetto trace, phases sharing a flow id are joined by arrows in
        the order they started (across threads and processes): a collector's
        inference request, the learner's inference serving it, and the
        collector's action wait (``end=True`` closes the flow).
        """
        self._recorder.lane().flow(perf_counter_ns(), flow_id, end)

    def _cuda_phase(self, name: str, timeline: str, stream: Any):
        key = (name, timeline, "cuda", id(stream))
        phase = self._phases.get(key)
        if phase is not None:
            return phase
        host = self.phase(name, timeline)
        from otel_rl.training.cuda_timing import CudaPhase, CudaTimer, cuda_unavailable_reason

        reason = cuda_unavailable_reason()
        if reason is not None:
            _logger.warning("otel-rl: %s; CUDA phases are timed on the host", reason)
            self._recorder.add_cuda_fallback(CudaFallback(timeline, name, reason))
            phase = host
        else:
            with self._phases_lock:
                if self._cuda_timer is None:
                    self._cuda_timer = CudaTimer(self._recorder, self._clock.to_epoch_ns)
            phase = CudaPhase(host, self._cuda_timer, stream, self._recorder)
        with self._phases_lock:
            return self._phases.setdefault(key, phase)

    def record_phase(self, name: str, start_ns: int, end_ns: int, timeline: str = schema.LEARNER) -> None:
        """Record a phase measured elsewhere, with ``time.perf_counter_ns()`` timestamps.

        It belongs to the calling thread, nested in whatever phase is open there.
        """
        if not end_ns >= start_ns:
            raise ValueError(f"phase {name!r}: end_ns {end_ns} is before start_ns {start_ns}")
        phase = self.phase(name, timeline)
        self._recorder.lane().phase(phase, int(start_ns), int(end_ns), None)

    def record_iteration(
        self, index: int, start_ns: int, end_ns: int, phases: Sequence[tuple[str, int, int]] = (), env_steps: int | None = None,
        timeline: str = schema.LEARNER,
    ) -> None:
        """Record an iteration measured elsewhere, and its top-level phases (``(name, start_ns, end_ns)``, in order),
        with ``time.perf_counter_ns()`` timestamps: a step a library reports only as durations after it ended.

        The calling thread must hold no open iteration of ``timeline`` (one is said once and nothing recorded).

        Raises:
            ValueError: a phase or the iteration ends before it starts, or a phase lies outside the iteration; an index
                below 0; a phase that is not ``(name, start_ns, end_ns)``; times in the future (``time.time_ns()``).
        """
        checked = as_step(index, "iteration index")
        if checked is None or checked < 0:
            raise ValueError(f"record_iteration(): index must be an integer from 0, got {describe(index)[:100]}")
        start_ns, end_ns = _timestamp(start_ns, "start_ns"), _timestamp(end_ns, "end_ns")
        if not end_ns >= start_ns:
            raise ValueError(f"iteration {index}: end_ns {end_ns} is before start_ns {start_ns}")
        ahead_s = (end_ns - perf_counter_ns()) / 1e9
        if ahead_s > FUTURE_S:  # perf_counter_ns() counts from boot; time.time_ns() from 1970, decades ahead of it
            raise ValueError(f"iteration {index}: end_ns is {ahead_s:,.0f} s ahead of time.perf_counter_ns() (stamped with time.time_ns()?); "
                             "record_iteration() takes perf_counter_ns() timestamps")  # fmt: skip
        resolved = []
        for n, phase in enumerate(phases):
            if not isinstance(phase, (tuple, list)) or len(phase) != 3:
                raise ValueError(f"record_iteration(): phases[{n}] must be (name, start_ns, end_ns), got {describe(phase)[:100]}")
            name, start, end = phase
            start, end = _timestamp(start, f"phase {name!r}'s start"), _timestamp(end, f"phase {name!r}'s end")
            if not start_ns <= start <= end <= end_ns:
                raise ValueError(f"phase {name!r} ({start} to {end}) does not lie in iteration {index} ({start_ns} to {end_ns})")
            resolved.append((self.phase(name, timeline), start, end))
        index = as_step(index, "iteration index")
        index = -1 if index is None else index
        env_steps = None if env_steps is None else as_step(env_steps, "env_steps")
        lane = self._recorder.lane()
        if timeline in lane.open_iterations:
            _logger.warning("otel-rl: record_iteration() inside an open %s iteration of the same thread; nothing is recorded", timeline)
            return
        steps = layout.NO_STEPS if env_steps is None else env_steps
        timeline_id = lane.timeline_id(timeline)
        lane.iteration_mark(layout.RecordKind.ITERATION_START, start_ns, -1, index, steps, timeline_id)
        for phase, start, end in resolved:
            lane.phase(phase, start, end, None)
        lane.iteration_mark(layout.RecordKind.ITERATION_END, end_ns, -1, index, steps, timeline_id)
        if timeline == schema.LEARNER:
            self._last_iteration = index
            if env_steps is not None:
                self._last_env_steps = env_steps

    def _on_iteration(self, iteration: Iteration) -> None:
        if iteration.timeline == schema.LEARNER:
            self._last_iteration = iteration.index
            if iteration.env_steps is not None:
                self._last_env_steps = iteration.env_steps

    def scalars(self, values: Mapping[str, Any], step: int | None = None, env_steps: int | None = None) -> None:
        """Record scalar values (losses, rewards, throughput) at ``step``.

        ``step`` defaults to the current iteration's env steps; ``env_steps``
        (the call's env-steps axis) to the env steps the current iteration
        started at: a loop that knows its count after the iteration's
        sampling (RLlib's result) passes it, so that the run's env steps are
        not an iteration behind. numpy and torch
        values are converted with one host transfer per call; an array or
        tensor of several elements is recorded as its mean (one warning); NaN
        and Inf are exported as null with one ``nonfinite`` event per key;
        keys that are not strings and values that are not numbers are dropped
        with one warning naming them.
        """
        if self._closed:
            _logger.warning("otel-rl: scalars() after close(); values dropped")
            return
        step = _step(step)
        values = snapshot(values)
        if self.config.strict:
            for key in values:
                if key not in self._strict_keys:
                    schema.metric_spec(key, strict=True)
                    self._strict_keys.add(key)
        env_steps = self._last_env_steps if env_steps is None else _step(env_steps)
        self._recorder.add_scalars((perf_counter_ns(), values, step, self._last_iteration, env_steps))

    def reward_terms(self, terms: Mapping[str, Any], step: int | None = None, env_steps: int | None = None) -> None:
        """Record a reward's components (``{"upright": 0.8, "effort": -0.1}``) as ``reward/<term>`` scalars.

        Seed 003's reward components: a bare name goes under ``reward/``, a key
        already there stays; values, ``step`` and ``env_steps`` as :meth:`scalars`.
        The panel shows them in its Rewards column.
        """
        if not isinstance(terms, Mapping):
            _logger.warning("otel-rl: reward_terms() takes a mapping of term names to values, got %s; dropped", describe(terms), extra=once("reward-terms-type"))
            return
        # A key that is not a string goes on as it is: scalars() drops it with one warning, running none of its code.
        self.scalars({f"reward/{key}" if isinstance(key, str) and not key.startswith("reward/") else key: value for key, value in terms.items()}, step, env_steps)

    def distribution(self, key: str, values: Any, step: int | None = None) -> None:
        """Record the distribution of ``values`` (actions, advantages, gradient norms...) at ``step``.

        ``values`` is a tensor, array, sequence or number of any shape. The
        training thread makes one host copy (one transfer for a tensor; inputs
        over :data:`otel_rl.core.distributions.MAX_VALUES` elements are evenly
        strided on their device first); the rest happens off it: a histogram
        for TensorBoard and W&B, the OpenTelemetry histogram
        ``rl.distribution``, and ``<key>/min``, ``/mean``, ``/max``, ``/std``
        and quantiles ``/p05`` ... ``/p95`` as scalars in the live records.
        Non-finite values are left out of all of them and reported once
        with a ``nonfinite`` event. Keys follow the rules of :meth:`scalars`.
        """
        if self._closed:
            _logger.warning("otel-rl: distribution() after close(); values dropped")
            return
        step = _step(step)
        array = to_host_array(values, key)
        if array is None:
            return
        record = (perf_counter_ns(), key, array, step, self._last_iteration, self._last_env_steps)
        self._recorder.add_distribution(record)

    def event(self, name: str, **attributes: Any) -> None:
        """Record a named event (``warmup_done``, ``checkpoint_saved``...).

        Attributes may hold any value: they are made JSON-safe by the rules of
        :mod:`otel_rl.base.values`. A name that is not a non-empty string, or is
        longer than the protocol allows, is fixed with one warning.
        """
        if self._closed:
            _logger.warning("otel-rl: event() after close(); event %r dropped", name, extra=once(f"closed-event:{name!r}"))
            return
        name = self._event_name(name)
        safe = json_safe(attributes, self._nonfinite, f"event:{name}") if attributes else {}
        self._recorder.add_event((perf_counter_ns(), name, safe))

    def video(self, key: str, source: Any, fps: float = 30.0, step: int | None = None, caption: str | None = None) -> None:
        """Record a video: ``source`` is frames (an array or tensor ``(T, H, W, C)`` or ``(T, C, H, W)``, a list of
        ``(H, W, C)`` frames; uint8, or floats from 0 to 1) or the path of an ``.mp4``, ``.webm`` or ``.gif`` file.

        The frames are copied once, as they are, and the loop goes on: the agent writes them to an H.264 MP4 in the
        run folder's ``media/`` (a file is copied there), then every output gets a ``media`` record naming it
        (``metrics.jsonl``, W&B, TensorBoard, the live service and its run page). ``step``: default the run's latest.
        A source that is not frames or such a file is one warning, and the call costs nothing else; so is a video
        past the bound of what waits to be written (checked before anything is copied).
        """
        self._media_call("video", key, source, fps, step, caption)

    def image(self, key: str, source: Any, step: int | None = None, caption: str | None = None) -> None:
        """Record an image: an array or tensor ``(H, W)``, ``(H, W, C)`` or ``(C, H, W)``, or the path of a
        ``.png``, ``.jpg``, ``.gif`` or ``.webp`` file; written to PNG in ``media/`` and recorded like :meth:`video`."""
        self._media_call("image", key, source, 0.0, step, caption)

    def _media_call(self, kind: str, key: Any, source: Any, fps: Any, step: Any, caption: Any) -> None:
        if self._closed:
            _logger.warning("otel-rl: %s() after close(); %s dropped", kind, describe(key)[:100], extra=once(f"closed-media:{kind}"))
            return
        out = self._media_out()
        if out is None:
            return
        try:
            key, fps, step, caption = media.check_call(kind, key, fps, step, caption)
            if self._media_missing and not isinstance(source, (str, os.PathLike)):
                raise ValueError(self._media_missing)
            if step is None:
                step = self._last_env_steps if self._last_env_steps is not None else self._last_iteration
            out.hand({"kind": kind, "key": key, "fps": fps, "step": step, "caption": caption, "time_ns": perf_counter_ns()}, source)
        except Refused as exc:
            _logger.warning("otel-rl: %s %r dropped: %s", kind, key[:100], exc, extra=once(f"media-drop:{str(exc)[:12]}"))
        except (TypeError, ValueError, OSError) as exc:
            _logger.warning("otel-rl: %s(%s) ignored: %s", kind, describe(key)[:100], exc, extra=once(f"media-input:{kind}:{describe(key)[:100]}:{str(exc)[:200]}"))

    def _media_out(self) -> MediaOut | None:
        """Where this process's videos and images are handed to the agent, made at the first (None without a run folder: said once)."""
        if self._media is None:
            folder = self.config.run_dir or self.config.trace_output_dir
            if folder is None:
                _logger.warning("otel-rl: videos and images need a run folder (this process has none: run_dir=False); dropped",
                                extra=once("media-no-folder"))  # fmt: skip
                return None
            missing = extras.MEDIA["video"]
            self._media_missing = missing.message() if missing.missing() else ""
            fallback = Path(folder) / media.MEDIA_DIR / HANDOFF_FOLDER
            stem = self._host.media_stem or fallback / f"{self.config.role}-{self.config.rank}-{os.getpid()}"
            self._media = MediaOut(stem, fallback, self._recorder.add_media)
        return self._media

    def _media_wait(self, deadline_s: float) -> bool:
        """Wait until the agent has written (or lost) every video and image handed to it, or ``deadline_s`` (``time.monotonic()``)."""
        while self._media is not None and self._media.held():
            if time.monotonic() >= deadline_s:
                return False
            time.sleep(0.02)
        return True

    def _media_before_end(self, status: str) -> None:
        """The run's videos and images go out before its end (half the shutdown timeout at most; none when killed)."""
        if self._media is not None and status != lifecycle.KILLED:
            if not self._media_wait(time.monotonic() + self.config.shutdown_timeout_s / 2):
                _logger.warning("otel-rl: videos or images still being written follow the run's end record", extra=once("media-after-end"))

    def add_summary(self, **fields: Any) -> None:
        """Add the loop's own fields to ``run_summary.json`` (``backend_diagnostics={...}``, say), beside otel-rl's.

        Values are made JSON-safe like an event's; a later call with the same name replaces the field. A name
        otel-rl writes itself (``status``, ``timelines``...) is left out with one warning; the rest are kept.
        """
        taken = {name: value for name, value in fields.items() if name not in schema.SUMMARY_KEYS}
        for name in sorted(set(fields) - set(taken)):
            _logger.warning("otel-rl: add_summary(%s=...) is left out: run_summary.json writes %r itself", name, name, extra=once(f"summary-field:{name}"))
        if taken:
            self.event(schema.EVENT_SUMMARY_FIELDS, **taken)

    def status(self, text: str) -> None:
        """Say what the run is doing (``"Buffer fill: 8,000/10,000"``, ``"Evaluating"``): the panel's status line
        until the next one (an empty text clears it; one that says error or fail is drawn at once), and a
        ``status`` event in every output."""
        self.event("status", text=text if isinstance(text, str) else describe(text))  # runs none of the object's own code

    def _internal_event(self, name: str, attributes: dict[str, Any]) -> None:
        """An event of otel-rl's own (plain attributes, a name of the schema's)."""
        self._recorder.add_event((perf_counter_ns(), name, attributes))

    def _event_name(self, name: Any) -> str:
        if type(name) is str and 0 < len(name) <= 256 and "\x00" not in name:
            return name
        fixed = name if isinstance(name, str) else json_safe(name)
        fixed = shorten(clean_text(str(fixed) if fixed != "" else "unnamed"))
        _logger.warning(
            "otel-rl: event name %s is not a string of 1 to 256 characters; recorded as %r",
            describe(name),
            fixed,
            extra=once(f"event-name:{fixed}"),
        )
        return fixed

    def _nonfinite(self, path: str, value: Any) -> None:
        """A NaN or Inf replaced by null in a document: one ``nonfinite`` event per path."""
        if path in self._nonfinite_paths or len(self._nonfinite_paths) > 10_000:
            return
        self._nonfinite_paths.add(path)
        self._recorder.add_event((perf_counter_ns(), "nonfinite", {"key": path, "value": repr(value)}))

    @contextmanager
    def run(
        self,
        *,
        family: str | None = None,
        total_steps: int | None = None,
        num_envs: int | None = None,
        config: Mapping[str, Any] | None = None,
        handle_sigterm: bool = True,
    ) -> Iterator[Telemetry]:
        """The whole run: the root span, ended with status finished, failed or killed.

        Args:
            family: algorithm family, ``rl.offpolicy`` or ``rl.onpolicy``.
            total_steps: planned env steps (for progress).
            num_envs: parallel environments.
            config: the resolved training configuration: a mapping (or a
                dataclass, ``argparse.Namespace``...) of any values, made
                JSON-safe by the rules of :mod:`otel_rl.base.values`.
            handle_sigterm: on the main thread, and when SIGTERM has its default
                action, turn SIGTERM into :class:`otel_rl.training.run_scope.Terminated` for the
                run's duration so the run ends as ``killed`` and telemetry is
                flushed; a second SIGTERM during shutdown only shortens it.

        Exceptions propagate unchanged. ``SystemExit(0)`` counts as finished,
        ``KeyboardInterrupt`` and SIGTERM as killed, any other exception as
        failed with its ``Type: message`` as the reason.
        """
        with self._runs.scope(self._closed, family, total_steps, num_envs, config, handle_sigterm):
            yield self

    def start_run(
        self,
        *,
        family: str | None = None,
        total_steps: int | None = None,
        num_envs: int | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> bool:
        """Open a run that :meth:`end_run` (or :meth:`close`) ends: :meth:`run` for code that cannot wrap training in a block.

        The integrations call it when training starts. Arguments as for
        :meth:`run`; SIGTERM is handled as there. Returns False, and opens
        nothing, when a run is open already (the user's own :meth:`run`).
        """
        return self._runs.start(self._closed, family, total_steps, num_envs, config)

    def end_run(self, error: BaseException | None = None) -> None:
        """End the run :meth:`start_run` opened: finished, or as ``error`` ends it (failed, or killed by SIGTERM or Ctrl-C).

        Does nothing when no such run is open. Anything else than an exception or None
        (a message, say) ends the run as failed with its text as the reason, with one warning.
        """
        self._runs.end(error)

    def describe_system(self, system: str, environment: str | None = None, algorithm: str | None = None) -> None:
        """Name the RL framework training runs on and, when known, its environment and algorithm (the integrations call it).

        They become the resource attributes ``rl.system``,
        ``rl.environment.name`` and ``rl.algorithm`` of the proposed ``rl.*``
        conventions on what is exported from then on (OTLP spans, metrics and
        logs), and a ``framework`` event; the algorithm is also the run
        summary's. An algorithm given to :func:`otel_rl.init` wins. A value
        that is not a string is dropped with one warning; a repeated
        description records nothing.
        """
        described = {}
        if self.config.algorithm:
            algorithm = None
        for name, value in (("system", system), ("environment", environment), ("algorithm", algorithm)):
            if value is None:
                continue
            if not isinstance(value, str) or not value.strip():
                _logger.warning("otel-rl: describe_system(%s=%s) is not a non-empty string; ignored", name, describe(value))
                continue
            described[name] = clean_text(value.strip(), NAME_LIMIT)
        if described and described != self._described:
            self._described = described
            self._internal_event(schema.EVENT_FRAMEWORK, described)

    def window_timings(self) -> dict[str, float]:
        """Learner timings per iteration since the previous call, under their ``Perf/*`` keys.

        Reads what the pipeline has assembled so far (it trails the training
        thread by at most ``pipeline_interval_s``; :meth:`flush` first for an exact window).
        """
        return self._windows.timings()

    def log_window(self, values: Mapping[str, Any] | None = None, group: Any = None) -> dict[str, float]:
        """The job's view of a log window: timings averaged and throughput summed across ranks.

        ``values`` (``Perf/total_fps``, losses...) join this rank's learner
        timings of the window; with an initialised ``torch.distributed`` and a
        ``group`` they are reduced across ranks with one packed all-reduce
        (see :func:`otel_rl.training.distributed.reduce_across_ranks`) and each
        rank's own timings are gathered. Rank 0 records ``values`` as reduced,
        and each rank's timings under :func:`otel_rl.formats.schema.rank_key`
        (the live view's ranks side by side); the learner's timings under their
        own names are the outputs' (one-second windows, one cadence per curve).
        The ranks' latest env steps are summed (``Perf/job_env_steps``, the axis
        of rank 0's record), so the run's env steps are the job's. Every rank
        gets the whole result back.
        The first window and every :data:`ALIGN_EVERY`-th also measure the
        ranks' clocks (:meth:`align_clocks`). Every rank of ``group`` calls it
        at the same point, as any collective.
        """
        if group is not None and self._windows.count % ALIGN_EVERY == 0:
            self.align_clocks(group)
        reduced, per_rank = self._windows.across_ranks(values, group, self._last_env_steps)
        if self.config.rank == 0:
            # The learner's timings under their own names come from the outputs' one-second windows; written here too, at
            # the loop's cadence, their curves would zig-zag between two. The job's view is each rank's, side by side.
            recorded = {key: v for key, v in reduced.items() if not schema.is_learner_timing(key) or key in (values or {})}
            job_steps = reduced.get(schema.JOB_ENV_STEPS)  # every rank's env steps: the run's are the job's, not rank 0's alone
            self.scalars({**recorded, **{schema.rank_key(rank, key): v for rank, own in enumerate(per_rank) for key, v in own.items()}},
                         env_steps=None if job_steps is None else int(job_steps))
        return reduced

    def align_clocks(self, group: Any = None) -> float:
        """Measure this rank's clock against the first rank's of ``group`` (the default group: rank 0's), in ms.

        A few timed all-reduces (:func:`otel_rl.training.distributed.clock_offsets`);
        the offset is a record of its own (:data:`otel_rl.formats.schema.EVENT_CLOCK_OFFSET`),
        written to the trace as :data:`otel_rl.formats.trace.CLOCK_OFFSET_KEY`,
        which puts this rank's part of the trace on rank 0's clock for
        ``otel-rl analyze`` and a merged trace, however far the machines'
        clocks are apart (the trackers never see it as a curve). :meth:`log_window` calls it; call it yourself after
        ``init_process_group`` in a loop that does not. Every rank of ``group``
        calls it at the same point.
        """
        from otel_rl.training.distributed import clock_offsets

        offset = clock_offsets(self._clock.now_ns, group)[_group_rank(group)]
        if not self._closed:
            self._internal_event(schema.EVENT_CLOCK_OFFSET, {"offset_ms": float(offset), "rank": self.config.rank})
        return offset

    def add_sink(self, sink: RecordSink) -> None:
        """Add a record sink (see :class:`otel_rl.core.pipeline.RecordSink`) to the running pipeline.

        It needs the outputs in this process (``agent="thread"``, or sinks passed to
        ``init()``): with an agent process it warns and adds nothing.
        """
        if not self._host.add_sink(sink):
            _logger.warning("otel-rl: add_sink() needs the outputs in this process (agent='thread'); %r not added", sink)

    def worker_spec(self, role: str, context: Any = None, relay: Any = None, **options: Any) -> WorkerSpec:
        """What a worker process needs to join this run (pass it to the process; see :mod:`otel_rl.worker_processes`).

        ``context`` is the multiprocessing context the worker is started with
        (its queue must come from the same one). ``relay`` replaces that queue
        with another one that reaches the worker (a ``ray.util.queue.Queue``
        for Ray actors): ``put_nowait`` and ``get_nowait`` raising
        ``queue.Full`` and ``queue.Empty``.
        """
        # A worker records into this process's agent, unless a relay is given (a Ray actor may be on another machine).
        agent = self._host.workers_agent if relay is None else None
        if agent is None:
            relay = self._workers.relay(context, relay)
        directory = self.config.trace_output_dir or self.config.run_dir
        return WorkerSpec(
            role=role,
            run_id=self.config.run_id,  # type: ignore[arg-type]
            traceparent=self.traceparent(),
            relay=relay if agent is None else None,
            agent=agent,
            run_dir=str(directory) if directory is not None else None,
            trace_enabled=bool(self.config.trace_enabled),
            options=options,
            service_name=self._service_name,
        )

    def watch_worker(self, process: Any, role: str) -> None:
        """Report a ``worker_crashed`` event (with the exit code) if ``process`` (a ``multiprocessing.Process``
        or a ``subprocess.Popen``) exits abnormally."""
        self._workers.watch(process, role)

    def traceparent(self) -> str:
        """W3C ``traceparent`` of the open run (for worker processes to join the trace)."""
        span_id = self._runs.span_id or self._parent_span_id or new_span_id()
        return f"00-{self.trace_id:032x}-{span_id:016x}-01"

    # -- lifecycle ------------------------------------------------------

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Drain the buffers and push everything to the exporters; True if all finished in time."""
        if self._closed:
            return True
        return self._host.flush(Deadline(timeout_s))

    def close(self, timeout_s: float | None = None) -> None:
        """Drain, export and stop every thread, all within one deadline of ``timeout_s`` (default from the config).

        When it returns, every output has finished (``metrics.jsonl`` holds
        every record, the terminal status among them) or the deadline has
        passed. Idempotent. Calls made after it are ignored with one warning.
        """
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self._atexit)
        closing_since = time.time()  # an upload outcome written after this is this run's end's
        deadline = self._deadline = Deadline(self.config.shutdown_timeout_s if timeout_s is None else timeout_s)
        if self._hurried:
            deadline.shorten(HURRY_S)
        if self._profile is not None:  # training ended inside the window: what was profiled is still written
            self._profile.shutdown(Deadline(deadline.left() / 2))  # in half the deadline at most: the outputs need the rest
        if self._media is not None:  # the videos and images recorded so far, before the run's end (half the time at most)
            self._media_wait(time.monotonic() + deadline.left() / 2)
        # A run start_run() opened and nothing ended: training ended here (at exit, of an uncaught exception?).
        uncaught = getattr(sys, "last_value", None) if self._at_exit else None
        self._runs.end(uncaught)
        if uncaught is not None:  # between init() and the run: the announced run must not stay pending
            self._runs.fail_unopened(self._started_ns, uncaught)
        interrupted = _CloseInterrupt(deadline, self._host)
        try:
            with interrupted:  # a Ctrl-C while the outputs close ends the wait at once (said below), then goes on as one
                self._workers.shutdown(deadline)  # records made for the run first: a crashed worker's event, the last relayed cycles
                if self._cuda_timer is not None:
                    self._cuda_timer.shutdown(Deadline(deadline.left(cap_s=1.0)))
                if self._panel_warnings is not None:
                    self._host.relay_logs()  # the agent's latest warnings, while its panel still draws
                panel_warnings.closing(self._panel_warnings)  # what the outputs say as they close is never lost to a panel that has stopped
                self._host.shutdown(deadline, self._at_exit)
        finally:
            panel_warnings.remove(self._panel_warnings)  # the panel has stopped: later lines go to the terminal as before
            self._panel_warnings = None
            self._runs.sigterm.restore()
            run_folder.forget(self._job_notes)
            run_folder.release(self._run_folder)
        counts = self._host.counts()  # what the outputs said last, once they closed
        if self._run_folder is not None:
            seconds = self._runs.duration_s if self._runs.duration_s is not None else (self._clock.now_ns() - self._started_ns) / 1e9
            uploaded = self._await_upload(closing_since) if self.config.upload_wait_s and self.config.motrix_url else None
            notices.ended(self.config, self._runs.status, seconds, counts.failed_outputs, counts.unwritten, self._last_env_steps, uploaded,
                          counts.trackers_behind)
            terminal.wait_all(deadline.left(cap_s=1.0))  # the end line reaches a terminal that reads; one that stopped costs 1 s at most
        self._report_undelivered(counts.live_undelivered)
        if interrupted.happened:
            where = self.config.run_dir
            _logger.warning("otel-rl: interrupted while closing: the outputs closed at once%s",
                            f"; every record is in {where} (`otel-rl backfill {shlex.quote(str(where))} --url URL` sends them to a service)"
                            if where is not None and self.config.jsonl else "")  # fmt: skip
            raise KeyboardInterrupt

    def _await_upload(self, since: float) -> dict[str, Any] | None:
        """The outcome of the run's upload (``trace_upload.json`` written after ``since``, epoch seconds) within
        ``upload_wait_s``; None when it did not come, or this process does not speak for the job."""
        config = self.config
        if config.run_dir is None or config.role != schema.LEARNER or config.rank != 0:
            return None
        note = config.run_dir / files.TRACE_UPLOAD_FILE
        deadline = Deadline(config.upload_wait_s)
        while deadline.left() > 0:
            try:
                if note.stat().st_mtime >= since:
                    return json.loads(note.read_text())
            except (OSError, ValueError):  # not there yet (it is written whole, atomically)
                pass
            time.sleep(deadline.left(cap_s=0.1))
        return None

    def _report_undelivered(self, count: int) -> None:
        """One warning when the live service did not get every record by the close deadline, with how to send them."""
        if not count:
            return
        config = self.config
        if config.jsonl and config.run_dir is not None:
            how = (f"metrics.jsonl holds them, and a backfill in the background sends them when the service is back (for {RESEND_WINDOW_S:.0f} s; "
                   f"its outcome in {shlex.quote(str(config.run_dir / files.TRACE_UPLOAD_FILE))}); later, "
                   f"otel-rl backfill {shlex.quote(str(config.run_dir))} --url {shlex.quote(str(config.motrix_url))}")
        else:
            how = "without a run folder they are lost"
        _logger.warning("otel-rl: the live service did not get %d of run %s's records by the close deadline; %s", count, config.run_id, how)

    def _close_at_exit(self) -> None:
        self._at_exit = True  # no thread pool can start any more: what needs one must run elsewhere
        self.close()

    def _forked(self) -> None:
        """In a forked child: closed, and the parent's segment written no more."""
        self._closed = True
        atexit.unregister(self._atexit)
        panel_warnings.remove(getattr(self, "_panel_warnings", None))  # a child draws no panel: its lines go to its terminal
        self._recorder.after_fork()

    def _hurry(self) -> None:
        """A second SIGTERM: shorten what is left of the shutdown deadline."""
        self._hurried = True
        if self._deadline is not None:
            self._deadline.shorten(HURRY_S)
            self._host.hurry(self._deadline)

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- health ---------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters of the telemetry itself: pending and dropped records per queue, spans sampled out, the agent.

        With an agent process, what its outputs count is as of its last pass
        (:meth:`flush` first for an exact figure).
        """
        counts = self._host.counts()
        dropped = self._recorder.dropped()
        if self._cuda_timer is not None:
            dropped["cuda_pending"] = self._cuda_timer.pending.dropped
        if self._media is not None:  # refused at the call, and lost by the agent (both counted once)
            dropped["media"] = self._media.refused + (counts.dropped or {}).get("media", 0)
        for queue, n in (counts.dropped or {}).items():
            if queue == "media":
                continue
            # The outputs mirror this recorder's counters (so that they report them): not counted twice.
            dropped[queue] = max(dropped.get(queue, 0), n) if queue in dropped else n
        return {
            "pending": self._host.pending(),
            "dropped": dropped,
            "spans_sampled_out": counts.spans_sampled_out,
            "agent": self._host.mode,
            "agent_pid": self._host.agent_pid(),
        }

    @property
    def tracer_provider(self):
        """The SDK tracer provider for the user's own spans (None when no span exporter is configured)."""
        return self._host.tracer_provider()

    @property
    def meter_provider(self):
        """The SDK meter provider for the user's own instruments (None when no metric exporter is configured)."""
        return self._host.meter_provider()


def _group_rank(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_rank(group)


def _step(step: Any) -> int | None:
    """A ``step`` argument as an int (numpy and torch integers too), or None with one warning."""
    if step is None or (type(step) is int and INT64_MIN <= step <= INT64_MAX):
        return step
    return as_step(step, "step")


INTERRUPTED_S = 0.5
"""What is left of the close deadline after a Ctrl-C during close(): the outputs finish what they can, at once."""


def _moved_id(earlier_id: str, earlier: Path, fresh: Path) -> str:
    """The run id of a run that moved from ``earlier`` to ``fresh`` (``exp`` -> ``exp-2``): the folder's name where the id
    was the folder's, else the id with the same number."""
    return fresh.name if earlier_id == earlier.resolve().name else f"{earlier_id}-{fresh.name.rsplit('-', 1)[1]}"


class _CloseInterrupt:
    """A Ctrl-C (SIGINT) during ``close()``'s wait for the outputs, on the main thread: the first one ends the wait
    at once (the deadline shortened to :data:`INTERRUPTED_S`, the outputs told) instead of raising inside it; the caller
    raises ``KeyboardInterrupt`` when the close is done. A second one raises at once. Only where SIGINT has Python's
    own handler (an application's handler is left alone)."""

    def __init__(self, deadline: Deadline, host: Host) -> None:
        self._deadline, self._host = deadline, host
        self.happened = False
        self._installed = False

    def __enter__(self) -> _CloseInterrupt:
        if threading.current_thread() is threading.main_thread():
            try:
                if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                    signal.signal(signal.SIGINT, self._handle)
                    self._installed = True
            except (ValueError, OSError):
                pass
        return self

    def _handle(self, signum: int, frame: object) -> None:
        if self.happened:
            raise KeyboardInterrupt
        self.happened = True
        self._deadline.shorten(INTERRUPTED_S)
        self._host.hurry(self._deadline)

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            try:
                if signal.getsignal(signal.SIGINT) == self._handle:
                    signal.signal(signal.SIGINT, signal.default_int_handler)
            except (ValueError, OSError):
                pass


FUTURE_S = 60.0
"""How far past ``perf_counter_ns()`` a ``record_iteration()`` may end (clocks of one machine): beyond it, a wrong clock."""


def _timestamp(value: Any, what: str) -> int:
    """A ``time.perf_counter_ns()`` timestamp as a plain int (numpy and torch integers too).

    Raises:
        ValueError: not an integer, or outside the signed 64-bit range.
    """
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{what} must be an integer of nanoseconds (time.perf_counter_ns()), got {describe(value)}") from None
    if not INT64_MIN <= number <= INT64_MAX:
        raise ValueError(f"{what} {number} is outside the 64-bit range of nanoseconds")
    return number

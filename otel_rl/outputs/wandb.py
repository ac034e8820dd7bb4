"""A Weights & Biases run from the same records as every other output.

``wandb=True`` (or ``OTEL_RL_WANDB=1``; the ``wandb`` extra installs the
library) makes one W&B run per otel-rl run: its id is the run id (a resumed
run continues it), its config the run's configuration (secrets already
redacted), every scalar logged against ``env_steps`` (the call's ``step``,
else the env-step count, as in ``metrics.jsonl``, else the iteration), with
``axis/iteration`` and ``axis/env_steps_total`` beside them (either can be a
chart's x axis), ``Perf/*`` phase
timings per window, distributions as W&B histograms, events as a count
series at the step they happened (``events/<name>/count``) and in the
summary (``events/<name>``: count, step and attributes of the last one),
and the end of the run as W&B's exit code (``finished`` 0, ``failed`` 1,
``killed`` 143) with ``otel_rl/status`` and ``otel_rl/reason`` in the summary.

Steps: W&B drops a ``log`` call whose ``step`` is lower than the last one.
Here the x axis is a logged metric (``env_steps``, declared with
``define_metric``) and W&B's own step only counts calls, so a step that goes
back (a restarted job) is plotted where it belongs and nothing is dropped;
otel-rl reports the regression itself (``step_regression`` event).

The run's fields, each an :func:`otel_rl.init` keyword and W&B's own
environment variable (the keyword wins): ``wandb_project``
(``WANDB_PROJECT``; default the run's ``project``, else ``otel-rl``),
``wandb_entity`` (``WANDB_ENTITY``), ``wandb_group`` (``WANDB_RUN_GROUP``;
default the run's ``group``), ``wandb_name`` (``WANDB_NAME``; default the run
id), ``wandb_tags`` (``WANDB_TAGS``, comma-separated), ``wandb_notes``
(``WANDB_NOTES``) and ``wandb_job_type`` (``WANDB_JOB_TYPE``). The config's
``otel_rl`` block carries the provenance: git commit, branch and dirty flag,
the otel-rl version, host, program and arguments (secret-looking ones
redacted).

Mode (``wandb_mode``, ``WANDB_MODE``): ``online``, ``offline``, ``shared``
(several processes writing one online run) or ``disabled`` (the output is left
out). Unset: ``online`` when ``WANDB_API_KEY`` is set, and ``offline``
otherwise (``wandb sync <run_dir>/wandb/offline-run-*`` uploads it later): a
background output never prompts for a login.
W&B's own features are kept as the user configured them: its System tab
samples the training process (also from an agent process), its messages
(the sync hint among them) print unless ``WANDB_SILENT`` says otherwise,
and its console capture records the process W&B runs in (the training
process with ``agent="thread"``; with an agent process, the agent's).
``wandb.init`` runs on this output's thread, so training never waits for W&B
to start; everything goes through :mod:`otel_rl.outputs.tracker` (bounded
queue, failures counted and warned once, within the shutdown deadline).
"""

from __future__ import annotations

import contextlib
import html
import os
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from otel_rl.formats import lifecycle, schema
from otel_rl.base import extras
from otel_rl.base import environment_variables as env
from otel_rl.base.drops import Drops
from otel_rl.base.log import logger
from otel_rl.core.records import RunStart
from otel_rl.outputs.tracker import TrackerSink, TrackerWriter, run_provenance, without_variables

_logger = logger(__name__)

STEP_METRIC = "env_steps"
EXIT_CODES = {lifecycle.FINISHED: 0, lifecycle.FAILED: 1, lifecycle.KILLED: 143}
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def wandb_run_id(run_id: str) -> str:
    """The W&B run id of an otel-rl run: W&B takes letters, digits, ``_ . -`` and at most 128 characters."""
    return _ID_UNSAFE.sub("-", run_id)[:128]


def wandb_sink(config: Any, drops: Drops, pid: int, resumed_after: int | None = None) -> TrackerSink:
    """The W&B output of a run (an :class:`otel_rl.TelemetryConfig`) of training process ``pid``: a :class:`TrackerSink` feeding a :class:`WandbWriter`.

    ``resumed_after``: a resumed run's last step so far, which its steps stay above.

    Raises:
        ImportError: the ``wandb`` package is not installed (``pip install 'otel-rl[wandb]'``).
    """
    extras.require(extras.OUTPUTS["wandb"])  # here, rather than failing later on the writer's thread
    writer = WandbWriter(config.run_id, config.run_dir, drops, fields=config.wandb_fields(), resume=config.resume, pid=pid)
    writer.media_root = config.run_dir  # videos and images go with the run
    return TrackerSink(writer, resumed_after=resumed_after)


class WandbWriter(TrackerWriter):
    """Logs queued items to one W&B run, started and finished on this output's own thread."""
    title = "W&B"


    def __init__(
        self,
        run_id: str,
        directory: Path | None,
        drops: Drops,
        *,
        fields: dict[str, Any] | None = None,
        resume: bool = False,
        pid: int | None = None,
    ) -> None:
        """``fields``: ``wandb.init``'s project, entity, group, name, tags, notes, mode and job type (:meth:`otel_rl.TelemetryConfig.wandb_fields`).

        ``pid``: the training process, whose CPU and memory W&B's System tab shows (default: this process).
        """
        super().__init__("wandb", drops)
        self.pid = os.getpid() if pid is None else pid
        self.run_id = run_id
        self.directory = directory
        self.fields = {"project": "otel-rl", "name": run_id, "mode": "offline", **{k: v for k, v in (fields or {}).items() if v not in (None, [])}}
        self.resume = resume
        self._run: Any = None
        self._ended = False
        self._events: dict[str, dict[str, Any]] = {}

    def write(self, items: list[tuple]) -> None:
        import wandb

        for item in items:
            kind = item[0]
            if kind == "start":
                self._start(item[2])
                continue
            run = self._run or self._start(None)
            try:
                if kind == "scalars":
                    _, _, step, values, axes = item
                    row = {k: v for k, v in values.items() if v is not None}
                    if row:
                        if axes:  # the iteration and env steps, either of which a chart can take as its x axis
                            row.update(axes)
                        run.log(row if step is None else {STEP_METRIC: step, **row})
                elif kind == "distribution":
                    _, _, step, key, histogram = item
                    if histogram is not None:
                        value = wandb.Histogram(np_histogram=(histogram.counts, histogram.edges))
                        run.log({key: value} if step is None else {STEP_METRIC: step, key: value})
                elif kind == "event":
                    _, _, step, name, attributes = item
                    seen = self._events.setdefault(name, {"count": 0})
                    seen.update(count=seen["count"] + 1, step=step, attributes=attributes)
                    run.summary[f"events/{name}"] = dict(seen)
                    # Its count as a series too, so the event shows on the charts' axis where it happened.
                    count: dict = {f"events/{name}/count": seen["count"]}
                    if name == schema.EVENT_BOTTLENECK and attributes.get("text"):  # the verdict, readable where it changed
                        count[f"events/{name}/text"] = wandb.Html(f"<p>{html.escape(str(attributes['text']))}</p>", inject=False)
                    run.log(count if step is None else {STEP_METRIC: step, **count})
                elif kind == "media":
                    _, _, step, attributes = item
                    value = _media_value(wandb, self.media_root / attributes["path"], attributes)  # type: ignore[operator]
                    run.log({attributes["key"]: value} if step is None else {STEP_METRIC: step, attributes["key"]: value})
                elif kind == "end":
                    _, _, status, reason = item
                    self._finish(status, reason)
            except Exception:  # one bad item costs itself
                self.skipped(item)

    def _start(self, started: RunStart | None):
        """Start the W&B run (or add the configuration to one started by an earlier record)."""
        import wandb

        config = dict(started.config or {}) if started is not None else {}
        if self._run is not None:
            self._run.config.update(config, allow_val_change=True)
            return self._run
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
        # W&B's own features stay as the user set them (WANDB_CONSOLE, WANDB_SILENT, WANDB_X_DISABLE_STATS...).
        provenance = started.provenance if started is not None else {}
        program = provenance.get("program")
        settings = wandb.Settings(
            x_stats_pid=self.pid,  # its System tab samples the training process, wherever this output runs
            disable_git=True,  # provenance is in the config
            init_timeout=60,
            # The run describes the training script, not the process this output runs in (an agent).
            program=program,
            program_abspath=program if program and os.path.isabs(program) else None,
        )
        # W&B reads a run's arguments from sys.argv, and its fields from its variables again (refusing what otel-rl took).
        with _ARGV_LOCK, _argv(provenance.get("args")), without_variables(env.WANDB_FIELD_VARIABLES):
            self._run = self._init(wandb, config, started, settings)
        self._run.define_metric(STEP_METRIC)
        self._run.define_metric("*", step_metric=STEP_METRIC)
        return self._run

    def _init(self, wandb: Any, config: dict[str, Any], started: RunStart | None, settings: Any) -> Any:
        return wandb.init(
            id=wandb_run_id(self.run_id),
            **self.fields,
            dir=None if self.directory is None else str(self.directory),
            config={**config, "otel_rl": run_provenance(started)},
            resume="allow" if self.resume else None,
            reinit="create_new",  # several Telemetry objects in one process each get their own run
            settings=settings,
        )

    def _finish(self, status: str, reason: str | None) -> None:
        run = self._run
        if run is None or self._ended:
            return
        self._ended = True
        run.summary["otel_rl/status"] = status
        if reason:
            run.summary["otel_rl/reason"] = reason
        run.finish(exit_code=EXIT_CODES.get(status, 1))

    def release(self) -> None:
        """The thread's last act: a run still open (no ``tel.run()``, or its end not recorded) is finished."""
        if self._run is not None and not self._ended:
            try:
                self._ended = True
                self._run.finish(exit_code=0)
            except Exception:  # W&B failing on the way out: nothing left to save
                _logger.warning("otel-rl: the W&B run did not finish cleanly", exc_info=True)


_ARGV_LOCK = threading.Lock()
"""One W&B run starts at a time in a process: each with its own training script's arguments in ``sys.argv``."""


@contextlib.contextmanager
def _argv(args: list[str] | None) -> Iterator[None]:
    """``sys.argv[1:]`` is ``args`` (when given) inside the block."""
    if args is None:
        yield
        return
    saved = sys.argv
    sys.argv = [saved[0] if saved else "", *map(str, args)]
    try:
        yield
    finally:
        sys.argv = saved


def _media_value(wandb: Any, path: Path, attributes: dict[str, Any]) -> Any:
    """The W&B object of a video or image file (W&B uploads it with the run)."""
    caption = attributes.get("caption")
    if attributes.get("type") == "video":
        return wandb.Video(str(path), format=attributes.get("format"), caption=caption)
    return wandb.Image(str(path), caption=caption)

"""A SwanLab run from the same records as every other output.

``swanlab=True`` (or ``OTEL_RL_SWANLAB=1``; the ``swanlab`` extra installs
the library) makes one SwanLab experiment per otel-rl run (per part, for a
resumed run), on this output's own thread: project ``wandb_project``'s
default (the run's ``project``, else ``otel-rl``), named after the run id,
in the run's ``group``, with the run's configuration (secrets already
redacted) and provenance under ``otel_rl``. Every scalar is logged at its
step (the call's ``step``, else the env-step count, else the iteration) with
``axis/iteration`` and ``axis/env_steps_total`` beside it, ``Perf/*`` phase
timings per window, events as a count series (``events/<name>/count``) at the
step they happened; a distribution's statistics (``<key>/mean``, ``/p95``...)
are its scalars (SwanLab has no histogram). The run's end is SwanLab's
state: ``finished`` is ``success``, ``failed`` ``crashed`` (with the reason),
``killed`` ``aborted``.

Mode (``swanlab_mode``, ``SWANLAB_MODE``): ``online`` (SwanLab's cloud;
``cloud``, its older name, is taken too), ``offline`` (the run's file in
``run_dir/swanlab``, which ``swanlab sync`` uploads later), ``local`` (SwanLab's
own dashboard) or ``disabled`` (the output is left out). Unset: ``online``
when ``SWANLAB_API_KEY`` is set, else ``offline``: a background output never
prompts for a login. SwanLab keeps one run per process: a second otel-rl run
in one process (``agent="thread"``) gets none, said once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from otel_rl.formats import lifecycle
from otel_rl.base import extras
from otel_rl.base.drops import Drops
from otel_rl.core.records import RunStart
from otel_rl.outputs.tracker import RowWriter, TrackerSink, run_config

STATES = {lifecycle.FINISHED: "success", lifecycle.FAILED: "crashed", lifecycle.KILLED: "aborted"}


def swanlab_sink(config: Any, drops: Drops, resumed_after: int | None = None) -> TrackerSink:
    """The SwanLab output of a run (an :class:`otel_rl.TelemetryConfig`): a :class:`TrackerSink` feeding a :class:`SwanLabWriter`.

    Raises:
        ImportError: the ``swanlab`` package is not installed (``pip install 'otel-rl[swanlab]'``).
    """
    extras.require(extras.OUTPUTS["swanlab"])  # here, rather than failing later on the writer's thread
    fields = config.wandb_fields()
    folder = None if config.run_dir is None else config.run_dir / "swanlab"
    writer = SwanLabWriter(fields["project"], fields["name"], fields["group"], config.swanlab_mode or "offline", folder, drops)
    writer.media_root = config.run_dir  # images (and GIF videos) go with the run
    return TrackerSink(writer, resumed_after=resumed_after)


class SwanLabWriter(RowWriter):
    """Logs queued items to one SwanLab experiment, started and finished on this output's own thread."""
    title = "SwanLab"


    def __init__(self, project: str, name: str, group: str | None, mode: str, folder: Path | None, drops: Drops) -> None:
        super().__init__("swanlab", drops)
        self.project, self.name, self.group, self.mode, self.folder = project, name, group, mode, folder

    def begin(self, started: RunStart | None) -> Any:
        import swanlab

        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
        return swanlab.init(
            project=self.project, name=self.name, group=self.group, config=run_config(started), mode=self.mode,
            log_dir=None if self.folder is None else str(self.folder),
        )  # fmt: skip

    def log(self, row: dict[str, Any], step: int | None) -> None:
        self.run.log(row, step=step)

    def media(self, path: Path, attributes: dict[str, Any]) -> Any:
        """An image as SwanLab's; a video only as a GIF (SwanLab's videos are GIFs)."""
        import swanlab

        caption = attributes.get("caption")
        if attributes.get("format") == "gif" and attributes.get("type") == "video":
            return swanlab.Video(str(path), caption=caption)
        if attributes.get("type") == "image" and attributes.get("format") in ("png", "jpg", "jpeg"):
            return swanlab.Image(str(path), caption=caption)
        return None

    def end(self, status: str, reason: str | None) -> None:
        state = STATES.get(status, "crashed")
        self.run.finish(state=state, error=(reason or status) if state == "crashed" else None)

"""A Trackio run from the same records as every other output.

``trackio=True`` (or ``OTEL_RL_TRACKIO=1``; the ``trackio`` extra installs
the library) makes one Trackio run per otel-rl run, on this output's own
thread: project ``wandb_project``'s default (the run's ``project``, else
``otel-rl``), named after the run id, in the run's ``group``, with the run's
configuration (secrets already redacted) and provenance under ``otel_rl``.
Every scalar is logged at its step (the call's ``step``, else the env-step
count, else the iteration) with ``axis/iteration`` and
``axis/env_steps_total`` beside it, ``Perf/*`` phase timings per window,
distributions as Trackio histograms, events as a count series
(``events/<name>/count``) at the step they happened. A resumed run continues
its Trackio run.

Mode (``trackio_mode``, ``OTEL_RL_TRACKIO_MODE``): ``local`` (Trackio's
database under ``TRACKIO_DIR``, default ``~/.cache/huggingface/trackio``;
``trackio show`` opens its dashboard), ``online`` (the Hugging Face Space of
``TRACKIO_SPACE_ID``, or the server of ``TRACKIO_SERVER_URL``) or
``disabled`` (the output is left out). Unset: ``online`` when one of those
variables is set, else ``local``. Trackio's own features (its CPU and GPU
sampling) are kept as the user configured them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from otel_rl.base import environment_variables as env
from otel_rl.base import extras
from otel_rl.base.drops import Drops
from otel_rl.core.records import RunStart
from otel_rl.outputs.tracker import RowWriter, TrackerSink, run_config, without_variables


def trackio_sink(config: Any, drops: Drops, resumed_after: int | None = None) -> TrackerSink:
    """The Trackio output of a run (an :class:`otel_rl.TelemetryConfig`): a :class:`TrackerSink` feeding a :class:`TrackioWriter`.

    Raises:
        ImportError: the ``trackio`` package is not installed (``pip install 'otel-rl[trackio]'``).
    """
    extras.require(extras.OUTPUTS["trackio"])  # here, rather than failing later on the writer's thread
    fields = config.wandb_fields()
    writer = TrackioWriter(fields["project"], fields["name"], fields["group"], config.trackio_mode or "local", config.resume, drops)
    writer.media_root = config.run_dir  # videos and images go with the run
    return TrackerSink(writer, resumed_after=resumed_after)


class TrackioWriter(RowWriter):
    """Logs queued items to one Trackio run, started and finished on this output's own thread."""
    title = "Trackio"


    def __init__(self, project: str, name: str, group: str | None, mode: str, resume: bool, drops: Drops) -> None:
        super().__init__("trackio", drops)
        self.project, self.name, self.group, self.mode, self.resume = project, name, group, mode, resume

    def begin(self, started: RunStart | None) -> Any:
        import trackio

        # local: a Space or server named in the environment is not where this run goes
        hidden = (env.TRACKIO_SPACE_ID, env.TRACKIO_SERVER_URL) if self.mode == "local" else ()
        with without_variables(hidden):
            return trackio.init(
                project=self.project, name=self.name, group=self.group, config=run_config(started),
                resume="allow" if self.resume else "never", embed=False,
            )  # fmt: skip

    def log(self, row: dict[str, Any], step: int | None) -> None:
        self.run.log(row, step=step)

    def histogram(self, histogram: Any) -> Any:
        import trackio

        return trackio.Histogram(np_histogram=(histogram.counts, histogram.edges))

    def media(self, path: Path, attributes: dict[str, Any]) -> Any:
        import trackio

        caption = attributes.get("caption")
        if attributes.get("type") == "video":
            return trackio.Video(str(path), caption=caption, format=attributes.get("format"))
        return trackio.Image(str(path), caption=caption)

    def end(self, status: str, reason: str | None) -> None:
        self.run.finish()  # Trackio keeps no end status

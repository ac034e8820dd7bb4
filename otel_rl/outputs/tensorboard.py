"""TensorBoard event files in the run folder, from the same records as every other output.

``tensorboard=True`` (or ``OTEL_RL_TENSORBOARD=1``) writes ``run_dir/tensorboard/``
with the ``tensorboard`` package's own event-file writer: every scalar at its
step (the call's ``step``, else the env-step count, as in ``metrics.jsonl``,
else the iteration), with ``axis/iteration`` and ``axis/env_steps_total``
beside them wherever the loop moved on (so a chart can be read against either),
``Perf/*`` phase timings per window, events as text (``events/<name>``), and
the run's configuration through the HParams plugin (flattened, secrets
already redacted; the session ends with the run's status), so TensorBoard's
HParams table compares runs. A resumed run's part takes in the earlier parts'
events (their HParams sessions left out), so the table shows the run as its
last part ended it.

Distributions are TensorBoard histograms. The pipeline thread only queues
what it received (:mod:`otel_rl.outputs.tracker`: bounded, drops counted
as ``tensorboard``); protobufs are built and written by this output's own
thread. A failing writer is warned about once; training never waits for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from otel_rl.formats import lifecycle
from otel_rl.base import compat, extras
from otel_rl.base.drops import Drops
from otel_rl.outputs.tracker import TrackerSink, TrackerWriter
from otel_rl.run import provenance

MAX_METRICS = 20
"""Scalar tags listed as metrics in the HParams table (training keys first)."""
_HPARAMS_TAGS = "_hparams_/"
_STATUS = {lifecycle.FINISHED: "STATUS_SUCCESS", lifecycle.FAILED: "STATUS_FAILURE", lifecycle.KILLED: "STATUS_FAILURE"}  # TensorBoard has no aborted status


def tensorboard_sink(
    log_dir: Path, drops: Drops, resumed_after: int | None = None, media_root: Path | None = None,
) -> TrackerSink:
    """The TensorBoard output: a :class:`TrackerSink` feeding a :class:`TensorBoardWriter`.

    ``resumed_after``: a resumed run's last step so far, which its steps stay above; ``media_root``: the run folder, whose
    videos (as animated GIFs, which TensorBoard's Images tab plays) and images are written too.

    Raises:
        ImportError: the ``tensorboard`` package is not installed (``pip install 'otel-rl[tensorboard]'``).
    """
    extras.require(extras.OUTPUTS["tensorboard"])  # here, rather than failing later on the writer's thread
    writer = TensorBoardWriter(Path(log_dir), drops)
    writer.media_root = media_root
    return TrackerSink(writer, resumed_after=resumed_after)


class TensorBoardWriter(TrackerWriter):
    """Builds TensorBoard events and writes them with ``tensorboard``'s ``EventFileWriter`` on its own thread."""
    title = "TensorBoard"


    def __init__(self, log_dir: Path, drops: Drops) -> None:
        super().__init__("tensorboard", drops)
        self.log_dir = log_dir
        self._writer: Any = None
        self._tags_seen: set[str] = set()
        self._config: dict[str, Any] | None = None

    def write(self, items: list[tuple]) -> None:
        events = []
        for item in items:
            try:
                events += self._events(item)
            except Exception:  # one bad item costs itself
                self.skipped(item)
        writer = self._open()
        for event in events:
            writer.add_event(event)
        writer.flush()

    def release(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # a failing disk: nothing left to save
                pass

    def _open(self):
        if self._writer is None:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            compat.fast_tensorboard_crc()  # a C CRC where google-crc32c is installed (it comes with the extra)
            self.log_dir.mkdir(parents=True, exist_ok=True)
            earlier = sorted(self.log_dir.glob("events.out.tfevents.*"))
            self._writer = EventFileWriter(str(self.log_dir), flush_secs=5)
            if earlier:
                self._carry_over(earlier)
        return self._writer

    def _carry_over(self, files: list[Path]) -> None:
        """A resumed run: the earlier parts' events move into this part's file, their HParams session left out.

        TensorBoard keeps the first HParams session it reads in a folder, so the
        earlier part's (its configuration, a killed part's failure) would hide
        this one's. The earlier files are removed once their events are written.
        """
        from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader  # the events as written

        for path in files:
            for event in LegacyEventFileLoader(str(path)).Load():
                if event.HasField("file_version"):
                    continue
                if event.HasField("summary"):
                    kept = [v for v in event.summary.value if not v.tag.startswith(_HPARAMS_TAGS)]
                    if not kept:
                        continue
                    del event.summary.value[:]
                    event.summary.value.extend(kept)
                self._writer.add_event(event)
        self._writer.flush()
        for path in files:
            path.unlink(missing_ok=True)

    # -- events --------------------------------------------------------------

    def _events(self, item: tuple) -> list:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary

        kind, time_ns = item[0], item[1]
        wall = time_ns / 1e9
        if kind == "scalars":
            _, _, step, values, axes = item
            self._tags_seen.update(values)
            summary = Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in values.items() if v is not None])
            if axes:  # the iteration and env steps at this step: either can be a chart's axis
                summary.value.extend(Summary.Value(tag=k, simple_value=v) for k, v in axes.items())
            return [Event(wall_time=wall, step=step or 0, summary=summary)]
        if kind == "distribution":
            _, _, step, key, h = item
            histo = HistogramProto(
                min=h.minimum, max=h.maximum, num=h.count, sum=h.total, sum_squares=h.sum_squares,
                bucket_limit=h.edges[1:], bucket=h.counts,
            )  # fmt: skip
            return [Event(wall_time=wall, step=step or 0, summary=Summary(value=[Summary.Value(tag=key, histo=histo)]))]
        if kind == "event":
            _, _, step, name, attributes = item
            text = f"**{name}** `{json.dumps(attributes, sort_keys=True)}`" if attributes else f"**{name}**"
            return [Event(wall_time=wall, step=step or 0, summary=Summary(value=[_text_value(f"events/{name}", text)]))]
        if kind == "media":
            _, _, step, attributes = item
            image = _image_value(self.media_root / attributes["path"], attributes)  # type: ignore[operator]
            return [Event(wall_time=wall, step=step or 0, summary=Summary(value=[image]))]
        if kind == "start":
            self._config = {**dict(item[2].config or {}), **_provenance(item[2].provenance)}
            return [Event(wall_time=wall, summary=_hparams_start(self._config, wall))]
        return [  # "end": the session's status, and the experiment with the metrics seen
            Event(wall_time=wall, summary=_hparams_experiment(self._config or {}, sorted(self._tags_seen))),
            Event(wall_time=wall, summary=_hparams_end(item[2], wall)),
        ]


GIF_MAX_FRAMES = 150
GIF_MAX_WIDTH = 480


def _image_value(path: Path, attributes: dict[str, Any]):
    """A video or image file as a TensorBoard image (Images tab): an image's own bytes, a video as an animated GIF.

    TensorBoard shows what a browser shows in an ``<img>``: a GIF plays, an MP4 does not. A video is decoded
    (imageio-ffmpeg) and written as a GIF of at most :data:`GIF_MAX_FRAMES` frames (evenly taken) and
    :data:`GIF_MAX_WIDTH` pixels wide, at the video's pace.
    """
    from tensorboard.compat.proto.summary_pb2 import Summary

    fmt = attributes.get("format")
    if attributes.get("type") == "image" or fmt == "gif":
        data = path.read_bytes()
    else:
        data = _gif_of(path, float(attributes.get("fps") or 30.0))
    image = Summary.Image(height=int(attributes.get("height") or 0), width=int(attributes.get("width") or 0),
                          colorspace=3, encoded_image_string=data)  # fmt: skip
    return Summary.Value(tag=attributes["key"], image=image)


def _gif_of(path: Path, fps: float) -> bytes:
    import imageio.v3 as iio
    import imageio_ffmpeg
    import numpy as np

    reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
    meta = next(reader)
    width, height = meta["size"]
    frames = [np.frombuffer(frame, np.uint8).reshape(height, width, 3) for frame in reader]
    if not frames:
        raise ValueError(f"{path.name} holds no frame")
    every = max(1, -(-len(frames) // GIF_MAX_FRAMES))
    shrink = max(1, -(-width // GIF_MAX_WIDTH))
    kept = np.stack(frames[::every])[:, ::shrink, ::shrink]
    return bytes(iio.imwrite("<bytes>", kept, extension=".gif", duration=1000.0 * every / max(fps, 1e-3), loop=0))


def _text_value(tag: str, text: str):
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
    from tensorboard.plugins.text import metadata

    tensor = TensorProto(dtype="DT_STRING", string_val=[text.encode("utf-8")], tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
    return Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(display_name=tag, description=""), tensor=tensor)


PROVENANCE_KEYS = ("git_commit", "git_branch", "git_dirty", "otel_rl_version", "host")
"""What of the run's provenance the HParams table shows beside the configuration (under ``provenance/``)."""


def _provenance(found: dict[str, Any] | None) -> dict[str, Any]:
    """The provenance's columns: ``provenance/git_commit``, ``provenance/git_branch``..., those the run has."""
    flat = provenance.flatten(found or {})
    names = {"git_commit": "git.commit", "git_branch": "git.branch", "git_dirty": "git.dirty", "otel_rl_version": "versions.otel_rl", "host": "host"}
    return {f"provenance/{key}": flat[names[key]] for key in PROVENANCE_KEYS if flat.get(names[key]) is not None}


def _hparams(config: dict[str, Any]) -> dict[str, Any]:
    """The configuration flattened into values the HParams plugin takes (numbers, strings, booleans)."""
    out: dict[str, Any] = {}
    for key, value in provenance.flatten(config).items():
        out[key] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return out


def _hparams_summary(tag: str, plugin_data):
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import metadata

    return Summary(value=[Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(plugin_data), tensor=metadata.NULL_TENSOR)])


def _hparams_start(config: dict[str, Any], wall: float):
    from google.protobuf import struct_pb2
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    start = plugin_data_pb2.SessionStartInfo(start_time_secs=wall)
    for key, value in _hparams(config).items():
        if isinstance(value, bool):
            start.hparams[key].CopyFrom(struct_pb2.Value(bool_value=value))
        elif isinstance(value, (int, float)):
            start.hparams[key].CopyFrom(struct_pb2.Value(number_value=value))
        else:
            start.hparams[key].CopyFrom(struct_pb2.Value(string_value=value))
    data = plugin_data_pb2.HParamsPluginData(version=metadata.PLUGIN_DATA_VERSION, session_start_info=start)
    return _hparams_summary(metadata.SESSION_START_INFO_TAG, data)


def _hparams_experiment(config: dict[str, Any], tags: list[str]):
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    kinds = {bool: api_pb2.DATA_TYPE_BOOL, str: api_pb2.DATA_TYPE_STRING}
    infos = [api_pb2.HParamInfo(name=k, type=kinds.get(type(v), api_pb2.DATA_TYPE_FLOAT64)) for k, v in _hparams(config).items()]
    wanted = [t for t in tags if t.startswith(("Train/", "Loss/", "Episode/", "Perf/total_fps"))] or tags
    metrics = [api_pb2.MetricInfo(name=api_pb2.MetricName(tag=t)) for t in wanted[:MAX_METRICS]]
    experiment = api_pb2.Experiment(hparam_infos=infos, metric_infos=metrics)
    data = plugin_data_pb2.HParamsPluginData(version=metadata.PLUGIN_DATA_VERSION, experiment=experiment)
    return _hparams_summary(metadata.EXPERIMENT_TAG, data)


def _hparams_end(status: str, wall: float):
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    end = plugin_data_pb2.SessionEndInfo(status=getattr(api_pb2, _STATUS.get(status, "STATUS_UNKNOWN")), end_time_secs=wall)
    data = plugin_data_pb2.HParamsPluginData(version=metadata.PLUGIN_DATA_VERSION, session_end_info=end)
    return _hparams_summary(metadata.SESSION_END_INFO_TAG, data)

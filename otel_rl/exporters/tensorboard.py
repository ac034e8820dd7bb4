"""TensorBoard event files in the run folder, from the same records as every other output.

``tensorboard=True`` (or ``OTEL_RL_TENSORBOARD=1``) writes ``run_dir/tensorboard/``
with the ``tensorboard`` package's own event-file writer: every scalar at its
step (the call's ``step``, else the env-step count, as in ``metrics.jsonl``),
``Perf/*`` phase timings per window, events as text (``events/<name>``), and
the run's configuration through the HParams plugin (flattened, secrets
already redacted; the session ends with the run's status), so TensorBoard's
HParams table compares runs.

The pipeline thread only queues what it received (bounded: the oldest
scalars go first, counted as ``tensorboard`` drops); protobufs are built and
written by this output's own worker. A failing writer is warned about once;
training never waits for it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from otel_rl import run_metadata
from otel_rl._logging import logger
from otel_rl.background import Deadline, Worker
from otel_rl.drops import Drops
from otel_rl.perf_windows import PerfWindows
from otel_rl.pipeline import PassTotals, RecordSink
from otel_rl.records import EventRecord, RunRecord, ScalarsRecord

_logger = logger(__name__)

TENSORBOARD_DIR = "tensorboard"
CAPACITY = 100_000
MAX_METRICS = 20
"""Scalar tags listed as metrics in the HParams table (training keys first)."""
_STATUS = {"finished": "STATUS_SUCCESS", "failed": "STATUS_FAILURE", "killed": "STATUS_ABORTED"}


class TensorBoardSink(RecordSink):
    """Queues scalars, events and run records for :class:`TensorBoardWriter` (see the module docstring)."""

    def __init__(self, log_dir: Path, drops: Drops, perf_interval_s: float = 1.0) -> None:
        self._writer = TensorBoardWriter(Path(log_dir), drops)
        self._perf = PerfWindows(perf_interval_s)

    def on_run(self, run: RunRecord) -> None:
        if run.end_ns is None:
            self._writer.put(("start", run.start_ns, run.attributes.get("config")))
        else:
            self._flush_perf()
            self._writer.put(("end", run.end_ns, run.status))

    def on_scalars(self, record: ScalarsRecord) -> None:
        step = record.step if record.step is not None else record.env_steps
        self._writer.put(("scalars", record.time_ns, step, record.values))

    def on_event(self, event: EventRecord) -> None:
        self._writer.put(("event", event.time_ns, event.name, event.attributes))

    def on_cycles(self, totals: PassTotals) -> None:
        self._perf.add(totals)

    def on_drain(self, now_ns: int) -> None:
        if self._perf.due():
            self._flush_perf()

    def _flush_perf(self) -> None:
        values = self._perf.take()
        if values:
            self._writer.put(("scalars", time.time_ns(), self._perf.axes["env_steps"], values))

    def flush(self, timeout_s: float) -> bool:
        return self._writer.flush(timeout_s)

    def shutdown(self, timeout_s: float) -> None:
        deadline = Deadline(timeout_s)
        self._flush_perf()
        self._writer.close(deadline)
        self._writer.join(deadline.left())


class TensorBoardWriter(Worker):
    """Builds TensorBoard events and writes them with ``tensorboard``'s ``EventFileWriter`` on its own thread."""

    def __init__(self, log_dir: Path, drops: Drops, interval_s: float = 1.0) -> None:
        super().__init__("otel-rl-tensorboard", interval_s)
        self.log_dir = log_dir
        self._drops = drops
        self._queue: deque[tuple] = deque()
        self._lock = threading.Lock()
        self._writer: Any = None
        self._failed = False
        self._tags_seen: set[str] = set()
        self._config: dict[str, Any] | None = None
        self.start()

    def put(self, item: tuple) -> None:
        """Queue one item (pipeline thread); past :data:`CAPACITY` the oldest scalars make room."""
        with self._lock:
            queue = self._queue
            if len(queue) >= CAPACITY:
                for index, old in enumerate(queue):
                    if old[0] == "scalars":
                        del queue[index]
                        self._drops.add("tensorboard", "scalars")
                        break
                else:
                    self._drops.add("tensorboard", item[0])
                    return
            queue.append(item)

    def has_work(self) -> bool:
        return bool(self._queue)

    def run_once(self) -> None:
        with self._lock:
            items = list(self._queue)
            self._queue.clear()
        if self._failed:
            self._drops.add("tensorboard", "records", len(items))
            return
        events = []
        for item in items:
            try:
                events += self._events(item)
            except Exception:  # one bad item costs itself
                self._drops.add("tensorboard", item[0])
                _logger.warning("otel-rl: could not make a TensorBoard %s event; skipped", item[0], exc_info=True)
        try:
            writer = self._open()
            for event in events:
                writer.add_event(event)
            writer.flush()
        except Exception as exc:
            self._failed = True
            self._drops.add("tensorboard", "records", len(events))
            _logger.warning("otel-rl: cannot write TensorBoard events to %s (%s); TensorBoard output stops", self.log_dir, exc)

    def finish(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # a failing disk: nothing left to save
                pass

    def _open(self):
        if self._writer is None:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._writer = EventFileWriter(str(self.log_dir), flush_secs=5)
        return self._writer

    # -- events --------------------------------------------------------------

    def _events(self, item: tuple) -> list:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        kind, time_ns = item[0], item[1]
        wall = time_ns / 1e9
        if kind == "scalars":
            _, _, step, values = item
            self._tags_seen.update(values)
            summary = Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in values.items() if v is not None])
            return [Event(wall_time=wall, step=step or 0, summary=summary)]
        if kind == "event":
            _, _, name, attributes = item
            text = f"**{name}** `{json.dumps(attributes, sort_keys=True)}`" if attributes else f"**{name}**"
            return [Event(wall_time=wall, summary=Summary(value=[_text_value(f"events/{name}", text)]))]
        if kind == "start":
            self._config = item[2] or {}
            return [Event(wall_time=wall, summary=_hparams_start(self._config, wall))]
        return [  # "end": the session's status, and the experiment with the metrics seen
            Event(wall_time=wall, summary=_hparams_experiment(self._config or {}, sorted(self._tags_seen))),
            Event(wall_time=wall, summary=_hparams_end(item[2], wall)),
        ]


def _text_value(tag: str, text: str):
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
    from tensorboard.plugins.text import metadata

    tensor = TensorProto(dtype="DT_STRING", string_val=[text.encode("utf-8")], tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
    return Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(display_name=tag, description=""), tensor=tensor)


def _hparams(config: dict[str, Any]) -> dict[str, Any]:
    """The configuration flattened into values the HParams plugin takes (numbers, strings, booleans)."""
    out: dict[str, Any] = {}
    for key, value in run_metadata.flatten(config).items():
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

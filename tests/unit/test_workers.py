"""Worker processes join the learner's run: trace parentage over OTLP (spawn and fork), crashes as events."""

from __future__ import annotations

import logging
import multiprocessing as mp
import subprocess
import sys
import time

import pytest
from otlp_receivers import HttpReceiver
from worker_targets import collector, crash

import otel_rl
from otel_rl.config import TelemetryConfig
from otel_rl.telemetry import Telemetry


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_worker_spans_are_children_of_the_run_span(method, monkeypatch, tmp_path):
    receiver = HttpReceiver().start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    try:
        tel = otel_rl.init(run_dir=tmp_path, trace_enabled=True, system_metrics_interval_s=0)
        context = mp.get_context(method)
        with tel.run():
            process = context.Process(target=collector, args=(tel.worker_spec("collector 0", context),))
            process.start()
            process.join(60)
            assert process.exitcode == 0
        tel.close()
    finally:
        receiver.stop()
    spans = receiver.received.spans()
    (run,) = [s for _, s in spans if s.name == "rl.run"]
    cycles = [(r, s) for r, s in spans if s.name == "rl.iteration"]
    assert len(cycles) == 5
    for resource, span in cycles:
        role = {a.key: a.value.string_value for a in resource.attributes}["rl.role"]
        assert role == "collector 0" and span.parent_span_id == run.span_id and span.trace_id == run.trace_id
    from otel_rl.readers.analysis import protobuf_engine, trace_files

    processes = {s.process for s in protobuf_engine.read(trace_files(tmp_path)).slices}
    assert processes == {"collector 0"}  # the learner recorded no phases; the worker's fragment was merged


def test_a_crashed_worker_becomes_a_worker_crashed_event(caplog):
    from otel_rl.core.pipeline import RecordSink

    class Capture(RecordSink):
        def __init__(self):
            self.events = []

        def on_event(self, event):
            self.events.append(event)

    sink = Capture()
    tel = Telemetry(TelemetryConfig(system_metrics_interval_s=0), sinks=[sink])
    context = mp.get_context("spawn")
    bad = context.Process(target=crash, args=(3,))
    good = context.Process(target=crash, args=(0,))
    for process in (bad, good):
        process.start()
    launched = subprocess.Popen([sys.executable, "-c", "raise SystemExit(5)"])  # a worker started as a command
    tel.watch_worker(bad, "collector 1")
    tel.watch_worker(good, "collector 2")
    tel.watch_worker(launched, "collector 3")
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        tel.watch_worker("collector-4.pid", "collector 4")  # not a process: one warning, nothing else
    bad.join(30)
    good.join(30)
    launched.wait(30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len([e for e in sink.events if e.name == "worker_crashed"]) < 2:
        tel.flush()
        time.sleep(0.1)
    tel.close()
    crashed = sorted((e.attributes for e in sink.events if e.name == "worker_crashed"), key=lambda a: a["role"])
    assert crashed == [{"role": "collector 1", "pid": bad.pid, "exit_code": 3}, {"role": "collector 3", "pid": launched.pid, "exit_code": 5}]
    assert [r.getMessage() for r in caplog.records if "watch_worker" in r.getMessage()] == [
        "otel-rl: watch_worker() takes a multiprocessing.Process or a subprocess.Popen, got 'collector-4.pid'; collector 4 is not watched"
    ]

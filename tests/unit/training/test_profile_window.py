"""``init(profile=(start, count))``: torch.profiler's operators inside the run's phases, in the Perfetto trace.

A learner loop with a small torch model runs in a subprocess with the
default agent process; the trace is read back with the analysis reader.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import otel_rl
from otel_rl.base.deadline import Deadline
from otel_rl.config import TelemetryConfig
from otel_rl.core.batches import IterationBatch
from otel_rl.core.records import EventRecord, IterationRecord, PhaseRecord
from otel_rl.formats import schema
from otel_rl.formats.trace import PROFILE_MARKER as MARKER
from otel_rl.formats.trace import PROFILE_MARKERS as MARKERS
from otel_rl.outputs.perfetto.profile import LEAD_NS, KeptIntervals, Op, fit, nested_order
from otel_rl.outputs.perfetto.trace import PerfettoTraceSink
from otel_rl.readers.analysis import protobuf_engine, trace_files

torch = pytest.importorskip("torch")

LOOP = """
import sys, torch, otel_rl
tel = otel_rl.init(run_dir=sys.argv[1], profile=({start}, {count}))
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.Adam(model.parameters())
with tel.run():
    for i in range({iterations}):
        with tel.iteration(i, env_steps=i * 16):
            with tel.phase("collector_wait"):
                batch = [1.0] * 64  # no torch here: only Learning runs operators
            with tel.phase("learning"):
                loss = model(torch.randn(64, 32)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        tel.scalars({{"Loss/critic": float(loss)}})
tel.close()
"""


def run_loop(run_dir: Path, start: int, count: int, iterations: int) -> subprocess.CompletedProcess:
    script = LOOP.format(start=start, count=count, iterations=iterations)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    result = subprocess.run([sys.executable, "-c", script, str(run_dir)], capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def events(run_dir: Path, name: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "event" and r["name"] == name]


def test_operators_sit_inside_the_learning_slices_of_the_profiled_iterations_only(tmp_path):
    run_dir = tmp_path / "run"
    result = run_loop(run_dir, start=4, count=5, iterations=14)
    assert "otel-rl: torch.profiler" not in result.stderr  # no warning of ours

    assert "(metrics.jsonl, trace.perfetto-trace, run_summary.json, run_config.json, profile/: torch.profiler over learner iterations 4 to 8)" in result.stderr
    (profile_event,) = events(run_dir, schema.EVENT_TORCH_PROFILE)
    attributes = profile_event["attributes"]
    assert (attributes["first_iteration"], attributes["iterations"]) == (4, 5)
    kept = Path(attributes["file"])  # the profiler's own trace, for TensorBoard's profiler view and HTA
    assert kept.parent == (run_dir / "profile").resolve() and kept.name.endswith(".pt.trace.json")
    assert any(e.get("cat") == "cpu_op" for e in json.loads(kept.read_text())["traceEvents"])

    model = protobuf_engine.read(trace_files(run_dir))
    slices = model.slices
    iterations = sorted((s for s in slices if s.name == "learner iteration"), key=lambda s: s.start_ns)
    assert len(iterations) == 14
    operators = [s for s in slices if s.category == "torch" and s.name.startswith("aten::")]
    assert len(operators) > 5 * 20  # forward, backward and the optimizer's step, five times

    def phase_of(s):
        while s.parent != -1 and slices[s.parent].category == "torch":
            s = slices[s.parent]
        return slices[s.parent] if s.parent != -1 else None

    profiled = set()
    for op in operators:
        phase = phase_of(op)
        if phase is None:  # an operator between iterations (float(loss)), still within the window
            assert iterations[4].start_ns <= op.start_ns and op.end_ns <= iterations[9].start_ns
            continue
        assert phase.name == "Learning", (op.name, phase.name)
        assert phase.start_ns <= op.start_ns <= op.end_ns <= phase.end_ns
        iteration = slices[phase.parent]
        profiled.add(iterations.index(iteration))
    assert profiled == {4, 5, 6, 7, 8}
    assert not [op for op in operators if op.start_ns < iterations[4].start_ns or op.end_ns > iterations[8].end_ns]

    # The analysis still reads the trace: the operators are not phases.
    report = subprocess.run([sys.executable, "-m", "otel_rl.cli", "analyze", str(run_dir), "--json"], capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    learner = json.loads(report.stdout)["timelines"]["learner"]
    assert learner["cycles"] == 14
    assert set(learner["phases"]) == {"collector_wait", "learning"}
    assert learner["phases"]["learning"]["count"] == 14
    # ...and says what took the profiled phases' time.
    (profiled,) = json.loads(report.stdout)["profile"].values()
    assert (profiled["timeline"], profiled["title"], profiled["phases"]) == ("learner", "Learning", 5)
    assert profiled["operators"] and all(0 < op["share"] <= 1 for op in profiled["operators"])
    assert sum(op["share"] for op in profiled["operators"]) + profiled["outside_operators_share"] <= 1 + 1e-9
    text = subprocess.run([sys.executable, "-m", "otel_rl.cli", "analyze", str(run_dir)], capture_output=True, text=True, timeout=120).stdout
    assert "torch.profiler, learner Learning (5 profiled, " in text and profiled["operators"][0]["name"] in text


def test_a_run_that_ends_inside_the_window_still_writes_what_was_profiled(tmp_path):
    run_dir = tmp_path / "run"
    run_loop(run_dir, start=2, count=100, iterations=6)
    (profile_event,) = events(run_dir, schema.EVENT_TORCH_PROFILE)
    assert (profile_event["attributes"]["first_iteration"], profile_event["attributes"]["iterations"]) == (2, 4)
    slices = protobuf_engine.read(trace_files(run_dir)).slices
    assert any(s.category == "torch" for s in slices)


@pytest.mark.parametrize("failing", ["start", "export_chrome_trace"])
def test_a_failing_profiler_costs_one_warning_and_nothing_else(tmp_path, monkeypatch, caplog, failing):
    def fail(self, *args):
        raise RuntimeError(f"{failing} broke")

    monkeypatch.setattr(torch.profiler.profile, failing, fail)
    run_dir = tmp_path / "run"
    tel = otel_rl.init(run_dir=run_dir, agent="thread", quiet=True, profile=(1, 3))
    with caplog.at_level(logging.WARNING, logger="otel_rl"), tel.run():
        for i in range(8):
            with tel.iteration(i), tel.phase("learning"):
                torch.ones(4).sum()
            tel.scalars({"Loss/critic": float(i)})
    tel.close()
    warnings = [r.getMessage() for r in caplog.records if "torch.profiler" in r.getMessage()]
    assert len(warnings) == 1 and f"{failing} broke" in warnings[0], warnings
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["values"]["Loss/critic"] for r in records if "Loss/critic" in r.get("values", {})] == [float(i) for i in range(8)]
    assert not events(run_dir, schema.EVENT_TORCH_PROFILE)
    assert sum(1 for s in protobuf_engine.read(trace_files(run_dir)).slices if s.name == "learner iteration") == 8


def test_the_window_is_an_option_and_a_variable(monkeypatch, tmp_path):
    assert TelemetryConfig(run_dir=tmp_path, profile=[3, 2]).profile == (3, 2)
    window = TelemetryConfig(run_dir=tmp_path, profile=(np.int64(3), torch.tensor(2))).profile  # numpy and torch integers
    assert window == (3, 2) and all(type(v) is int for v in window)
    with pytest.raises(TypeError, match="profile must be"):
        TelemetryConfig(run_dir=tmp_path, profile=(True, 2))
    for bad, error in (((3, 0), ValueError), ((-1, 2), ValueError), ("3,2", TypeError), ((1.5, 2), TypeError)):
        with pytest.raises(error, match="profile must be"):
            TelemetryConfig(run_dir=tmp_path, profile=bad)
    with pytest.raises(ValueError, match="profile needs a run_dir"):
        TelemetryConfig(profile=(0, 1))
    monkeypatch.setenv("OTEL_RL_PROFILE", "10,5")
    assert TelemetryConfig.from_options(tmp_path).profile == (10, 5)
    monkeypatch.setenv("OTEL_RL_PROFILE", "ten")
    assert TelemetryConfig.from_options(tmp_path).profile is None


def test_an_operator_the_clocks_disagree_on_is_fitted_inside_its_phase():
    phase, child = (1_000, 2_000), (1_500, 1_800)
    ops = [
        Op(990, 1_200, "aten::starts_early", "torch"),  # begins 10 ns before its phase: fitted into it
        Op(1_790, 1_850, "aten::ends_past_the_child", "torch"),  # mostly after the child: starts at its end
        Op(1_400, 1_900, "aten::wraps_the_child", "torch"),  # holds the child whole: kept as it is
        Op(1_450, 1_950, "aten::inside_the_wrapper", "torch"),
    ]
    fitted = {op.name: (op.start_ns, op.end_ns) for op in fit([phase, child], ops)}
    assert fitted["aten::starts_early"] == (1_000, 1_200)
    assert fitted["aten::wraps_the_child"] == (1_400, 1_900)
    assert fitted["aten::inside_the_wrapper"] == (1_450, 1_900)  # ends with the op it began in
    stack: list[tuple[int, int]] = []
    for ts, op in nested_order(fit([phase, child], ops)):  # every END closes the latest BEGIN
        if op is None:
            assert stack.pop()[1] == ts
        else:
            stack.append((op.start_ns, op.end_ns))
    assert not stack


def test_kernels_go_on_stream_tracks_linked_from_their_launches(tmp_path):
    """The CUDA side of a profile (a hand-written chrome trace of the shape Kineto writes), merged by the real sink."""
    pid, tid = 4242, 4243
    markers = [[10_000 * i + 1_000_000, 10_000 * i + 1_001_000] for i in range(MARKERS)]
    markers += [[10_000 * i + 9_000_000, 10_000 * i + 9_001_000] for i in range(MARKERS)]
    trace_events = [
        {"ph": "X", "cat": "user_annotation", "name": MARKER, "pid": pid, "tid": tid, "ts": (before + 400) / 1000, "dur": 0.2}
        for before, _ in markers
    ]
    trace_events += [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": tid, "ts": 3000.0, "dur": 50.0},
        # begins 2 us before its phase by the profiler's clock: fitted into it
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": pid, "tid": tid, "ts": 2898.0, "dur": 10.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid, "ts": 3010.0, "dur": 5.0, "args": {"correlation": 77}},
        {"ph": "X", "cat": "kernel", "name": "sgemm_kernel", "pid": 0, "tid": 7, "ts": 3030.0, "dur": 80.0,
         "args": {"device": 0, "stream": 7, "correlation": 77}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": 3200.0, "dur": 10.0,
         "args": {"device": 0, "stream": 7, "correlation": 78}},
    ]  # fmt: skip
    profile_file = tmp_path / "host_4242.1.pt.trace.json"
    profile_file.write_text(json.dumps({"traceEvents": trace_events}))
    offset = 1_700_000_000_000_000_000
    sink = PerfettoTraceSink(tmp_path / "trace.perfetto-trace", "learner", pid=pid, profile=(0, 1), clock_offset_ns=offset)
    learning = PhaseRecord(schema.phase_spec("learner", "learning"), offset + 2_900_000, offset + 3_500_000, 0, tid, "MainThread")
    attributes = {"file": str(profile_file), "first_iteration": 0, "iterations": 1, "timebase_markers_ns": markers}
    # One pass: its events come before its phases, the profile's before the iteration it covers.
    sink.on_event(EventRecord(offset + 3_700_000, schema.EVENT_TORCH_PROFILE, attributes))
    sink.on_iterations(IterationBatch.of([IterationRecord("learner", 0, 0, offset + 2_800_000, offset + 3_600_000, tid, "MainThread", (learning,), 600_000)]))
    sink.on_drain(offset + 3_800_000)
    sink.shutdown(Deadline(5.0))

    model = protobuf_engine.read([tmp_path / "trace.perfetto-trace"])
    by_name = {s.name: s for s in model.slices}
    assert by_name["aten::mm"].start_ns == offset + 3_000_000 and by_name["aten::mm"].parent == model.slices.index(by_name["Learning"])
    assert (by_name["aten::empty"].start_ns, by_name["aten::empty"].end_ns) == (offset + 2_900_000, offset + 2_908_000)
    kernel, launch = by_name["sgemm_kernel"], by_name["cudaLaunchKernel"]
    assert kernel.category == "torch.gpu" and kernel.track == by_name["Memcpy HtoD"].track != by_name["aten::mm"].track
    assert "GPU 0" in kernel.process and kernel.track.endswith("stream 7 (kernels)")
    assert kernel.start_ns == offset + 3_030_000 and kernel.end_ns == offset + 3_110_000
    assert launch.flows and launch.flows == kernel.flows  # the arrow from the launch to its kernel


def test_the_loop_outside_the_window_is_the_loop_without_one(tmp_path):
    """Outside the window an iteration is the recorder's own object: nothing wraps it."""
    tel = otel_rl.init(run_dir=tmp_path / "run", agent="thread", quiet=True, profile=(100, 2))
    plain = otel_rl.init(run_dir=tmp_path / "plain", agent="thread", quiet=True)
    try:
        assert type(tel.iteration(5)) is type(plain.iteration(5))
        assert type(tel.iteration(100)) is not type(plain.iteration(100))
        assert type(tel.iteration(3, timeline="collector")) is type(plain.iteration(3, timeline="collector"))
        assert type(tel.iteration(500)) is type(plain.iteration(500))  # the loop jumped past the window...
        assert type(tel.iteration(100)) is type(plain.iteration(100))  # ...which is over, profiled or not
    finally:
        tel.close()
        plain.close()


def test_the_trace_keeps_a_second_of_records_before_the_window_and_none_after_it():
    kept = KeptIntervals(start=100, count=5)

    def iteration(index: int, end_ns: int, timeline: str = "learner") -> IterationBatch:
        return IterationBatch.of([IterationRecord(timeline, index, None, end_ns - 1_000, end_ns, 1, "MainThread", (), 0)])

    for i in range(50):  # ten iterations a second, far before the window
        assert kept.add_iterations(iteration(i, i * LEAD_NS // 10))
    assert len(kept.intervals[1]) <= 11  # the last second only
    for i in range(100, 105):
        assert kept.add_iterations(iteration(i, (i + 1000) * LEAD_NS))  # the window: everything from here on
        assert kept.add_iterations(iteration(i, (i + 1000) * LEAD_NS, timeline="collector"))
    assert len(kept.intervals[1]) >= 10
    assert not kept.add_iterations(iteration(105, 2000 * LEAD_NS))  # past the window with no profile: its profile failed


def test_a_window_read_in_the_same_pass_as_its_last_iterations_is_fitted_inside_them(tmp_path):
    """One pass at close takes everything: the profile's event comes before the phases it must nest in."""
    run_dir = tmp_path / "run"
    tel = otel_rl.init(run_dir=run_dir, agent="thread", quiet=True, pipeline_interval_s=600, profile=(1, 3))
    layer = torch.nn.Linear(16, 16)
    with tel.run():
        for i in range(6):
            with tel.iteration(i), tel.phase("learning"):
                layer(torch.randn(8, 16)).sum().backward()
    tel.close()
    slices = protobuf_engine.read(trace_files(run_dir)).slices
    learning = [s for s in slices if s.name == "Learning"]
    operators = [s for s in slices if s.category == "torch" and s.name.startswith("aten::")]
    assert operators
    for op in operators:
        assert any(p.start_ns <= op.start_ns <= op.end_ns <= p.end_ns for p in learning), op.name


def test_a_profiler_of_the_users_own_is_left_running(tmp_path, caplog):
    run_dir = tmp_path / "run"
    tel = otel_rl.init(run_dir=run_dir, agent="thread", quiet=True, profile=(0, 2))
    own = torch.profiler.profile()
    own.start()
    with caplog.at_level(logging.WARNING, logger="otel_rl"), tel.run():
        for i in range(3):
            with tel.iteration(i), tel.phase("learning"):
                torch.ones(4).sum()
    own.stop()
    tel.close()
    assert any(e.name == "aten::sum" for e in own.events())  # the user's session was not cancelled
    assert [r.getMessage() for r in caplog.records if "torch.profiler" in r.getMessage()] == [
        "otel-rl: torch.profiler is already running (its own session); the run goes on unprofiled"
    ]
    assert not events(run_dir, schema.EVENT_TORCH_PROFILE)


def test_a_window_open_at_close_is_written_within_the_shutdown_deadline(tmp_path, monkeypatch, caplog):
    export = torch.profiler.profile.export_chrome_trace

    def slow_export(self, path):
        time.sleep(4)  # a huge window
        return export(self, path)

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", slow_export)
    tel = otel_rl.init(run_dir=tmp_path / "run", agent="thread", quiet=True, profile=(0, 100))
    with tel.run():
        for i in range(3):
            with tel.iteration(i), tel.phase("learning"):
                torch.ones(4).sum()
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        tel.close(timeout_s=1.0)
    assert time.monotonic() - began < 2.0
    assert any("torch.profiler export did not finish within 0.5 s" in r.getMessage() for r in caplog.records)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["kind"] == "run" and records[-1]["status"] == "finished"
    # The export goes on, on its thread: it ends (and writes the file) before the next test's profiler starts.
    (exporting,) = [t for t in threading.enumerate() if t.name == "otel-rl-torch.profiler export"]
    exporting.join(30)
    assert not exporting.is_alive() and list((tmp_path / "run" / "profile").glob("*.pt.trace.json"))


def test_an_exit_inside_the_window_keeps_the_shutdown_deadline(tmp_path):
    script = textwrap.dedent("""
        import sys, time, torch, otel_rl
        export = torch.profiler.profile.export_chrome_trace
        def slow_export(self, path):
            time.sleep(6)  # a huge window
            return export(self, path)
        torch.profiler.profile.export_chrome_trace = slow_export
        tel = otel_rl.init(run_dir=sys.argv[1], quiet=True, profile=(0, 100_000), shutdown_timeout_s=2, system_metrics_interval_s=0)
        tel.start_run()
        for i in range(20):
            with tel.iteration(i), tel.phase("learning"):
                torch.ones(4).sum()
        print(time.monotonic(), flush=True)  # the script ends inside the window, without close()
    """)
    process = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "run")], stdout=subprocess.PIPE, text=True)
    exiting = float(process.stdout.readline())
    assert process.wait(30) == 0
    # The 2 s deadline and the interpreter's own teardown, never the 6 s export: a loaded machine's teardown takes seconds.
    assert time.monotonic() - exiting < 5.0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["kind"] == "run" and records[-1]["status"] == "finished"


@pytest.mark.slow
def test_an_exit_inside_a_long_window_stops_collecting_and_keeps_the_deadline(tmp_path):
    """Stopping torch.profiler turns every event it recorded into results on the training thread: seconds for a long
    window. Past what close() gives it, collection stops at once (the interpreter then exits cleanly) and it is said."""
    script = textwrap.dedent("""
        import sys, time, torch, otel_rl
        tel = otel_rl.init(run_dir=sys.argv[1], profile=(0, 10**6), shutdown_timeout_s=2, system_metrics_interval_s=0, panel=False)
        x = torch.randn(64, 64)
        tel.start_run()
        began, i = time.monotonic(), 0
        while time.monotonic() - began < 8:  # a window of 8 s of small operators: stopping it would take seconds
            with tel.iteration(i, env_steps=i), tel.phase("learning"):
                for _ in range(20):
                    x = torch.tanh(x @ x.T / 64)
            i += 1
        print(time.monotonic(), flush=True)  # the script ends inside the window, without close()
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    process = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "run")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    exiting = float(process.stdout.readline())
    assert process.wait(60) == 0  # a clean exit: a profiler left collecting ends the interpreter with a segmentation fault
    assert time.monotonic() - exiting < 5.0  # the 2 s deadline and the interpreter's teardown, not the seconds of the stop
    said = [line for line in process.stderr.read().splitlines() if "torch.profiler's window" in line]
    assert len(said) == 1 and "is not written" in said[0] and "shutdown_timeout_s keeps it" in said[0]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["kind"] == "run" and records[-1]["status"] == "finished"

"""The Perfetto trace: tracks, nesting, flows and counters parse back with the perfetto protos."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter

import numpy as np
import pytest
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent
from synthetic_trace import write_trace

import otel_rl
from otel_rl.base.deadline import Deadline
from otel_rl.base.drops import Drops
from otel_rl.core.batches import IterationBatch, Phases
from otel_rl.core.records import IterationRecord, PhaseRecord
from otel_rl.formats import schema
from otel_rl.outputs.perfetto.encoder import TraceEncoder
from otel_rl.outputs.perfetto.trace import PerfettoTraceSink
from otel_rl.readers.analysis import analyze, protobuf_engine, trace_files


def instrumented(run_dir, iterations=15, **options):
    tel = otel_rl.init(run_dir=run_dir, trace_enabled=True, **options)

    def collector():
        for t in range(iterations):
            with tel.iteration(t, timeline="collector"):
                with tel.phase("inference_request", "collector"):
                    tel.flow(t + 1)
                with tel.phase("learner_action_wait", "collector"):
                    time.sleep(0.001)
                    tel.flow(t + 1, end=True)
                with tel.phase("env_step", "collector"):
                    time.sleep(0.002)

    thread = threading.Thread(target=collector, name="collector")
    thread.start()
    with tel.run():
        for i in range(iterations):
            with tel.iteration(i, env_steps=8 * i):
                with tel.phase("inference"):
                    tel.flow(i + 1)
                    with tel.phase("inference_forward"):
                        time.sleep(0.001)
                with tel.phase("learning"):
                    time.sleep(0.002)
            tel.scalars({"Perf/total_fps": 100.0 + i, "Loss/critic": 1.0})
    thread.join()
    tel.close()
    return tel


@pytest.mark.parametrize("pure_python", [False, True], ids=["c", "python"])
def test_trace_parses_back_with_tracks_nesting_flows_and_counters(tmp_path, monkeypatch, pure_python):
    if pure_python:
        monkeypatch.setenv("OTEL_RL_PURE_PYTHON", "1")
    instrumented(tmp_path, trace_thread_time=True)
    trace = Trace.FromString((tmp_path / "trace.perfetto-trace").read_bytes())
    descriptors = [p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")]
    processes = [d.process.process_name for d in descriptors if d.HasField("process")]
    threads = {d.thread.thread_name for d in descriptors if d.HasField("thread")}
    counters = {d.name for d in descriptors if d.HasField("counter")}
    assert processes == ["learner"]
    assert threads == {"MainThread", "collector"}
    assert counters == {"Perf/total_fps", "MainThread CPU", "collector CPU"}  # Loss/* is not a counter track
    assert len({d.uuid for d in descriptors}) == len(descriptors)

    events = Counter(TrackEvent.Type.Name(p.track_event.type) for p in trace.packet if p.HasField("track_event"))
    assert events["TYPE_SLICE_BEGIN"] == events["TYPE_SLICE_END"] == 15 * 4 + 15 * 4  # iteration + 3 slices, on each side
    assert events["TYPE_COUNTER"] == 15 + 2 * 15

    model = protobuf_engine.read([tmp_path / "trace.perfetto-trace"])
    by_name = {}
    for s in model.slices:
        by_name.setdefault(s.name, []).append(s)
    forward = by_name["Forward"][0]
    parent = model.slices[forward.parent]
    assert parent.name == "Inference" and model.slices[parent.parent].name == "learner iteration"
    assert parent.start_ns <= forward.start_ns <= forward.end_ns <= parent.end_ns
    # One flow per tick: collector request -> learner inference -> collector action wait (terminating).
    flows = Counter(f for s in model.slices for f in s.flows)
    assert flows == Counter({f: 3 for f in range(1, 16)})
    wait_packets = [p for p in trace.packet if p.track_event.terminating_flow_ids]
    assert len(wait_packets) == 15
    fps = model.counters["Perf/total_fps"]
    assert [v for _, v in fps] == [100.0 + i for i in range(15)]


def _encode(batch: IterationBatch, native: bool, pieces: tuple[tuple[int, int], ...] | None = None) -> bytes:
    """A batch's packets from its columns (``pieces``: iterations first to last, in turns), after its track's descriptors."""
    encoder = TraceEncoder(pid=42, process_name="learner", native=native)
    track, descriptors = encoder.thread_track(batch.thread_id, batch.thread_name)
    bounds = np.concatenate(([0], np.cumsum(batch.counts))).tolist()
    out = b"".join(descriptors)
    for first, last in pieces or ((0, len(batch)),):
        out += encoder.batch(track, batch.phases, bounds[first], bounds[last], batch, (first, last))
    return out


def test_c_and_python_slice_encoders_write_the_same_bytes():
    assert importlib.util.find_spec("otel_rl.outputs.perfetto._slices")  # the test command builds it; without it the writer costs ~10x
    forward = PhaseRecord(schema.phase_spec("learner", "inference_forward"), 150, 180, 1, 1, "t")
    h2d = PhaseRecord(schema.phase_spec("learner", "inference_h2d"), 120, 140, 1, 1, "t")
    inference = PhaseRecord(schema.phase_spec("learner", "inference"), 100, 200, 0, 1, "t", children=(h2d, forward), flows=((7, False), (2**64 - 1, True)))
    learning = PhaseRecord(schema.phase_spec("learner", "learning"), 1_800_000_000_000_000_000, 1_800_000_000_000_000_999, 0, 1, "t")
    iteration = IterationRecord("learner", 3, 2**40, 90, 2_000_000_000_000_000_000, 1, "t", (inference, learning), 0)
    batch = IterationBatch.of([iteration])
    native, python = _encode(batch, True), _encode(batch, False)
    assert native == python
    packets = Trace.FromString(native).packet
    events = [p for p in packets if p.HasField("track_event")]
    names = {i.iid: i.name for p in packets for i in p.interned_data.event_names}
    begins = [(names[p.track_event.name_iid], p.timestamp) for p in events if p.track_event.type == TrackEvent.TYPE_SLICE_BEGIN]
    assert begins == [("learner iteration", 90), ("Inference", 100), ("H2D", 120), ("Forward", 150), ("Learning", 1_800_000_000_000_000_000)]
    assert [p.timestamp for p in events if p.track_event.type == TrackEvent.TYPE_SLICE_END] == [
        140, 180, 200, 1_800_000_000_000_000_999, 2_000_000_000_000_000_000
    ]
    inference_begin = events[1].track_event
    assert list(inference_begin.flow_ids) == [7] and list(inference_begin.terminating_flow_ids) == [2**64 - 1]
    annotations = {a.name: a.int_value for a in events[0].track_event.debug_annotations}
    assert annotations == {"iteration": 3, "env_steps": 2**40}
    assert all(p.trusted_packet_sequence_id == packets[0].trusted_packet_sequence_id for p in packets)


def test_every_phase_is_on_the_timeline_even_when_spans_are_sampled_out(tmp_path):
    tel = instrumented(tmp_path, span_budget_per_s=0)
    model = protobuf_engine.read([tmp_path / "trace.perfetto-trace"])
    assert sum(1 for s in model.slices if s.name == "Learning") == 15
    assert tel.stats()["dropped"]["phases"] == 0


def test_rotation_keeps_both_files_readable(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path, trace_enabled=True, trace_max_bytes=4096)
    for i in range(300):
        with tel.iteration(i):
            with tel.phase("learning"):
                pass
        if i % 50 == 0:
            tel.flush()
    tel.close()
    files = trace_files(tmp_path)
    assert [f.name for f in files] == ["trace.1.perfetto-trace", "trace.perfetto-trace"]
    for path in files:
        trace = Trace.FromString(path.read_bytes())
        first = trace.packet[0]
        assert first.first_packet_on_sequence and first.sequence_flags & 1  # a fresh sequence state
        described = {p.track_descriptor.uuid for p in trace.packet if p.HasField("track_descriptor")}
        used = {p.track_event.track_uuid for p in trace.packet if p.HasField("track_event")}
        assert used and used <= described  # each file describes the tracks its slices are on
    assert os.path.getsize(files[0]) < 4096 + 4096
    model = protobuf_engine.read(files)
    assert 0 < sum(1 for s in model.slices if s.name == "Learning") <= 300


def _learning_iterations(sink: PerfettoTraceSink, count: int) -> None:
    spec = schema.phase_spec("learner", "learning")
    for i in range(count):
        phase = PhaseRecord(spec, i * 10 + 1, i * 10 + 5, 0, 1, "t")
        sink.on_iterations(IterationBatch.of([IterationRecord("learner", i, None, i * 10, i * 10 + 6, 1, "t", (phase,), 4)]))


def test_a_full_queue_waits_for_the_disk_and_loses_nothing(tmp_path):
    drops = Drops()
    sink = PerfettoTraceSink(tmp_path / "t.perfetto-trace", "learner", drops, capacity=10)
    _learning_iterations(sink, 1000)
    sink.shutdown(Deadline(5))
    assert sink.dropped == 0 and drops.totals() == {}
    model = protobuf_engine.read([tmp_path / "t.perfetto-trace"])
    assert len(model.slices) == 2 * 1000


def test_a_full_queue_before_a_stalled_disk_drops_whole_iterations_and_counts_them(tmp_path, monkeypatch):
    from otel_rl.base import loops
    from otel_rl.run import files

    monkeypatch.setattr(loops, "STALL_S", 0.5)
    path = tmp_path / "t.perfetto-trace"
    os.mkfifo(files.partial(path))  # the writer's open() waits for a reader that never comes
    drops = Drops()
    sink = PerfettoTraceSink(path, "learner", drops, capacity=10)
    try:
        _learning_iterations(sink, 1000)
    finally:
        os.close(os.open(files.partial(path), os.O_RDONLY | os.O_NONBLOCK))
        sink.shutdown(Deadline(2))
    # Whole iterations are dropped, counted under the trace's name; the descriptors and names they needed never are.
    # (Those in the queue and the round stuck in open() are written or lost once it is unblocked: counted alike.)
    assert sink.dropped >= 1000 - 2 * 10 - 2 and sink.lost >= sink.dropped and drops.by_kind("perfetto") == {"records": sink.lost}


def test_gpu_streams_get_their_own_process_and_tracks(tmp_path):
    path = write_trace(tmp_path / "t.perfetto-trace", [("learning", 5.0, [])], cycles=4, gpu=[(7, 0.5, 2.0), (9, 1.0, 1.0)])
    trace = Trace.FromString(path.read_bytes())
    names = {(d.process.process_name or d.name) for p in trace.packet if p.HasField("track_descriptor") for d in [p.track_descriptor]}
    assert {"GPU 0", "stream 7", "stream 9"} <= names
    report = analyze(path)
    shares = report.gpu_busy_share
    assert set(shares) == {"GPU 0/stream 7", "GPU 0/stream 9"}
    assert abs(shares["GPU 0/stream 7"] - 2.0 / 5.1) < 0.02


CHILD = textwrap.dedent(
    """
    import sys, time
    import otel_rl
    tel = otel_rl.init(trace_enabled=True, trace_output_dir=sys.argv[1], role="collector 0")
    for t in range(10):
        with tel.iteration(t, timeline="collector"):
            with tel.phase("env_step", "collector"):
                time.sleep(0.002)
    tel.close()
    """
)


def test_worker_fragments_are_merged_into_the_learner_trace(tmp_path):
    subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], check=True, timeout=60)
    assert (tmp_path / "trace-collector-0.perfetto-trace").exists()  # complete: renamed from .partial
    instrumented(tmp_path, iterations=5)
    assert [f.name for f in trace_files(tmp_path)] == ["trace.perfetto-trace"]  # one file to open
    model = protobuf_engine.read(trace_files(tmp_path))
    processes = {s.process for s in model.slices}
    assert processes == {"learner", "collector 0"}
    steps = [s for s in model.slices if s.name == "Env Step" and s.process == "collector 0"]
    assert len(steps) == 10 and all(s.duration_ns >= 2_000_000 for s in steps)


def _iterations() -> IterationBatch:
    """Eight iterations of 0 to 3 phases (two specs), env steps on every other one, as a pass assembles them."""
    specs = (schema.phase_spec("learner", "inference"), schema.phase_spec("learner", "learning"))
    counts = np.array([2, 0, 3, 1, 2, 2, 1, 3])
    phase_ids = np.array([0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1])
    starts = np.arange(8, dtype=np.int64) * 1_000_000 + 5 * 10**17
    phase_starts = np.concatenate([start + 1_000 + np.arange(n) * 200_000 for start, n in zip(starts, counts)])
    phases = Phases(specs, phase_ids, phase_starts, phase_starts + 150_000, np.zeros(14, dtype=np.int16), np.zeros(14, dtype=np.uint64))
    return IterationBatch(
        "learner", (77, "main"), list(range(100, 108)), [i * 8 if i % 2 else None for i in range(8)], starts, starts + 900_000,
        [None] * 8, np.zeros(8, dtype=np.uint64), counts, phases,
    )  # fmt: skip


def test_iterations_encoded_in_pieces_are_the_packets_of_the_whole():
    """One C call per piece of a batch writes what one call for all of it writes, and what the Python twin writes."""
    batch = _iterations()
    whole = _encode(batch, True)
    assert whole == _encode(batch, True, ((0, 3), (3, 8))) == _encode(batch, False, ((0, 5), (5, 8)))
    events = [p.track_event for p in Trace.FromString(whole).packet if p.HasField("track_event")]
    assert sum(e.type == TrackEvent.TYPE_SLICE_BEGIN for e in events) == 8 + 14


def test_a_batch_builds_only_the_records_a_sink_reads():
    """One record built alone is the one the whole batch holds later."""
    batch = _iterations()
    (sampled,) = batch.at([5])
    assert [p.spec.name for p in sampled.phases] == ["learning", "inference"]  # phases 8 and 9 of the batch
    assert (sampled.index, sampled.env_steps, sampled.accounted_ns) == (105, 40, 300_000)
    assert batch[5] is sampled and len(batch) == 8 and [r.index for r in batch] == list(range(100, 108))
    assert all(p.iteration == r.index and p.env_steps == r.env_steps for r in batch for p in r.phases)
    assert batch.first_overlap() is None


def test_a_disk_that_fills_and_frees_again_leaves_a_readable_trace_that_goes_on(small_disk):
    """What the full disk refused waits for it, as metrics.jsonl does; what was written before stays (never emptied by
    the reopening), and what the disk took late and what came after follow it in order: the file reads whole."""
    drops = Drops()
    path = small_disk / "t.perfetto-trace"
    sink = PerfettoTraceSink(path, "learner", drops, fragments="none")  # written in place
    spec = schema.phase_spec("learner", "learning")

    def iterations(first: int, count: int, full: bool = False) -> None:
        for i in range(first, first + count):
            phase = PhaseRecord(spec, i * 10 + 1, i * 10 + 5, 0, 1, "t")
            sink.on_iterations(IterationBatch.of([IterationRecord("learner", i, None, i * 10, i * 10 + 6, 1, "t", (phase,), 4)]))
        assert sink.flush(Deadline(1 if full else 5)) is not full  # a full disk holds them back: not flushed

    iterations(0, 100)
    filler = small_disk / "filler"
    with open(filler, "wb", buffering=0) as fill:  # the disk fills up
        try:
            while True:
                fill.write(b"\0" * 4096)
        except OSError:
            pass
    iterations(100, 100, full=True)  # refused, kept
    assert sink.error == "No space left on device" and sink.lost == 0
    filler.unlink()  # and frees up again
    iterations(200, 100)
    sink.shutdown(Deadline(5))
    model = protobuf_engine.read([path])
    learning = [s for s in model.slices if s.name == "Learning"]
    assert len(learning) == 300 and [s.start_ns for s in learning] == sorted(s.start_ns for s in learning)  # all, in order
    assert sum(1 for s in model.slices if s.name == "learner iteration") == 300
    assert drops.by_kind("perfetto") == {} and sink.error is None and sink.lost == 0

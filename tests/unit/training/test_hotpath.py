"""The C hot path and its pure-Python twin write the same records into a segment."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from otel_rl.base.log import DEDUP
from otel_rl.formats.schema import phase_spec
from otel_rl.shm import segment as shm
from otel_rl.shm.layout import NO_STEPS, RecordKind
from otel_rl.training import misuse
from otel_rl.training import recorder as recorder_module
from otel_rl.training.recorder import IMPLEMENTATIONS, Recorder

IMPLS = sorted(IMPLEMENTATIONS)


def recorder(impl: str | None = None, lane_capacity: int = 4096) -> Recorder:
    segment = shm.Segment(None, b"", lane_capacity)
    return Recorder(segment, lane_capacity, implementation=impl)


def read(rec: Recorder) -> list[np.ndarray]:
    """Every lane's records, as the pipeline's source reads them."""
    reader = shm.SegmentReader(rec.segment.buffer)
    return [reader.take_lane(index, 1 << 20) for index in range(len(reader.lanes()))]


def names(rec: Recorder) -> list[str]:
    return shm.SegmentReader(rec.segment.buffer).update_names()


def test_c_extension_is_built_and_default():
    # The test command builds the package; a missing extension would silently cost 4x per phase.
    assert "c" in IMPLEMENTATIONS
    assert recorder_module.default_implementation() == "c"


def test_pure_python_can_be_forced(monkeypatch):
    monkeypatch.setenv("OTEL_RL_PURE_PYTHON", "1")
    assert recorder().implementation == "python"


def test_c_clock_is_perf_counter():
    from otel_rl.training import _hotpath

    before = time.perf_counter_ns()
    mid = _hotpath.monotonic_ns()
    after = time.perf_counter_ns()
    assert before <= mid <= after


@pytest.mark.parametrize("impl", IMPLS)
def test_records_nesting_and_order(impl):
    rec = recorder(impl)
    outer = rec.new_phase(phase_spec("learner", "inference"))
    inner = rec.new_phase(phase_spec("learner", "inference_forward"))
    with outer:
        with inner:
            pass
    rec.lane().flow(time.perf_counter_ns(), 2**64 + 5, True)  # outside any phase: depth 0
    (records,) = read(rec)
    assert len(rec.lane()) == 3
    first, second, flow = records.tolist()
    table = names(rec)
    assert (table[first[4]], first[5], table[second[4]], second[5]) == ("learner\tinference_forward", 1, "learner\tinference", 0)
    assert second[0] <= first[0] <= first[1] <= second[1]
    assert first[8] == -1  # no exception
    assert (flow[6], flow[2], flow[7], flow[5]) == (RecordKind.FLOW, 5, 1, 0)  # the id's low 64 bits


@pytest.mark.parametrize("impl", IMPLS)
def test_exception_type_is_recorded(impl):
    rec = recorder(impl)
    phase = rec.new_phase(phase_spec("learner", "learning"))
    with pytest.raises(KeyError):
        with phase:
            raise KeyError("x")
    ((record,),) = read(rec)
    assert names(rec)[record["exc"]] == "KeyError"


@pytest.mark.parametrize("impl", IMPLS)
def test_a_full_lane_refuses_and_counts(impl):
    rec = recorder(impl, lane_capacity=10)
    phase = rec.new_phase(phase_spec("learner", "learning"))
    for _ in range(25):
        with phase:
            pass
    lane = rec.lane()
    assert (len(lane), lane.dropped) == (10, 15)
    (records,) = read(rec)
    starts = records["start"].tolist()
    assert len(starts) == 10 and starts == sorted(starts)
    assert rec.dropped()["phases"] == 15


@pytest.mark.parametrize("impl", IMPLS)
def test_records_written_while_the_reader_reads_are_all_seen_or_counted(impl):
    rec = recorder(impl, lane_capacity=4096)
    phase = rec.new_phase(phase_spec("collector", "env_step"))
    total, done = 100_000, threading.Event()

    def record() -> None:
        for i in range(total):
            with phase:
                pass
            if i % 50 == 0:
                time.sleep(0.00001)  # the reader reads much more slowly than this thread records
        done.set()

    thread = threading.Thread(target=record)
    reader = shm.SegmentReader(rec.segment.buffer)
    read_so_far = 0
    thread.start()
    while not done.is_set() or thread.is_alive():
        if reader.lanes():
            read_so_far += len(reader.take_lane(0, 1 << 20))
            reader.commit()
    thread.join()
    read_so_far += len(reader.take_lane(0, 1 << 20))
    assert read_so_far + rec.dropped()["phases"] == total  # every record read or counted, none lost unseen
    assert read_so_far > total // 2


@pytest.mark.parametrize("impl", IMPLS)
def test_lanes_are_per_thread(impl):
    rec = recorder(impl)
    phase = rec.new_phase(phase_spec("collector", "env_step"))
    barrier = threading.Barrier(3)

    def work():
        barrier.wait()  # all three alive at once: no lane is handed on
        with phase:
            pass
        barrier.wait()

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lanes = rec.snapshot_lanes()
    assert len(lanes) == 3
    assert len({lane.thread_id for lane in lanes}) == 3
    assert [len(records) for records in read(rec)] == [1, 1, 1]


@pytest.mark.parametrize("impl", IMPLS)
def test_misuse_warns_and_keeps_stack_intact(impl, caplog):
    rec = recorder(impl)
    a = rec.new_phase(phase_spec("learner", "learning"))
    b = rec.new_phase(phase_spec("learner", "replay_sample"))
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        a.__enter__()
        b.__exit__(None, None, None)  # b was never entered: a stays open
        a.__exit__(None, None, None)
        a.__exit__(None, None, None)  # nothing open any more
    ((record,),) = read(rec)
    assert names(rec)[record["name"]] == "learner\tlearning"
    messages = [r.getMessage() for r in caplog.records]
    assert sum("'replay_sample' exited but it is not open on this thread" in m for m in messages) == 1
    assert sum("'learning' exited but it is not open on this thread" in m for m in messages) == 1
    assert rec.dropped()["phase_misuse"] == 0  # neither exit lost a record


@pytest.mark.parametrize("impl", IMPLS)
def test_nesting_deeper_than_the_limit_warns(impl, caplog):
    rec = recorder(impl)
    phases = [rec.new_phase(phase_spec("learner", f"level_{i}")) for i in range(misuse.MAX_DEPTH + 1)]
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        for phase in phases:
            phase.__enter__()
        for phase in reversed(phases):
            phase.__exit__(None, None, None)
    (records,) = read(rec)
    assert len(records) == misuse.MAX_DEPTH
    assert any("deeper than" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("impl", IMPLS)
def test_iteration_marks_and_misuse(impl, caplog):
    DEDUP.reset()
    rec = recorder(impl)
    entered = []
    make = rec.iteration_factory(on_enter=entered.append, thread_time=True)
    phase = rec.new_phase(phase_spec("learner", "learning"))
    outer = make("learner", 7, 56)
    with caplog.at_level(logging.WARNING):
        with outer:
            with phase:
                pass
            with make("learner", 8, None):  # the same timeline twice: warned, not recorded
                pass
            with make("collector", 0, None):  # another timeline may nest
                pass
        foreign = make("learner", 9, None)
        foreign.__enter__()
        thread = threading.Thread(target=foreign.__exit__, args=(None, None, None))
        thread.start()
        thread.join()
    assert [i.index for i in entered] == [7, 0, 9]
    assert (outer.timeline, outer.index, outer.env_steps) == ("learner", 7, 56)
    (records,) = read(rec)
    table = names(rec)
    marks = records[records["kind"] != RecordKind.PHASE]
    assert [(int(m["kind"]), table[m["name"]], int(m["a"]), int(m["b"])) for m in marks] == [
        (RecordKind.ITERATION_START, "learner", 7, 56),
        (RecordKind.ITERATION_START, "collector", 0, NO_STEPS),
        (RecordKind.ITERATION_END, "collector", 0, NO_STEPS),
        (RecordKind.ITERATION_END, "learner", 7, 56),
        (RecordKind.ITERATION_START, "learner", 9, NO_STEPS),
    ]
    assert (marks["end"] > 0).all()  # thread CPU time
    (phase_record,) = records[records["kind"] == RecordKind.PHASE]
    assert marks[0]["start"] <= phase_record["start"] <= phase_record["end"] <= marks[3]["start"]  # inside its iteration
    assert "iteration 8 entered while iteration 7 is open" in caplog.text
    assert "iteration 9 exited on another thread" in caplog.text


@pytest.mark.parametrize("impl", IMPLS)
def test_both_implementations_pack_scalars_alike(impl):
    from otel_rl.core.pipeline import Batch
    from otel_rl.core.segment_source import SegmentSource

    rec = recorder(impl)
    mixed = {"Loss/a": 1.5, "Loss/b": 2, "Loss/c": None, "Loss/d": True, "Loss/e": -(2**63)}
    rec.add_scalars((123, mixed, 4, 5, None))  # packed; read back call by call (not every value a float)
    rec.add_scalars((124, {1: 2.0}, None, None, None))  # not plain: a message the pipeline checks
    for time_ns in (125, 126):
        rec.add_scalars((time_ns, {"Loss/a": 0.5, "Loss/b": 1.5}, time_ns, None, 7))
    batch = Batch()
    SegmentSource(shm.SegmentReader(rec.segment.buffer)).take(batch)
    first, second, floats = batch.scalars
    assert first == (123, mixed, 4, 5, None) and second == (124, {1: 2.0}, None, None, None)
    assert floats.names == ("Loss/a", "Loss/b") and floats.values.tolist() == [[0.5, 1.5], [0.5, 1.5]]
    assert (floats.times_ns.tolist(), floats.steps, floats.iterations, floats.env_steps) == ([125, 126], [125, 126], [None, None], [7, 7])


@pytest.mark.parametrize("impl", IMPLS)
def test_a_ctrl_c_during_a_name_lookup_is_raised_to_the_loop_never_swallowed(impl, monkeypatch):
    """A KeyboardInterrupt is raised wherever the interpreter is when Ctrl-C arrives: inside the string table's call too."""
    rec = recorder(impl)
    intern = rec.segment.intern
    armed = []

    def interrupted(item):
        if armed and armed.pop():
            raise KeyboardInterrupt
        return intern(item)

    monkeypatch.setattr(rec.segment, "intern", interrupted)
    iterate = rec.iteration_factory(None, False)
    learning = rec.new_phase(phase_spec("learner", "learning"))
    with iterate("learner", 0, None), learning:
        pass  # names known from here on... but an exception's type is looked up when it is first raised
    armed.append(True)
    with pytest.raises(KeyboardInterrupt), learning:
        raise ValueError("diverged")
    assert not armed
    armed.append(True)
    with pytest.raises(KeyboardInterrupt), iterate("collector", 0, None):  # a timeline not seen yet
        pass
    assert not armed
    with iterate("learner", 1, None), learning:  # the loop's state survived: nothing open, nothing lost
        pass
    kinds = [RecordKind(r[6]).name for r in read(rec)[0].tolist()]
    assert kinds.count("PHASE") == 3 and kinds.count("ITERATION_START") == kinds.count("ITERATION_END") == 2, kinds


@pytest.mark.parametrize("impl", IMPLS)
def test_an_iteration_measured_elsewhere_is_written_as_one_measured_here(impl):
    """``iteration_mark`` (what record_iteration writes): the same start and end records as an iteration entered and left."""
    rec = recorder(impl)
    lane = rec.lane()
    timeline = lane.timeline_id("learner")
    lane.iteration_mark(RecordKind.ITERATION_START, 1_000, -1, 7, 56, timeline)
    lane.phase(rec.new_phase(phase_spec("learner", "learning")), 1_100, 1_900, None)
    lane.iteration_mark(RecordKind.ITERATION_END, 2_000, -1, 7, NO_STEPS, timeline)
    (records,) = read(rec)
    start, phase, end = records.tolist()
    assert (start[6], start[0], start[2], start[3], names(rec)[start[4]]) == (RecordKind.ITERATION_START, 1_000, 7, 56, "learner")
    assert (phase[6], phase[0], phase[1], phase[5]) == (RecordKind.PHASE, 1_100, 1_900, 0)
    assert (end[6], end[0], end[3]) == (RecordKind.ITERATION_END, 2_000, NO_STEPS)

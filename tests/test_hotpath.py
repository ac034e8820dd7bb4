"""The C hot path and its pure-Python twin behave the same."""

from __future__ import annotations

import gc
import logging
import threading
import time

import pytest

from otel_rl.base.log import DEDUP
from otel_rl.formats.schema import phase_spec
from otel_rl.training import recorder as recorder_module
from otel_rl.training.recorder import IMPLEMENTATIONS, ITERATION_END, ITERATION_START, Recorder

IMPLS = sorted(IMPLEMENTATIONS)


def test_c_extension_is_built_and_default():
    # The test command builds the package; a missing extension would silently cost 4x per phase.
    assert "c" in IMPLEMENTATIONS
    assert recorder_module.default_implementation() == "c"


def test_pure_python_can_be_forced(monkeypatch):
    monkeypatch.setenv("OTEL_RL_PURE_PYTHON", "1")
    assert Recorder().implementation == "python"


def test_c_clock_is_perf_counter():
    from otel_rl.training import _hotpath

    before = time.perf_counter_ns()
    mid = _hotpath.monotonic_ns()
    after = time.perf_counter_ns()
    assert before <= mid <= after


@pytest.mark.parametrize("impl", IMPLS)
def test_records_nesting_and_order(impl):
    rec = Recorder(implementation=impl)
    outer = rec.new_phase(phase_spec("learner", "inference"))
    inner = rec.new_phase(phase_spec("learner", "inference_forward"))
    with outer:
        with inner:
            pass
    lane = rec.lane()
    lane.append((ITERATION_START, 1, "learner", 0, None))
    assert len(lane) == 3
    records = lane.drain()
    assert len(lane) == 0 and lane.drain() == []
    (p1, s1, e1, d1, x1), (p2, s2, e2, d2, x2), marker = records
    assert (p1, d1, p2, d2) == (inner, 1, outer, 0)
    assert s2 <= s1 <= e1 <= e2
    assert x1 is None and marker[0] is ITERATION_START


@pytest.mark.parametrize("impl", IMPLS)
def test_exception_type_is_recorded(impl):
    rec = Recorder(implementation=impl)
    phase = rec.new_phase(phase_spec("learner", "learning"))
    with pytest.raises(KeyError):
        with phase:
            raise KeyError("x")
    (record,) = rec.lane().drain()
    assert record[4] is KeyError


@pytest.mark.parametrize("impl", IMPLS)
def test_ring_drops_oldest_and_counts(impl):
    rec = Recorder(lane_capacity=10, implementation=impl)
    phase = rec.new_phase(phase_spec("learner", "learning"))
    for _ in range(25):
        with phase:
            pass
    lane = rec.lane()
    assert (len(lane), lane.dropped) == (10, 15)
    records = lane.drain()
    assert len(records) == 10
    starts = [r[1] for r in records]
    assert starts == sorted(starts)


class _YieldsWhenCollected:
    """Garbage whose finalizer gives the GIL away, as any ``__del__`` may."""

    def __init__(self) -> None:
        self.cycle = self  # freed only by the cyclic GC, which allocations inside drain() can start

    def __del__(self) -> None:
        time.sleep(0)


@pytest.mark.parametrize("impl", IMPLS)
def test_records_written_while_a_drain_runs_the_gc_are_kept(impl):
    # drain() allocates the records it returns; an allocation can run the GC, whose
    # finalizers can switch to the recording thread in the middle of the drain.
    rec = Recorder(implementation=impl)
    phase = rec.new_phase(phase_spec("collector", "env_step"))
    total, done = 100_000, threading.Event()

    def record() -> None:
        for i in range(total):
            with phase:
                pass
            if i % 50 == 0:
                time.sleep(0.00001)  # the pipeline drains much more slowly than this thread records
        done.set()

    thread = threading.Thread(target=record)
    drained = 0
    thresholds = gc.get_threshold()
    gc.set_threshold(5, 1, 1)
    try:
        thread.start()
        while not done.is_set() or thread.is_alive():
            for _ in range(20):
                _YieldsWhenCollected()  # the last few are still uncollected when drain() starts
            for lane in rec.snapshot_lanes():
                drained += len(lane.drain())
    finally:
        gc.set_threshold(*thresholds)
        thread.join()
    drained += sum(len(lane.drain()) for lane in rec.snapshot_lanes())
    assert drained + rec.phases_dropped == total  # every record returned or counted, none lost unseen
    assert drained > total // 2


@pytest.mark.parametrize("impl", IMPLS)
def test_lanes_are_per_thread(impl):
    rec = Recorder(implementation=impl)
    phase = rec.new_phase(phase_spec("collector", "env_step"))

    def work():
        with phase:
            pass

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lanes = rec.snapshot_lanes()
    assert len(lanes) == 3
    assert len({lane.thread_id for lane in lanes}) == 3
    assert all(len(lane) == 1 for lane in lanes)


@pytest.mark.parametrize("impl", IMPLS)
def test_misuse_warns_and_keeps_stack_intact(impl, caplog):
    rec = Recorder(implementation=impl)
    a = rec.new_phase(phase_spec("learner", "learning"))
    b = rec.new_phase(phase_spec("learner", "replay_sample"))
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        a.__enter__()
        b.__exit__(None, None, None)  # b was never entered: a stays open
        a.__exit__(None, None, None)
        a.__exit__(None, None, None)  # nothing open any more
    records = rec.lane().drain()
    assert [r[0] for r in records] == [a]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("'replay_sample' exited but it is not open on this thread" in m for m in messages) == 1
    assert sum("'learning' exited but it is not open on this thread" in m for m in messages) == 1
    assert rec.phase_misuse_dropped == 0  # neither exit lost a record


@pytest.mark.parametrize("impl", IMPLS)
def test_nesting_deeper_than_the_limit_warns(impl, caplog):
    rec = Recorder(implementation=impl)
    phases = [rec.new_phase(phase_spec("learner", f"level_{i}")) for i in range(recorder_module.MAX_DEPTH + 1)]
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        for phase in phases:
            phase.__enter__()
        for phase in reversed(phases):
            phase.__exit__(None, None, None)
    assert len(rec.lane().drain()) == recorder_module.MAX_DEPTH
    assert any("deeper than" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("impl", IMPLS)
def test_iteration_marks_and_misuse(impl, caplog):
    DEDUP.reset()
    rec = Recorder(implementation=impl)
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
    records = rec.lane().drain()
    marks = [r for r in records if r[0] in (ITERATION_START, ITERATION_END)]
    assert [(r[0], r[2], r[3], r[4]) for r in marks] == [
        (ITERATION_START, "learner", 7, 56),
        (ITERATION_START, "collector", 0, None),
        (ITERATION_END, "collector", 0, None),
        (ITERATION_END, "learner", 7, 56),
        (ITERATION_START, "learner", 9, None),
    ]
    assert all(isinstance(r[5], int) and r[5] > 0 for r in marks)  # thread CPU time
    assert marks[0][1] <= records[1][1] <= records[1][2] <= marks[3][1]  # the phase lies inside its iteration
    assert "iteration 8 entered while iteration 7 is open" in caplog.text
    assert "iteration 9 exited on another thread" in caplog.text

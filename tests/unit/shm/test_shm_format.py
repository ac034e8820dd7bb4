"""The shared-memory records are defined once: the C structs and the Python layouts are checked against each other."""

import itertools
import random
from pathlib import Path
from time import perf_counter_ns

import numpy as np
import pytest

from otel_rl.base.clock import Clock
from otel_rl.core import assembly
from otel_rl.core.pipeline import Pipeline, RecordSink
from otel_rl.core.segment_source import SegmentSource
from otel_rl.formats.schema import phase_spec
from otel_rl.shm import _frames, layout
from otel_rl.shm import segment as shm
from otel_rl.training import _hotpath  # the test command always builds it
from otel_rl.training.recorder import Recorder


def _python_layout() -> dict[str, dict[str, int]]:
    structs = {declared.name: declared.offsets() for declared in layout.STRUCTS}
    return {**structs, **{kind.__name__: {member.name: member.value for member in kind} for kind in layout.ENUMS}}


@pytest.mark.parametrize("extension", [_hotpath, _frames], ids=["_hotpath", "_frames"])
def test_each_extension_was_compiled_with_the_layout_python_reads(extension):
    """The compiler's offsets and sizes of every shared struct, and every kind and tag, are Python's."""
    assert extension.layout == _python_layout()


def test_the_header_the_extensions_compile_against_is_generated_from_the_layout():
    assert (Path(layout.__file__).parent / "layout.h").read_text() == layout.c_header()


def test_numpy_and_struct_read_the_records_at_the_same_offsets():
    for declared in layout.STRUCTS:
        dtype = np.dtype(declared.numpy())
        assert {name: dtype.fields[name][1] for name in dtype.names} == {f.name: declared.offset(f.name) for f in declared.fields}
        assert dtype.itemsize == declared.struct().size == declared.itemsize
    assert shm.RECORD.itemsize == 48 and shm.SCALAR_ENTRY.itemsize == 16  # what a segment written before holds


def test_the_table_of_packed_scalars_agrees_with_its_struct():
    table = shm.scalars_table(3)
    header = layout.SCALARS_HEADER.offsets()
    assert table.itemsize == header.pop("itemsize") + 3 * shm.SCALAR_ENTRY.itemsize
    assert {name: table.fields[name][1] for name in header} == header
    assert table.fields["entries"][1] == shm.SCALARS_HEADER.size


class _Keep(RecordSink):
    """The scalars blocks and events a pipeline hands over."""

    def __init__(self):
        self.blocks, self.events = [], []

    def on_scalars(self, block):
        self.blocks.append(block)

    def on_event(self, event):
        self.events.append(event)


def _segment_pipeline():
    """A recorder writing a segment, and a pipeline reading it into a :class:`_Keep`."""
    segment = shm.Segment(None, b"", 64)
    sink = _Keep()
    pipeline = Pipeline([SegmentSource(shm.SegmentReader(segment.buffer))], [sink], Clock(), itertools.count(1))
    return Recorder(segment, 64), pipeline, sink


def test_scalars_read_from_a_segment_arrive_as_recorded_in_order():
    """Stretches of one key set go through in bulk; every other record is read and checked alone, in its place."""
    recorder, pipeline, sink = _segment_pipeline()
    calls = [
        ({"Loss/a": 1.0, "Loss/b": 2.0}, 1),
        ({"Loss/a": 3.0, "Loss/b": 4.0}, 2),
        ({"Loss/a": float("nan"), "Loss/b": 5.0}, 3),  # not finite: checked alone
        ({"Loss/a": 6.0, "Loss/c": 7.0}, 4),  # the same length, other keys
        ({"Loss/a": 8, "Loss/b": True}, 5),  # not floats
        ({"loss": 9.0, "Loss/b": 10.0}, 6),  # not a canonical key
        ({"Loss/a": 11.0, "Loss/b": 12.0}, 2),  # a step that goes back
        ({"Loss/a": 13.0, "Loss/b": 14.0}, 7),
    ]
    for values, step in calls:
        recorder.add_scalars((perf_counter_ns(), values, step, None, None))
    pipeline.drain()
    records = [record for block in sink.blocks for record in block]
    assert [r.values for r in records] == [
        {"Loss/a": 1.0, "Loss/b": 2.0},
        {"Loss/a": 3.0, "Loss/b": 4.0},
        {"Loss/a": None, "Loss/b": 5.0},
        {"Loss/a": 6.0, "Loss/c": 7.0},
        {"Loss/a": 8, "Loss/b": True},
        {"custom/loss": 9.0, "Loss/b": 10.0},
        {"Loss/a": 11.0, "Loss/b": 12.0},
        {"Loss/a": 13.0, "Loss/b": 14.0},
    ]
    assert [r.step for r in records] == [step for _, step in calls]
    assert [type(v) for v in records[4].values.values()] == [int, int]  # a bool goes out as 0 or 1
    seqs = sorted([r.seq for r in records] + [e.seq for e in sink.events])
    assert len(set(seqs)) == len(seqs)
    (nonfinite,) = [e for e in sink.events if e.name == "nonfinite"]
    (regression,) = [e for e in sink.events if e.name == "step_regression"]
    assert nonfinite.attributes["key"] == "Loss/a" and records[2].seq > nonfinite.seq
    assert regression.seq > records[6].seq and regression.attributes["step"] == 2
    assert all(r.seq < regression.seq for r in records[:7]) and records[7].seq > regression.seq  # in its place
    finite = [block for block in sink.blocks if any(r is records[1] for r in block)][0]
    assert finite.latest_values() == {"Loss/a": 3.0, "Loss/b": 4.0}
    # Keys known from an earlier pass go through as they are, and a step of theirs that goes back is still reported.
    recorder.add_scalars((perf_counter_ns(), {"Loss/d": 0.0, "Loss/e": 0.0}, 8, None, None))
    pipeline.drain()
    for values, step in [({"Loss/d": 1.0, "Loss/e": 2.0}, 9), ({"Loss/d": 3.0, "Loss/e": 4.0}, 3), ({"Loss/d": 5.0, "Loss/e": 6.0}, 10)]:
        recorder.add_scalars((perf_counter_ns(), values, step, None, None))
    sink.blocks.clear()
    pipeline.drain()
    records = [record for block in sink.blocks for record in block]
    assert [(r.step, r.values["Loss/d"]) for r in records] == [(9, 1.0), (3, 3.0), (10, 5.0)]
    (second,) = [e for e in sink.events if e.name == "step_regression" and e is not regression]
    assert second.attributes == {"keys": ["Loss/d", "Loss/e"], "step": 3, "last_step": 9}
    assert records[1].seq < second.seq < records[2].seq


def test_rising_scalars_of_known_keys_go_through_as_one_table():
    """The steady state: one block naming its keys, seqs in call order, and the steps noted for the next check."""
    recorder, pipeline, sink = _segment_pipeline()
    recorder.add_scalars((perf_counter_ns(), {"Loss/a": 0.0, "Loss/b": 0.0}, 0, None, None))  # the keys become known
    pipeline.drain()
    sink.blocks.clear()
    for step in range(1, 6):
        recorder.add_scalars((perf_counter_ns(), {"Loss/a": float(step), "Loss/b": -float(step)}, step, step, step * 8))
    pipeline.drain()
    (block,) = sink.blocks
    assert block.names == ("Loss/a", "Loss/b") and block.finite
    assert [(r.step, r.iteration, r.env_steps, r.values["Loss/a"]) for r in block] == [(s, s, s * 8, float(s)) for s in range(1, 6)]
    seqs = [r.seq for r in block]
    assert seqs == list(range(seqs[0], seqs[0] + 5))
    assert block.latest() == {"Loss/a": (5.0, block[-1].time_ns), "Loss/b": (-5.0, block[-1].time_ns)}
    # Without a step, env steps are the axis; each table is a block of its own.
    recorder.add_scalars((perf_counter_ns(), {"Loss/c": 1.0}, None, None, 100))
    for env_steps in (101, 102):
        recorder.add_scalars((perf_counter_ns(), {"Loss/a": 1.0, "Loss/b": 2.0}, None, None, env_steps))
    sink.blocks.clear()
    pipeline.drain()
    records = [r for b in sink.blocks for r in b]
    assert [r.env_steps for r in records] == [100, 101, 102]
    assert [b.names for b in sink.blocks] == [("Loss/c",), ("Loss/a", "Loss/b")] and all(b.values.dtype == np.float64 for b in sink.blocks)
    assert not sink.events
    # The table's last step was noted: a later call that goes back is reported.
    recorder.add_scalars((perf_counter_ns(), {"Loss/a": 1.0, "Loss/b": 2.0}, 3, None, None))
    pipeline.drain()
    (regression,) = sink.events
    assert regression.name == "step_regression" and regression.attributes["last_step"] == 102


def test_records_beside_the_run_on_another_axis_leave_the_training_scalars_in_blocks():
    """System metrics step by the env steps, the loop's scalars by its own ``step=``: neither sends the other call by call."""
    from otel_rl.core.inbox import Inbox

    segment, inbox = shm.Segment(None, b"", 64), Inbox()  # the agent's own records (its system metrics) come in beside the segment
    sink = _Keep()
    pipeline = Pipeline([SegmentSource(shm.SegmentReader(segment.buffer)), inbox], [sink], Clock(), itertools.count(1))
    recorder = Recorder(segment, 64)
    step = 0
    for round_ in range(4):
        for _ in range(5):
            step += 1
            recorder.add_scalars((perf_counter_ns(), {"Loss/a": float(step), "Loss/b": 1.0}, step, step, step * 1000))
        inbox.add_scalars((perf_counter_ns(), {"sys/cpu_percent": 5.0}, None, step, step * 1000))  # far above the loop's steps
        sink.blocks.clear()
        pipeline.drain()
        training = [block for block in sink.blocks if "Loss/a" in block.names]
        assert [len(block) for block in training] == [5], round_  # one block a pass, never a record at a time
        assert [len(block) for block in sink.blocks if "sys/cpu_percent" in block.names] == [1]
    assert not sink.events  # no step went back on either axis
    # A step of the loop's that does go back is still reported, though it is below the other axis's highest.
    recorder.add_scalars((perf_counter_ns(), {"Loss/a": 0.0, "Loss/b": 0.0}, 3, None, None))
    pipeline.drain()
    (regression,) = sink.events
    assert regression.attributes == {"keys": ["Loss/a", "Loss/b"], "step": 3, "last_step": 20}


class _Assembled(RecordSink):
    """The iterations and loose phases a pipeline hands over."""

    def __init__(self):
        self.iterations, self.loose = [], []

    def on_iterations(self, batch):
        self.iterations += batch

    def on_phases(self, batch):
        self.loose += batch


def _phase_shape(phase):
    children = [_phase_shape(child) for child in phase.children]
    return phase.spec.name, phase.depth, phase.error, phase.iteration, phase.env_steps, children, phase.start_ns <= phase.end_ns


def _iteration_shape(iteration):
    phases = iteration.phases
    inside = all(iteration.start_ns <= p.start_ns <= p.end_ns <= iteration.end_ns for p in phases)
    accounted = iteration.accounted_ns == sum(p.end_ns - p.start_ns for p in phases)
    cpu = iteration.thread_cpu_ns is not None and iteration.thread_cpu_ns >= 0
    return iteration.timeline, iteration.index, iteration.env_steps, [_phase_shape(p) for p in phases], inside, accounted, cpu


def _training_loop(recorder, drain):
    """Iterations of the steady state, with passes begun mid-iteration and the cases that leave it between them."""
    names = ("collector_wait", "inference", "replay_sample", "learning")
    phases = {name: recorder.new_phase(phase_spec("learner", name)) for name in names}
    forward = recorder.new_phase(phase_spec("learner", "inference_forward"))
    iteration = recorder.iteration_factory(None, True)
    for i in range(60):
        with iteration("learner", i, None if i % 7 == 0 else i * 8):
            for name, phase in phases.items():
                if i in (11, 40) and name == "replay_sample":
                    drain()  # the next pass begins inside this iteration
                try:
                    with phase:
                        if i == 23 and name == "inference":
                            with forward:  # a nested phase
                                pass
                        if i == 31 and name == "learning":
                            raise ValueError("diverged")
                except ValueError:
                    pass
        if i == 47:
            with phases["collector_wait"]:  # a loose phase between iterations
                pass
        if i == 52:
            drain()
    drain()


def test_iterations_found_as_steady_stretches_assemble_as_record_by_record(monkeypatch):
    """The steady state's iterations go through as whole runs; they arrive as the same records, in order, as record by record."""
    runs = []
    found = assembly.steady_stretches

    def noted(records, specs):  # what the assembly found, noted and returned unchanged
        runs.append(found(records, specs))
        return runs[-1]

    monkeypatch.setattr(assembly, "steady_stretches", noted)
    steady, one_by_one = _Assembled(), _Assembled()
    for sink in (steady, one_by_one):
        segment = shm.Segment(None, b"", 4096)
        pipeline = Pipeline([SegmentSource(shm.SegmentReader(segment.buffer))], [sink], Clock(), itertools.count(1))
        _training_loop(Recorder(segment, 4096), pipeline.drain)
        monkeypatch.setattr(assembly, "MIN_STRETCH", 10**9)  # the second time, no run is long enough
    # Stretches of 8 or more plain iterations: a nested phase, an error, a loose phase, a pass's edge cut them.
    first_time = [run for found_in_pass in runs[: len(runs) // 2] for run in found_in_pass]
    assert len(first_time) == 3 and not any(runs[len(runs) // 2 :])
    shapes = [_iteration_shape(it) for it in steady.iterations]
    assert shapes == [_iteration_shape(it) for it in one_by_one.iterations]
    assert [s[1] for s in shapes] == list(range(60)) and all(s[4] and s[5] and s[6] for s in shapes)
    assert shapes[23][3][1][5] == [("inference_forward", 1, None, 23, None if 23 % 7 == 0 else 23 * 8, [], True)]
    assert shapes[31][3][3][2] == "ValueError"
    assert [_phase_shape(p) for p in steady.loose] == [_phase_shape(p) for p in one_by_one.loose]
    assert [p.spec.name for p in steady.loose] == ["collector_wait"]


def test_a_ring_reads_the_same_in_c_and_in_python():
    """Frames of every size around the ring's end (SKIP frames, the tail too short for a header), with budgets cut short."""
    assert _frames is not None  # the test command always builds it
    buffer = bytearray(64 + 1024)
    ring = shm.Ring(buffer, 0, 1024)
    rng = random.Random(5)
    read, pending = 0, []
    for round_ in range(300):
        for _ in range(rng.randrange(1, 6)):
            payload = bytes([round_ % 251]) * rng.randrange(0, 90)
            if ring.put(1 + len(payload) % 7, payload, 1024):
                pending.append((1 + len(payload) % 7, payload))
        budget = rng.choice([8, 64, 1 << 20])
        frames, after, behind = _frames.take_frames(buffer, 0, 1024, read, budget)
        assert (frames, after, behind) == ring.take_in_python(buffer, 0, 1024, read, budget)
        assert frames == pending[: len(frames)] and behind == (len(frames) < len(pending))
        pending = pending[len(frames) :]
        read = after
        ring.read.value = after  # committed: the writer may reuse the room


def test_any_number_of_segments_map_in_one_process_and_their_guards_are_freed_with_them(tmp_path):
    import gc
    import os

    from otel_rl.shm import segment as shm

    def mapped(n: int) -> shm.FileMapping:
        path = tmp_path / f"{n}.seg"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, 4096)
        return shm.FileMapping(fd, 4096)

    descriptors = len(os.listdir(f"/proc/{os.getpid()}/fd"))
    held = mapped(0)
    view = memoryview(held.buffer)  # held, as a C lane holds its segment's mapping past close()
    held.close()
    for n in range(1, 3000):  # more than the guard's table holds, one after the other
        mapping = mapped(n)
        assert mapping.guarded
        mapping.close()
    assert held.guarded and not held.buffer.closed  # still mapped, still guarded
    view.release()
    del held, view, mapping
    gc.collect()
    assert len(os.listdir(f"/proc/{os.getpid()}/fd")) <= descriptors  # every descriptor went with its mapping


def test_the_counts_saved_with_a_commit_are_the_ones_a_reader_taking_over_finds():
    """An agent saves its counts just before each commit; one taking over finds those of the last commit made, also
    when its predecessor died between saving the next counts and committing them (it re-reads that pass)."""
    recorder, pipeline, _ = _segment_pipeline()
    (source,) = [s for s in pipeline.sources if isinstance(s, SegmentSource)]
    assert source.saved_state() is None  # nothing saved: a first reader starts from nothing
    recorder.add_scalars((perf_counter_ns(), {"Loss/a": 1.0}, 1, None, None))
    pipeline.drain()
    assert source.save_state(None, b"counts at the first commit")
    source.commit()
    assert SegmentSource(shm.SegmentReader(source.reader.buffer)).saved_state() == b"counts at the first commit"
    recorder.add_scalars((perf_counter_ns(), {"Loss/a": 2.0}, 2, None, None))
    pipeline.drain()
    assert source.save_state(None, b"counts at the second commit")  # and the reader dies before it commits
    assert SegmentSource(shm.SegmentReader(source.reader.buffer)).saved_state() == b"counts at the first commit"
    source.commit()
    assert SegmentSource(shm.SegmentReader(source.reader.buffer)).saved_state() == b"counts at the second commit"
    assert not source.save_state(None, b"x" * shm.STATE_BYTES)  # too large: refused, the last ones kept
    assert SegmentSource(shm.SegmentReader(source.reader.buffer)).saved_state() == b"counts at the second commit"

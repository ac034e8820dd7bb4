"""The analysis of a job of several ranks, from parts written by the real trace writer with known durations and clocks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from synthetic_trace import MS, T0, cycle

from otel_rl.base.deadline import Deadline
from otel_rl.core.batches import IterationBatch
from otel_rl.core.records import EventRecord
from otel_rl.formats import schema, trace
from otel_rl.outputs.perfetto.trace import PerfettoTraceSink
from otel_rl.readers.analysis import read_trace
from otel_rl.readers.analysis import analyze_model, render_text

CYCLES = 40
SKEW_MS = 250.0


def write_rank(folder, rank: int, learning_ms: float, sync_ms: float, skew_ms: float = 0.0, measured: bool = True) -> None:
    """One rank's part: machine ``rank // 2``, its clock ``skew_ms`` ahead, and (``measured``) the offset it measured."""
    node = rank // 2
    host = f"node{node}"
    sink = PerfettoTraceSink(folder / f"rank{rank}.perfetto-trace", trace.process_name("learner", rank, host), pid=1000 + rank % 2, node=node, host=host)
    t = T0 + int(skew_ms * MS)
    for i in range(CYCLES):
        it, t = cycle("learner", i, t, [("learning", learning_ms, []), ("gradient_sync", sync_ms, [])], 1, "MainThread")
        sink.on_iterations(IterationBatch.of([it]))
    if measured:
        sink.on_event(EventRecord(T0, schema.EVENT_CLOCK_OFFSET, {"offset_ms": skew_ms + 0.01 * rank, "rank": rank}))
    sink.flush(Deadline(10))
    sink.shutdown(Deadline(10))


def job(folder, slow_rank: int | None, skew_ms: float = SKEW_MS, measured: bool = True):
    """Four ranks on two machines taking the same wall time per iteration: the slow rank learns longer, the others sync longer."""
    for rank in range(4):
        slow = rank == slow_rank
        write_rank(folder, rank, 10.0 if slow else 5.0, 1.0 if slow else 6.0, skew_ms if rank >= 2 else 0.0, measured)
    return analyze_model(read_trace(folder)[0])


def test_the_straggler_is_named_with_its_host_phase_and_what_the_others_wait_in(tmp_path):
    report = job(tmp_path, slow_rank=3)
    found = report.straggler
    assert (found.rank, found.host, found.phase, found.others_wait_in) == (3, "node1", "learning", "Gradient Sync")
    assert found.ratio == pytest.approx(2.0, rel=0.01)
    assert found.others_wait_ms_per_iteration == pytest.approx(5.0, rel=0.01)
    assert report.diagnosis.findings[0].finding == "rank 3 is the straggler"
    rows = report.timelines["learner"].ranks
    assert [(r.rank, r.host, r.cycles) for r in rows] == [(0, "node0", CYCLES), (1, "node0", CYCLES), (2, "node1", CYCLES), (3, "node1", CYCLES)]
    assert rows[3].phases["learning"].mean_ms == pytest.approx(10.0, rel=0.01)
    text = render_text(report)
    assert "straggler: rank 3 on node1: Learning 2.0x the median rank" in text
    assert "<- straggler" in [line for line in text.splitlines() if line.strip().startswith("3 node1") and "10.000" in line][0]


def test_ranks_in_step_have_no_straggler(tmp_path):
    report = job(tmp_path, slow_rank=None)
    assert report.straggler is None and "straggler" not in render_text(report)
    assert len(report.timelines["learner"].ranks) == 4


def test_each_machine_is_moved_onto_rank_0s_clock_by_its_measured_offset(tmp_path):
    job(tmp_path, slow_rank=3)
    model, _ = read_trace(tmp_path)
    ends = {}
    for s in model.slices:
        if s.name == "Gradient Sync":
            ends.setdefault(trace.parse_process(s.process)[1], []).append(s.end_ns)
    for first, *others in zip(*(sorted(v) for _, v in sorted(ends.items()))):
        assert all(abs(other - first) < 0.1 * MS for other in others)  # one offset per machine: the median of its ranks'


def test_without_a_measurement_each_part_keeps_its_wall_clock(tmp_path):
    job(tmp_path, slow_rank=3, measured=False)
    model, _ = read_trace(tmp_path)
    starts = {trace.parse_process(s.process)[1]: s.start_ns for s in sorted(model.slices, key=lambda s: -s.start_ns) if s.name == "learner iteration"}
    assert (starts[2] - starts[0]) / MS == pytest.approx(SKEW_MS, abs=0.01)


def test_throughput_counts_each_ranks_env_steps_once(tmp_path):
    report = job(tmp_path, slow_rank=None)
    per_rank = report.env_steps_per_s_by_rank
    assert set(per_rank) == {"0", "1", "2", "3"}
    for rate in per_rank.values():  # 8 env steps per 11 ms iteration
        assert rate == pytest.approx(8 / 0.011, rel=0.01)
    assert report.env_steps_per_s == pytest.approx(4 * 8 / 0.011, rel=0.01)


@pytest.mark.parametrize("name", ["learner", "learner rank 3", "learner rank 3 (node-1.cluster)", "collector 2", "learner rank 0 ()", "weird (x"])
def test_process_names_round_trip(name):
    role, rank, host = trace.parse_process(name)
    assert trace.process_name(role, rank, host) == name or host == ""


def test_machines_that_kept_their_parts_on_their_own_disks_are_read_as_one_job(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    job(shared, slow_rank=3)
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    for folder, ranks in ((node0, (0, 1)), (node1, (2, 3))):
        folder.mkdir()
        for rank in ranks:
            (shared / f"rank{rank}.perfetto-trace").rename(folder / f"rank{rank}.perfetto-trace")
    report = analyze_model(read_trace([node0, node1])[0])
    assert report.straggler.rank == 3 and len(report.timelines["learner"].ranks) == 4
    assert analyze_model(read_trace([node0, node1, node0])[0]).timelines["learner"].cycles == 4 * CYCLES  # a folder named twice counts once
    cli = subprocess.run([sys.executable, "-m", "otel_rl.cli", "analyze", str(node0), str(node1), "--json"], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and json.loads(cli.stdout)["straggler"]["rank"] == 3, cli.stderr


@pytest.mark.parametrize("world", [2, 3, 8])
@pytest.mark.parametrize("slow_rank", [0, 1])
def test_the_rank_that_works_longer_is_the_straggler_never_one_that_waits(tmp_path, world, slow_rank):
    """Two ranks: the waiter's excess in its all-reduce equals the worker's in Learning; the worker is named, and leads the headline."""
    for rank in range(world):
        slow = rank == slow_rank
        write_rank(tmp_path, rank, 20.2 if slow else 10.2, 1.0 if slow else 11.0, measured=False)
    report = analyze_model(read_trace(tmp_path)[0])
    found = report.straggler
    assert (found.rank, found.phase, found.others_wait_in) == (slow_rank, "learning", "Gradient Sync")
    assert report.diagnosis.bottleneck == f"learner rank {slow_rank} (learning, {found.ratio:.1f}x the median rank): the straggler"
    assert render_text(report).startswith(f"bottleneck: learner rank {slow_rank} (learning, ")

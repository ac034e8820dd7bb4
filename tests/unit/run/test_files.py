"""Every name in a run folder, for a job on one machine and on several."""

from __future__ import annotations

from pathlib import Path

import pytest

import otel_rl
from otel_rl.run import files

D = Path("/runs/job")


def test_one_machine_keeps_the_names_it_always_had():
    assert files.trace_part(D, 0) == D / "trace.perfetto-trace"
    assert files.trace_part(D, 2) == D / "trace.resume-2.perfetto-trace"
    assert files.fragment_name("learner", 3) == "trace-learner-rank3.perfetto-trace"
    assert files.fragment_name("collector 0") == "trace-collector-0.perfetto-trace"


def test_each_machine_of_a_job_has_its_own_part_and_fragments():
    assert files.trace_part(D, 0, node=1) == D / "trace.node-1.perfetto-trace"
    assert files.trace_part(D, 1, node=1) == D / "trace.node-1.resume-1.perfetto-trace"
    assert files.fragment_name("learner", 3, node=1) == "trace-node1-learner-rank3.perfetto-trace"
    assert files.fragment_name("learner", 3, node=1).startswith(files.fragment_prefix(1))
    assert not files.fragment_name("learner", 1, node=0).startswith(files.fragment_prefix(1))
    assert files.agent_part(D / "trace.node-1.perfetto-trace", 2).name == "trace.agent-2.node-1.perfetto-trace"
    every = [files.trace_part(D, 0, n).name for n in range(3)] + [files.fragment_name("learner", r, r // 2) for r in range(6)]
    assert all(Path(name).match(files.TRACE_GLOB) for name in every)  # the readers' glob finds every part


def test_a_ranks_place_comes_from_torchruns_variables(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("GROUP_RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    config = otel_rl.TelemetryConfig.from_options(run_dir=Path("/tmp/x"))
    assert (config.rank, config.node_rank, config.local_rank, config.nodes, config.machine) == (5, 1, 1, 2, 1)
    assert not config.first_on_node and config.trace_enabled and not config.jsonl  # its part of the trace, not rank 0's files


@pytest.mark.parametrize(
    "options, says",
    [
        ({"rank": 3, "world_size": 4, "node_rank": 3, "local_world_size": 2}, "node_rank=3"),
        ({"rank": 1, "world_size": 4, "local_world_size": 0}, "local_world_size must be a positive integer"),
        ({"rank": 1, "world_size": 4, "local_rank": "1"}, "local_rank must be an integer"),
    ],
)
def test_a_place_that_does_not_fit_the_job_is_refused_naming_it(options, says):
    with pytest.raises((ValueError, TypeError), match=says):
        otel_rl.TelemetryConfig(**options)


@pytest.mark.parametrize(
    "variables, says",
    [
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK=-1 is not 0 or more"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1"}, "LOCAL_RANK=-1 is not 0 or more"),
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0 is not a number of ranks"),
    ],
)
def test_launcher_variables_that_cannot_place_the_rank_are_refused_naming_the_variables(monkeypatch, variables, says):
    for name in ("RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_NODEID", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"the launcher's variables do not place this rank: {says}"):
        otel_rl.TelemetryConfig.from_options()
    monkeypatch.setenv("RANK", "0")  # a keyword that mends it wins: nothing is said of the variable it replaced
    assert otel_rl.TelemetryConfig.from_options(rank=0, world_size=2, local_rank=0, local_world_size=2).rank == 0


def test_slurm_machines_of_different_sizes_are_read_as_slurm_gives_them(monkeypatch):
    for name, value in {"RANK": "2", "WORLD_SIZE": "3", "SLURM_NODEID": "1", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "2,1"}.items():
        monkeypatch.setenv(name, value)
    for name in ("GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    config = otel_rl.TelemetryConfig.from_options()
    assert (config.node_rank, config.local_rank, config.local_world_size, config.nodes, config.machine) == (1, 0, 1, 2, 1)
    assert config.first_on_node


def test_a_job_of_many_machines_keeps_every_pid_a_valid_trace_pid(tmp_path):
    from synthetic_trace import T0, cycle

    from otel_rl.base.deadline import Deadline
    from otel_rl.core.batches import IterationBatch
    from otel_rl.formats import trace
    from otel_rl.outputs.perfetto.trace import PerfettoTraceSink
    from otel_rl.readers.analysis import read_trace

    assert trace.node_pid(4_194_303, 255) < trace.GPU_PID_BASE
    for node in (0, 1, 255, 256, 4095):  # a thousand-machine job: pids past 255 machines repeat, never overflow int32
        assert 0 < trace.node_pid(4_194_303, node) < 2**31 and trace.local_pid(trace.node_pid(1234, node)) == 1234
        sink = PerfettoTraceSink(tmp_path / f"n{node}.perfetto-trace", trace.process_name("learner", node, f"h{node}"), pid=4_194_303, node=node, host=f"h{node}")
        sink.on_iterations(IterationBatch.of([cycle("learner", 0, T0, [("learning", 1.0, [])], 1, "MainThread")[0]]))
        sink.flush(Deadline(5))
        sink.shutdown(Deadline(5))
    processes = {s.process for s in read_trace(tmp_path)[0].slices}  # every part parses
    assert processes == {trace.process_name("learner", node, f"h{node}") for node in (0, 1, 255, 256, 4095)}


def test_a_launcher_that_sets_only_the_ranks_per_machine_gets_the_machine_derived(monkeypatch):
    for name, value in (("RANK", "3"), ("WORLD_SIZE", "4"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    config = otel_rl.TelemetryConfig.from_options()
    assert (config.node_rank, config.local_rank, config.machine) == (1, 1, 1)

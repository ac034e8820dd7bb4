"""The agent: outputs assembled outside the training process, nothing lost when it dies (real processes, files, server)."""

from __future__ import annotations

import datetime
import enum
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests
from locations import SUPPORT
from ports import free_port

import otel_rl
from otel_rl.agent import directory as agents
from otel_rl.formats.schema import phase_spec
from otel_rl.readers.analysis import protobuf_engine, trace_files
from otel_rl.readers.server import IngestServer
from otel_rl.shm import segment as shm
from otel_rl.shm.layout import MessageKind, RecordKind
from otel_rl.training.lanes import PyLane
from otel_rl.training.recorder import IMPLEMENTATIONS, Recorder

TARGET = SUPPORT / "agent_target.py"
KILLED_AFTER = 60  # iterations the target finishes before it is killed


def train(run_dir: Path, end: str, agent: str = "process", env: dict | None = None) -> int:
    return subprocess.run(
        [sys.executable, str(TARGET), str(run_dir), end, agent], env={**os.environ, **(env or {})}, timeout=120
    ).returncode


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def wait_for_terminal(run_dir: Path, timeout_s: float = 30.0) -> list[dict]:
    """The JSONL records once the agent has written the run's end (it outlives the killed producer)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (run_dir / "metrics.jsonl").exists():
            found = records(run_dir)
            if any(r["kind"] == "run" and r["status"] not in ("pending", "running") for r in found):
                if (run_dir / "run_summary.json").exists() and not _segments_of(run_dir.name):
                    return found
        time.sleep(0.05)
    raise AssertionError(f"the agent did not end the run in {run_dir} within {timeout_s} s")


def unique(name: str) -> str:
    """A run folder's name no other suite on the machine uses at the same time: segments are named after it."""
    return f"{name}-{os.getpid()}"


def _segments_of(run_id: str, pid: int | None = None) -> list[Path]:
    """The segments of ``run_id`` (of process ``pid`` only, when given: another suite on the machine may run
    the same test at the same time)."""
    return [path for path in agents.segment_dir().glob(f"*/{run_id}-*.seg") if pid is None or f"-{pid}-" in path.name]


def learning_slices(run_dir: Path) -> int:
    model = protobuf_engine.read(trace_files(run_dir))
    return sum(1 for s in model.slices if s.name == "Learning")


def check_everything_before_the_kill(run_dir: Path, server_url: str, status: str) -> dict:
    found = wait_for_terminal(run_dir)
    run_id = run_dir.name
    assert [r["status"] for r in found if r["kind"] == "run"] == ["pending", "running", status]
    steps = [r["step"] for r in found if r["kind"] == "scalars" and "Loss/critic" in r["values"]]
    assert steps == [10 * (i + 1) for i in range(KILLED_AFTER)]  # every one, once, in order
    events = [r["attributes"]["iteration"] for r in found if r["kind"] == "event" and r["name"] == "checkpoint_saved"]
    assert events == list(range(0, KILLED_AFTER, 10))
    assert learning_slices(run_dir) == KILLED_AFTER
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert summary["timelines"]["learner"]["iterations"]["count"] == KILLED_AFTER
    stored = requests.get(f"{server_url}/api/v1/runs/{run_id}", timeout=10).json()
    series = requests.get(f"{server_url}/api/v1/runs/{run_id}/scalars", params={"key": "Loss/critic"}, timeout=10).json()
    assert stored["run"]["status"] == status
    assert [p["step"] for p in series["points"]] == [10 * (i + 1) for i in range(KILLED_AFTER)]
    return next(r for r in found if r["kind"] == "run" and r["status"] == status)


def test_a_sigkilled_producer_loses_nothing_it_recorded(tmp_path):
    run_dir = tmp_path / unique("sigkill-1")
    with IngestServer(tmp_path / "db.sqlite3") as server:
        assert train(run_dir, "sigkill", env={"MOTRIX_METRICS_URL": server.url}) == -signal.SIGKILL
        end = check_everything_before_the_kill(run_dir, server.url, "killed")
    assert "SIGKILL" in end["reason"] or "disappeared" in end["reason"]


def test_sigterm_then_sigkill_during_shutdown_loses_nothing(tmp_path):
    run_dir = tmp_path / unique("sigterm-1")
    with IngestServer(tmp_path / "db.sqlite3") as server:
        assert train(run_dir, "sigterm_sigkill", env={"MOTRIX_METRICS_URL": server.url}) == -signal.SIGKILL
        end = check_everything_before_the_kill(run_dir, server.url, "killed")
    assert end["reason"] == "Terminated: SIGTERM"  # the producer's own record of the first signal, not the agent's guess


def test_a_killed_agent_costs_no_training_and_its_work_is_finished_at_close(tmp_path, capfd):
    run_dir = tmp_path / unique("agent-killed-1")
    assert train(run_dir, "kill_agent") == 0
    assert "finishing its work here" in capfd.readouterr().err
    found = records(run_dir)
    assert [r["status"] for r in found if r["kind"] == "run"][-1] == "finished"
    steps = [r["step"] for r in found if r["kind"] == "scalars" and "Loss/critic" in r["values"]]
    # The dead agent committed only what its files held: every step arrives, once.
    assert steps == [10 * (i + 1) for i in range(100)]
    # What the dead agent had counted is counted once: the summary's are the whole run's, as the trace's.
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert summary["timelines"]["learner"]["phases"]["learning"]["count"] == learning_slices(run_dir) == 100, summary["timelines"]
    assert summary["timelines"]["learner"]["iterations"]["count"] == 100
    assert not _segments_of(run_dir.name)


def test_a_new_agent_takes_over_while_training_runs(tmp_path):
    run_dir = tmp_path / unique("agent-restarted-1")
    out = subprocess.run(
        [sys.executable, str(TARGET), str(run_dir), "restart_agent"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]  # training went on
    assert "starting a new one" in out.stderr and "finishing its work here" not in out.stderr
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    assert stats["dropped"]["scalars"] > 0  # the ring filled while no agent read it: counted, never blocking
    found = records(run_dir)
    reported = [r["attributes"] for r in found if r["kind"] == "event" and r["name"] == "records_dropped"]
    assert sum(r["total"] for r in reported if r["queue"] == "scalars") >= stats["dropped"]["scalars"]  # the agent reports them
    assert [r["status"] for r in found if r["kind"] == "run"][-1] == "finished"
    assert [r["status"] for r in found if r["kind"] == "run"].count("pending") == 1  # the run continued, not restarted
    steps = [r["step"] for r in found if r["kind"] == "scalars" and "Loss/critic" in r["values"]]
    assert steps[-40:] == [10 * (i + 1) for i in range(60, 100)]  # once the new agent reads, nothing is missed
    # The new agent's trace part sits next to the first agent's; the run span closes in its part.
    assert (run_dir / "trace.agent-1.perfetto-trace").exists()
    assert learning_slices(run_dir) >= 40
    # What the first agent had counted is counted once: the summary's are the whole run's, as the trace's.
    summary = json.loads((run_dir / "run_summary.json").read_text())
    learner = summary["timelines"]["learner"]
    assert learner["phases"]["learning"]["count"] == learning_slices(run_dir), learner
    assert learner["iterations"]["count"] == 100 and summary["env_steps"] == 1000
    assert not _segments_of(run_dir.name)


@pytest.mark.parametrize("agent", ["thread", "process"])
def test_both_hosts_write_the_same_outputs(tmp_path, agent):
    run_dir = tmp_path / unique(f"same-{agent}")
    assert train(run_dir, "finish", agent) == 0
    found = records(run_dir)
    assert [r["status"] for r in found if r["kind"] == "run"] == ["pending", "running", "finished"]
    assert [r["step"] for r in found if r["kind"] == "scalars" and "Loss/critic" in r["values"]] == [10 * (i + 1) for i in range(100)]
    assert learning_slices(run_dir) == 100
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert summary["timelines"]["learner"]["phases"]["learning"]["count"] == 100
    assert not _segments_of(run_dir.name)


def test_segments_are_private_and_removed(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path / "private-1", jsonl=True, agent="process", system_metrics_interval_s=0)
    try:
        (path,) = _segments_of("private-1", os.getpid())
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700  # the agent's directory
        assert stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o700
        with tel.run():
            tel.scalars({"Loss/critic": 1.0})
        assert tel.flush(timeout_s=30)  # the agent serves it
    finally:
        tel.close()
    assert not _segments_of("private-1", os.getpid())
    deadline = time.monotonic() + 15
    while path.parent.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not path.parent.exists()  # the agent, idle, removed its directory (and lock) as it ended


def test_python_and_c_lanes_write_the_same_records(tmp_path):
    # The test command builds the C hot path (test_hotpath checks it): both lanes are always here.
    written = {}
    for implementation in ("c", "python"):
        segment = shm.Segment(None, b"", 64)
        recorder = Recorder(segment, 64, implementation)
        learning = recorder.new_phase(phase_spec("learner", "learning"))
        iteration = recorder.iteration_factory()("learner", 2**70, 5)  # an index past int64: recorded as -1
        with iteration:
            with pytest.raises(KeyError):
                with learning:
                    raise KeyError("x")
        recorder.lane().flow(7, 2**64 - 1, True)
        reader = shm.SegmentReader(segment.buffer)
        (lane,) = reader.lanes()
        got = reader.take_lane(0, 100)
        if implementation == "python":
            assert isinstance(recorder.lane(), PyLane)
        written[implementation] = [
            (int(r["kind"]), int(r["name"]), int(r["depth"]), int(r["a"]), int(r["b"]), int(r["exc"]), int(r["flags"])) for r in got
        ]
        names = reader.update_names()
        assert names[written[implementation][1][1]] == "learner\tlearning" and "KeyError" in names
    assert written["c"] == written["python"]
    kinds = [r[0] for r in written["c"]]
    assert kinds == [RecordKind.ITERATION_START, RecordKind.PHASE, RecordKind.ITERATION_END, RecordKind.FLOW]
    assert written["c"][0][3:5] == (-1, 5)


@pytest.mark.parametrize("implementation", sorted(IMPLEMENTATIONS))
def test_a_full_lane_drops_new_records_and_counts_them(implementation):
    segment = shm.Segment(None, b"", 8)
    recorder = Recorder(segment, 8, implementation)
    learning = recorder.new_phase(phase_spec("learner", "learning"))
    for _ in range(20):
        with learning:
            pass
    reader = shm.SegmentReader(segment.buffer)
    assert reader.lanes()[0][2] == 12 == recorder.dropped()["phases"]
    first = reader.take_lane(0, 100)
    assert len(first) == 8
    with learning:
        pass
    assert len(reader.take_lane(0, 100)) == 0  # taken is not committed: the slots are still the reader's
    reader.commit()
    with learning:
        pass
    assert len(reader.take_lane(0, 100)) == 1  # room again once the reader has committed


def test_window_timings_come_from_the_agent(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path / "window-1", agent="process", system_metrics_interval_s=0)
    try:
        with tel.run():
            for i in range(20):
                with tel.iteration(i, env_steps=i):
                    with tel.phase("learning"):
                        time.sleep(0.002)
            assert tel.flush(30.0)
            first = tel.window_timings()
            assert first["Perf/iteration_time"] >= 0.002 and first["Perf/learning_time"] >= 0.002  # s per iteration
            assert tel.window_timings() == {}  # nothing new since
    finally:
        tel.close()


@pytest.mark.parametrize("implementation", sorted(IMPLEMENTATIONS))
def test_a_forked_child_writes_nothing_into_its_parents_segment(implementation, monkeypatch, tmp_path):
    if implementation == "python":
        monkeypatch.setenv("OTEL_RL_PURE_PYTHON", "1")
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, agent="process", system_metrics_interval_s=0)
    learning = tel.phase("learning")
    with learning:
        pass
    pid = os.fork()
    if pid == 0:  # the child records as if nothing happened
        for _ in range(1000):
            with learning:
                pass
        tel.scalars({"Loss/critic": 1.0})
        with tel.run():
            pass
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert tel.flush(30.0)
    assert tel.stats()["pending"] == {"phases": 0, "messages": 0}
    tel.close()
    summary = json.loads((tmp_path / "run_summary.json").read_text())
    assert summary["timelines"]["learner"]["phases"]["learning"]["count"] == 1
    found = records(tmp_path)
    assert not [r for r in found if r["kind"] == "scalars" and "Loss/critic" in r["values"]]
    assert [r["status"] for r in found if r["kind"] == "run"] == ["pending"]  # nothing of the child's run


def test_message_rings_wrap_fill_and_agree_between_c_and_python():
    from otel_rl.training import _hotpath

    frames = [(MessageKind.SCALARS, bytes([i]) * (100 + 37 * i)) for i in range(40)]
    taken = {}
    for writer in ("c", "python"):
        segment = shm.Segment(None, b"", 64, control_bytes=4096, data_bytes=4096)
        reader = shm.SegmentReader(segment.buffer)
        got, accepted = [], []
        for kind, payload in frames:
            ring, limit = segment.ring_for(kind)
            if writer == "c":
                put = _hotpath.put_frame(segment.buffer, ring.offset, ring.capacity, kind, payload, limit)
            else:
                put = segment.put(kind, payload)
            if put:
                accepted.append((kind, payload))
            else:
                got += reader.data.take(1 << 20)  # the reader catches up; the refused frame is dropped, not retried
                reader.data.commit()
        got += reader.data.take(1 << 20)
        assert got == accepted  # whole, in order, across the ring's end
        assert reader.data.dropped.value == len(frames) - len(accepted) > 0
        taken[writer] = got
    assert taken["c"] == taken["python"]


class _Algo(enum.Enum):
    SAC = "sac"


def test_odd_keys_and_values_reach_the_agent_as_what_they_were(tmp_path, caplog):
    run_dir = tmp_path / "odd-1"
    caplog.set_level("WARNING", logger="otel_rl")
    tel = otel_rl.init(run_dir=run_dir, jsonl=True, agent="process", system_metrics_interval_s=0)
    try:
        # A class the agent cannot import, a path, bytes, numpy: one warning each, the rest kept.
        tel.scalars({1: np.float32(2.0), "1": 3.0, ("a", 1): 4.0, _Algo.SAC: 5.0, "Loss/critic": 1.0,
                     "Loss/path": Path("/p"), "Loss/bytes": b"xx", "Loss/nan": float("nan")})  # fmt: skip
        tel.event("configured", algo=_Algo.SAC, when=datetime.date(2026, 1, 2))
    finally:
        tel.close()
    found = records(run_dir)
    assert [r["values"] for r in found if r["kind"] == "scalars"] == [{"custom/1": 3.0, "Loss/critic": 1.0, "Loss/nan": None}]
    (configured,) = [r["attributes"] for r in found if r["kind"] == "event" and r["name"] == "configured"]
    assert configured["when"] == "2026-01-02"
    # The agent's warnings are logged in this process, under the loggers that raised them, by close().
    logged = {(r.name, r.getMessage()) for r in caplog.records}
    assert ("otel_rl.core.keys", "otel-rl: scalars()/distribution() key _Algo.SAC (_Algo) is not a string; its value is dropped") in logged
    assert ("otel_rl.base.values", "otel-rl: scalars(): 'Loss/path' is PosixPath, not a number; dropped") in logged
    assert any("'Loss/bytes' is bytes, not a number" in message for _, message in logged)


def test_without_a_process_the_agent_runs_on_a_thread(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python-here"))
    run_dir = tmp_path / "no-process-1"
    with caplog.at_level("WARNING", logger="otel_rl"):
        tel = otel_rl.init(run_dir=run_dir, jsonl=True, agent="process", system_metrics_interval_s=0)
    try:
        assert tel.stats()["agent"] == "thread"
        with tel.run():
            tel.scalars({"Loss/critic": 1.0}, step=1)
    finally:
        tel.close()
    assert any("could not start" in r.getMessage() for r in caplog.records)
    assert [r["status"] for r in records(run_dir) if r["kind"] == "run"] == ["pending", "running", "finished"]
    assert not _segments_of("no-process-1", os.getpid())


def test_scalars_reach_every_host_alike(tmp_path):
    calls = [
        {"Loss/critic": 1.5, "Loss/steps": 7, "Loss/flag": True, "Loss/none": None, "Loss/nan": float("nan")},
        {"Loss/critic": np.float32(2.5), "Loss/huge": 2**70, "Loss/negative": -(2**63) + 1},
        {"Loss/new_key": 3.0, "Loss/critic": float("-inf")},
    ]
    seen = {}
    for agent in ("off", "thread", "process"):
        run_dir = tmp_path / f"alike-{agent}"
        tel = otel_rl.init(run_dir=run_dir, jsonl=True, agent=agent, system_metrics_interval_s=0)
        try:
            for step, values in enumerate(calls):
                tel.scalars(values, step=step if step != 1 else None)
        finally:
            tel.close()
        found = records(run_dir)
        seen[agent] = (
            [(r["values"], r.get("step")) for r in found if r["kind"] == "scalars"],
            sorted((r["name"], json.dumps(r["attributes"], sort_keys=True)) for r in found if r["kind"] == "event"),
        )
    assert seen["thread"] == seen["off"] == seen["process"]
    assert seen["off"][0][0][0]["Loss/steps"] == 7 and seen["off"][0][0][0]["Loss/nan"] is None


def test_segments_left_by_dead_producers_and_agents_are_removed_or_finished(tmp_path):
    directory = tmp_path / "segments"
    directory.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    (directory / "orphans").mkdir()
    for name, pid, agent_pid, state in (
        ("done.seg", dead_pid, dead_pid, shm.AGENT_DONE),  # both gone, served to the end: removed
        ("orphans/unwritten.seg", dead_pid, dead_pid, shm.AGENT_ATTACHED),  # both gone mid-run: a new agent finishes it
        ("producer-alive.seg", os.getpid(), dead_pid, shm.AGENT_NONE),
        ("agent-alive.seg", dead_pid, os.getpid(), shm.AGENT_ATTACHED),
    ):
        segment = shm.Segment(directory / name, b"", 8, control_bytes=4096, data_bytes=4096)
        segment.set("pid", pid)
        segment.set("agent_pid", agent_pid)
        segment.set("agent_state", state)
        segment.close()
    (directory / "young.seg").write_bytes(b"\0" * 64)  # not a segment yet: maybe being created by another process
    (directory / "older-version").mkdir()  # both gone mid-run, its layout another otel-rl version's: left to that version
    older = shm.Segment(directory / "older-version" / "older.seg", b"", 8, control_bytes=4096, data_bytes=4096)
    older.set("pid", dead_pid), older.set("agent_pid", dead_pid), older.set("agent_state", shm.AGENT_ATTACHED)
    older.close()
    os.truncate(directory / "older-version" / "older.seg", older.regions.total - 2 * shm.STATE_BYTES)
    for name, age_s in (("ended-agent", 3600), ("serving-agent", 3600), ("young-agent", 0)):  # agents' directories
        (directory / name).mkdir()
        (directory / name / agents.AGENT_LOCK).touch()
        os.utime(directory / name, (time.time() - age_s, time.time() - age_s))
    serving = agents.lock_agent(directory / "serving-agent")
    try:
        removed, orphaned = agents.tidy(directory)
    finally:
        os.close(serving)
    assert [p.name for p in removed] == ["done.seg"] and orphaned == {directory / "orphans"}
    assert sorted(p.name for p in directory.iterdir()) == [
        "agent-alive.seg", "older-version", "orphans", "producer-alive.seg", "serving-agent", "young-agent", "young.seg"
    ]  # an old agent directory with no segment and no agent is gone


def test_close_and_flush_do_not_wait_for_the_agents_next_pass(tmp_path):
    run_dir = tmp_path / "slow-pass-1"
    tel = otel_rl.init(run_dir=run_dir, jsonl=True, agent="process", pipeline_interval_s=3600, system_metrics_interval_s=0)
    try:
        with tel.run():
            with tel.iteration(0, env_steps=1):
                with tel.phase("learning"):
                    pass
            assert tel.flush(30.0)
            assert tel.window_timings()["Perf/iteration_time"] > 0  # flushed through the agent
    finally:
        tel.close(30.0)
    assert [r["status"] for r in records(run_dir) if r["kind"] == "run"] == ["pending", "running", "finished"]


def _slices(run_dir: Path) -> list:
    return protobuf_engine.read(trace_files(run_dir)).slices


def test_two_ranks_and_a_collector_share_one_agent_and_one_trace(tmp_path):
    import multiprocessing as mp

    import agent_group

    run_dir, out = tmp_path / "ranks-1", tmp_path / "out"
    out.mkdir()
    name = f"test-{os.getpid()}-{os.urandom(3).hex()}"
    port = free_port()
    context = mp.get_context("spawn")
    ranks = [context.Process(target=agent_group.rank, args=(r, 2, port, str(run_dir), name, str(out))) for r in range(2)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(120)
    assert [p.exitcode for p in ranks] == [0, 0]
    agents = {f.stem: int(f.read_text()) for f in out.glob("*.agent")}
    assert set(agents) == {"rank0", "rank1", "collector 0"}
    assert len(set(agents.values())) == 1 and 0 not in agents.values()  # one agent served all three
    slices = _slices(run_dir)
    by_process = {}
    for s in slices:
        by_process.setdefault(s.process, []).append(s.name)
    assert set(by_process) == {"learner", "learner rank 1", "collector 0"}  # one trace, every process
    assert by_process["learner"].count("Learning") == by_process["learner rank 1"].count("Learning") == agent_group.LEARNER_ITERATIONS
    assert by_process["collector 0"].count("Env Step") == agent_group.COLLECTOR_CYCLES
    found = records(run_dir)
    keys = set().union(*(r["values"] for r in found if r["kind"] == "scalars"))
    assert "Perf/collector_env_step_ms" in keys  # the learner's live metrics see the collector
    assert [r["status"] for r in found if r["kind"] == "run"] == ["pending", "running", "finished"]
    assert not list((tmp_path).glob("**/trace-*.perfetto-trace*"))  # every fragment merged


def test_a_worker_killed_mid_run_loses_nothing_it_recorded(tmp_path):
    import multiprocessing as mp

    import agent_group

    run_dir, out = tmp_path / "doomed-1", tmp_path / "out"
    out.mkdir()
    learner = mp.get_context("spawn").Process(target=agent_group.learner_with_doomed_worker, args=(str(run_dir), str(out)))
    learner.start()
    learner.join(120)
    assert learner.exitcode == 0
    assert int((out / "collector 0.agent").read_text()) == int((out / "learner.agent").read_text())
    slices = _slices(run_dir)
    env_steps = [s for s in slices if s.process == "collector 0" and s.name == "Env Step"]
    assert len(env_steps) == agent_group.COLLECTOR_CYCLES // 2  # every cycle before the SIGKILL, once
    raw = (run_dir / "trace.perfetto-trace").read_bytes()
    # The agent's mark names the signal when it reads the wait status before the learner reaps the worker.
    assert b"worker crashed: its trace ends here (killed by SIGKILL)" in raw or b"ends here (the process disappeared" in raw
    found = records(run_dir)
    assert [r["attributes"]["exit_code"] for r in found if r["kind"] == "event" and r["name"] == "worker_crashed"] == [-9]
    assert "Perf/collector_env_step_ms" in set().union(*(r["values"] for r in found if r["kind"] == "scalars"))
    assert [r["status"] for r in found if r["kind"] == "run"] == ["pending", "running", "finished"]


def test_lane_drops_are_counted_once_in_stats_and_reach_the_outputs(tmp_path):
    run_dir = tmp_path / "lane-drops-1"
    tel = otel_rl.init(run_dir=run_dir, jsonl=True, agent="process", lane_capacity=64, pipeline_interval_s=3600, system_metrics_interval_s=0)
    learning = tel.phase("learning")
    for _ in range(200):  # before the agent is up: the lane keeps 64, drops the rest
        with learning:
            pass
    assert tel.flush(timeout_s=30)
    assert tel.stats()["dropped"]["phases"] == 136  # the agent mirrors the count; the sum is not doubled
    tel.close()
    reports = [r["attributes"] for r in records(run_dir) if r["kind"] == "event" and r["name"] == "records_dropped"]
    assert sum(a["phases"] for a in reports if a["queue"] == "phases") == 136  # the live outputs report them too


def test_a_segment_is_read_by_one_reader_at_a_time(tmp_path):
    path = tmp_path / "one-reader.seg"
    segment = shm.Segment(path, b"", 8, control_bytes=4096, data_bytes=4096)
    first, second = shm.SegmentReader(path), shm.SegmentReader(path)
    try:
        assert first.claim() and not second.claim()  # an agent and a producer finishing the work never both read
        first.close()
        assert second.claim()  # released with its holder (on close, or by the kernel when it dies)
    finally:
        second.close()
        segment.close()


def test_the_learners_panel_shows_the_collector_its_agent_serves(tmp_path, capfd, monkeypatch):
    import multiprocessing as mp

    import agent_group

    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # the agent, which inherits the terminal, draws the full panel
    monkeypatch.setenv("COLUMNS", "160")
    learner = mp.get_context("spawn").Process(target=agent_group.learner_with_panel, args=(str(tmp_path / "panel-1"), str(out)))
    learner.start()
    learner.join(120)
    assert learner.exitcode == 0
    drawn = capfd.readouterr().out
    assert "Collector" in drawn and "Env Step" in drawn and "Learning" in drawn


def test_a_shared_agent_killed_mid_run_is_replaced_once_for_all_its_producers(tmp_path):
    name = f"test-{os.getpid()}-{os.urandom(3).hex()}"
    tels = [otel_rl.init(run_dir=tmp_path / f"shared-{i}", jsonl=True, agent=name, system_metrics_interval_s=0) for i in range(2)]
    runs = [tel.run() for tel in tels]
    for run in runs:
        run.__enter__()
    for step in range(20):
        for tel in tels:
            tel.scalars({"Loss/critic": float(step)}, step=step)
    assert all(tel.flush(timeout_s=30) for tel in tels)  # written out by the first agent
    (first,) = {tel.stats()["agent_pid"] for tel in tels}  # one agent serves both
    os.kill(first, signal.SIGKILL)
    for step in range(20, 40):
        for tel in tels:
            tel.scalars({"Loss/critic": float(step)}, step=step)
    deadline = time.monotonic() + 20
    while {tel.stats()["agent_pid"] for tel in tels} & {first, None} and time.monotonic() < deadline:
        time.sleep(0.05)
    (second,) = {tel.stats()["agent_pid"] for tel in tels}  # both watchers started one; one took the directory
    assert second != first
    for run in runs:
        run.__exit__(None, None, None)
    for tel in tels:
        tel.close()
    for i in range(2):
        found = records(tmp_path / f"shared-{i}")
        assert [r["step"] for r in found if r["kind"] == "scalars" and "Loss/critic" in r["values"]] == list(range(40))
        assert [r["status"] for r in found if r["kind"] == "run"] == ["pending", "running", "finished"]


class _Scheme(enum.Enum):
    """A class of the test module: an agent process cannot import it."""

    GAE = "gae"


def test_a_configuration_with_the_users_own_classes_still_reaches_an_agent_or_stays_here(tmp_path, caplog):
    # meta is made plain data before it travels: the agent process serves it, the NaN reported once.
    tel = otel_rl.init(run_dir=tmp_path / "meta-1", jsonl=True, agent="process", system_metrics_interval_s=0,
                       meta={"scheme": _Scheme.GAE, "clip": float("nan"), "path": Path("/data")})  # fmt: skip
    assert tel.flush(timeout_s=30) and tel.stats()["agent"] == "process" and tel.stats()["agent_pid"]
    tel.close()
    found = records(tmp_path / "meta-1")
    assert [r["attributes"]["key"] for r in found if r["kind"] == "event" and r["name"] == "nonfinite"] == ["meta.clip"]
    # Elsewhere in the configuration such an object keeps the outputs in this process, said once.
    tel = otel_rl.init(run_dir=tmp_path / "meta-2", jsonl=True, agent="process", system_metrics_interval_s=0,
                       resource_attributes={"rl.scheme": _Scheme.GAE})  # fmt: skip
    assert tel.stats()["agent"] == "thread"
    tel.close()
    assert any("_Scheme" in r.getMessage() and "run on a thread" in r.getMessage() for r in caplog.records)
    assert records(tmp_path / "meta-2")[0]["status"] == "pending"


def test_a_backlog_larger_than_the_jsonl_queue_reaches_the_file_whole(tmp_path):
    """An agent that finds more records than ``metrics.jsonl``'s queue holds (it took over from one that died) writes them pass by pass: none dropped."""
    from otel_rl.agent.serve import serve_segment
    from otel_rl.base.clock import Clock
    from otel_rl.config import TelemetryConfig
    from otel_rl.core.identity import RunIdentity

    config = TelemetryConfig.from_options(tmp_path / "run", None, jsonl=True, trace_enabled=False, panel=False, system_metrics_interval_s=0)
    clock = Clock()
    identity = RunIdentity(config, 0x1234, None, os.getpid(), clock.now_ns(), clock.offset_ns)
    segment = shm.Segment(None, b"", 64, data_bytes=32 << 20)
    recorder = Recorder(segment, 64)
    calls = 150_000  # past the queue's 100,000
    for step in range(calls):
        recorder.add_scalars((time.perf_counter_ns(), {"Loss/critic": float(step)}, step, None, None))
    server = serve_segment(shm.SegmentReader(segment.buffer), identity)
    jsonl = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not jsonl.exists() or jsonl.read_bytes().count(b"\n") < calls):
        time.sleep(0.2)
    segment.set("state", shm.CLOSING)
    assert server.done.wait(30)
    steps = [json.loads(line)["step"] for line in jsonl.read_text().splitlines() if '"kind":"scalars"' in line]
    assert steps == list(range(calls))
    assert not {k: v for k, v in server.producer.pipeline.dropped().items() if v}


def test_an_agent_killed_inside_an_iteration_leaves_it_whole_to_the_next(tmp_path):
    """SIGKILL the agent while an iteration is open (its Collector Wait read, its Learning not yet): the next agent reads
    that iteration again from its start, so the trace has every iteration once with its phases (it had 6 cycles for
    7 Learning phases, Learning 102% of Iter Wall)."""
    from otel_rl.readers.analysis import analyze

    run_dir = tmp_path / unique("agent-killed-inside")
    script = f"""
import os, signal, time, otel_rl
tel = otel_rl.init(run_dir={str(run_dir)!r}, system_metrics_interval_s=0, panel=False, pipeline_interval_s=0.05)
with tel.run():
    for i in range(25):  # the next agent has time to start and read a few seconds of it
        with tel.iteration(i, env_steps=100 * (i + 1)):
            with tel.phase("collector_wait"):
                time.sleep(0.03)
            with tel.phase("learning"):
                time.sleep(0.2)  # the agent has read this iteration's start and its wait by now
                if i == 2:
                    while tel.stats()["agent_pid"] is None:  # a loaded machine: the agent process may not have attached yet
                        time.sleep(0.05)
                    os.kill(tel.stats()["agent_pid"], signal.SIGKILL)
tel.close()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "starting a new one" in done.stderr, done.stderr[-2000:]
    learner = analyze(run_dir).timelines["learner"]
    assert learner.cycles == 25
    assert {name: stat.count + stat.stalls for name, stat in learner.phases.items()} == {"collector_wait": 25, "learning": 25}
    assert learner.accounted_share + learner.stall_share <= 1.0 + 1e-9
    said = [r["attributes"] for r in records(run_dir) if r["kind"] == "event" and r["name"] == "bottleneck"]
    assert any(s.get("iteration", -1) >= 4 for s in said), said  # the next agent says the live verdict of the run it took over


def test_a_pass_that_keeps_failing_never_keeps_the_agent_past_its_producers_close(tmp_path, monkeypatch, caplog):
    """A segment the agent cannot read (say, laid out by another otel-rl version: a pass raised every round, commit
    never came, and the agent outlived its producer for good): once the producer closes, the run ends with what was
    read and the agent is done."""
    from otel_rl.agent import serve
    from otel_rl.base.clock import Clock
    from otel_rl.config import TelemetryConfig
    from otel_rl.core.identity import RunIdentity

    def fails(self):
        raise IndexError("a pass that cannot read its segment")

    monkeypatch.setattr(serve.SegmentServer, "_passes", fails)  # the fault injected; the server's own handling is tested
    config = TelemetryConfig.from_options(tmp_path / "run", None, jsonl=True, trace_enabled=False, panel=False, system_metrics_interval_s=0)
    clock = Clock()
    identity = RunIdentity(config, 0x1234, None, os.getpid(), clock.now_ns(), clock.offset_ns)
    segment = shm.Segment(None, b"", 64)
    server = serve.serve_segment(shm.SegmentReader(segment.buffer), identity)
    time.sleep(0.5)  # rounds that fail while the producer lives: said, and tried again
    assert not server.done.is_set()
    segment.set("state", shm.CLOSING)
    assert server.done.wait(30)
    assert segment.get("agent_state") == shm.AGENT_DONE
    assert any("its run ends with what was read" in r.getMessage() for r in caplog.records)


def test_a_segment_of_another_layout_is_refused_whole(tmp_path):
    """A file shorter than its header's layout (another otel-rl version's segment) is not read past its end: refused, said why."""
    path = tmp_path / "old.seg"
    segment = shm.Segment(path, b"", 64)
    total = segment.regions.total
    os.truncate(path, total - shm.STATE_BYTES)
    with pytest.raises(ValueError, match="another otel-rl version"):
        shm.SegmentReader(path)
    segment.close()

"""Crash-complete in every window: whatever the training process recorded reaches the outputs, exactly once.

Real processes killed with SIGKILL at chosen moments (during start-up, during
``close()``, the agent mid-run, the agent and the producer together); each
test counts every scalar, event and Learning slice the producer made in
``metrics.jsonl`` and the Perfetto trace.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from locations import SUPPORT, interruptible

import otel_rl
from otel_rl.agent import directory as agents
from otel_rl.readers.analysis import protobuf_engine, trace_files

TARGET = SUPPORT / "crash_target.py"
ITERATIONS = 3000


def start(run_dir: Path, mode: str) -> tuple[subprocess.Popen, Path]:
    progress = run_dir.parent / f"{run_dir.name}.progress"
    process = subprocess.Popen([sys.executable, str(TARGET), str(run_dir), mode, str(progress)])
    return process, progress


def lines(progress: Path) -> list[str]:
    return progress.read_text().split() if progress.exists() else []


def wait_for_line(progress: Path, line: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while line not in lines(progress):
        assert time.monotonic() < deadline, f"{progress.name} never said {line!r}"
        time.sleep(0.001)


def recorded(progress: Path) -> int:
    """Iterations whose records the producer had handed over when it was killed (at least)."""
    return len([line for line in lines(progress) if line.isdigit()])


def served(run_dir: Path, timeout_s: float = 60.0) -> list[dict]:
    """``metrics.jsonl`` once an agent ended the run and removed its segment."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        jsonl = run_dir / "metrics.jsonl"
        if jsonl.exists() and not list(agents.segment_dir().glob(f"*/{run_dir.name}-*.seg")):
            found = [json.loads(line) for line in jsonl.read_text().splitlines()]
            if any(r["kind"] == "run" and r["status"] not in ("pending", "running") for r in found):
                return found
        time.sleep(0.05)
    raise AssertionError(f"no agent ended the run in {run_dir} within {timeout_s} s")


def check_once(run_dir: Path, found: list[dict], made: set[int]) -> None:
    """Every iteration in ``made`` (and perhaps the one after: recorded, not yet said) is there exactly once."""
    steps = [r["values"]["Loss/critic"] for r in found if r["kind"] == "scalars" and "Loss/critic" in r["values"]]
    assert len(steps) == len(set(steps)), "a scalar was written twice"
    assert set(range(len(made))) == made and set(steps) in (made, made | {len(made)})
    events = [r["attributes"]["iteration"] for r in found if r["kind"] == "event" and r["name"] == "checkpoint_saved"]
    said = list(range(0, len(made), 10))  # the iteration after them may have died between its scalar and its event
    assert sorted(events) == sorted(set(events)) and sorted(events) in (said, said + [len(made)])
    if steps or list(run_dir.glob("*.perfetto-trace")):  # a producer killed before its first phase has no trace
        model = protobuf_engine.read(trace_files(run_dir))
        # The last iteration's phase may be recorded without its scalar (killed in between).
        assert sum(1 for s in model.slices if s.name == "Learning") in (len(steps), len(steps) + 1)
    assert len({r["seq"] for r in found}) == len(found)
    statuses = [r["status"] for r in found if r["kind"] == "run"]
    assert statuses.count("pending") == 1 and statuses[-1] in ("finished", "killed")


@pytest.mark.parametrize("after_ms", [0, 5, 50])
def test_a_short_run_killed_during_close_loses_nothing(tmp_path, after_ms):
    run_dir = tmp_path / f"close-{after_ms}"
    process, progress = start(run_dir, "close")
    wait_for_line(progress, "closing")
    time.sleep(after_ms / 1000)
    process.kill()
    process.wait()
    found = served(run_dir)
    check_once(run_dir, found, set(range(ITERATIONS)))
    assert [r["status"] for r in found if r["kind"] == "run"] == ["pending", "running", "finished"]  # it had ended


@pytest.mark.parametrize("after_ms", [0, 100, 300])
def test_a_process_killed_right_after_init_loses_nothing(tmp_path, after_ms):
    run_dir = tmp_path / f"init-{after_ms}"
    process, progress = start(run_dir, "init")
    wait_for_line(progress, "init")
    time.sleep(after_ms / 1000)
    process.kill()
    process.wait()
    found = served(run_dir)
    check_once(run_dir, found, set(range(recorded(progress))))
    end = [r for r in found if r["kind"] == "run"][-1]
    assert end["status"] == "killed" and ("SIGKILL" in end["reason"] or "disappeared" in end["reason"])


def test_an_agent_killed_twice_mid_run_costs_nothing(tmp_path):
    run_dir = tmp_path / "agent-twice"
    process, progress = start(run_dir, "agent-twice")
    assert process.wait(timeout=120) == 0
    assert "closed" in lines(progress)
    found = served(run_dir)
    check_once(run_dir, found, set(range(ITERATIONS)))
    assert [r["status"] for r in found if r["kind"] == "run"] == ["pending", "running", "finished"]


def test_a_producer_and_its_agent_both_killed_are_finished_by_the_next_start(tmp_path):
    run_dir = tmp_path / "both"
    process, progress = start(run_dir, "both")
    assert process.wait(timeout=120) == -signal.SIGKILL
    time.sleep(0.5)
    assert list(agents.segment_dir().glob(f"*/{run_dir.name}-*.seg"))  # left behind, holding what no agent wrote
    otel_rl.init(run_dir=tmp_path / "next", system_metrics_interval_s=0).close()  # any start finds it
    found = served(run_dir)
    check_once(run_dir, found, set(range(recorded(progress))))
    assert [r["status"] for r in found if r["kind"] == "run"][-1] == "killed"


BUSY_LOOP = """
import sys, otel_rl
tel = otel_rl.init(run_dir=sys.argv[1], quiet=True)
with tel.run():
    i = 0
    while True:  # nothing but otel-rl's calls: a Ctrl-C lands inside them
        with tel.iteration(i, env_steps=i), tel.phase("learning"):
            pass
        tel.scalars({"Loss/critic": float(i)})
        if i == 5:
            print("ready", flush=True)
        i += 1
"""


def test_a_ctrl_c_anywhere_in_the_loop_ends_the_run_as_killed(tmp_path):
    """Wherever the interpreter is when it arrives, a Ctrl-C is the user's: raised, never swallowed by a call of ours."""
    for attempt in range(6):
        run_dir = tmp_path / f"run{attempt}"
        process = subprocess.Popen(
            [sys.executable, "-c", BUSY_LOOP, str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=interruptible
        )
        assert process.stdout.readline().strip() == "ready"
        time.sleep(0.05 * attempt)
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == -signal.SIGINT  # an uncaught KeyboardInterrupt ends Python by SIGINT, after close() at exit
        ends = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "run"]
        assert (ends[-1]["status"], ends[-1]["reason"]) == ("killed", "KeyboardInterrupt")

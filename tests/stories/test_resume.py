"""Resuming a run after a restart: one run, one trace, continuous steps in every output (real processes and readers)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from locations import SUPPORT
from otlp_receivers import HttpReceiver
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from wandb_reader import history, run_dirs, summary

import otel_rl
from otel_rl.readers.analysis import analyze
from otel_rl.readers.server import IngestServer

TARGET = SUPPORT / "resume_target.py"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)


def train(run_dir: Path, start: int, stop: int, end: str, *extra: str, env: dict | None = None) -> int:
    return subprocess.run(
        [sys.executable, str(TARGET), str(run_dir), str(start), str(stop), end, *extra],
        env={**os.environ, **(env or {})}, timeout=120,
    ).returncode  # fmt: skip


def jsonl(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_killed_run_resumes_as_one_run_in_every_output(tmp_path):
    run_dir = tmp_path / "sac-1"
    with IngestServer(tmp_path / "db.sqlite3") as server:
        live = {"MOTRIX_METRICS_URL": server.url}
        assert train(run_dir, 0, 20, "sigterm", env=live) == 128 + signal.SIGTERM  # Terminated exits with 143
        first_trace_id = json.loads((run_dir / "run_config.json").read_text())["trace_id"]
        assert train(run_dir, 20, 40, "finish", "resume", env=live) == 0
        stored = requests.get(f"{server.url}/api/v1/runs/sac-1", timeout=10).json()
        series = requests.get(f"{server.url}/api/v1/runs/sac-1/scalars", params={"key": "Loss/critic"}, timeout=10).json()
    # Live metrics: one run, back to running and then finished, steps continuous.
    assert stored["run"]["status"] == "finished"
    assert [e["name"] for e in stored["events"]].count("resumed") == 1
    assert [p["step"] for p in series["points"]] == [10 * (i + 1) for i in range(40)]
    # metrics.jsonl: appended; one run id; the lifecycle; the resumed event.
    records = jsonl(run_dir)
    assert {r["run_id"] for r in records} == {"sac-1"}
    assert [r["status"] for r in records if r["kind"] == "run"] == ["pending", "running", "killed", "pending", "running", "finished"]
    (resumed,) = [r for r in records if r["kind"] == "event" and r["name"] == "resumed"]
    assert resumed["attributes"] == {"previous_status": "killed", "last_step": 200, "resumes": 1}
    steps = [r["step"] for r in records if r["kind"] == "scalars" and "Loss/critic" in r["values"]]
    assert steps == [10 * (i + 1) for i in range(40)]
    assert not any(r["kind"] == "event" and r["name"] == "step_regression" for r in records)
    # The same trace id; the trace in two parts that analyze reads together.
    config = json.loads((run_dir / "run_config.json").read_text())
    assert config["trace_id"] == first_trace_id and config["resumes"] == 1
    assert (run_dir / "trace.perfetto-trace").exists() and (run_dir / "trace.resume-1.perfetto-trace").exists()
    assert analyze(run_dir).timelines["learner"].cycles == 40
    # TensorBoard: both parts' event files in one folder, steps continuous.
    accumulator = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("Loss/critic")] == [10 * (i + 1) for i in range(40)]
    from tensorboard.plugins.hparams import metadata

    sessions = accumulator.PluginTagToContent(metadata.PLUGIN_NAME)
    end = metadata.parse_session_end_info_plugin_data(sessions[metadata.SESSION_END_INFO_TAG])
    assert end.status == 1  # STATUS_SUCCESS: the run as its last part ended it, not the killed part's failure
    # W&B: the same run id twice (offline parts; ``wandb sync`` joins them), env steps continuous.
    first, second = run_dirs(run_dir)
    assert summary(first)["run_id"] == summary(second)["run_id"] == "sac-1"
    assert summary(first)["summary"]["otel_rl/status"] == "killed" and summary(second)["state"] == "finished"
    logged = [r["env_steps"] for part in (first, second) for r in history(part) if "Loss/critic" in r]
    assert logged == [10 * (i + 1) for i in range(40)]
    assert summary(second)["summary"]["events/resumed"]["count"] == 1


@pytest.mark.parametrize("agent, previous_status", [("off", "lost"), ("process", "killed")])
def test_a_sigkilled_run_resumes_in_the_same_trace_and_is_reported_lost(tmp_path, monkeypatch, agent, previous_status):
    # In-process outputs die with the process (the run is found "lost"); an agent ends it as "killed" first.
    run_dir = tmp_path / "sac-2"
    assert train(run_dir, 0, 10, "sigkill", env={"OTEL_RL_AGENT": agent}) == -signal.SIGKILL
    trace_id = int(json.loads((run_dir / "run_config.json").read_text())["trace_id"], 16)
    receiver = HttpReceiver().start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_RL_RESUME", "true")
    try:
        tel = otel_rl.init(run_dir=run_dir, jsonl=True, system_metrics_interval_s=0)
        with tel.run():
            with tel.iteration(10, env_steps=110):
                tel.scalars({"Loss/critic": 0.1})
        tel.close()
        assert receiver.received.wait_for(lambda r: any(s.name == "rl.run" for _, s in r.spans()))
    finally:
        receiver.stop()
    assert tel.trace_id == trace_id
    assert {int.from_bytes(s.trace_id, "big") for _, s in receiver.received.spans()} == {trace_id}
    (resumed,) = [r for r in jsonl(run_dir) if r["kind"] == "event" and r["name"] == "resumed"]
    assert resumed["attributes"]["previous_status"] == previous_status and resumed["attributes"]["last_step"] == 100


def test_resuming_an_empty_folder_starts_afresh_with_one_warning(tmp_path, caplog):
    tel = otel_rl.init(run_dir=tmp_path / "new", resume=True, jsonl=True, system_metrics_interval_s=0)
    with tel.run():
        tel.scalars({"Loss/critic": 1.0}, step=1)
    tel.close()
    assert sum("nothing to resume" in r.getMessage() for r in caplog.records) == 1
    assert not any(r["kind"] == "event" and r["name"] == "resumed" for r in jsonl(tmp_path / "new"))


def test_resuming_another_runs_folder_is_an_error(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, system_metrics_interval_s=0)
    with tel.run():
        pass
    tel.close()
    with pytest.raises(ValueError, match="holds run"):
        otel_rl.init(run_dir=tmp_path, run_id="another", resume=True)
    with pytest.raises(ValueError, match="resume=True needs"):
        otel_rl.init(resume=True)


def test_steps_going_back_after_a_resume_are_reported_once(tmp_path, caplog):
    run_dir = tmp_path / "sac-3"
    assert train(run_dir, 0, 10, "finish") == 0
    tel = otel_rl.init(run_dir=run_dir, resume=True, jsonl=True, system_metrics_interval_s=0)
    with tel.run():
        for i in range(3):  # restarted from scratch instead of from the checkpoint
            with tel.iteration(i, env_steps=10 * (i + 1)):
                tel.scalars({"Loss/critic": 1.0})
    tel.close()
    records = jsonl(run_dir)
    (regression,) = [r["attributes"] for r in records if r["kind"] == "event" and r["name"] == "step_regression"]
    assert regression == {"keys": ["Loss/critic"], "step": 10, "last_step": 100}
    assert [r["step"] for r in records if r["kind"] == "scalars" and "Loss/critic" in r["values"]][-3:] == [10, 20, 30]
    assert sum("is lower than the last step" in r.getMessage() for r in caplog.records) == 1


def test_steps_that_start_over_after_a_resume_never_go_back_in_tensorboard_or_wandb(tmp_path):
    """AReaL's ``max(global_step, last_commit_step + 1)``: a loop restarted from scratch is written at the next free steps."""
    run_dir = tmp_path / "sac-4"
    assert train(run_dir, 0, 20, "sigterm") == 128 + signal.SIGTERM  # env steps 10 ... 200
    assert train(run_dir, 0, 30, "finish", "resume") == 0  # its count started over: 10 ... 300
    accumulator = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    accumulator.Reload()
    steps = [e.step for e in accumulator.Scalars("Loss/critic")]
    # Each step of the loop that is behind goes one further (201, 202, ...) until its own steps pass them (230 > 222).
    behind = [200 + n for n in range(1, 23)]
    assert steps == [10 * (i + 1) for i in range(20)] + behind + [10 * (i + 1) for i in range(22, 30)], steps
    first, second = run_dirs(run_dir)
    logged = [r["env_steps"] for part in (first, second) for r in history(part) if "Loss/critic" in r]
    assert logged == steps
    # The run folder's own copy keeps the loop's steps as it gave them, and says that they went back.
    own = [r["step"] for r in jsonl(run_dir) if r["kind"] == "scalars" and "Loss/critic" in r["values"]]
    assert own == [10 * (i + 1) for i in range(20)] + [10 * (i + 1) for i in range(30)]


def test_a_moved_folder_resumes_the_run_it_holds(tmp_path, caplog):
    """The folder was renamed between the two parts: resume=True continues its run ('exp'), not one named after the folder."""
    import logging
    import shutil

    assert train(tmp_path / "exp", 0, 10, "sigterm") == 128 + signal.SIGTERM
    shutil.move(tmp_path / "exp", tmp_path / "exp-moved")
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        tel = otel_rl.init(run_dir=tmp_path / "exp-moved", resume=True, system_metrics_interval_s=0)
        with tel.run():
            tel.scalars({"Loss/critic": 0.5}, step=110)
        tel.close()
    assert tel.run_id == "exp"
    assert sum("holds run 'exp' (the folder was moved or renamed); continuing it" in r.getMessage() for r in caplog.records) == 1
    records = jsonl(tmp_path / "exp-moved")
    assert {r["run_id"] for r in records} == {"exp"}
    assert [r["status"] for r in records if r["kind"] == "run"] == ["pending", "running", "killed", "pending", "running", "finished"]
    (resumed,) = [r for r in records if r["kind"] == "event" and r["name"] == "resumed"]
    assert resumed["attributes"]["previous_status"] == "killed"

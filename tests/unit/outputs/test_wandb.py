"""The W&B output, run offline and read back with W&B's own reader."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from wandb_reader import history, records, run_dirs, summary

import otel_rl


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)


def test_config_scalars_distributions_events_and_status_reach_wandb(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path, wandb=True, perf_interval_s=0.05, system_metrics_interval_s=0, group="sweep-1")
    config = {"lr": 3e-4, "env": {"id": "Pendulum-v1"}, "api_key": "sk-123", "seed": np.int64(7)}
    with tel.run(config=config):
        for i in range(20):
            with tel.iteration(i, env_steps=8 * (i + 1)):
                with tel.phase("learning"):
                    time.sleep(0.002)
            tel.scalars({"Loss/critic": np.float32(1.0 / (i + 1)), "Train/mean_reward": torch.tensor(-100.0 + i)})
        tel.distribution("Policy/action", torch.linspace(-1, 1, 101))
        tel.event("checkpoint_saved", path=tmp_path / "ckpt.pt")
    tel.close()  # the W&B run is finished when close() returns
    (run,) = run_dirs(tmp_path)
    rows = history(run)
    critic = [(r["env_steps"], r["Loss/critic"]) for r in rows if "Loss/critic" in r]
    assert [s for s, _ in critic] == [8 * (i + 1) for i in range(20)]  # at env steps, as the JSONL
    assert critic[3][1] == pytest.approx(0.25)
    assert any(r.get("Perf/learning_time", 0) >= 0.002 for r in rows)
    (action,) = [r for r in rows if "Policy/action._type" in r]  # W&B's log flattens the histogram's fields
    assert action["Policy/action._type"] == "histogram" and sum(action["Policy/action.values"]) == 101
    assert action["Policy/action.bins"][0] == -1 and action["Policy/action.bins"][-1] == 1
    assert [r["Policy/action/p50"] for r in rows if "Policy/action/p50" in r] == [pytest.approx(0.0, abs=1e-6)]
    state = summary(run)
    assert state["run_id"] == tmp_path.name and state["state"] == "finished" and state["exit_code"] == 0
    assert state["config"]["lr"] == 3e-4 and state["config"]["env"] == {"id": "Pendulum-v1"}
    assert state["config"]["api_key"] == "<redacted>" and state["config"]["seed"] == 7
    assert state["config"]["otel_rl"]["versions"]["otel_rl"]
    assert state["summary"]["otel_rl/status"] == "finished"
    event = state["summary"]["events/checkpoint_saved"]
    assert event["count"] == 1 and event["attributes"]["path"].endswith("ckpt.pt")
    assert event["step"] == 8 * 20  # at the step it happened, not null
    (marked,) = [r for r in rows if "events/checkpoint_saved/count" in r]
    assert marked["env_steps"] == 8 * 20
    # W&B's own System tab is kept: it samples the training process (here, from the agent process).
    stats = [r["stats"]["item"] for r in records(run) if r["type"] == "stats"]
    assert stats and "proc.memory.rssMB" in stats[0]
    assert state["project"] == "otel-rl"


@pytest.mark.parametrize(("error", "status", "exit_code"), [(RuntimeError("diverged"), "failed", 1), (KeyboardInterrupt(), "killed", 143)])
def test_the_run_status_becomes_the_wandb_exit_code(tmp_path, error, status, exit_code):
    tel = otel_rl.init(run_dir=tmp_path, wandb=True, system_metrics_interval_s=0)
    with pytest.raises(type(error)):
        with tel.run(config={"lr": 1.0}):
            tel.scalars({"Loss/critic": 1.0}, step=1)
            raise error
    tel.close()
    state = summary(run_dirs(tmp_path)[0])
    assert state["exit_code"] == exit_code and state["state"] == "failed"
    assert state["summary"]["otel_rl/status"] == status


def test_a_step_that_goes_back_is_kept_and_reported_once(tmp_path, caplog):
    tel = otel_rl.init(run_dir=tmp_path, wandb=True, jsonl=True, system_metrics_interval_s=0)
    with tel.run():
        for step in (100, 200, 50, 60, 10):
            tel.scalars({"Loss/critic": float(step)}, step=step)
    tel.close()
    rows = history(run_dirs(tmp_path)[0])
    assert [(r["env_steps"], r["Loss/critic"]) for r in rows if "Loss/critic" in r] == [(s, s) for s in (100, 200, 50, 60, 10)]
    assert sum("is lower than the last step" in r.getMessage() for r in caplog.records) == 1
    lines = (tmp_path / "metrics.jsonl").read_text()
    assert lines.count('"step_regression"') == 1 and '"last_step":200' in lines


def test_a_failing_wandb_costs_only_its_own_output(tmp_path, caplog):
    (tmp_path / "wandb").write_text("a file where W&B's folder should be")
    tel = otel_rl.init(run_dir=tmp_path, wandb=True, jsonl=True, system_metrics_interval_s=0)
    with tel.run():
        for i in range(5):
            tel.scalars({"Loss/critic": 1.0}, step=i)
    tel.close()
    assert sum("wandb output failed" in r.getMessage() for r in caplog.records) == 1
    assert tel.stats()["dropped"]["wandb"] >= 1
    assert '"finished"' in (tmp_path / "metrics.jsonl").read_text()


def test_only_rank_zero_logs_to_wandb(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path, wandb=True, rank=1, world_size=2, system_metrics_interval_s=0)
    with tel.run():
        tel.scalars({"Loss/critic": 1.0})
    tel.close()
    assert not (tmp_path / "wandb").exists()


def test_wandb_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_RL_WANDB", "1")
    monkeypatch.setenv("WANDB_PROJECT", "my-project")
    tel = otel_rl.init(run_dir=tmp_path, system_metrics_interval_s=0)
    with tel.run():
        tel.scalars({"Loss/critic": 1.0}, step=3)
    tel.close()
    state = summary(run_dirs(tmp_path)[0])
    assert state["project"] == "my-project" and state["summary"]["Loss/critic"] == 1.0


def test_the_wandb_run_describes_the_training_script_not_the_agent(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, otel_rl\n"
        "tel = otel_rl.init(run_dir=sys.argv[1], wandb=True, system_metrics_interval_s=0, quiet=True)\n"
        "with tel.run():\n"
        "    tel.scalars({'Loss/critic': 1.0})\n"
        "tel.close()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_", "WANDB_"))}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true")
    subprocess.run([sys.executable, str(script), str(tmp_path / "run"), "--lr", "3e-4"], check=True, timeout=120, env=env, cwd=tmp_path)
    (run,) = run_dirs(tmp_path / "run")
    (environment,) = [r["environment"] for r in records(run) if r["type"] == "environment" and "program" in r["environment"]]
    assert environment["program"] == str(script)
    assert environment["args"] == [str(tmp_path / "run"), "--lr", "3e-4"]

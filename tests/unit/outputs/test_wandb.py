"""The W&B output, run offline and read back with W&B's own reader."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from wandb_reader import history, records, run_dirs, summary

import otel_rl


WANDB_VARIABLES = ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_GROUP", "WANDB_NAME", "WANDB_TAGS", "WANDB_NOTES", "WANDB_JOB_TYPE")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    for name in WANDB_VARIABLES:
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
    axes = [(r["axis/iteration"], r["axis/env_steps_total"]) for r in rows if "Loss/critic" in r]
    assert axes == [(i, 8 * (i + 1)) for i in range(20)]  # either can be the charts' x axis
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
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_", "WANDB_")) or k == "OTEL_RL_RUN_DIR"}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true")
    subprocess.run([sys.executable, str(script), str(tmp_path / "run"), "--lr", "3e-4"], check=True, timeout=120, env=env, cwd=tmp_path)
    (run,) = run_dirs(tmp_path / "run")
    (environment,) = [r["environment"] for r in records(run) if r["type"] == "environment" and "program" in r["environment"]]
    assert environment["program"] == str(script)
    assert environment["args"] == [str(tmp_path / "run"), "--lr", "3e-4"]


def _run_record(run) -> dict:
    (first,) = [r["run"] for r in records(run) if r["type"] == "run"][:1]
    return first


def test_the_wandb_run_is_named_tagged_and_described_as_its_user_says_with_the_provenance(tmp_path):
    """Seed 001's wandb_project/entity/group/name/tags/notes/mode and seed 002's job_type, as keywords; the config's otel_rl
    block carries the commit, branch and dirty flag, the version and the command line with its secrets redacted."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "feature/per"], check=True)
    (repo / "train.py").write_text(
        "import sys, otel_rl\n"
        "tel = otel_rl.init(run_dir=sys.argv[1], wandb=True, system_metrics_interval_s=0, quiet=True, wandb_project='proj',\n"
        "                   wandb_entity='team-a', wandb_group='sweep-7', wandb_name='sac lr=3e-4', wandb_tags=['sac', 'pendulum'],\n"
        "                   wandb_notes='a first try', wandb_job_type='train', wandb_mode='offline')\n"
        "with tel.run(config={'lr': 3e-4}):\n"
        "    tel.scalars({'Loss/critic': 1.0}, step=1)\n"
        "tel.close()\n"
    )
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    (repo / "train.py").write_text((repo / "train.py").read_text() + "# edited\n")  # uncommitted: dirty
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_", "WANDB_")) or k == "OTEL_RL_RUN_DIR"}
    env["WANDB_SILENT"] = "true"
    subprocess.run([sys.executable, "train.py", str(repo / "run"), "--api-key=sk-1", "--token", "sk-2", "--lr", "3e-4"],
                   check=True, timeout=120, env=env, cwd=repo)  # fmt: skip
    (run,) = run_dirs(repo / "run")
    described = _run_record(run)
    assert described["display_name"] == "sac lr=3e-4" and described["entity"] == "team-a" and described["project"] == "proj"
    assert described["run_group"] == "sweep-7" and described["job_type"] == "train" and described["notes"] == "a first try"
    assert described["tags"] == ["sac", "pendulum"] and described["run_id"] == "run"
    origin = summary(run)["config"]["otel_rl"]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert origin["git"] == {"commit": commit, "branch": "feature/per", "dirty": True}
    assert origin["versions"]["otel_rl"] == otel_rl.__version__
    assert origin["args"] == [str(repo / "run"), "--api-key=<redacted>", "--token", "<redacted>", "--lr", "3e-4"]
    (environment,) = [r["environment"] for r in records(run) if r["type"] == "environment" and "args" in r["environment"]]
    assert "sk-1" not in json.dumps(environment) and "sk-2" not in json.dumps(environment)  # W&B's own copy of the arguments too


def test_the_wandb_fields_come_from_wandbs_own_variables_and_a_keyword_wins(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("WANDB_NAME", "from-env")
    monkeypatch.setenv("WANDB_TAGS", "a, b,,c," + "x" * 65)  # W&B itself refuses this value: here the one bad tag is left out
    monkeypatch.setenv("WANDB_NOTES", "noted")
    monkeypatch.setenv("WANDB_JOB_TYPE", "eval")
    monkeypatch.setenv("WANDB_RUN_GROUP", "env-group")
    monkeypatch.setenv("WANDB_ENTITY", "env-team")
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        tel = otel_rl.init(run_dir=tmp_path, wandb=True, system_metrics_interval_s=0, wandb_name="from-keyword")
        with tel.run():
            tel.scalars({"Loss/critic": 1.0}, step=1)
        tel.close()
    assert [r.getMessage() for r in caplog.records if "WANDB_TAGS" in r.getMessage()] == [
        "otel-rl: WANDB_TAGS: leaving out the tag '" + "x" * 65 + "' (W&B takes tags of 1 to 64 characters); the other tags are kept"]
    described = _run_record(run_dirs(tmp_path)[0])
    assert described["display_name"] == "from-keyword" and described["tags"] == ["a", "b", "c"]
    assert described["notes"] == "noted" and described["job_type"] == "eval"
    assert described["run_group"] == "env-group" and described["entity"] == "env-team"


def test_wandb_disabled_is_no_wandb_run_and_a_wrong_mode_is_named(tmp_path, monkeypatch, caplog):
    tel = otel_rl.init(run_dir=tmp_path / "off", wandb=True, wandb_mode="disabled", system_metrics_interval_s=0)
    with tel.run():
        tel.scalars({"Loss/critic": 1.0}, step=1)
    tel.close()
    assert not (tmp_path / "off" / "wandb").exists() and (tmp_path / "off" / "metrics.jsonl").exists()
    with pytest.raises(ValueError, match="wandb_mode must be online, offline, disabled, shared, got 'ofline'; did you mean 'offline'"):
        otel_rl.init(run_dir=tmp_path / "bad", wandb=True, wandb_mode="ofline")
    with pytest.raises(ValueError, match="wandb_tags"):
        otel_rl.init(run_dir=tmp_path / "bad", wandb=True, wandb_tags=["x" * 65])
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        tel = otel_rl.init(run_dir=tmp_path / "env", wandb=True, system_metrics_interval_s=0)
        tel.close()
    assert sum("WANDB_MODE" in r.getMessage() for r in caplog.records) == 1
    assert tel.config.wandb_mode == "offline"  # the variable ignored: no API key, so offline


def test_a_change_of_bottleneck_reaches_wandb_as_text_at_its_step(tmp_path):
    """The live verdict's changes: a history row with the verdict as HTML text and its count, the latest in the summary."""
    tel = otel_rl.init(run_dir=tmp_path, wandb=True, system_metrics_interval_s=0)
    with tel.run():
        began, i = time.monotonic(), 0
        while time.monotonic() - began < 4:
            with tel.iteration(i, env_steps=8 * (i + 1)):
                with tel.phase("learning"):
                    time.sleep(0.01)
            i += 1
    tel.close()
    (run,) = run_dirs(tmp_path)
    (row,) = [r for r in history(run) if "events/bottleneck/count" in r]
    assert row["events/bottleneck/text._type"] == "html-file" and row["env_steps"] > 0
    text = (run / "files" / row["events/bottleneck/text.path"]).read_text()
    assert "learner (learning)" in text
    assert summary(run)["summary"]["events/bottleneck"]["attributes"]["text"] == "learner (learning)"

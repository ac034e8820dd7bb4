"""The run's configuration and provenance reach every backend, secrets redacted (real git, files and OTLP receiver)."""

from __future__ import annotations

import json
import subprocess

import pytest
from otlp_receivers import HttpReceiver

import otel_rl
from otel_rl.run.provenance import REDACTED, flatten, redact


@pytest.fixture
def git_checkout(tmp_path, monkeypatch):
    """The working directory is a real git checkout with one commit and a modified file."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for args in (["init", "-q", "-b", "main"], ["config", "user.email", "t@example.invalid"], ["config", "user.name", "t"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    (repo / "train.py").write_text("print('v1')\n")
    subprocess.run(["git", "add", "train.py"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "v1"], cwd=repo, check=True)
    (repo / "train.py").write_text("print('v2')\n")  # uncommitted: dirty
    monkeypatch.chdir(repo)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()


CONFIG = {
    "lr": 3e-4,
    "batch_size": 256,
    "env": {"id": "Pendulum-v1", "num_envs": 8},
    "wandb": {"api_key": "wk-123", "project": "p"},
    "db_password": "hunter2",
    "hf_token": "hf-456",
    "layers": [256, 256],
}


def test_config_and_provenance_on_every_backend_with_secrets_redacted(tmp_path, git_checkout, monkeypatch):
    receiver = HttpReceiver().start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    run_dir = tmp_path / "run"
    try:
        tel = otel_rl.init(run_dir=run_dir, jsonl=True, algorithm="sac", meta={"owner": "me", "token": "t-789"},
                           system_metrics_interval_s=0)  # fmt: skip
        with tel.run(family="rl.offpolicy", config=CONFIG):
            tel.scalars({"Loss/critic": 1.0})
        tel.close()
        assert receiver.received.wait_for(lambda r: any(m.name == "rl.run.info" for _, m in r.metric_list()))
    finally:
        receiver.stop()
    secrets = ("wk-123", "hunter2", "hf-456", "t-789")
    for path in run_dir.iterdir():
        assert not any(s in path.read_text(errors="replace") for s in secrets), path
    run_config = json.loads((run_dir / "run_config.json").read_text())
    assert run_config["config"]["wandb"] == {"api_key": REDACTED, "project": "p"}
    assert run_config["config"]["lr"] == 3e-4 and run_config["git"] == {"commit": git_checkout, "branch": "main", "dirty": True}
    assert run_config["run_id"] == "run" and run_config["algorithm"] == "sac" and run_config["family"] == "rl.offpolicy"
    assert run_config["command"] and run_config["host"] and run_config["versions"]["otel_rl"]
    (running,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"running"' in line]
    assert running["config"] == run_config["config"] and running["git"]["commit"] == git_checkout
    assert running["meta"] == {"owner": "me", "token": REDACTED}
    (run_span,) = [s for _, s in receiver.received.spans() if s.name == "rl.run"]
    attributes = {a.key: a.value for a in run_span.attributes}
    assert attributes["rl.config.lr"].double_value == 3e-4 and attributes["rl.config.env.id"].string_value == "Pendulum-v1"
    assert attributes["rl.config.wandb.api_key"].string_value == REDACTED
    assert [v.int_value for v in attributes["rl.config.layers"].array_value.values] == [256, 256]
    assert attributes["rl.git.commit"].string_value == git_checkout and attributes["rl.git.dirty"].bool_value is True
    assert attributes["rl.git.branch"].string_value == "main"
    assert attributes["process.command_line"].string_value
    (info,) = [m for _, m in receiver.received.metric_list() if m.name == "rl.run.info"][-1:]
    (point,) = info.gauge.data_points
    labels = {a.key: a.value.string_value for a in point.attributes}
    assert point.as_int == 1 and labels["rl.config.batch_size"] == "256" and labels["rl.git.commit"] == git_checkout
    assert labels["rl.config.db_password"] == REDACTED


def test_redaction_and_flattening_rules():
    document = {"a": {"API_KEY": "x", "keys": [{"secret": 1}]}, "token": None, "max_tokens": 512, "author": "me", "WandbApiKey": 1}
    assert redact(document) == {
        "a": {"API_KEY": REDACTED, "keys": [{"secret": REDACTED}]},
        "token": None,  # nothing to hide
        "max_tokens": 512,  # whole words only
        "author": "me",
        "WandbApiKey": REDACTED,
    }
    assert flatten({"a": {"b": 1, "c": [1, "x"]}, "d": [1, 2], "e": None}) == {"a.b": 1, "a.c": [1, "x"], "d": [1, 2]}


def test_outside_a_git_checkout_there_is_no_commit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tel = otel_rl.init(run_dir=tmp_path / "run", system_metrics_interval_s=0)
    with tel.run(config={"lr": 1.0}):
        pass
    tel.close()
    assert json.loads((tmp_path / "run" / "run_config.json").read_text())["git"] is None

"""RLlib: a real PPO on CartPole with a local Ray (2 CPUs), one EnvRunner actor, followed into one trace."""

from __future__ import annotations

import json

import pytest
import ray
from integration_checks import check_run, counts, framework, records
from otlp_receivers import HttpReceiver
from ray.rllib.algorithms.ppo import PPOConfig

import otel_rl
from otel_rl.integrations.rllib import TelemetryCallbacks

pytestmark = pytest.mark.slow  # a real RL library, the demo, or a whole machine: pytest -m 'not slow' leaves it out


@pytest.fixture
def receiver(monkeypatch):
    """An OTLP receiver whose endpoint the Ray workers inherit (set before ray.init)."""
    server = HttpReceiver().start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", server.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "1000")
    yield server
    server.stop()

def test_ppo_driver_and_env_runner_actor_share_one_trace(tmp_path, receiver):
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")  # loopback only
    try:
        tel = otel_rl.init(run_dir=tmp_path)  # the fewest lines: no tel.run(), no output options
        config = (
            PPOConfig()
            .environment("CartPole-v1")
            .env_runners(num_env_runners=1, num_envs_per_env_runner=2)
            .training(train_batch_size_per_learner=400, minibatch_size=100, num_epochs=1)
            .callbacks(TelemetryCallbacks.for_run(tel, system_metrics_interval_s=0))
        )
        algo = config.build_algo()
        for _ in range(2):
            result = algo.train()
        sampled = int(result["env_runners"]["num_env_steps_sampled_lifetime"])
        algo.stop()  # the EnvRunner's telemetry closes with it, and the run ends
        tel.close()
    finally:
        ray.shutdown()
    found = check_run(
        tmp_path,
        {"learner": {"Learning", "Collector Wait", "Weight Publish"}, "env runner 1": {"Policy Inference", "Env Step"}},
        {"Train/mean_reward", "Loss/policy", "Loss/value", "Perf/learning_time",
         "Perf/collector_env_step_ms", "Perf/collector_policy_inference_ms"},  # the collector's, relayed to the learner
    )  # fmt: skip
    assert set(found["processes"]) == {"learner", "env runner 1"}
    # The run's env steps are RLlib's after its last iteration, not the count that iteration started at.
    assert json.loads((tmp_path / "run_summary.json").read_text())["env_steps"] == sampled >= 800
    assert max(r["axes"]["env_steps"] for r in records(tmp_path) if r["kind"] == "scalars" and r["axes"]["env_steps"] is not None) == sampled
    (running,) = [r for r in records(tmp_path) if r["kind"] == "run" and r["status"] == "running"]
    assert running["num_envs"] == 2 and running["config"]["algorithm"] == "PPO" and running["family"] == "rl.onpolicy"
    assert framework(tmp_path) == {"system": "rllib", "environment": "CartPole-v1", "algorithm": "PPO"}
    assert receiver.received.wait_for(lambda r: any(
        {a.key: a.value.string_value for a in res.attributes}.get("rl.system") == "rllib" for res, _ in r.spans()
    ))  # fmt: skip
    learner = counts(tmp_path)["learner"]
    assert learner["cycles"] == 2 and learner["collector_wait"] == 2  # sampling only, not state syncs
    assert receiver.received.wait_for(lambda r: any(
        {a.key: a.value.string_value for a in res.attributes}.get("rl.role") == "env runner 1" for res, _ in r.spans()
    ))  # fmt: skip
    roles = {}
    for resource, span in receiver.received.spans():
        role = {a.key: a.value.string_value for a in resource.attributes}["rl.role"]
        roles.setdefault(role, set()).add(span.trace_id)
    assert roles.keys() == {"learner", "env runner 1"}
    assert roles["learner"] == roles["env runner 1"] == {tel.trace_id.to_bytes(16, "big")}


def test_the_statistics_rllib_reports_as_nan_for_no_data_yet_are_left_out():
    from otel_rl.integrations.rllib import _flatten

    result = {"env_runners": {"episode_return_mean": float("nan"), "num_env_steps_sampled": 400}, "config": {"lr": 1.0}}
    assert _flatten(result) == {"env_runners/num_env_steps_sampled": 400}
